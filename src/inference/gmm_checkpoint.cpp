#include "inference/gmm_checkpoint.hpp"

#include <climits>
#include <span>

#include "core/error.hpp"
#include "core/parallel.hpp"

namespace caviar::gmm {

namespace {
ckpt::Every checked_every(const Comm& comm, const FitOptions& o,
                          const std::vector<std::string>& inputs) {
  ckpt::check_paths(comm, o.checkpoint, o.checkpoint_every, inputs);
  if (!o.checkpoint.empty() && !o.out.empty() && o.checkpoint == o.out)
    throw Error("--checkpoint and --out name the same file");
  if (!o.checkpoint.empty() && !o.labels.empty() && o.checkpoint == o.labels)
    throw Error("--checkpoint and --labels name the same file");
  if (!o.resume.empty() && (o.resume == o.out || o.resume == o.labels))
    throw Error("--resume names the same file as --out or --labels");
  ckpt::check_resume(comm, o.resume);
  return ckpt::parse_every(o.checkpoint_every);
}

}  // namespace

Checkpointer::Checkpointer(const Comm& comm, const FitOptions& o,
                           const std::vector<std::string>& inputs)
    : comm_(comm), o_(o), poller_(comm, checked_every(comm, o, inputs)) {}

void add_mixture_keys(ckpt::Fingerprint& fp, const Comm& comm, const FitOptions& o,
                      const io::DataRef& ref, const io::MatrixShape& shape, const Model& model,
                      const std::string& init) {
  const Prior& pr = model.prior();
  fp.add("components", static_cast<std::int64_t>(o.components), "--components");
  fp.add("dim", static_cast<std::int64_t>(shape.cols), "data dimension D =");
  ckpt::add_data(fp, comm, "--data", ref, shape);
  fp.add("seed", static_cast<std::int64_t>(o.seed), "--seed");
  fp.add("init", init, "--init");
  if (init == "kmeans++")
    fp.add("kmeans_iter", static_cast<std::int64_t>(o.kmeans_iter), "--kmeans-iter");
  fp.add("alpha0", pr.alpha0, "--alpha0");
  fp.add("beta0", pr.beta0, "--beta0");
  fp.add("nu0", pr.nu0, "--nu0");
  fp.add("prior_mean", o.prior_mean, "--prior-mean");
  fp.add("prior_scale", o.prior_scale, "--prior-scale");
}

ckpt::Fingerprint fingerprint(const Comm& comm, const FitOptions& o, const io::DataRef& ref,
                              const io::MatrixShape& shape, const Model& model,
                              const std::string& init) {
  ckpt::Fingerprint fp("gmm");
  fp.add("algorithm", to_string(o.algorithm), "--algorithm");
  fp.add("covariance", to_string(o.covariance), "--covariance");
  fp.add("weights", to_string(model.prior().weights), "--weights");
  add_mixture_keys(fp, comm, o, ref, shape, model, init);
  if (o.algorithm == Algorithm::kEm) fp.add("reg_covar", o.reg_covar, "--reg-covar");
  if (o.algorithm == Algorithm::kSvi) {
    fp.add("batch_size", static_cast<std::int64_t>(o.batch_size), "--batch-size");
    fp.add("schedule", to_string(o.schedule), "--schedule");
    // Named as in lda fit and hmm fit since the Robbins-Monro delay and decay became --tau0 and
    // --kappa (they were --omega and --delta, and --tau0 was the adaptive memory): checkpoints
    // written before lack these keys and are refused.
    fp.add("tau0", o.tau0, "--tau0");
    fp.add("kappa", o.kappa, "--kappa");
    fp.add("adaptive_memory", o.adaptive_memory, "--adaptive-memory");
    fp.add("full_elbo_every", static_cast<std::int64_t>(o.full_elbo_every), "--full-elbo-every");
    // What a mid-epoch checkpoint's epoch_sum means. Checkpoints written before the epoch average
    // was taken over rows (a plain mean of the steps) lack this key and are refused, as their
    // partial sum cannot be continued.
    fp.add("epoch_average", "per-row", "", "the epoch-average ELBO is accumulated differently");
  }
  // Plain double sums change with the summation order, hence the last bits.
  fp.add("fast_reduce", static_cast<std::int64_t>(o.fast_reduce), "--fast-reduce");
  fp.add("precision", to_string(o.precision), "--precision");
  // Streaming changes how rows are grouped into partial sums (with --fast-reduce).
  fp.add("stream", static_cast<std::int64_t>(o.stream), "--stream");
  if (o.stream) fp.add("chunk_rows", static_cast<std::int64_t>(o.chunk_rows), "--chunk-rows");
  if (o.algorithm != Algorithm::kSvi)
    // The batch fits' checkpoints are the engine's (engine/checkpoint.hpp: the statistics under
    // model/stats). Older ones kept them at /stats: they lack this entry, and a resume from one
    // stops with "its fingerprint lacks 'layout' (written by another version?)".
    fp.add("layout", std::string("engine"), "the checkpoint layout");
  return fp;
}

void Checkpointer::open(const io::DataRef& ref, const io::MatrixShape& shape, const Model& model,
                        const std::string& init) {
  if (o_.checkpoint.empty() && o_.resume.empty()) return;
  fp_ = fingerprint(comm_, o_, ref, shape, model, init);
  if (o_.resume.empty()) return;

  State s;
  const std::size_t n_stats = model.make_stats().buffer().size();
  comm_.agree([&] {
    const io::FileReader r(o_.resume);
    fp_->check(r, o_.resume);
    const std::string bad = "--resume " + o_.resume + ": ";
    auto num = [&](const char* name) { return r.read_double_attr(name); };
    auto count = [&](const char* name, std::int64_t hi) {
      return ckpt::read_int(r, name, 0, hi, bad);
    };
    s.stats = r.read("/stats");
    if (s.stats.size() != n_stats) throw Error(bad + "its statistics have the wrong size");
    s.iteration = static_cast<int>(count("iteration", INT_MAX));
    s.elapsed = num("elapsed");
    s.res.iterations = static_cast<int>(count("iterations", INT_MAX));
    s.res.steps = count("steps", ckpt::kMaxCount);
    s.res.trace = ckpt::read_vec(r, "/trace/objective");
    s.res.seconds_trace = ckpt::read_vec(r, "/trace/seconds");
    {
      SviPosition& p = s.svi;
      p.epoch = static_cast<int>(count("epoch", INT_MAX));
      p.step = count("step", ckpt::kMaxCount);
      p.t = count("t", ckpt::kMaxCount);
      p.decreases = static_cast<int>(count("decreases", INT_MAX));
      p.epoch_sum = num("epoch_sum");
      p.rho = num("rho");
      p.tau = num("tau");
      p.hbar = num("hbar");
      s.gbar = ckpt::read_vec(r, "/svi/gbar");
      if (o_.schedule == Schedule::kAdaptive && s.gbar.size() != n_stats)
        throw Error(bad + "its adaptive-schedule state has the wrong size");
      s.res.epoch_trace = ckpt::read_vec(r, "/trace/epoch_elbo");
      s.res.rho_trace = ckpt::read_vec(r, "/trace/rho");
      s.res.full_elbo = ckpt::read_vec(r, "/trace/full_elbo");
      s.res.full_elbo_seconds = ckpt::read_vec(r, "/trace/full_elbo_seconds");
      s.res.full_elbo_step = ckpt::read_vec(r, "/trace/full_elbo_step");
      if (p.epoch < 0 || p.step < 0 || p.t < 0 || s.res.trace.size() != std::size_t(p.t) ||
          s.res.rho_trace.size() != std::size_t(p.t))
        throw Error(bad + "its SVI position and traces disagree (corrupt checkpoint?)");
    }
  });
  // The boundary we resume at was the one saved: no need to save it again by count.
  poller_.skip_count_at(s.svi.t);
  state_ = std::move(s);
}

Stats Checkpointer::stats(const Model& model) const {
  Stats s = model.make_stats();
  std::copy(state_->stats.begin(), state_->stats.end(), s.buffer().begin());
  return s;
}

void Checkpointer::restore(FitResult& res) const {
  if (!resuming()) return;
  const FitResult& c = state_->res;
  res.iterations = c.iterations;
  res.steps = c.steps;
  res.trace = c.trace;
  res.seconds_trace = c.seconds_trace;
  res.epoch_trace = c.epoch_trace;
  res.rho_trace = c.rho_trace;
  res.full_elbo = c.full_elbo;
  res.full_elbo_seconds = c.full_elbo_seconds;
  res.full_elbo_step = c.full_elbo_step;
}

const std::vector<double>& Checkpointer::gbar() const {
  static const std::vector<double> empty;
  return resuming() ? state_->gbar : empty;
}

template <class Where, class W>
void Checkpointer::boundary(std::int64_t done, Where&& where, W&& write_at) {
  const ckpt::StopPoller::Decision d = poller_.poll(done);
  if (d.save && !o_.checkpoint.empty()) {
    write_at();
    poller_.saved();
  }
  if (d.signal != 0) ckpt::stop(d.signal, where(), o_.checkpoint);
}

void Checkpointer::svi_step(const SviPosition& pos, const Stats* gbar, const Stats& s_eff,
                            const FitResult& res, double elapsed) {
  boundary(
      pos.t,
      [&] {
        return "after step " + std::to_string(pos.t) + " (epoch " + std::to_string(pos.epoch + 1) +
               ", step " + std::to_string(pos.step) + " of the epoch done)";
      },
      [&] { write(pos.epoch, pos, gbar, s_eff, res, elapsed); });
}

void Checkpointer::write(int iteration, const SviPosition& svi, const Stats* gbar,
                         const Stats& stats, const FitResult& res, double elapsed) const {
  comm_.on_root([&] {
    io::FileWriter w(o_.checkpoint);
    fp_->write(w);
    w.write("stats", stats.buffer(), {stats.buffer().size()});
    ckpt::write_vec(w, "trace/objective", res.trace);
    ckpt::write_vec(w, "trace/seconds", res.seconds_trace);
    w.attr("iteration", static_cast<std::int64_t>(iteration));
    w.attr("iterations", static_cast<std::int64_t>(res.iterations));
    w.attr("steps", res.steps);
    w.attr("elapsed", elapsed);
    w.attr("epoch", static_cast<std::int64_t>(svi.epoch));
    w.attr("step", svi.step);
    w.attr("t", svi.t);
    w.attr("decreases", static_cast<std::int64_t>(svi.decreases));
    w.attr("epoch_sum", svi.epoch_sum);
    w.attr("rho", svi.rho);
    w.attr("tau", svi.tau);
    w.attr("hbar", svi.hbar);
    if (gbar) ckpt::write_vec(w, "svi/gbar", gbar->buffer());
    ckpt::write_vec(w, "trace/epoch_elbo", res.epoch_trace);
    ckpt::write_vec(w, "trace/rho", res.rho_trace);
    ckpt::write_vec(w, "trace/full_elbo", res.full_elbo);
    ckpt::write_vec(w, "trace/full_elbo_seconds", res.full_elbo_seconds);
    ckpt::write_vec(w, "trace/full_elbo_step", res.full_elbo_step);
    // Provenance only (not compared on resume).
    w.attr("data", o_.data);
    w.attr("ranks", static_cast<std::int64_t>(comm_.size()));
    w.attr("threads", static_cast<std::int64_t>(max_threads()));
    w.attr("version", o_.version);
    w.attr("command", o_.command);
    w.commit();
  });
}

}  // namespace caviar::gmm
