// caviar hmm fit | score | decode | sample and caviar generate hmm: the HMM (hmm.hpp) on the
// engine's batch driver (EM, CAVI) or its stochastic driver (SVI), over sequences stored as one
// HDF5 file: /X (every time step, sequence after sequence: T_total symbols, or T_total x D rows)
// and /offsets (n_sequences + 1 increasing int64, from 0 to T_total).
#include "models/hmm/commands.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/exact_sum.hpp"
#include "core/parallel.hpp"
#include "core/rng.hpp"
#include "core/scripts.hpp"
#include "engine/batch.hpp"
#include "engine/checkpoint.hpp"
#include "engine/compare.hpp"
#include "engine/model_file.hpp"
#include "engine/reduce.hpp"
#include "engine/state_io.hpp"
#include "engine/stochastic.hpp"
#include "inference/checkpoint.hpp"
#include "io/h5.hpp"
#include "io/h5_stream.hpp"
#include "models/hmm/hmm.hpp"

namespace caviar::hmm {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// The chunk of a streamed pass: whole sequences of about this many bytes of /X as doubles (a
// sequence longer than that is read alone: forward-backward needs it whole).
constexpr std::int64_t kChunkBytes = 8 << 20;

// The contiguous range of whole sequences of rank `part`: sequence s belongs to the first rank
// whose share of the steps [T p / P, T (p + 1) / P) holds its first step. A function of the offsets
// and the rank count only; a sequence is never split.
RowRange sequence_range(const std::vector<std::int64_t>& off, int parts, int part) {
  const std::int64_t n = static_cast<std::int64_t>(off.size()) - 1, t = off.back();
  auto first = [&](int p) -> std::int64_t {
    if (p >= parts) return n;
    // floor(t p / parts) without overflow
    const std::int64_t target = t / parts * p + t % parts * p / parts;
    return std::lower_bound(off.begin(), off.end() - 1, target) - off.begin();
  };
  return {first(part), first(part + 1)};
}

// Collective: the whole /offsets of `file`, checked (agreed errors).
std::vector<std::int64_t> read_offsets(const Comm& comm, const std::string& file) {
  const io::DataRef oref{file, "/offsets"};
  std::vector<std::int64_t> off;
  comm.agree([&] {
    const io::FileReader r(file);
    if (!r.has("offsets")) throw Error(oref.str() + " does not exist (need /X and /offsets)");
    io::Dims dims;
    const std::vector<double> v = r.read("offsets", &dims);
    if (dims.size() != 1 || v.size() < 2)
      throw Error(oref.str() + " must be 1-D with at least 2 entries (n_sequences + 1)");
    off.resize(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (!(v[i] >= 0 && v[i] <= 9e15 && v[i] == std::floor(v[i])))
        throw Error(oref.str() + " holds a value that is not a non-negative integer at entry " +
                    std::to_string(i));
      off[i] = static_cast<std::int64_t>(v[i]);
    }
    if (off[0] != 0)
      throw Error(oref.str() + " must start at 0 (it starts at " + std::to_string(off[0]) + ")");
    for (std::size_t i = 0; i + 1 < off.size(); ++i) {
      if (off[i + 1] < off[i])
        throw Error(oref.str() + " is not increasing at entry " + std::to_string(i + 1));
      if (off[i + 1] == off[i])
        throw Error("sequence " + std::to_string(i) + " of " + file + " is empty (offsets " +
                    std::to_string(i) + " and " + std::to_string(i + 1) + " are equal)");
    }
  });
  return off;
}

// --stream and --chunk-steps (0: about kChunkBytes of /X per piece).
struct StreamOptions {
  bool stream = false;
  std::int64_t chunk_steps = 0;
  const CLI::Option* chunk = nullptr;  // whether --chunk-steps was given
};

// This rank's sequences of a data file, and the global facts about it. In memory, the rank's
// whole shard is read once. With --stream (stream = true), it is read again from
// the file at every pass, a piece of whole sequences of at most chunk_steps steps at a time
// (longer sequences alone), and every SVI minibatch reads its own sequences, through one open
// io::RowStream: a rank then holds one piece or minibatch, the whole /offsets (8 bytes per
// sequence) and per-sequence scalars (objective terms), never its shard of /X.
class Source {
 public:
  Source(const Comm& comm, const std::string& file, Emission emission, const StreamOptions& so);
  Source(const Source&) = delete;
  Source& operator=(const Source&) = delete;

  DataSummary summary;
  RowRange rows, steps;      // this rank's sequences and their (global) steps
  std::int64_t symbols = 0;  // 1 + the largest symbol (categorical)
  io::MatrixShape shape;
  std::string identity;  // of /offsets

  // The engine's view of the rank's sequences (hmm.hpp).
  const SequenceSource& sequences() const { return view_; }
  // f(piece, first) over the rank's pieces (first: the local index of the piece's first
  // sequence), the same number of calls on every rank, so f may make collective calls; a rank
  // past its last piece, or whose piece failed to convert, gets an empty piece. Conversion errors
  // are agreed after the loop.
  void for_each(const SequenceSource::PieceFn& f) const;
  // The global step of the local sequence `first`'s first step.
  std::int64_t step_of(std::int64_t first) const { return off_[rows.begin + first]; }

 private:
  // The offsets, from 0, of the global sequences [g0, g1).
  std::vector<std::int64_t> offsets_of(std::int64_t g0, std::int64_t g1) const;
  // Sequences of the given offsets from their rows x, validated (*error says what is wrong, and
  // the result is then empty); row t is global step at[t], or first + t if at is empty.
  Sequences convert(io::RowMatrix x, std::vector<std::int64_t> offsets,
                    std::span<const std::int64_t> at, std::int64_t first, std::string* error) const;
  Sequences select(std::span<const std::int64_t> rows) const;
  void summarise();
  void summarise_gaussian();

