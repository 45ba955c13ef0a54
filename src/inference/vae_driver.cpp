#include "inference/vae_driver.hpp"

#include <bit>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <optional>

#include "core/error.hpp"
#include "core/parallel.hpp"
#include "core/partition.hpp"
#include "core/rng.hpp"
#include "core/scripts.hpp"
#include "core/signals.hpp"
#include "inference/checkpoint.hpp"
#include "io/h5.hpp"

namespace caviar::vae {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Noise steps reserved for evaluation and generation, far above any training step.
constexpr std::uint32_t kEvalStep = 0xFFFFFFFFu;
constexpr std::uint32_t kSampleStep = 0xFFFFFFFEu;
constexpr std::int64_t kParamChunk = 1 << 15;  // parameters per task in the element-wise loops

// Checks that every value is finite and, for the Bernoulli likelihood, in [0, 1]. Returns the
// first problem ("" if none). `first_row` is the global index of column 0.
std::string check_values(const io::RowMatrix& x, std::int64_t first_row, const io::DataRef& ref,
                         Likelihood lik) {
  for (Eigen::Index i = 0; i < x.rows(); ++i)
    for (Eigen::Index j = 0; j < x.cols(); ++j) {
      const double v = x(i, j);
      const bool bad = !std::isfinite(v) || (lik == Likelihood::kBernoulli && (v < 0 || v > 1));
      if (bad) {
        char buf[64];
        std::snprintf(buf, sizeof buf, "%g", v);
        return ref.str() + " has value " + buf + " at row " + std::to_string(first_row + i) +
               ", column " + std::to_string(j) +
               (lik == Likelihood::kBernoulli
                    ? "; the Bernoulli likelihood needs values in [0, 1] (scale pixels by 1/255, "
                      "or use --likelihood gaussian)"
                    : "; values must be finite");
      }
    }
  return "";
}

// Every rank reads every row (in chunks, to bound the double-precision staging) into a float
// D x N matrix: the global minibatches draw rows from anywhere in the file.
Mat<float> load_all_rows(const Comm& comm, const io::DataRef& ref, const io::MatrixShape& shape,
                         Likelihood lik) {
  Mat<float> data(shape.cols, shape.rows);
  const std::int64_t chunk = 8192;
  std::string err;
  for (std::int64_t b = 0; b < shape.rows; b += chunk) {
    const RowRange r{b, std::min(shape.rows, b + chunk)};
    const io::RowMatrix x = io::read_rows(comm, ref, shape, r);
    if (err.empty()) err = check_values(x, b, ref, lik);
    data.middleCols(b, r.size()) = x.transpose().cast<float>();
  }
  comm.raise_if_any(err);
  return data;
}

// A rank's block-aligned rows, checked, as float D x n.
struct FloatShard {
  io::MatrixShape shape;
  RowRange range;
  Mat<float> x;
};
FloatShard load_float_shard(const Comm& comm, const std::string& spec, Likelihood lik, int dim) {
  const io::DataRef ref = io::DataRef::parse(spec);
  FloatShard s;
  s.shape = io::inspect_matrix(comm, ref);
  if (s.shape.cols != dim)
    throw Error(ref.str() + " has " + std::to_string(s.shape.cols) + " columns; the model has " +
                std::to_string(dim) + " inputs");
  if (s.shape.rows < comm.size())
    throw Error(ref.str() + " has " + std::to_string(s.shape.rows) + " rows, fewer than the " +
                std::to_string(comm.size()) + " MPI ranks");
  s.range = partition_rows(s.shape.rows, comm.size(), comm.rank());
  const io::RowMatrix x = io::read_rows(comm, ref, s.shape, s.range);
  comm.raise_if_any(check_values(x, s.range.begin, ref, lik));
  s.x = x.transpose().cast<float>();
  return s;
}

// The epoch's permutation of [0, N): Fisher-Yates keyed by (seed, epoch), the same on every rank.
std::vector<std::int64_t> epoch_permutation(std::int64_t n, std::uint64_t seed, int epoch) {
  std::vector<std::int64_t> p(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) p[i] = i;
  const CounterRng rng(seed, Stream::kVaeShuffle);
  for (std::int64_t i = n - 1; i > 0; --i) {
    const double u =
        rng.uniform2(static_cast<std::uint64_t>(i), static_cast<std::uint32_t>(epoch))[0];
    const std::int64_t j = std::min<std::int64_t>(i, static_cast<std::int64_t>(u * (i + 1)));
    std::swap(p[i], p[j]);
  }
  return p;
}

// eps for rows `rows` (global indices), S samples each: column c * S + s holds the Z normals
// keyed by (seed, row, step), so a row's noise does not depend on who computes it.
void fill_noise(Mat<float>& eps, const std::int64_t* rows, std::int64_t n, int s, int z,
                std::uint64_t seed, std::uint32_t step) {
  const CounterRng rng(seed, Stream::kVaeNoise);
  const std::int64_t pairs = (z + 1) / 2;
  eps.resize(z, n * s);
  for (std::int64_t c = 0; c < n; ++c)
    for (int k = 0; k < s; ++k)
      for (std::int64_t q = 0; q < pairs; ++q) {
        const auto e = rng.normal2(static_cast<std::uint64_t>((rows[c] * s + k) * pairs + q), step);
        eps(2 * q, c * s + k) = static_cast<float>(e[0]);
        if (2 * q + 1 < z) eps(2 * q + 1, c * s + k) = static_cast<float>(e[1]);
      }
}

// Sum of the ELBO over the rows of a rank's shard, in fixed 256-row blocks whose sums are
// combined in block order: the same total at any rank or thread count.
double evaluate_elbo(const Comm& comm, const Layout& layout, const float* params,
                     const FloatShard& s, int samples, std::uint64_t seed) {
  const std::int64_t n_blocks_total = (s.shape.rows + kBlockRows - 1) / kBlockRows;
  std::vector<double> block_sums(static_cast<std::size_t>(n_blocks_total), 0.0);
  const int threads = max_threads();
  std::vector<Network<float>> nets(static_cast<std::size_t>(threads), Network<float>(layout));
  std::vector<Mat<float>> xs(threads), eps(threads);
  parallel_blocks(s.range.size(), kBlockRows, threads, [&](int t, std::int64_t b, std::int64_t e) {
    const std::int64_t n = e - b;
    std::vector<std::int64_t> ids(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) ids[i] = s.range.begin + b + i;
    xs[t] = s.x.middleCols(b, n);
    fill_noise(eps[t], ids.data(), n, samples, layout.latent(), seed, kEvalStep);
    block_sums[(s.range.begin + b) / kBlockRows] =
        nets[t].run(params, xs[t], eps[t], samples, nullptr);
  });
  // One rank owns each block, so the sum of the others' zeros is exact.
  comm.allreduce_sum(std::span<double>(block_sums));
  double total = 0;
  for (double v : block_sums) total += v;
  return total;
}

struct Checkpoint {
  ParamVec params, m, v;
  std::int64_t step = 0;
  int epoch = 0;  // epochs completed
  // A checkpoint taken on a stop signal inside epoch `epoch + 1`: the steps of it already done
  // and the sum of their minibatch ELBOs (0 and 0 at an epoch end).
  std::int64_t step_in_epoch = 0;
  double epoch_elbo = 0;
  std::vector<double> train_trace, test_trace;
};

// What a resume must share with the run that wrote the checkpoint (inference/checkpoint.hpp):
// the data (shape and sampled-rows identity) and the options that change the sequence of
// minibatches and noise. The architecture is checked separately (read_checkpoint).
ckpt::Fingerprint fingerprint(const Comm& comm, const TrainOptions& o, const io::DataRef& ref,
                              const io::MatrixShape& shape) {
  ckpt::Fingerprint fp("vae");
  ckpt::add_data(fp, comm, "--data", ref, shape);
  fp.add("seed", static_cast<std::int64_t>(o.seed), "--seed");
  fp.add("batch_size", static_cast<std::int64_t>(o.batch_size), "--batch-size");
  fp.add("samples", static_cast<std::int64_t>(o.samples), "--samples");
  fp.add("micro_blocks", static_cast<std::int64_t>(o.micro_blocks), "--micro-blocks");
  return fp;
}

std::vector<double> to_double(const ParamVec& v) {
  return {v.begin(), v.end()};
}
ParamVec to_float(const std::vector<double>& v) {
  return {v.begin(), v.end()};
}

void write_architecture(io::FileWriter& w, const Architecture& a) {
  std::vector<std::int64_t> h(a.hidden.begin(), a.hidden.end());
  w.write("architecture/hidden", h, {h.size()});
  w.attr("model", std::string("vae"));
  w.attr("input_dim", static_cast<std::int64_t>(a.input_dim));
  w.attr("latent", static_cast<std::int64_t>(a.latent));
  w.attr("likelihood", to_string(a.likelihood));
}

Architecture read_architecture(const io::FileReader& r, const std::string& file) {
  if (!r.has("/architecture/hidden"))
    throw Error("'" + file + "' is not a caviar VAE model or checkpoint (no /architecture)");
  Architecture a;
  const std::string bad = "'" + file + "': ";
  for (double h : r.read("/architecture/hidden"))
    a.hidden.push_back(static_cast<int>(ckpt::checked_int(h, 1, INT_MAX, bad + "a hidden width")));
  a.input_dim = static_cast<int>(ckpt::read_int(r, "input_dim", 1, INT_MAX, bad));
  a.latent = static_cast<int>(ckpt::read_int(r, "latent", 1, INT_MAX, bad));
  a.likelihood = parse_likelihood(r.read_string_attr("likelihood"));
  return a;
}

void write_checkpoint(const Comm& comm, const std::string& path, const TrainOptions& o,
                      const ckpt::Fingerprint& fp, const Architecture& a, const ParamVec& params,
                      Adam& adam, int epoch, const std::vector<double>& train_trace,
                      const std::vector<double>& test_trace, std::int64_t step_in_epoch = 0,
                      double epoch_elbo = 0) {
  comm.on_root([&] {
    io::FileWriter w(path);
    write_architecture(w, a);
    fp.write(w);
    w.attr("step_in_epoch", step_in_epoch);
    w.attr("epoch_elbo", epoch_elbo);
    const std::uint64_t n = params.size();
    w.write("params", to_double(params), {n});  // float32 values, exactly representable
    w.write("adam/m", to_double(adam.m()), {n});
    w.write("adam/v", to_double(adam.v()), {n});
    w.write("trace/train_elbo", train_trace, {train_trace.size()});
    w.write("trace/test_elbo", test_trace, {test_trace.size()});
    w.attr("step", adam.steps());
    w.attr("epoch", static_cast<std::int64_t>(epoch));
    w.attr("seed", static_cast<std::int64_t>(o.seed));
    w.attr("batch_size", static_cast<std::int64_t>(o.batch_size));
    w.attr("samples", static_cast<std::int64_t>(o.samples));
    w.attr("micro_blocks", static_cast<std::int64_t>(o.micro_blocks));
    w.attr("data", o.data);
    w.commit();
  });
}

Checkpoint read_checkpoint(const Comm& comm, const std::string& path, const ckpt::Fingerprint& fp,
                           const Layout& layout) {
  Checkpoint c;
  comm.agree([&] {
    io::FileReader r(path);
    fp.check(r, path);  // model type, data and options: one clear line on a mismatch
    if (!r.has("/params") || !r.has("/adam/m"))
      throw Error("'" + path + "' is not a caviar VAE checkpoint (no /params, /adam)");
    const Architecture a = read_architecture(r, path);
    const Architecture& want = layout.arch;
    if (a.hidden != want.hidden || a.latent != want.latent || a.input_dim != want.input_dim ||
        a.likelihood != want.likelihood)
      throw Error("--resume " + path + ": its architecture differs from this run's " +
                  "(--hidden, --latent, --likelihood or the data's columns)");
    c.params = to_float(r.read("/params"));
    c.m = to_float(r.read("/adam/m"));
    c.v = to_float(r.read("/adam/v"));
    if (static_cast<std::int64_t>(c.params.size()) != layout.n_params ||
        c.m.size() != c.params.size() || c.v.size() != c.params.size())
      throw Error("--resume " + path + ": parameter buffers have the wrong size");
    c.train_trace = r.read("/trace/train_elbo");
    c.test_trace = r.read("/trace/test_elbo");
    const std::string bad = "--resume " + path + ": ";
    c.step = ckpt::read_int(r, "step", 0, ckpt::kMaxCount, bad);
    c.epoch = static_cast<int>(ckpt::read_int(r, "epoch", 0, INT_MAX - 1, bad));
    c.step_in_epoch = ckpt::read_int(r, "step_in_epoch", 0, ckpt::kMaxCount, bad);
    c.epoch_elbo = r.read_double_attr("epoch_elbo");
  });
  return c;
}

void write_model(const Comm& comm, const TrainOptions& o, const Layout& layout,
                 const TrainResult& res) {
  comm.on_root([&] {
    io::FileWriter w(o.out);
    write_architecture(w, layout.arch);
    // Weights by layer name; a layer with two heads is saved as two (rows split evenly).
    for (const Dense* d : layout.layers()) {
      const int rows = d->out / static_cast<int>(d->parts.size());
      for (std::size_t k = 0; k < d->parts.size(); ++k) {
        const float* wp = res.params.data() + d->w + static_cast<std::int64_t>(k) * rows * d->in;
        const float* bp = res.params.data() + d->b + static_cast<std::int64_t>(k) * rows;
        w.write(d->parts[k] + "/W",
                std::vector<double>(wp, wp + static_cast<std::int64_t>(rows) * d->in),
                {static_cast<std::uint64_t>(rows), static_cast<std::uint64_t>(d->in)});
        w.write(d->parts[k] + "/b", std::vector<double>(bp, bp + rows),
                {static_cast<std::uint64_t>(rows)});
      }
    }
    w.write("trace/train_elbo", res.train_trace, {res.train_trace.size()});
    w.write("trace/test_elbo", res.test_trace, {res.test_trace.size()});
    w.attr("train_elbo", res.train_elbo);
    w.attr("test_elbo", res.test_elbo);
    w.attr("epochs", static_cast<std::int64_t>(res.epochs));
    w.attr("steps", res.steps);
    w.attr("n_samples", res.n);
    w.attr("batch_size", static_cast<std::int64_t>(o.batch_size));
    w.attr("lr", o.lr);
    w.attr("weight_decay", o.weight_decay);
    w.attr("samples", static_cast<std::int64_t>(o.samples));
    w.attr("micro_blocks", static_cast<std::int64_t>(o.micro_blocks));
    w.attr("reduction", o.reduction);
    w.attr("seed", static_cast<std::int64_t>(o.seed));
    w.attr("ranks", static_cast<std::int64_t>(comm.size()));
    w.attr("threads", static_cast<std::int64_t>(max_threads()));
    w.attr("data", o.data);
    w.attr("test", o.test);
    w.attr("version", o.version);
    w.attr("command", o.command);
    w.commit();
  });
}

void validate(const TrainOptions& o, std::int64_t n) {
  if (o.epochs < 0) throw Error("--max-iter (epochs) must be >= 0");
  if (o.batch_size < 1 || o.batch_size > n)
    throw Error("--batch-size must be between 1 and the number of rows (" + std::to_string(n) +
                "), got " + std::to_string(o.batch_size));
  if (o.micro_blocks < 1 || o.micro_blocks > o.batch_size)
    throw Error("--micro-blocks must be between 1 and --batch-size");
  if (o.samples < 1) throw Error("--samples must be >= 1");
  if (!(o.lr > 0) || !std::isfinite(o.lr)) throw Error("--lr must be > 0");
  if (!(o.weight_decay >= 0) || !std::isfinite(o.weight_decay))
    throw Error("--weight-decay must be >= 0");
  if (o.reduction != "exact" && o.reduction != "fast")
    throw Error("--reduction must be exact or fast");
}

}  // namespace

