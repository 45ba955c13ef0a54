#include "engine/command.hpp"

#include <iostream>

#include "core/parallel.hpp"

namespace caviar::engine {

void print_summary(const Context& ctx, const nlohmann::ordered_json& j) {
  if (ctx.comm->is_root()) std::cout << j.dump() << std::endl;
}

void print_progress(const Context& ctx, const std::string& line) {
  // One write per line (std::cerr is unbuffered: `<< line << std::endl` is two), so that a line
  // is not split when mpirun or SLURM interleave it with stdout in one file.
  if (!ctx.quiet && ctx.comm->is_root()) std::cerr << (line + '\n') << std::flush;
}

void note(const Context& ctx, const std::string& line) {
  if (ctx.comm->is_root()) std::cerr << ("caviar: note: " + line + '\n') << std::flush;
}

void add_stop_options(CLI::App* c, StopRule& s) {
  c->add_option("--max-iter", s.max_iter, "At most this many iterations (updates)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  c->add_option("--tol", s.tol,
                "Stop when the relative change of the objective is below this (0: never)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
}

void add_checkpoint_options(CLI::App* c, CheckpointFiles& f) {
  add_checkpoint_options(c, f.checkpoint, f.every, f.resume);
}

void add_checkpoint_options(CLI::App* c, std::string& checkpoint, std::string& every,
                            std::string& resume, const std::string& unit,
                            const std::string& default_every) {
  c->add_option("--checkpoint", checkpoint,
                "Checkpoint file (HDF5), written atomically every --checkpoint-every and on "
                "SIGTERM/SIGUSR1");
  c->add_option("--checkpoint-every", every,
                "N (" + unit + ") or Ts (seconds, e.g. 30s) between checkpoints [default: " +
                    default_every + "]");
  c->add_option("--resume", resume,
                "Continue from this checkpoint (same data and options; the result is bitwise "
                "that of an uninterrupted run, at any rank and thread count)");
  c->footer(
      "Exit codes: 0 done; 1 error (one 'caviar: error:' line); 75 stopped by SIGTERM or SIGUSR1 "
      "at an iteration, pass or minibatch boundary, after writing --checkpoint if given (resume "
      "with --resume).");
}

nlohmann::ordered_json summary(const Context& ctx, const RunResult& r) {
  nlohmann::ordered_json j;
  j["objective"] = r.trace.objective.empty() ? 0.0 : r.trace.objective.back();
  j["iterations"] = r.iterations;
  j["converged"] = r.converged;
  j["seconds"] = r.seconds;
  j["local_seconds_max"] = r.local_seconds_max;
  j["local_seconds_min"] = r.local_seconds_min;
  j["reduce_seconds_max"] = r.reduce_seconds_max;
  if (!r.trace.heldout.empty()) j["heldout"] = r.trace.heldout.back();
  j["ranks"] = ctx.comm->size();
  j["threads"] = max_threads();
  return j;
}

}  // namespace caviar::engine
