#pragma once
// What every driver shares: the options that decide when a fit stops and where it checkpoints,
// the traces it records, the progress it reports and the result it returns. One meaning per name
// for every model: --max-iter counts iterations (batch) or epochs (stochastic), --tol is the
// relative change of the objective below which a fit has converged.
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace caviar::engine {

struct StopRule {
  int max_iter = 100;  // updates at most (the objective is reported max_iter + 1 times)
  double tol = 1e-6;   // converged when |f_t - f_{t-1}| / |f_t| < tol (0: never)
};

struct CheckpointFiles {
  std::string checkpoint;  // written atomically every `every` and on SIGTERM/SIGUSR1
  std::string every;       // "N" iterations or "Ts" seconds; "" = only on a signal
  std::string resume;      // continue from this checkpoint
};

// Per reported iteration; held-out entries only when the fit evaluates held-out data.
struct Trace {
  std::vector<double> objective, seconds, heldout;
};

struct Report {
  int iteration = 0;
  double objective = 0;
  double heldout = 0;  // NaN without held-out data
  double seconds = 0;  // of fitting, since the start (held-out evaluation excluded)
};
using Progress = std::function<void(const Report&)>;

struct RunResult {
  Trace trace;
  int iterations = 0;  // updates done
  bool converged = false;
  // Stochastic fits (engine/stochastic.hpp): tol | objective-decreased | max-iter.
  std::string stop_reason;
  double seconds = 0;  // of fitting, held-out evaluation excluded
  // Where the time went: the local steps (slowest and fastest rank) and the reductions of the
  // statistics (slowest rank, including any wait for other ranks).
  double local_seconds_max = 0, local_seconds_min = 0, reduce_seconds_max = 0;
  // Gradient fits (engine/gradient.hpp): optimiser steps done (including those of a resumed
  // checkpoint), and the seconds of the optimiser's updates (slowest rank).
  std::int64_t steps = 0;
  double update_seconds_max = 0;
};

// Seconds of fitting, continued across a resume, with held-out evaluation excluded.
class FitClock {
 public:
  explicit FitClock(double already = 0) : start_(now() - already) {}
  double elapsed() const { return now() - start_ - excluded_; }
  template <class F>
  auto excluding(F&& f) {
    const double t = now();
    struct Add {
      FitClock* c;
      double t;
      ~Add() { c->excluded_ += now() - t; }
    } add{this, t};
    return f();
  }

 private:
  static double now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  double start_, excluded_ = 0;
};

}  // namespace caviar::engine