  const Comm& comm_;
  io::DataRef ref_;
  bool cat_;
  std::vector<std::int64_t> off_;  // the whole /offsets
  Sequences seqs_;                 // in memory
  std::unique_ptr<io::RowStream> stream_;
  std::vector<RowRange> pieces_;  // --stream: global sequence ranges
  std::int64_t calls_ = 0;
  SequenceSource view_;
};

Source::Source(const Comm& comm, const std::string& file, Emission emission,
               const StreamOptions& so)
    : comm_(comm), ref_{file, "/X"}, cat_(emission == Emission::kCategorical) {
  if (so.chunk && so.chunk->count() > 0) {
    if (!so.stream) throw Error("--chunk-steps needs --stream");
    if (so.chunk_steps < 1)
      throw Error("--chunk-steps must be >= 1 (got " + std::to_string(so.chunk_steps) + ")");
  }
  off_ = read_offsets(comm, file);
  const io::DataRef oref{file, "/offsets"};
  shape = io::inspect_matrix(comm, ref_, true);
  if (cat_ && shape.ndims != 1)
    throw Error(ref_.str() + " is 2-D, but categorical emissions need 1-D integer symbols");
  if (!cat_ && shape.ndims != 2)
    throw Error(ref_.str() + " is 1-D, but Gaussian emissions need a 2-D (steps x D) array");
  if (off_.back() != shape.rows)
    throw Error(oref.str() + " ends at " + std::to_string(off_.back()) + " but " + ref_.str() +
                " has " + std::to_string(shape.rows) + " time steps");
  rows = sequence_range(off_, comm.size(), comm.rank());
  steps = {off_[rows.begin], off_[rows.end]};
  summary.sequences = static_cast<std::int64_t>(off_.size()) - 1;
  summary.steps = shape.rows;
  ckpt::IdentityHash h;
  for (std::int64_t o : off_) h.word(static_cast<std::uint64_t>(o));
  identity = h.hex();
  if (!so.stream) {
    std::string error;
    seqs_ = convert(io::read_rows(comm, ref_, shape, steps), offsets_of(rows.begin, rows.end), {},
                    steps.begin, &error);
    comm.raise_if_any(error);
  } else {
    stream_ = std::make_unique<io::RowStream>(comm, ref_, shape);
    const std::int64_t chunk_steps =
        so.chunk_steps > 0 ? so.chunk_steps
                           : std::max<std::int64_t>(1, kChunkBytes / (8 * shape.cols));
    for (std::int64_t a = rows.begin; a < rows.end;) {
      std::int64_t b = a + 1;
      while (b < rows.end && off_[b + 1] - off_[a] <= chunk_steps) ++b;
      pieces_.push_back({a, b});
      a = b;
    }
    calls_ = comm.allreduce_max(static_cast<std::int64_t>(pieces_.size()));
  }
  view_.n = rows.size();
  view_.for_each = [this](const SequenceSource::PieceFn& f) { for_each(f); };
  view_.select = [this](std::span<const std::int64_t> r) { return select(r); };
  summarise();
}

std::vector<std::int64_t> Source::offsets_of(std::int64_t g0, std::int64_t g1) const {
  std::vector<std::int64_t> o{0};
  for (std::int64_t g = g0; g < g1; ++g) o.push_back(o.back() + off_[g + 1] - off_[g]);
  return o;
}

Sequences Source::convert(io::RowMatrix x, std::vector<std::int64_t> offsets,
                          std::span<const std::int64_t> at, std::int64_t first,
                          std::string* error) const {
  auto step = [&](Eigen::Index t) {
    return std::to_string(at.empty() ? first + t : at[static_cast<std::size_t>(t)]);
  };
  Sequences s;
  s.offsets = std::move(offsets);
  if (cat_) {
    s.symbols.resize(static_cast<std::size_t>(x.rows()));
    for (Eigen::Index t = 0; t < x.rows(); ++t) {
      const double v = x(t, 0);
      if (!(v >= 0 && v < 2147483647.0 && v == std::floor(v))) {
        char shown[32];
        std::snprintf(shown, sizeof shown, "%.17g", v);
        *error = ref_.str() + " holds " + shown + " at step " + step(t) +
                 ": symbols must be integers in [0, V) (negative, fractional or NaN values are "
                 "not symbols)";
        return Sequences{};
      }
      s.symbols[static_cast<std::size_t>(t)] = static_cast<std::int32_t>(v);
    }
    return s;
  }
  for (Eigen::Index t = 0; t < x.rows(); ++t)
    if (!x.row(t).allFinite()) {
      *error = ref_.str() + " holds a value that is not finite (NaN or inf) at step " + step(t);
      return Sequences{};
    }
  s.x = std::move(x);
  return s;
}

void Source::for_each(const SequenceSource::PieceFn& f) const {
  if (!stream_) return f(seqs_, 0);
  std::string error;
  for (std::int64_t i = 0; i < calls_; ++i) {
    const bool mine = i < static_cast<std::int64_t>(pieces_.size());
    const RowRange g = mine ? pieces_[static_cast<std::size_t>(i)] : RowRange{rows.end, rows.end};
    io::RowMatrix x = stream_->read_range({off_[g.begin], off_[g.end]});
    Sequences piece;
    if (error.empty())
      piece = convert(std::move(x), offsets_of(g.begin, g.end), {}, off_[g.begin], &error);
    // After an error, empty pieces: the remaining reads (collective) still happen.
    f(piece, error.empty() ? g.begin - rows.begin : rows.size());
  }
  comm_.raise_if_any(error);
}

Sequences Source::select(std::span<const std::int64_t> r) const {
  std::vector<std::int64_t> offsets{0};
  for (const std::int64_t q : r)
    offsets.push_back(offsets.back() + off_[rows.begin + q + 1] - off_[rows.begin + q]);
  if (stream_) {
    // Every step of the listed sequences, in one collective read.
    std::vector<std::int64_t> at;
    at.reserve(static_cast<std::size_t>(offsets.back()));
    for (const std::int64_t q : r)
      for (std::int64_t t = off_[rows.begin + q]; t < off_[rows.begin + q + 1]; ++t)
        at.push_back(t);
    std::string error;
    Sequences s = convert(stream_->read_rows(at), std::move(offsets), at, 0, &error);
    comm_.raise_if_any(error);
    return s;
  }
  // In memory: copies of the listed sequences (a minibatch's worth).
  Sequences s;
  s.offsets = std::move(offsets);
  if (!cat_) s.x.resize(s.steps(), shape.cols);
  for (std::size_t i = 0; i < r.size(); ++i) {
    const std::int64_t a = seqs_.offsets[r[i]], n = seqs_.length(r[i]);
    if (cat_)
      s.symbols.insert(s.symbols.end(), seqs_.symbols.begin() + a, seqs_.symbols.begin() + a + n);
    else
      s.x.middleRows(s.offsets[i], n) = seqs_.x.middleRows(a, n);
  }
  return s;
}

void Source::summarise() {
  if (!cat_) return summarise_gaussian();
  std::int64_t mx = -1;
  for_each([&](const Sequences& p, std::int64_t) {
    for (const std::int32_t v : p.symbols) mx = std::max<std::int64_t>(mx, v);
  });
  symbols = comm_.allreduce_max(mx) + 1;
}

// The data's max |x|, and its mean and variance per dimension, which the Gaussian initialisation
// and the Normal-Wishart prior use: summed exactly on engine::exact_sum's grid (2 T max|addend| per
// dimension over every rank), so the same bits at any rank count and piece size. Four passes.
void Source::summarise_gaussian() {
  const Eigen::Index d = shape.cols;
  const auto ud = static_cast<std::size_t>(d);
  const double total = static_cast<double>(shape.rows);
  // The largest |term(x_tj, j)| per dimension, over every rank.
  auto max_of = [&](const auto& term) {
    std::vector<double> m(ud, 0.0);
    for_each([&](const Sequences& p, std::int64_t) {
      for (Eigen::Index t = 0; t < p.x.rows(); ++t)
        for (Eigen::Index j = 0; j < d; ++j) {
          const double v = std::abs(term(p.x(t, j), j));
          m[j] = std::isfinite(v) ? std::max(m[j], v) : kInf;
        }
    });
    comm_.allreduce_max(std::span<double>(m));
    return m;
  };
  // The exact sum of term(x_tj, j) over every step, per dimension (NaN where the grid overflows).
  auto sum_of = [&](const auto& term, const std::vector<double>& m) {
    std::vector<int> e(ud);
    std::vector<char> ok(ud);
    for (std::size_t j = 0; j < ud; ++j) {
      ok[j] = std::isfinite(2.0 * m[j] * total);
      e[j] = ok[j] ? bound_exponent(2.0 * m[j] * total) : 0;
    }
    ExactSum acc(e);
    std::vector<double> row(ud);
    for_each([&](const Sequences& p, std::int64_t) {
      for (Eigen::Index t = 0; t < p.x.rows(); ++t) {
        for (Eigen::Index j = 0; j < d; ++j) row[j] = ok[j] ? term(p.x(t, j), j) : 0.0;
        acc.add(row);
      }
    });
    comm_.allreduce_sum(acc.raw());
    std::vector<double> s = acc.result();
    for (std::size_t j = 0; j < ud; ++j)
      if (!ok[j]) s[j] = kNaN;
    return s;
  };
  const auto x = [](double v, Eigen::Index) { return v; };
  const std::vector<double> mx = max_of(x);
  summary.max_abs = *std::max_element(mx.begin(), mx.end());
  for (const double s : sum_of(x, mx)) summary.mean.push_back(s / total);
  const auto sq = [&](double v, Eigen::Index j) {
    const double c = v - summary.mean[static_cast<std::size_t>(j)];
    return c * c;
  };
  for (const double s : sum_of(sq, max_of(sq))) summary.var.push_back(s / total);
}

template <class E>
E parse_enum(const std::string& s, const std::string& flag,
             std::initializer_list<std::pair<const char*, E>> names) {
  for (const auto& [n, e] : names)
    if (s == n) return e;
  throw Error(flag + " " + s + " is not one of the choices");
}

struct FitOptions {
  std::string data, out, posteriors, emission = "categorical", covariance = "full",
                                     algorithm = "em";
  int states = 0;
  std::int64_t symbols = 0;
  std::uint64_t seed = 0;
  StreamOptions stream;
  Config cfg;
  engine::StopRule stop{100, 1e-6};
  engine::CheckpointFiles files;
  engine::Schedule schedule;  // svi
};

Config config_of(const FitOptions& o) {
  Config c = o.cfg;
  c.states = o.states;
  c.emission = parse_enum<Emission>(
      o.emission, "--emission",
      {{"categorical", Emission::kCategorical}, {"gaussian", Emission::kGaussian}});
  c.covariance = parse_enum<Covariance>(o.covariance, "--covariance",
                                        {{"full", Covariance::kFull}, {"diag", Covariance::kDiag}});
  c.algorithm = parse_enum<Algorithm>(
      o.algorithm, "--algorithm",
      {{"em", Algorithm::kEm}, {"cavi", Algorithm::kCavi}, {"svi", Algorithm::kSvi}});
  return c;
}

// Every step's state marginals of the fitted state (q(z_t) for VB, p(z_t | x) for EM), one row
// per time step, written piece by piece (collective).
void write_posteriors(const Comm& comm, const Source& d, const Model& model,
                      const std::string& out) {
  const int k = model.config().states;
  io::ParallelRowWriter w(comm, out);
  w.create_rows("posteriors", d.summary.steps, {static_cast<std::uint64_t>(k)},
                io::ParallelRowWriter::Type::kDouble);
  std::vector<double> g;
  d.for_each([&](const Sequences& piece, std::int64_t first) {
    g.resize(static_cast<std::size_t>(piece.steps() * k));
    model.posteriors(piece, g);
    const std::int64_t t0 = d.step_of(first);
    w.write_part("posteriors", {t0, t0 + piece.steps()}, g.data());
  });
  w.commit();
}

// hmm score and hmm decode.
struct ScoreOptions {
  std::string model, data, out, png;
  StreamOptions stream;
};

// What a checkpoint of this fit must agree on to be resumed. Not --stream or --chunk-steps: the
// streamed fit is the in-memory one bit for bit, so either may resume the other's checkpoint.
ckpt::Fingerprint fingerprint(const Comm& comm, const FitOptions& o, const Config& cfg,
                              const Source& d) {
  ckpt::Fingerprint fp("hmm");
  fp.add("algorithm", o.algorithm, "--algorithm");
  fp.add("emission", o.emission, "--emission");
  if (cfg.emission == Emission::kGaussian) fp.add("covariance", o.covariance, "--covariance");
  fp.add("states", static_cast<std::int64_t>(o.states), "--states");
  fp.add("symbols", cfg.symbols, "--symbols");
  fp.add("seed", static_cast<std::int64_t>(o.seed), "--seed");
  fp.add("prior_start", cfg.prior_start, "--prior-start");
  fp.add("prior_trans", cfg.prior_trans, "--prior-trans");
  fp.add("prior_emission", cfg.prior_emission, "--prior-emission");
  fp.add("prior_beta", cfg.prior_beta, "--prior-beta");
  fp.add("min_covar", cfg.min_covar, "--min-covar");
  if (cfg.algorithm == Algorithm::kSvi) {
    // SVI checkpoints hold the position inside a pass (and its row terms) since they may be taken
    // at any minibatch boundary; an older one, taken at pass ends only, is refused in one line.
    fp.add("layout", std::string("midpass"), "the checkpoint layout");
    fp.add("batch_size", o.schedule.batch_size, "--batch-size");
    fp.add("tau0", o.schedule.tau0, "--tau0");
    fp.add("kappa", o.schedule.kappa, "--kappa");
  }
  ckpt::add_data(fp, comm, "--data", io::DataRef{o.data, "/X"}, d.shape);
  fp.add("offsets_identity", d.identity, "--data",
         "its /offsets differ from this run's --data " + o.data);
  return fp;
}

void fit(const engine::Context& ctx, const FitOptions& o) {
  const Comm& comm = *ctx.comm;
  Config cfg = config_of(o);
  if (o.states < 1) throw Error("--states must be >= 1");
  const bool svi = cfg.algorithm == Algorithm::kSvi;
  if (svi) {
    const engine::Schedule& sc = o.schedule;
    if (sc.batch_size < 1)
      throw Error("--batch-size must be >= 1 (got " + std::to_string(sc.batch_size) + ")");
    if (!(sc.tau0 >= 0) || !std::isfinite(sc.tau0))
      throw Error("--tau0 must be a finite number >= 0");
    // Robbins & Monro 1951: sum rho_t = inf and sum rho_t^2 < inf.
    if (!(sc.kappa > 0.5 && sc.kappa <= 1)) throw Error("--kappa must be in (0.5, 1]");
    if (o.stop.max_iter < 1) throw Error("--max-iter (passes) must be >= 1 with --algorithm svi");
  }
  const std::vector<std::string> inputs{o.data};
  if (!o.out.empty()) io::check_output_path(comm, o.out, inputs);
  if (!o.posteriors.empty()) io::check_output_path(comm, o.posteriors, inputs);
  if (!o.out.empty() && o.out == o.posteriors)
    throw Error("--posteriors and --out name the same file");
  engine::Checkpointer ck(comm, o.files, inputs, o.out);
  const Source d(comm, o.data, cfg.emission, o.stream);
  if (o.states > d.summary.steps)
    throw Error("--states " + std::to_string(o.states) + " is more than the " +
                std::to_string(d.summary.steps) + " time steps of " + o.data);
  if (cfg.emission == Emission::kCategorical) {
    if (o.symbols > 0 && d.symbols > o.symbols)
      throw Error(o.data + ":/X holds the symbol " + std::to_string(d.symbols - 1) +
                  ", outside [0, --symbols " + std::to_string(o.symbols) + ")");
    cfg.symbols = o.symbols > 0 ? o.symbols : d.symbols;
  } else {
    cfg.dim = static_cast<int>(d.shape.cols);
  }
  Model model(cfg, &d.sequences(), d.summary);
  model.init_random(o.seed);
  if (!o.files.checkpoint.empty() || !o.files.resume.empty()) ck.open(fingerprint(comm, o, cfg, d));
  print_progress(ctx, "caviar hmm fit: " + o.data + ", K=" + std::to_string(o.states) + ", " +
                          o.emission + ", " + o.algorithm + ", " + std::to_string(comm.size()) +
                          " ranks x " + std::to_string(max_threads()) + " threads");
  const char* what = cfg.algorithm == Algorithm::kEm ? "loglik" : "elbo";
  const engine::Progress progress = [&](const engine::Report& r) {
    char line[160];
    std::snprintf(line, sizeof line, "%s %4d  %s % .10e  %8.3fs", svi ? "pass" : "iter",
                  r.iteration, what, r.objective, r.seconds);
    print_progress(ctx, line);
  };
  engine::Run run;
  run.comm = &comm;
  run.stop = o.stop;
  run.checkpoint = &ck;
  run.rows = d.rows;
  run.global_rows = d.summary.sequences;
  run.progress = progress;
  engine::RunResult res;
  if (svi) {
    engine::StochasticRun srun{run, o.schedule};
    srun.schedule.seed = o.seed;
    res = engine::fit_stochastic(model, srun);
  } else {
    res = engine::fit_batch(model, run);
  }
  if (!o.out.empty()) {
    engine::write_model_file(
        comm, o.out, [&](engine::StateWriter& w) { model.save(w); }, res,
        {"hmm", o.algorithm, o.data, ctx.command_line, CAVIAR_VERSION, o.seed});
    print_progress(ctx, "wrote model " + o.out);
  }
  if (!o.posteriors.empty()) {
    write_posteriors(comm, d, model, o.posteriors);
    print_progress(ctx, "wrote " + o.posteriors + ":/posteriors");
  }
  auto j = engine::summary(ctx, res);
  j[cfg.algorithm == Algorithm::kEm ? "log_likelihood" : "elbo"] = res.trace.objective.back();
  j["sequences"] = d.summary.sequences;
  j["steps"] = d.summary.steps;
  print_summary(ctx, j);
}

// A model file's point parameters as a scoring model, and the data read for its emission type.
struct Loaded {
  std::optional<Model> model;
  std::unique_ptr<Source> data;
};

// The point parameters of a model file written by hmm fit (collective: agreed errors).
std::optional<Model> load_model(const Comm& comm, const std::string& model_file, Config& cfg) {
  std::optional<Model> model;
  comm.agree([&] {
    const io::FileReader r(model_file);
    engine::require_model_kind(r, model_file, "hmm");
    const std::string em = r.read_string_attr("emission");
    if (em != "categorical" && em != "gaussian")
      throw Error("'" + model_file + "': unknown emission '" + em + "'");
    cfg.emission = em == "categorical" ? Emission::kCategorical : Emission::kGaussian;
    const double k = r.read_double_attr("n_states");
    if (!(k >= 1 && k <= 1e5 && k == std::floor(k)))
      throw Error("'" + model_file + "': its n_states is not a valid size");
    cfg.states = static_cast<int>(k);
    if (cfg.emission == Emission::kCategorical) {
      const double v = r.read_double_attr("n_symbols");
      if (!(v >= 1 && v <= 2147483647.0 && v == std::floor(v)))
        throw Error("'" + model_file + "': its n_symbols is not a valid size");
      cfg.symbols = static_cast<std::int64_t>(v);
    } else {
      const double dd = r.read_double_attr("n_features");
      if (!(dd >= 1 && dd <= 1e5 && dd == std::floor(dd)))
        throw Error("'" + model_file + "': its n_features is not a valid size");
      cfg.dim = static_cast<int>(dd);
      cfg.covariance =
          r.read_string_attr("covariance") == "diag" ? Covariance::kDiag : Covariance::kFull;
    }
    cfg.algorithm = Algorithm::kEm;  // the point estimates
    try {
      model.emplace(cfg, nullptr, DataSummary{});
      model->load_point(engine::FileStateReader(r, model_file));
    } catch (const Error& e) {
      throw Error("'" + model_file + "': " + e.what());
    }
  });
  return model;
}

Loaded load(const engine::Context& ctx, const std::string& model_file, const std::string& data,
            const StreamOptions& stream) {
  const Comm& comm = *ctx.comm;
  Loaded l;
  Config cfg;
  l.model = load_model(comm, model_file, cfg);
  // The data must hold the model's kind of emissions.
  const io::MatrixShape shape = io::inspect_matrix(comm, io::DataRef{data, "/X"}, true);
  const bool cat = cfg.emission == Emission::kCategorical;
  if (cat != (shape.ndims == 1))
    throw Error("'" + model_file + "' is a " + name(cfg.emission) + "-emission model but " + data +
                ":/X holds " + (shape.ndims == 1 ? "categorical symbols (1-D)" : "2-D rows"));
  l.data = std::make_unique<Source>(comm, data, cfg.emission, stream);
  if (cat && l.data->symbols > cfg.symbols)
    throw Error(data + ":/X holds the symbol " + std::to_string(l.data->symbols - 1) +
                ", outside the model's [0, " + std::to_string(cfg.symbols) + ")");
  if (!cat && l.data->shape.cols != cfg.dim)
    throw Error(data + ":/X has " + std::to_string(l.data->shape.cols) +
                " columns but the model has " + std::to_string(cfg.dim) + " features");
  return l;
}

void score(const engine::Context& ctx, const ScoreOptions& o) {
  const Comm& comm = *ctx.comm;
  const Loaded l = load(ctx, o.model, o.data, o.stream);
  const Source& d = *l.data;
  std::vector<double> ll(static_cast<std::size_t>(d.rows.size()));
  d.for_each([&](const Sequences& piece, std::int64_t first) {
    l.model->log_likelihood(piece,
                            std::span<double>(ll).subspan(static_cast<std::size_t>(first),
                                                          static_cast<std::size_t>(piece.n())));
  });
  const double total = engine::exact_sum(comm, ll);
  const double per_step = total / static_cast<double>(d.summary.steps);
  nlohmann::ordered_json j;
  j["score"] = per_step;
  j["log_likelihood"] = total;
  j["steps"] = d.summary.steps;
  j["sequences"] = d.summary.sequences;
  if (!std::isfinite(total))
    print_progress(ctx,
                   "caviar: warning: a sequence has probability 0 under the model (a symbol no "
                   "state emits, or a transition it forbids): the log-likelihood is not finite");
  print_progress(ctx, "log-likelihood per step " + std::to_string(per_step));
  print_summary(ctx, j);
}

// Rank 0: draws the PNG of a few decoded sequences and the model's trace with
// scripts/plot_hmm.py (matplotlib), from the files already written.
void render_png(const std::string& script, const std::string& model_file, const std::string& data,
                const std::string& paths, const std::string& png) {
  run_plot_script(script, {"--model", model_file, "--data", data, "--paths", paths, "--out", png},
                  png);
}

void decode(const engine::Context& ctx, const ScoreOptions& o) {
  const Comm& comm = *ctx.comm;
  const std::string &model_file = o.model, &data = o.data, &out = o.out, &png = o.png;
  io::check_output_path(comm, out, {model_file, data});
  if (!png.empty()) {
    io::check_output_path(comm, png, {model_file, data, out});
    if (png == out) throw Error("--png and --out name the same file");
  }
  // Found before anything is written: a missing script leaves no output behind.
  std::string script;
  if (!png.empty()) comm.on_root([&] { script = script_path("plot_hmm.py"); });
  const Loaded l = load(ctx, model_file, data, o.stream);
  const Source& d = *l.data;
  // The Viterbi paths of each piece as it is decoded (Rabiner 1989, section III.B).
  io::ParallelRowWriter w(comm, out);
  w.create_rows("states", d.summary.steps, {}, io::ParallelRowWriter::Type::kInt64);
  std::vector<std::int64_t> path;
  d.for_each([&](const Sequences& piece, std::int64_t first) {
    path.resize(static_cast<std::size_t>(piece.steps()));
    l.model->viterbi(piece, path);
    const std::int64_t t0 = d.step_of(first);
    w.write_part("states", {t0, t0 + piece.steps()}, path.data());
  });
  w.commit();
  print_progress(ctx, "wrote " + out + ":/states");
  if (!png.empty()) {
    comm.on_root([&] { render_png(script, model_file, data, out, png); });
    print_progress(ctx, "wrote " + png);
  }
  nlohmann::ordered_json j;
  j["steps"] = d.summary.steps;
  j["sequences"] = d.summary.sequences;
  if (!png.empty()) j["png"] = png;
  print_summary(ctx, j);
}

struct SampleOptions {
  std::string model, out;
  std::int64_t sequences = 0, length = 0;
  std::uint64_t seed = 0;
};

void sample(const engine::Context& ctx, const SampleOptions& o) {
  const Comm& comm = *ctx.comm;
  if (o.sequences < 1 || o.length < 1) throw Error("--sequences and --length must be >= 1");
  io::check_output_path(comm, o.out, {o.model});
  Config cfg;
  const std::optional<Model> m = load_model(comm, o.model, cfg);
  // Small outputs: rank 0 draws and writes them (the draws are keyed by step, not by rank).
  comm.on_root([&] {
    std::vector<std::int64_t> states, symbols;
    RowMatrix x;
    m->sample(o.seed, o.sequences, o.length, states, symbols, x);
    std::vector<std::int64_t> off;
    for (std::int64_t s = 0; s <= o.sequences; ++s) off.push_back(s * o.length);
    const auto t = static_cast<std::uint64_t>(states.size());
    io::FileWriter w(o.out);
    if (cfg.emission == Emission::kCategorical)
      w.write("X", std::span<const std::int64_t>(symbols), {t});
    else
      w.write("X", std::span<const double>(x.data(), static_cast<std::size_t>(x.size())),
              {t, static_cast<std::uint64_t>(cfg.dim)});
    w.write("offsets", std::span<const std::int64_t>(off), {off.size()});
    w.write("states", std::span<const std::int64_t>(states), {t});
    w.attr("emission", std::string(name(cfg.emission)));
    w.attr("seed", static_cast<std::int64_t>(o.seed));
    w.commit();
  });
  print_progress(ctx, "wrote " + o.out);
  nlohmann::ordered_json j;
  j["sequences"] = o.sequences;
  j["steps"] = o.sequences * o.length;
  print_summary(ctx, j);
}

// --- caviar generate hmm

struct GenerateOptions {
  std::int64_t sequences = 0;
  std::string length = "50-100", emission = "categorical", out;
  int states = 0, dim = 2;
  std::int64_t symbols = 8;
  std::uint64_t seed = 0;
};

// Counter indices carry a tag in their top byte (as the other generators).
constexpr std::uint64_t kTagStart = 1ull << 56, kTagTrans = 2ull << 56, kTagEmit = 3ull << 56,
                        kTagMean = 4ull << 56, kTagVar = 5ull << 56, kTagLength = 6ull << 56,
                        kTagStep = 7ull << 56, kTagNoise = 8ull << 56;

std::int64_t draw(const double* p, std::int64_t n, double u) {
  double c = 0;
  for (std::int64_t i = 0; i < n; ++i)
    if (u < (c += p[i])) return i;
  return n - 1;
}

void generate(const engine::Context& ctx, const GenerateOptions& o) {
  const Comm& comm = *ctx.comm;
  const bool cat = o.emission == "categorical";
  if (!cat && o.emission != "gaussian") throw Error("--emission must be categorical or gaussian");
  long long lo = 0, hi = 0;
  char extra = 0;
  if (std::sscanf(o.length.c_str(), "%lld-%lld%c", &lo, &hi, &extra) != 2 || lo < 1 || hi < lo)
    throw Error("--length must be A-B with 1 <= A <= B (got '" + o.length + "')");
  if (o.sequences < 1 || o.states < 1) throw Error("--sequences and --states must be >= 1");
  if (cat ? o.symbols < 1 : o.dim < 1) throw Error("--symbols and --dim must be >= 1");
  io::check_output_path(comm, o.out, {});
  const int K = o.states;
  const CounterRng rng(o.seed, Stream::kHmmGenerate);
  auto u = [&](std::uint64_t i) { return rng.uniform2(i, 0)[0]; };
  // Dirichlet(1) rows by normalised exponential draws; transitions lean on staying (half the mass
  // on the diagonal), so that states persist over several steps.
  auto dirichlet = [&](std::uint64_t tag, std::int64_t n, double* out) {
    double s = 0;
    for (std::int64_t i = 0; i < n; ++i) s += (out[i] = -std::log(u(tag + i)));
    for (std::int64_t i = 0; i < n; ++i) out[i] /= s;
  };
  RowMatrix pi(1, K), a(K, K), b, means, sd;
  dirichlet(kTagStart, K, pi.data());
  for (int i = 0; i < K; ++i) {
    dirichlet(kTagTrans | static_cast<std::uint64_t>(i * K), K, &a(i, 0));
    a.row(i) *= 0.5;
    a(i, i) += 0.5;
  }
  if (cat) {
    b.resize(K, o.symbols);
    for (int k = 0; k < K; ++k)
      dirichlet(kTagEmit | static_cast<std::uint64_t>(k * o.symbols), o.symbols, &b(k, 0));
  } else {
    means.resize(K, o.dim);
    sd.resize(K, o.dim);
    for (int k = 0; k < K; ++k)
      for (int j = 0; j < o.dim; ++j) {
        means(k, j) = 4.0 * rng.normal2(kTagMean | static_cast<std::uint64_t>(k * o.dim + j), 0)[0];
        sd(k, j) = 0.5 + u(kTagVar | static_cast<std::uint64_t>(k * o.dim + j));
      }
  }
  std::vector<std::int64_t> off{0};
  for (std::int64_t s = 0; s < o.sequences; ++s)
    off.push_back(off.back() + lo +
                  static_cast<std::int64_t>(u(kTagLength | static_cast<std::uint64_t>(s)) *
                                            static_cast<double>(hi - lo + 1)));
  comm.on_root([&] {
    const std::int64_t T = off.back();
    std::vector<std::int64_t> sym;
    std::vector<double> x;
    if (cat)
      sym.resize(static_cast<std::size_t>(T));
    else
      x.resize(static_cast<std::size_t>(T * o.dim));
    for (std::int64_t s = 0; s < o.sequences; ++s) {
      std::int64_t z = 0;
      for (std::int64_t t = off[s]; t < off[s + 1]; ++t) {
        const auto idx = static_cast<std::uint64_t>(t);
        z = t == off[s] ? draw(pi.data(), K, u(kTagStep | idx))
                        : draw(&a(z, 0), K, u(kTagStep | idx));
        if (cat) {
          sym[static_cast<std::size_t>(t)] = draw(&b(z, 0), o.symbols, rng.uniform2(idx, 1)[0]);
          continue;
        }
        for (int j = 0; j < o.dim; ++j)
          x[static_cast<std::size_t>(t * o.dim + j)] =
              means(z, j) +
              sd(z, j) *
                  rng.normal2(kTagNoise | (idx * static_cast<std::uint64_t>(o.dim) + j), 0)[0];
      }
    }
    io::FileWriter w(o.out);
    const auto ut = static_cast<std::uint64_t>(T);
    if (cat)
      w.write("X", std::span<const std::int64_t>(sym), {ut});
    else
      w.write("X", std::span<const double>(x), {ut, static_cast<std::uint64_t>(o.dim)});
    w.write("offsets", std::span<const std::int64_t>(off), {off.size()});
    const auto uk = static_cast<std::uint64_t>(K);
    w.write("true/startprob", std::span<const double>(pi.data(), uk), {uk});
    w.write("true/transmat", std::span<const double>(a.data(), uk * uk), {uk, uk});
    if (cat) {
      w.write("true/emissionprob", std::span<const double>(b.data(), b.size()),
              {uk, static_cast<std::uint64_t>(o.symbols)});
      w.attr("n_symbols", o.symbols);
    } else {
      const auto ud = static_cast<std::uint64_t>(o.dim);
      w.write("true/means", std::span<const double>(means.data(), means.size()), {uk, ud});
      RowMatrix cov = RowMatrix::Zero(K * o.dim, o.dim);
      for (int k = 0; k < K; ++k)
        for (int j = 0; j < o.dim; ++j) cov(k * o.dim + j, j) = sd(k, j) * sd(k, j);
      w.write("true/covariances", std::span<const double>(cov.data(), cov.size()), {uk, ud, ud});
    }
    w.attr("emission", o.emission);
    w.attr("seed", static_cast<std::int64_t>(o.seed));
    w.commit();
  });
  print_progress(ctx, "wrote " + o.out);
  nlohmann::ordered_json j;
  j["sequences"] = o.sequences;
  j["steps"] = off.back();
  print_summary(ctx, j);
}

// --stream and --chunk-steps, the same on fit, score and decode.
void add_stream_options(CLI::App* app, StreamOptions& so) {
  app->add_flag(
      "--stream", so.stream,
      "Read the sequences from the file piece by piece at every pass (and each svi minibatch's "
      "own sequences), never holding the rank's whole share of /X: memory is bounded by a piece "
      "(or the longest sequence), not by the data. The results are bitwise those in memory");
  so.chunk =
      app->add_option("--chunk-steps", so.chunk_steps,
                      "With --stream: the most time steps per piece of whole sequences (a "
                      "longer sequence is read alone; default: about 8 MB of /X as doubles)");
}

// hmm fit.
void add_fit(CLI::App* hmm, engine::Context& ctx) {
  auto o = std::make_shared<FitOptions>();
  auto* f = hmm->add_subcommand("fit", "Fit an HMM to sequences (/X and /offsets of one file)");
  f->add_option("--data", o->data, "Sequences FILE.h5 (/X: every step; /offsets: n+1 int64)")
      ->required();
  f->add_option("-k,--states", o->states, "Number of hidden states K")->required();
  f->add_option("--emission", o->emission, "Emissions: categorical or gaussian")
      ->check(CLI::IsMember({"categorical", "gaussian"}))
      ->capture_default_str();
  f->add_option("--covariance", o->covariance, "Gaussian covariances: full or diag")
      ->check(CLI::IsMember({"full", "diag"}))
      ->capture_default_str();
  f->add_option("--algorithm", o->algorithm,
                "em (Baum-Welch, maximum likelihood), cavi (variational Bayes) or svi (stochastic "
                "variational Bayes over minibatches of whole sequences; --max-iter counts passes, "
                "and checkpoints and stop signals are taken at pass boundaries only)")
      ->check(CLI::IsMember({"em", "cavi", "svi"}))
      ->capture_default_str();
  f->add_option("--symbols", o->symbols,
                "Categorical: the number of symbols V (default: 1 + the largest in the data)");
  f->add_option("--seed", o->seed,
                "Random seed of the initial parameters (and of the svi minibatch order)")
      ->capture_default_str();
  f->add_option("--batch-size", o->schedule.batch_size,
                "svi: sequences per global minibatch (drawn without replacement in an order keyed "
                "by --seed and the pass, the same at any rank count)")
      ->capture_default_str();
  f->add_option("--tau0", o->schedule.tau0,
                "svi: step size offset, rho_t = (tau0 + t)^-kappa at the t-th minibatch (t >= 1)")
      ->capture_default_str();
  f->add_option("--kappa", o->schedule.kappa, "svi: step size decay, in (0.5, 1]")
      ->capture_default_str();
  f->add_option("--prior-start", o->cfg.prior_start,
                "cavi, svi: Dirichlet concentration of the initial distribution")
      ->capture_default_str();
  f->add_option("--prior-trans", o->cfg.prior_trans,
                "cavi, svi: Dirichlet concentration of each transition row")
      ->capture_default_str();
  f->add_option("--prior-emission", o->cfg.prior_emission,
                "cavi, svi, categorical: Dirichlet concentration of each emission row")
      ->capture_default_str();
  f->add_option(
       "--prior-beta", o->cfg.prior_beta,
       "cavi, svi, gaussian: Normal-Wishart beta0 (m0 = data mean, nu0 = D + 2, W0^-1 = nu0 "
       "diag(data variance))")
      ->capture_default_str();
  f->add_option("--min-covar", o->cfg.min_covar,
                "em, gaussian: added to every covariance's diagonal in the M-step")
      ->capture_default_str();
  engine::add_stop_options(f, o->stop);
  f->add_option("--out", o->out,
                "Model file to write (HDF5: startprob, transmat, emissionprob or means and "
                "covariances, posterior/ for cavi and svi, traces, provenance)");
  f->add_option("--posteriors", o->posteriors,
                "File to write every step's state marginals to (dataset posteriors, T x K)");
  add_stream_options(f, o->stream);
  engine::add_checkpoint_options(f, o->files);
  f->callback([&ctx, o] {
    ctx.stop_signals = true;
    ctx.action = [&ctx, o] { fit(ctx, *o); };
  });
}

// hmm score and hmm decode.
void add_score_decode(CLI::App* hmm, engine::Context& ctx) {
  auto sc = std::make_shared<ScoreOptions>();
  auto* s = hmm->add_subcommand("score", "Held-out log-likelihood per time step (forward pass)");
  s->add_option("--model", sc->model, "Model file written by hmm fit")->required();
  s->add_option("--data", sc->data, "Sequences FILE.h5 (/X, /offsets)")->required();
  add_stream_options(s, sc->stream);
  s->callback([&ctx, sc] { ctx.action = [&ctx, sc] { score(ctx, *sc); }; });
  auto dco = std::make_shared<ScoreOptions>();
  auto* dc = hmm->add_subcommand("decode", "Most probable state path of every sequence (Viterbi)");
  dc->add_option("--model", dco->model, "Model file written by hmm fit")->required();
  dc->add_option("--data", dco->data, "Sequences FILE.h5 (/X, /offsets)")->required();
  dc->add_option("--out", dco->out,
                 "File to write the paths to (dataset states, int64 per step; every rank writes "
                 "its own sequences', piece by piece with --stream)")
      ->required();
  dc->add_option("--png", dco->png,
                 "PNG to write: the first sequences coloured by decoded state, and the model's "
                 "trace (rendered by scripts/plot_hmm.py)");
  add_stream_options(dc, dco->stream);
  dc->callback([&ctx, dco] { ctx.action = [&ctx, dco] { decode(ctx, *dco); }; });
}

}  // namespace

