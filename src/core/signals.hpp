#pragma once
// Preemption: SLURM sends SIGTERM (or, with `#SBATCH --signal=B:USR1@60`, SIGUSR1) before it kills
// or requeues a job. The handlers only set a flag (nothing else is async-signal-safe, and MPI must
// never be called from a handler); drivers poll the flag at iteration boundaries, agree on it over
// all ranks with one allreduce, write a checkpoint and exit with kExitPreempted.
#include <csignal>

namespace caviar {

// Exit code of a run stopped by a signal after writing its checkpoint (EX_TEMPFAIL of
// sysexits.h: "try again later"). jobscripts/preemptible.sbatch requeues on it.
inline constexpr int kExitPreempted = 75;

// Installs the handlers for SIGTERM and SIGUSR1 while alive, and restores the previous ones after.
class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // The signal received since installation (0 if none). Local to this process: agree on it
  // across ranks (allreduce max) before acting, so that every rank stops at the same iteration.
  static int received();
  // For tests: behave as if `sig` had arrived.
  static void raise_for_test(int sig);

  // Process start (main, before MPI_Init): the same flag-only handlers for the whole start-up
  // (MPI_Init, option parsing, data reading), so that a signal then is not fatal but honoured at
  // the first iteration boundary. While they are installed, a guard keeps a signal received
  // before its construction instead of starting clear.
  static void install_early();
  // For commands that poll no flag: the dispositions from before install_early() come back, and
  // a signal received meanwhile is raised again (it ends the process as it would have at once).
  static void end_early();

 private:
  struct sigaction old_term_ {
  }, old_usr1_{};
};

}  // namespace caviar
