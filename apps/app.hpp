#pragma once
// Shared plumbing of the caviar command-line program: how commands register, report progress
// and print their one-line JSON summary. Validation and I/O live in the drivers; apps stay thin.
#include <CLI/CLI.hpp>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "comm/comm.hpp"

namespace caviar::app {

struct Context {
  const Comm* comm = nullptr;
  std::string command_line;  // provenance, stored in output files
  bool quiet = false;
  std::function<void()> action;  // set by the chosen subcommand
  // Set by subcommands that poll SIGTERM/SIGUSR1 at iteration boundaries (checkpoints): main
  // then keeps the flag-only handlers it installed before MPI_Init (core/signals.hpp).
  bool stop_signals = false;
};

// Rank 0 prints the final summary as one JSON line on stdout.
void print_summary(const Context& ctx, const nlohmann::ordered_json& j);
// Rank 0 prints a progress line on stderr (unless --quiet).
void print_progress(const Context& ctx, const std::string& line);

void add_gmm_commands(CLI::App& app, Context& ctx);
void add_generate_commands(CLI::App& app, Context& ctx);
void add_prep_commands(CLI::App& app, Context& ctx);
// lda fit|topics|score|export|import, plus `generate lda` and `prep text` into those groups (so
// it must be called after add_generate_commands and add_prep_commands).
void add_lda_commands(CLI::App& app, Context& ctx);
void add_vae_commands(CLI::App& app, Context& ctx);

}  // namespace caviar::app