void add_commands(CLI::App& cli, engine::Context& ctx) {
  auto* hmm = cli.add_subcommand(
      "hmm",
      "Hidden Markov models (Rabiner 1989): Baum-Welch EM or variational Bayes (CAVI or SVI)");
  hmm->require_subcommand(1);
  engine::add_compare_command(hmm, ctx, "hmm");

  add_fit(hmm, ctx);
  add_score_decode(hmm, ctx);

  auto so = std::make_shared<SampleOptions>();
  auto* sm = hmm->add_subcommand("sample", "Sample sequences (and their states) from a fitted HMM");
  sm->add_option("--model", so->model, "Model file written by hmm fit")->required();
  sm->add_option("--sequences", so->sequences, "Number of sequences")->required();
  sm->add_option("--length", so->length, "Steps per sequence")->required();
  sm->add_option("--seed", so->seed, "Random seed")->capture_default_str();
  sm->add_option("--out", so->out, "Output FILE.h5 (/X, /offsets, /states)")->required();
  sm->callback([&ctx, so] { ctx.action = [&ctx, so] { sample(ctx, *so); }; });

  // caviar generate hmm: under the existing `generate` command.
  auto g = std::make_shared<GenerateOptions>();
  auto* gen = cli.get_subcommand("generate")
                  ->add_subcommand(
                      "hmm", "Sample sequences from a random HMM (true parameters under /true)");
  gen->add_option("--sequences", g->sequences, "Number of sequences")->required();
  gen->add_option("--length", g->length, "Sequence lengths, uniform in A-B")->capture_default_str();
  gen->add_option("--states", g->states, "Number of hidden states")->required();
  gen->add_option("--emission", g->emission, "categorical or gaussian")->capture_default_str();
  gen->add_option("--symbols", g->symbols, "Categorical: number of symbols V")
      ->capture_default_str();
  gen->add_option("--dim", g->dim, "Gaussian: dimension D")->capture_default_str();
  gen->add_option("--seed", g->seed, "Random seed")->capture_default_str();
  gen->add_option("--out", g->out, "Output FILE.h5 (/X, /offsets, /true/...)")->required();
  gen->callback([&ctx, g] { ctx.action = [&ctx, g] { generate(ctx, *g); }; });
}

}  // namespace caviar::hmm
