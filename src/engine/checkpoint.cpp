#include "engine/checkpoint.hpp"

#include <algorithm>
#include <climits>
#include <cmath>

#include "core/error.hpp"
#include "engine/state_io.hpp"
#include "io/h5.hpp"

namespace caviar::engine {

namespace {
ckpt::Every checked_every(const Comm& comm, const CheckpointFiles& f,
                          const std::vector<std::string>& inputs, const std::string& out) {
  ckpt::check_paths(comm, f.checkpoint, f.every, inputs);
  if (!f.checkpoint.empty() && !out.empty() && f.checkpoint == out)
    throw Error("--checkpoint and --out name the same file");
  if (!f.resume.empty() && f.resume == out) throw Error("--resume names the same file as --out");
  ckpt::check_resume(comm, f.resume);
  return ckpt::parse_every(f.every);
}

void write_trace(io::ParallelRowWriter& w, const std::string& name, const std::vector<double>& v) {
  if (!v.empty()) w.write_global(name, v, {v.size()});
}
}  // namespace

Checkpointer::Checkpointer(const Comm& comm, CheckpointFiles files,
                           const std::vector<std::string>& inputs, const std::string& out)
    : comm_(comm),
      files_(std::move(files)),
      poller_(comm, checked_every(comm, files_, inputs, out)) {}

void Checkpointer::open(ckpt::Fingerprint fp) {
  fp_ = std::move(fp);
  if (files_.resume.empty()) return;
  Resumed s;
  comm_.agree([&] {
    const io::FileReader r(files_.resume);
    fp_->check(r, files_.resume);
    const std::string bad = "--resume " + files_.resume + ": ";
    s.iteration = static_cast<int>(ckpt::read_int(r, "iteration", 0, INT_MAX, bad));
    s.elapsed = r.read_double_attr("elapsed");
    s.trace.objective = ckpt::read_vec(r, "/trace/objective");
    s.trace.seconds = ckpt::read_vec(r, "/trace/seconds");
    s.trace.heldout = ckpt::read_vec(r, "/trace/heldout");
    const auto n = static_cast<std::size_t>(s.iteration);
    if (s.trace.objective.size() != n || s.trace.seconds.size() != n ||
        (!s.trace.heldout.empty() && s.trace.heldout.size() != n))
      throw Error(bad + "its position and traces disagree (corrupt checkpoint?)");
  });
  // The boundary we resume at was the one saved: no need to save it again by count.
  poller_.skip_count_at(s.iteration);
  resumed_ = std::move(s);
}

void Checkpointer::restore(const std::string& prefix,
                           const std::function<void(const StateReader&)>& load) const {
  if (!resuming()) return;
  comm_.agree([&] {
    const io::FileReader r(files_.resume);
    load(FileStateReader(r, files_.resume, prefix));
  });
}

void Checkpointer::restore_model(const std::function<void(const StateReader&)>& load) const {
  restore("model/", load);
}

void Checkpointer::restore_driver(const std::function<void(const StateReader&)>& load) const {
  restore("driver/", load);
}

void Checkpointer::restore_rows(const RowState& s) const {
  if (!resuming()) return;
  const io::DataRef ref{files_.resume, "/rows/" + s.name};
  const io::MatrixShape shape = io::inspect_matrix(comm_, ref);  // collective, agreed
  if (shape.rows != s.global_rows || shape.cols != s.width)
    throw Error("--resume " + files_.resume + ": its " + s.name + " are " +
                std::to_string(shape.rows) + " x " + std::to_string(shape.cols) + ", expected " +
                std::to_string(s.global_rows) + " x " + std::to_string(s.width) +
                " (corrupt checkpoint?)");
  const io::RowMatrix m = io::read_rows(comm_, ref, shape, s.rows);
  // Each rank checks its own rows; the lowest failing rank names its first bad one.
  const auto category = [&](double v) {
    return v >= 0 && v < static_cast<double>(s.categories) && v == std::floor(v);
  };
  std::string err;
  for (Eigen::Index i = 0; i < m.rows() && err.empty(); ++i) {
    const auto row = m.row(i).array();
    if (!row.allFinite() || (s.positive && !(row > 0).all()) ||
        (s.categories > 0 && !std::all_of(row.begin(), row.end(), category)))
      err = "--resume " + files_.resume + ": the " + s.name + " of " + s.row_noun + " " +
            std::to_string(s.rows.begin + i) + " are not all " +
            (s.categories > 0 ? "whole numbers in [0, " + std::to_string(s.categories) + ")"
             : s.positive     ? std::string("positive and finite")
                              : std::string("finite")) +
            " (corrupt checkpoint?)";
  }
  comm_.raise_if_any(err);
  std::copy(m.data(), m.data() + m.size(), s.data);
}

void Checkpointer::restore_counters(std::span<const Counter> counters) const {
  if (!resuming() || counters.empty()) return;
  std::vector<std::int64_t> v(counters.size());
  comm_.agree([&] {
    const io::FileReader r(files_.resume);
    const std::string bad = "--resume " + files_.resume + ": ";
    for (std::size_t i = 0; i < counters.size(); ++i)
      v[i] = ckpt::read_int(r, "counters." + counters[i].name, 0, kMaxCount, bad);
  });
  for (std::size_t i = 0; i < counters.size(); ++i) *counters[i].value = comm_.is_root() ? v[i] : 0;
}

void Checkpointer::boundary(int iteration, const Trace& trace, double elapsed,
                            const std::function<void(StateWriter&)>& save,
                            std::span<const RowState> rows, std::span<const Counter> counters) {
  boundary(Position{iteration, false, ""}, trace, elapsed, save, rows, counters, {});
}

std::int64_t Checkpointer::boundary(const Position& at, const Trace& trace, double elapsed,
                                    const std::function<void(StateWriter&)>& save,
                                    std::span<const RowState> rows,
                                    std::span<const Counter> counters,
                                    const std::function<void(StateWriter&)>& save_driver) {
  // -1 completed: the poller never saves by count inside a pass.
  const ckpt::StopPoller::Decision d = poller_.poll(at.mid_pass ? -1 : at.iteration, at.propose);
  if (d.save && !files_.checkpoint.empty()) {
    write(at.iteration, trace, elapsed, save, rows, counters, save_driver);
    poller_.saved();
  }
  if (d.signal != 0)
    ckpt::stop(d.signal,
               at.where.empty() ? "before iteration " + std::to_string(at.iteration) : at.where,
               files_.checkpoint);
  return d.proposed;
}

void Checkpointer::write(int iteration, const Trace& trace, double elapsed,
                         const std::function<void(StateWriter&)>& save,
                         std::span<const RowState> rows, std::span<const Counter> counters,
                         const std::function<void(StateWriter&)>& save_driver) {
  std::vector<std::int64_t> sums;
  for (const Counter& c : counters) sums.push_back(*c.value);
  if (!sums.empty()) comm_.allreduce_sum(std::span<std::int64_t>(sums));
  io::ParallelRowWriter w(comm_, files_.checkpoint);
  for (std::size_t i = 0; i < sums.size(); ++i) w.attr("counters." + counters[i].name, sums[i]);
  fp_->write(w);
  w.attr("iteration", static_cast<std::int64_t>(iteration));
  // Rank 0's clock, so that every rank writes the same attribute.
  double e = elapsed;
  comm_.broadcast(std::span<double>(&e, 1), 0);
  w.attr("elapsed", e);
  write_trace(w, "trace/objective", trace.objective);
  write_trace(w, "trace/seconds", trace.seconds);
  write_trace(w, "trace/heldout", trace.heldout);
  ParallelStateWriter sw(w, "model/");
  save(sw);
  if (save_driver) {
    ParallelStateWriter dw(w, "driver/");
    save_driver(dw);
  }
  for (const RowState& s : rows)
    w.write_rows("rows/" + s.name, s.global_rows, s.rows, s.data,
                 {static_cast<std::uint64_t>(s.width)});
  w.commit();
}

}  // namespace caviar::engine
