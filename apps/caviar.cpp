// caviar: distributed variational inference. Thin main: parse, run the chosen command, and turn
// every error into one line and a non-zero exit on every rank.
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>

#include "app.hpp"
#include "core/error.hpp"
#include "core/isa.hpp"
#include "core/signals.hpp"
#include "inference/checkpoint.hpp"
#include "models/bbvi/commands.hpp"
#include "models/hmm/commands.hpp"
#include "models/plsa/commands.hpp"

int main(int argc, char** argv) {
  using namespace caviar;
  // Flag-only SIGTERM/SIGUSR1 handlers before anything else, MPI_Init included (Open MPI's
  // MPI_Init keeps them: tests/cli/test_early_signal.py): a preemption signal during start-up is
  // honoured at the first iteration boundary (checkpoint, exit 75) instead of killing the rank.
  StopSignals::install_early();
  // Test hook: a signal at a fixed point of the start-up, before or after MPI_Init.
  const char* test_signal = std::getenv("CAVIAR_TEST_SIGNAL_AT_START");
  if (test_signal && std::strcmp(test_signal, "before_init") == 0) std::raise(SIGTERM);
  Environment env(argc, argv);
  if (test_signal && std::strcmp(test_signal, "after_init") == 0) std::raise(SIGTERM);
  const Comm comm = Comm::world();
  app::Context ctx;
  ctx.comm = &comm;
  for (int i = 0; i < argc; ++i) ctx.command_line += (i ? " " : "") + std::string(argv[i]);

  CLI::App cli{"caviar: distributed variational inference (MPI + OpenMP + HDF5)"};
  cli.require_subcommand(1);
  cli.add_flag("-q,--quiet", ctx.quiet, "No progress output");
  std::string version = CAVIAR_VERSION;  // and what it was built for (core/isa.hpp)
  version += std::string(" (built for -march=") + (*isa::march() ? isa::march() : "x86-64") + ":";
  for (const char* const* e = isa::kBuiltFor; *e; ++e) version += std::string(" ") + *e;
  cli.set_version_flag("--version", version + ")");
  app::add_gmm_commands(cli, ctx);
  app::add_generate_commands(cli, ctx);
  app::add_prep_commands(cli, ctx);
  app::add_lda_commands(cli, ctx);
  app::add_vae_commands(cli, ctx);
  plsa::add_commands(cli, ctx);
  hmm::add_commands(cli, ctx);
  bbvi::add_commands(cli, ctx);

  // Every rank parses the same arguments, so every rank reaches the same verdict.
  try {
    cli.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version arrive as parse "errors" with exit code 0: CLI11 prints them.
    if (e.get_exit_code() == 0) return comm.is_root() ? cli.exit(e) : 0;
    // A bad command line is one error line, as every other error.
    if (comm.is_root()) std::fprintf(stderr, "caviar: error: %s (see --help)\n", e.what());
    return e.get_exit_code();
  }
  for (const std::string& line : ctx.deprecations) engine::note(ctx, line);
  // Commands that never poll the flag get the default dispositions back (a signal that came
  // meanwhile ends the process now).
  if (!ctx.stop_signals) StopSignals::end_early();
  try {
    ctx.action();
  } catch (const ckpt::Preempted& e) {
    // A stop signal, agreed on every rank at an iteration boundary (checkpoint written).
    if (comm.is_root()) std::fprintf(stderr, "%s\n", e.what());
    return kExitPreempted;
  } catch (const Error& e) {
    // Agreed errors: every rank throws the same one; rank 0 speaks for all.
    if (comm.is_root()) std::fprintf(stderr, "caviar: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    // Not agreed: other ranks may be waiting in a collective, so abort them all.
    std::fprintf(stderr, "caviar: internal error on rank %d: %s\n", comm.rank(), e.what());
    std::fflush(stderr);
    std::abort();
  }
  return 0;
}