TrainResult train(const Comm& comm, const TrainOptions& o, const EpochProgress& progress) {
  const auto t_start = Clock::now();
  // Cheap argument checks first, so that bad flags fail before any file is read.
  const Likelihood lik = parse_likelihood(o.likelihood);
  if (o.latent < 1) throw Error("--latent must be >= 1 (got " + std::to_string(o.latent) + ")");
  if (o.hidden.empty()) throw Error("--hidden needs at least one width");
  for (int h : o.hidden)
    if (h < 1) throw Error("--hidden widths must be >= 1 (got " + std::to_string(h) + ")");
  std::vector<std::string> inputs{io::DataRef::parse(o.data).file};
  if (!o.test.empty()) inputs.push_back(io::DataRef::parse(o.test).file);
  if (!o.resume.empty()) inputs.push_back(o.resume);
  if (!o.out.empty()) io::check_output_path(comm, o.out, inputs);
  if (!o.checkpoint.empty()) io::check_output_path(comm, o.checkpoint, {inputs[0]});
  ckpt::check_resume(comm, o.resume);
  const StopSignals signals;  // SIGTERM/SIGUSR1 only set a flag; polled at every step
  ckpt::StopPoller poller(comm, {});

  const io::DataRef ref = io::DataRef::parse(o.data);
  const io::MatrixShape shape = io::inspect_matrix(comm, ref);
  validate(o, shape.rows);
  const Layout layout(Architecture{static_cast<int>(shape.cols), o.hidden, o.latent, lik});
  const Mat<float> data = load_all_rows(comm, ref, shape, lik);
  std::optional<FloatShard> test;
  if (!o.test.empty()) test = load_float_shard(comm, o.test, lik, layout.input_dim());

  std::optional<ckpt::Fingerprint> fp;
  if (!o.checkpoint.empty() || !o.resume.empty()) fp = fingerprint(comm, o, ref, shape);

  const std::int64_t np = layout.n_params, n = shape.rows, b_size = o.batch_size;
  AdamConfig cfg;
  cfg.lr = o.lr;
  cfg.weight_decay = o.weight_decay;
  Adam adam(cfg, np);
  ParamVec params;
  TrainResult res;
  int first_epoch = 1;
  std::int64_t first_step = 0;  // inside first_epoch (a checkpoint taken on a signal)
  double first_elbo = 0;
  if (!o.resume.empty()) {
    Checkpoint c = read_checkpoint(comm, o.resume, *fp, layout);
    first_step = c.step_in_epoch;
    first_elbo = c.epoch_elbo;
    params = std::move(c.params);
    adam.m() = std::move(c.m);
    adam.v() = std::move(c.v);
    adam.set_steps(c.step);
    first_epoch = c.epoch + 1;
    res.train_trace = std::move(c.train_trace);
    res.test_trace = std::move(c.test_trace);
  } else {
    params = xavier_init(layout, o.seed);
  }

  // Micro-blocks of m rows: their number and layout depend on the batch size only.
  const std::int64_t m_rows = (b_size + o.micro_blocks - 1) / o.micro_blocks;
  const std::int64_t max_blocks = (b_size + m_rows - 1) / m_rows;
  const std::int64_t max_local = (max_blocks + comm.size() - 1) / comm.size();
  const std::int64_t steps_per_epoch = (n + b_size - 1) / b_size;
  if (static_cast<double>(o.epochs) * steps_per_epoch >= kSampleStep)
    throw Error("too many training steps for the 32-bit noise counter");
  const int threads = max_threads();
  const bool exact = o.reduction == "exact";
  // One gradient slot per local micro-block; np is a multiple of kParamAlign, so every slot is
  // aligned like the parameter buffer.
  ParamVec grads(static_cast<std::size_t>(max_local * np));
  std::vector<double> block_elbo(static_cast<std::size_t>(max_local)), block_max(max_local);
  std::vector<std::int64_t> iacc(static_cast<std::size_t>(np + max_blocks));
  std::vector<double> dacc(o.reduction == "fast" ? static_cast<std::size_t>(np + max_blocks) : 0);
  ParamVec g(static_cast<std::size_t>(np));
  std::vector<Network<float>> nets(static_cast<std::size_t>(threads), Network<float>(layout));
  std::vector<Mat<float>> xs(threads), eps(threads);

  res.n = n;
  res.epochs = first_epoch - 1;
  res.steps = adam.steps();
  if (!res.train_trace.empty()) res.train_elbo = res.train_trace.back();
  res.test_elbo =
      res.test_trace.empty() ? std::numeric_limits<double>::quiet_NaN() : res.test_trace.back();
  for (int epoch = first_epoch; epoch <= o.epochs; ++epoch) {
    const auto t_epoch = Clock::now();
    const std::vector<std::int64_t> perm = epoch_permutation(n, o.seed, epoch);
    double epoch_elbo = epoch == first_epoch ? first_elbo : 0;
    for (std::int64_t st = epoch == first_epoch ? first_step : 0; st < steps_per_epoch; ++st) {
      // Stop signals: agreed at every step (one small allreduce); a mid-epoch checkpoint.
      if (const int sig = poller.poll(adam.steps()).signal) {
        if (!o.checkpoint.empty())
          write_checkpoint(comm, o.checkpoint, o, *fp, layout.arch, params, adam, epoch - 1,
                           res.train_trace, res.test_trace, st, epoch_elbo);
        ckpt::stop(sig, "at epoch " + std::to_string(epoch) + ", step " + std::to_string(st),
                   o.checkpoint);
      }
      const std::int64_t b0 = st * b_size, bn = std::min(b_size, n - b0);
      const std::int64_t n_blocks = (bn + m_rows - 1) / m_rows;
      const std::int64_t lb0 = n_blocks * comm.rank() / comm.size();
      const std::int64_t lb1 = n_blocks * (comm.rank() + 1) / comm.size();
      const auto step = static_cast<std::uint32_t>(adam.steps());

      // 1. Each local micro-block's gradient of -sum ELBO, one thread per block.
      auto t0 = Clock::now();
      parallel_blocks(lb1 - lb0, 1, threads, [&](int t, std::int64_t lb, std::int64_t) {
        const std::int64_t blk = lb0 + lb;
        const std::int64_t r0 = b0 + blk * m_rows, rn = std::min(m_rows, b0 + bn - r0);
        const std::int64_t* rows = perm.data() + r0;
        Mat<float>& x = xs[t];
        x.resize(layout.input_dim(), rn);
        for (std::int64_t c = 0; c < rn; ++c) x.col(c) = data.col(rows[c]);
        fill_noise(eps[t], rows, rn, o.samples, layout.latent(), o.seed, step);
        float* gb = grads.data() + lb * np;
        block_elbo[lb] = nets[t].run(params.data(), x, eps[t], o.samples, gb);
        block_max[lb] = max_abs(gb, np);
      });
      res.compute_seconds += seconds_since(t0);

      // 2. One reduction of the gradient and the per-block ELBO sums.
      t0 = Clock::now();
      const std::int64_t n_local = lb1 - lb0;
      double batch_elbo = 0;
      int exponent = 0;
      if (exact) {
        double local_max = 0;
        for (std::int64_t lb = 0; lb < n_local; ++lb)  // NaN as +inf: MPI's max may drop a NaN
          local_max = std::max(local_max, std::isnan(block_max[lb])
                                              ? std::numeric_limits<double>::infinity()
                                              : block_max[lb]);
        // A non-finite gradient anywhere has no fixed-point grid (and its clamped values would
        // overflow the integer sum); every rank sees the same maximum and stops here.
        const double global_max = comm.allreduce_max(local_max);
        if (!std::isfinite(global_max))
          throw Error("training diverged at epoch " + std::to_string(epoch) + ", step " +
                      std::to_string(st + 1) + " (non-finite gradient); try a smaller --lr");
        const int e = fixed_point_exponent(global_max, n_blocks);
        std::fill(iacc.begin() + np, iacc.end(), 0);
        parallel_blocks(np, kParamChunk, threads, [&](int, std::int64_t pb, std::int64_t pe) {
          std::fill(iacc.begin() + pb, iacc.begin() + pe, 0);
          for (std::int64_t lb = 0; lb < n_local; ++lb)
            add_fixed_point(grads.data() + lb * np + pb, pe - pb, e, iacc.data() + pb);
        });
        // Each block's ELBO travels as the bits of its double: only its owner adds non-zero bits,
        // so the integer sum reproduces them exactly.
        for (std::int64_t lb = 0; lb < n_local; ++lb)
          iacc[np + lb0 + lb] = std::bit_cast<std::int64_t>(block_elbo[lb]);
        comm.allreduce_sum(std::span<std::int64_t>(iacc.data(), np + n_blocks));
        exponent = e;
        for (std::int64_t k = 0; k < n_blocks; ++k)
          batch_elbo += std::bit_cast<double>(iacc[np + k]);
      } else {
        // For measuring the cost of the exact reduction only: a plain double sum, whose rounding
        // depends on how blocks are grouped by rank.
        std::fill(dacc.begin(), dacc.end(), 0.0);
        parallel_blocks(np, kParamChunk, threads, [&](int, std::int64_t pb, std::int64_t pe) {
          for (std::int64_t lb = 0; lb < n_local; ++lb) {
            const float* gb = grads.data() + lb * np;
            for (std::int64_t i = pb; i < pe; ++i) dacc[i] += gb[i];
          }
        });
        for (std::int64_t lb = 0; lb < n_local; ++lb) dacc[np + lb0 + lb] = block_elbo[lb];
        comm.allreduce_sum(std::span<double>(dacc.data(), np + n_blocks));
        for (std::int64_t k = 0; k < n_blocks; ++k) batch_elbo += dacc[np + k];
      }
      epoch_elbo += batch_elbo;
      res.reduce_seconds += seconds_since(t0);

      // 3. The same Adam step on every rank (the loss is the mean of -ELBO over the batch), in
      // the same pass over memory as the conversion back from the reduced sums.
      t0 = Clock::now();
      adam.begin_step();
      parallel_blocks(np, kParamChunk, threads, [&](int, std::int64_t pb, std::int64_t pe) {
        if (exact) {
          from_fixed_point(iacc.data() + pb, pe - pb, exponent, static_cast<double>(bn),
                           g.data() + pb);
        } else {
          for (std::int64_t i = pb; i < pe; ++i) g[i] = static_cast<float>(dacc[i] / bn);
        }
        adam.update(params.data(), g.data(), pb, pe);
      });
      res.update_seconds += seconds_since(t0);
    }
    const double train_seconds = seconds_since(t_epoch);
    res.train_seconds += train_seconds;
    ++res.epochs_run;
    const auto t_eval = Clock::now();
    EpochReport rep;
    rep.epoch = epoch;
    rep.epochs = o.epochs;
    rep.train_elbo = epoch_elbo / static_cast<double>(n);
    rep.test_elbo = std::numeric_limits<double>::quiet_NaN();
    if (test)
      rep.test_elbo = evaluate_elbo(comm, layout, params.data(), *test, o.samples, o.seed) /
                      static_cast<double>(test->shape.rows);
    res.eval_seconds += seconds_since(t_eval);
    if (!std::isfinite(rep.train_elbo))
      throw Error("training diverged at epoch " + std::to_string(epoch) +
                  " (non-finite ELBO); try a smaller --lr");
    res.train_trace.push_back(rep.train_elbo);
    res.test_trace.push_back(rep.test_elbo);
    res.train_elbo = rep.train_elbo;
    res.test_elbo = rep.test_elbo;
    res.epochs = epoch;
    res.steps = adam.steps();
    if (!o.checkpoint.empty())
      write_checkpoint(comm, o.checkpoint, o, *fp, layout.arch, params, adam, epoch,
                       res.train_trace, res.test_trace);
    rep.seconds = seconds_since(t_epoch);
    rep.rows_per_second = static_cast<double>(n) / train_seconds;
    if (progress) progress(rep);
  }
  res.params = std::move(params);
  res.seconds = seconds_since(t_start);
  if (!o.out.empty()) write_model(comm, o, layout, res);
  return res;
}

