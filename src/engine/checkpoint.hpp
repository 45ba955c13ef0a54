#pragma once
// One checkpoint for every model. A checkpoint file holds
//   - the fingerprint (inference/checkpoint.hpp's ckpt::Fingerprint): model, algorithm, shapes,
//     every option that changes the result and the identity of each input; a resume with other
//     settings fails with one line;
//   - the position (attribute "iteration": the next iteration) and the fit's elapsed seconds;
//   - the traces (trace/objective, trace/seconds, trace/heldout);
//   - the model's global state under "model/" (the model's own save(), engine/state.hpp), and
//     the driver's own state, if it has any (an optimiser's moments, the position inside a pass),
//     under "driver/";
//   - the per-row local state under "rows/" (one N x width dataset per RowState), written by every
//     rank in parallel into the one file and read back by every rank for its own rows, whatever
//     the rank count that wrote it: never gathered onto one rank.
// Files are written to a temporary name and renamed, so the file on disk is always a complete
// checkpoint. At a boundary every rank polls the stop signals (one allreduce) and takes the same
// decision; on SIGTERM/SIGUSR1 the checkpoint is written and ckpt::Preempted is thrown on every
// rank (main() exits with code 75).
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "comm/comm.hpp"
#include "core/partition.hpp"
#include "core/signals.hpp"
#include "engine/run.hpp"
#include "engine/state.hpp"
#include "inference/checkpoint.hpp"

namespace caviar::engine {

// A model's per-row state: this rank's rows [rows.begin, rows.end) of a global_rows x width table.
// data holds rows.size() x width values, row-major.
struct RowState : LocalState {
  std::int64_t global_rows = 0;
  RowRange rows;
};

// A count kept by every rank for the fit's summary (e.g. inner-loop sweeps), which a resumed fit
// continues: the checkpoint stores the sum over ranks (attribute "counters.<name>"), and a resume
// gives it back to rank 0 (every other rank restarts from 0), so the final sum over ranks is that
// of an uninterrupted run.
struct Counter {
  std::string name;
  std::int64_t* value = nullptr;
};

// A boundary at which a driver may checkpoint or stop: after `iteration` completed iterations or
// passes (the attribute "iteration", the length of the traces). Inside a pass (mid_pass) only a
// signal or a timed --checkpoint-every Ts saves, never the count. `where` names the boundary in
// the stop message ("" gives "before iteration N").
struct Position {
  int iteration = 0;
  bool mid_pass = false;
  std::string where;
  std::int64_t propose = 0;  // rank 0's value that boundary() returns on every rank
};

class Checkpointer {
 public:
  // Installs the SIGTERM/SIGUSR1 handlers for the fit and checks the files (collective): the
  // checkpoint must be writable and none of `inputs`, nor `out`.
  Checkpointer(const Comm& comm, CheckpointFiles files, const std::vector<std::string>& inputs,
               const std::string& out);

  // With --resume: reads the checkpoint's position, clock and traces and checks its fingerprint
  // (collective; one agreed error on mismatch). Without, only keeps the fingerprint.
  void open(ckpt::Fingerprint fp);
  bool resuming() const { return resumed_.has_value(); }
  int iteration() const { return resuming() ? resumed_->iteration : 0; }
  double elapsed() const { return resuming() ? resumed_->elapsed : 0.0; }
  Trace trace() const { return resuming() ? resumed_->trace : Trace{}; }
  // Resuming: the model's global state (load reads it from the checkpoint's "model/").
  void restore_model(const std::function<void(const StateReader&)>& load) const;
  // Resuming: this rank's rows of a RowState (collective; checks the stored shape and values).
  void restore_rows(const RowState& s) const;
  // Resuming: the counters' values (collective).
  void restore_counters(std::span<const Counter> counters) const;
  // Resuming: the driver's own state (load reads it from the checkpoint's "driver/").
  void restore_driver(const std::function<void(const StateReader&)>& load) const;

  // At an iteration boundary, on every rank: polls the signals, writes the checkpoint when due
  // (collective), and on a signal throws ckpt::Preempted on every rank.
  void boundary(int iteration, const Trace& trace, double elapsed,
                const std::function<void(StateWriter&)>& save, std::span<const RowState> rows,
                std::span<const Counter> counters = {});
  // The same at any Position, with the driver's own state (save_driver may be empty). Returns
  // rank 0's at.propose, on every rank.
  std::int64_t boundary(const Position& at, const Trace& trace, double elapsed,
                        const std::function<void(StateWriter&)>& save,
                        std::span<const RowState> rows, std::span<const Counter> counters,
                        const std::function<void(StateWriter&)>& save_driver);

 private:
  void write(int iteration, const Trace& trace, double elapsed,
             const std::function<void(StateWriter&)>& save, std::span<const RowState> rows,
             std::span<const Counter> counters,
             const std::function<void(StateWriter&)>& save_driver);
  void restore(const std::string& prefix,
               const std::function<void(const StateReader&)>& load) const;
  struct Resumed {
    int iteration = 0;
    double elapsed = 0;
    Trace trace;
  };
  const Comm& comm_;
  CheckpointFiles files_;
  StopSignals signals_;
  ckpt::StopPoller poller_;
  std::optional<ckpt::Fingerprint> fp_;
  std::optional<Resumed> resumed_;
};

}  // namespace caviar::engine
