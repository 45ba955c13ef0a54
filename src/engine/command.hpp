#pragma once
// The command layer every model shares: how a command registers, reports progress and prints its
// one-line JSON summary, and the option blocks declared once for every fit (stopping, checkpoint).
// A model's commands add only the options of its own mathematics.
#include <CLI/CLI.hpp>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

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
  // Notes about deprecated option names, printed once the command line has parsed (so that a
  // parse error stays the only line): filled while parsing.
  mutable std::vector<std::string> deprecations;
};

// Rank 0 prints the final summary as one JSON line on stdout.
void print_summary(const Context& ctx, const nlohmann::ordered_json& j);
// Rank 0 prints a progress line on stderr (unless --quiet).
void print_progress(const Context& ctx, const std::string& line);
// Rank 0 prints "caviar: note: <line>" on stderr (even with --quiet).
void note(const Context& ctx, const std::string& line);

// --max-iter, --tol.
void add_stop_options(CLI::App* c, StopRule& s);

// An option under a name being retired in favour of `replacement` (an option of c): it still
// sets `target`, is listed under "Deprecated" in --help, cannot be given with its replacement,
// and using it prints one note on stderr (rank 0) after the command line has parsed.
template <class T>
CLI::Option* add_renamed_option(CLI::App* c, const std::string& old_name,
                                const std::string& replacement, T& target, const Context& ctx) {
  const Context* x = &ctx;
  return c->add_option(old_name, target, "Use " + replacement)
      ->group("Deprecated")
      ->excludes(replacement)
      ->each([x, old_name, replacement](const std::string&) {
        x->deprecations.push_back(old_name + " is deprecated and will be removed; use " +
                                  replacement);
      });
}
// --checkpoint, --checkpoint-every, --resume, and the exit-code footer.
void add_checkpoint_options(CLI::App* c, CheckpointFiles& f);
// The same over separate fields; `unit` is what --checkpoint-every N counts, `default_every` when
// checkpoints are written without it.
void add_checkpoint_options(CLI::App* c, std::string& checkpoint, std::string& every,
                            std::string& resume, const std::string& unit = "iterations",
                            const std::string& default_every = "only on a signal");
// The summary fields every fit reports: objective, iterations, converged, seconds, the timing
// split, ranks and threads.
nlohmann::ordered_json summary(const Context& ctx, const RunResult& r);

}  // namespace caviar::engine