LoadedModel load_model(const Comm& comm, const std::string& file) {
  std::optional<LoadedModel> model;
  comm.agree([&] {
    io::FileReader r(file);
    const Architecture a = read_architecture(r, file);
    Layout layout(a);
    ParamVec p(static_cast<std::size_t>(layout.n_params));
    for (const Dense* d : layout.layers()) {
      const std::int64_t rows = d->out / static_cast<int>(d->parts.size());
      for (std::size_t k = 0; k < d->parts.size(); ++k) {
        io::Dims dims;
        const auto w = r.read(d->parts[k] + "/W", &dims);
        const auto b = r.read(d->parts[k] + "/b");
        if (dims != io::Dims{static_cast<std::uint64_t>(rows), static_cast<std::uint64_t>(d->in)} ||
            static_cast<std::int64_t>(b.size()) != rows)
          throw Error("'" + file + "': " + d->parts[k] +
                      " has the wrong shape for its architecture");
        std::copy(w.begin(), w.end(),
                  p.begin() + d->w + static_cast<std::int64_t>(k) * rows * d->in);
        std::copy(b.begin(), b.end(), p.begin() + d->b + static_cast<std::int64_t>(k) * rows);
      }
    }
    model.emplace(LoadedModel{std::move(layout), std::move(p)});
  });
  return std::move(*model);
}

