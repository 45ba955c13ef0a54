#pragma once
// The command layer every model shares: how a command registers, reports progress and prints its
// one-line JSON summary, and the option blocks declared once for every fit (stopping, checkpoint).
// A model's commands add only the options of its own mathematics.
#include <CLI/CLI.hpp>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "comm/comm.hpp"
#include "engine/run.hpp"

namespace caviar::engine {

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

// --max-iter, --tol.
void add_stop_options(CLI::App* c, StopRule& s);
// --checkpoint, --checkpoint-every, --resume, and the exit-code footer.
void add_checkpoint_options(CLI::App* c, CheckpointFiles& f);
// The summary fields every fit reports: objective, iterations, converged, seconds, the timing
// split, ranks and threads.
nlohmann::ordered_json summary(const Context& ctx, const RunResult& r);

}  // namespace caviar::engine