namespace {

std::string plot_script() {
  if (const char* s = std::getenv("CAVIAR_PLOT_VAE")) return s;
  return script_path("plot_vae.py");
}

// Rank 0 writes /images (n x D) with the grid shape, then renders the PNG with matplotlib.
void write_images(const Comm& comm, const ImageOptions& o, const Mat<float>& images,
                  std::int64_t grid_rows, std::int64_t grid_cols, const std::string& kind) {
  comm.on_root([&] {
    // Found before anything is written: a missing script leaves no output behind.
    const std::string script = o.png.empty() ? std::string() : plot_script();
    std::string h5 = o.images_out;
    const bool temporary = h5.empty();
    if (temporary) h5 = o.png + ".tmp-caviar-images.h5";
    {
      io::FileWriter w(h5);
      std::vector<double> v(images.data(), images.data() + images.size());
      w.write(
          "images", v,
          {static_cast<std::uint64_t>(images.cols()), static_cast<std::uint64_t>(images.rows())});
      w.attr("grid_rows", grid_rows);
      w.attr("grid_cols", grid_cols);
      w.attr("kind", kind);
      w.attr("model", o.model);
      w.commit();
    }
    if (!o.png.empty()) {
      const char* py = std::getenv("CAVIAR_PYTHON");
      const std::string cmd = shell_quote(py ? py : "/usr/bin/python3") + " " +
                              shell_quote(script) + " grid " + shell_quote(h5) + " --png " +
                              shell_quote(o.png);
      const int rc = std::system(cmd.c_str());
      if (temporary) std::filesystem::remove(h5);
      if (rc != 0)
        throw Error("rendering " + o.png + " failed (" + cmd +
                    "); it needs Debian's python3-matplotlib and python3-h5py");
    }
  });
}

void check_image_options(const Comm& comm, const ImageOptions& o, const std::string& data = "") {
  if (o.png.empty() && o.images_out.empty()) throw Error("give --png and/or --out");
  std::vector<std::string> inputs{o.model};
  if (!data.empty()) inputs.push_back(io::DataRef::parse(data).file);
  if (!o.png.empty()) io::check_output_path(comm, o.png, inputs);
  if (!o.images_out.empty()) io::check_output_path(comm, o.images_out, inputs);
}

}  // namespace

std::int64_t sample(const Comm& comm, const ImageOptions& o, int n) {
  if (n < 1) throw Error("--n must be >= 1");
  check_image_options(comm, o);
  LoadedModel m = load_model(comm, o.model);
  const int z = m.layout.latent();
  std::vector<std::int64_t> ids(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) ids[i] = i;
  Mat<float> eps, mean;
  fill_noise(eps, ids.data(), n, 1, z, o.seed, kSampleStep);
  Network<float>(m.layout).decode_mean(m.params.data(), eps, mean);
  const std::int64_t cols =
      std::min<std::int64_t>(n, static_cast<std::int64_t>(std::ceil(std::sqrt(n))));
  write_images(comm, o, mean, (n + cols - 1) / cols, cols, "samples");
  return n;
}

std::int64_t reconstruct(const Comm& comm, const ImageOptions& o, const std::string& data, int n) {
  if (n < 1) throw Error("--n must be >= 1");
  check_image_options(comm, o, data);
  LoadedModel m = load_model(comm, o.model);
  const io::DataRef ref = io::DataRef::parse(data);
  const io::MatrixShape shape = io::inspect_matrix(comm, ref);
  if (shape.cols != m.layout.input_dim())
    throw Error(ref.str() + " has " + std::to_string(shape.cols) + " columns; the model has " +
                std::to_string(m.layout.input_dim()) + " inputs");
  n = static_cast<int>(std::min<std::int64_t>(n, shape.rows));
  const io::RowMatrix x = io::read_rows(comm, ref, shape, {0, n});
  comm.raise_if_any(check_values(x, 0, ref, m.layout.arch.likelihood));
  const Mat<float> xf = x.transpose().cast<float>();
  Network<float> net(m.layout);
  Mat<float> mu, lv, rec;
  net.encode(m.params.data(), xf, mu, lv);
  net.decode_mean(m.params.data(), mu, rec);
  // Rows of up to 10 originals, each followed by a row of their reconstructions.
  const int cols = std::min(n, 10), strips = (n + cols - 1) / cols;
  Mat<float> img = Mat<float>::Zero(xf.rows(), 2 * strips * cols);
  for (int i = 0; i < n; ++i) {
    const int s = i / cols, c = i % cols;
    img.col((2 * s) * cols + c) = xf.col(i);
    img.col((2 * s + 1) * cols + c) = rec.col(i);
  }
  write_images(comm, o, img, 2 * strips, cols, "reconstructions");
  return n;
}

std::int64_t manifold(const Comm& comm, const ImageOptions& o, int grid) {
  if (grid < 1) throw Error("--grid must be >= 1");
  check_image_options(comm, o);
  LoadedModel m = load_model(comm, o.model);
  if (m.layout.latent() != 2)
    throw Error("vae manifold needs a model with --latent 2; '" + o.model + "' has latent " +
                std::to_string(m.layout.latent()));
  // Equal-probability grid through the Gaussian inverse CDF (Kingma & Welling 2014, Figure 4;
  // Bruno 2022, Figure 4.6): x to the right, y upwards.
  Mat<float> z(2, grid * grid), mean;
  for (int i = 0; i < grid; ++i)
    for (int j = 0; j < grid; ++j) {
      z(0, i * grid + j) = static_cast<float>(normal_quantile((j + 0.5) / grid));
      z(1, i * grid + j) = static_cast<float>(normal_quantile((grid - i - 0.5) / grid));
    }
  Network<float>(m.layout).decode_mean(m.params.data(), z, mean);
  write_images(comm, o, mean, grid, grid, "manifold");
  return static_cast<std::int64_t>(grid) * grid;
}

std::int64_t encode(const Comm& comm, const std::string& model, const std::string& data,
                    const std::string& out) {
  io::check_output_path(comm, out, {model, io::DataRef::parse(data).file});
  LoadedModel m = load_model(comm, model);
  const FloatShard s = load_float_shard(comm, data, m.layout.arch.likelihood, m.layout.input_dim());
  const int z = m.layout.latent();
  // Row-major n x Z outputs: column-major Z x n is the same memory.
  Mat<float> mu(z, s.range.size()), lv(z, s.range.size());
  const int threads = max_threads();
  std::vector<Network<float>> nets(static_cast<std::size_t>(threads), Network<float>(m.layout));
  std::vector<Mat<float>> xs(threads), mus(threads), lvs(threads);
  parallel_blocks(s.range.size(), kBlockRows, threads, [&](int t, std::int64_t b, std::int64_t e) {
    xs[t] = s.x.middleCols(b, e - b);
    nets[t].encode(m.params.data(), xs[t], mus[t], lvs[t]);
    mu.middleCols(b, e - b) = mus[t];
    lv.middleCols(b, e - b) = lvs[t];
  });
  io::ParallelRowWriter w(comm, out);
  w.write_rows("mu", s.shape.rows, s.range, mu.data(), {static_cast<std::uint64_t>(z)});
  w.write_rows("logvar", s.shape.rows, s.range, lv.data(), {static_cast<std::uint64_t>(z)});
  w.commit();
  return s.shape.rows;
}

}  // namespace caviar::vae
