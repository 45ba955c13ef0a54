#include "inference/vae_driver.hpp"

#include <array>
#include <atomic>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <utility>

#include "core/error.hpp"
#include "core/parallel.hpp"
#include "core/partition.hpp"
#include "core/rng.hpp"
#include "core/scripts.hpp"
#include "engine/checkpoint.hpp"
#include "engine/gradient.hpp"
#include "inference/checkpoint.hpp"
#include "io/h5.hpp"
#include "models/vae/gradient.hpp"

namespace caviar::vae {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Noise steps reserved for evaluation and generation, far above any training step.
constexpr std::uint32_t kEvalStep = 0xFFFFFFFFu;
constexpr std::uint32_t kSampleStep = 0xFFFFFFFEu;
constexpr std::uint32_t kImportanceStep = 0xFFFFFFFDu;
constexpr std::uint32_t kFirstReservedStep = kImportanceStep;

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

// Sum of the ELBO over the rows of a rank's shard, in fixed 256-row blocks whose sums are
// combined in block order: the same total at any rank or thread count.
double evaluate_elbo(const Comm& comm, const Layout& layout, const float* params,
                     const double* running, const FloatShard& s, int samples, std::uint64_t seed) {
  const std::int64_t n_blocks_total = (s.shape.rows + kBlockRows - 1) / kBlockRows;
  std::vector<double> block_sums(static_cast<std::size_t>(n_blocks_total), 0.0);
  const int threads = max_threads();
  std::vector<Network<float>> nets(static_cast<std::size_t>(threads),
                                   Network<float>(layout, running));
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

// --estimator resolved: the path derivative for stl, and for auto with a full posterior.
bool uses_stl(const TrainOptions& o) {
  return o.estimator == "stl" ||
         (o.estimator == "auto" && parse_posterior(o.posterior) == Posterior::kFull);
}

// What a resume must share with the run that wrote the checkpoint (inference/checkpoint.hpp):
// the checkpoint layout (the engine's; the VAE's own older layout lacks it and is refused with
// one line), the data (shape and sampled-rows identity), the architecture, and the options that
// change the sequence of minibatches and noise.
ckpt::Fingerprint fingerprint(const Comm& comm, const TrainOptions& o, const io::DataRef& ref,
                              const io::MatrixShape& shape) {
  ckpt::Fingerprint fp("vae");
  fp.add("layout", std::string("engine"), "the checkpoint layout");
  ckpt::add_data(fp, comm, "--data", ref, shape);
  auto list = [](const std::vector<int>& v) {
    std::string out;
    for (int h : v) {
      if (!out.empty()) out += ',';
      out += std::to_string(h);
    }
    return out;
  };
  // The architecture; a convolutional one's only for conv runs, so that the checkpoints of MLP
  // runs stay resumable.
  if (o.arch == "conv") {
    fp.add("arch", o.arch, "--arch");
    fp.add("channels", list(o.channels), "--channels");
  } else {
    fp.add("hidden", list(o.hidden), "--hidden");
  }
  if (o.bayesian_decoder) {
    fp.add("bayesian_decoder", std::string("yes"), "--bayesian-decoder");
    fp.add("prior_scale", o.prior_scale, "--prior-scale");
  }
  fp.add("latent", static_cast<std::int64_t>(o.latent), "--latent");
  fp.add("likelihood", o.likelihood, "--likelihood");
  // Only for a full posterior, so that the checkpoints of diagonal runs stay resumable.
  if (parse_posterior(o.posterior) == Posterior::kFull)
    fp.add("posterior", o.posterior, "--posterior");
  if (uses_stl(o)) fp.add("estimator", std::string("stl"), "--estimator");
  fp.add("seed", static_cast<std::int64_t>(o.seed), "--seed");
  fp.add("batch_size", static_cast<std::int64_t>(o.batch_size), "--batch-size");
  fp.add("samples", static_cast<std::int64_t>(o.samples), "--samples");
  fp.add("micro_blocks", static_cast<std::int64_t>(o.micro_blocks), "--micro-blocks");
  fp.add("reduction", o.reduction, "--reduction");
  return fp;
}

void write_architecture(io::FileWriter& w, const Architecture& a) {
  if (a.conv()) {
    std::vector<std::int64_t> c(a.channels.begin(), a.channels.end());
    w.write("architecture/channels", c, {c.size()});
    std::vector<std::int64_t> image{a.image_channels, a.height, a.width};
    w.write("architecture/image", image, {3});
    w.attr("arch", std::string("conv"));
  } else {
    std::vector<std::int64_t> h(a.hidden.begin(), a.hidden.end());
    w.write("architecture/hidden", h, {h.size()});
  }
  w.attr("model", std::string("vae"));
  w.attr("input_dim", static_cast<std::int64_t>(a.input_dim));
  w.attr("latent", static_cast<std::int64_t>(a.latent));
  w.attr("likelihood", to_string(a.likelihood));
  // Written for a full posterior only: a file without it has a diagonal one (as every file of
  // earlier versions), and diagonal model files keep their bits.
  if (a.posterior == Posterior::kFull) {
    w.attr("posterior", to_string(a.posterior));
    // The triangle is relative to sigma, L = diag(sigma) (I + M (.) L'); files of earlier
    // versions, without this attribute, held an absolute one and are refused on reading.
    w.attr("lower", std::string("relative"));
  }
  // How it was trained, for the record (not needed to use the model); likewise only when not the
  // default.
  if (a.stl) w.attr("estimator", std::string("stl"));
  if (a.bayesian_decoder) {
    w.attr("bayesian_decoder", static_cast<std::int64_t>(1));
    w.attr("prior_scale", a.prior_scale);
  }
}

Architecture read_architecture(const io::FileReader& r, const std::string& file) {
  const bool conv = r.has("/architecture/channels");
  if (!r.has("/architecture/hidden") && !conv)
    throw Error("'" + file + "' is not a caviar VAE model or checkpoint (no /architecture)");
  Architecture a;
  const std::string bad = "'" + file + "': ";
  if (conv) {
    for (double c : r.read("/architecture/channels"))
      a.channels.push_back(static_cast<int>(checked_int(c, 1, 1 << 16, bad + "a channel count")));
    const std::vector<double> image = r.read("/architecture/image");
    if (image.size() != 3 || a.channels.empty())
      throw Error(bad + "/architecture/image must hold C, H, W");
    a.image_channels = static_cast<int>(checked_int(image[0], 1, 1 << 16, bad + "image channels"));
    a.height = static_cast<int>(checked_int(image[1], 1, 1 << 16, bad + "image height"));
    a.width = static_cast<int>(checked_int(image[2], 1, 1 << 16, bad + "image width"));
  } else {
    for (double h : r.read("/architecture/hidden"))
      a.hidden.push_back(static_cast<int>(checked_int(h, 1, INT_MAX, bad + "a hidden width")));
  }
  a.input_dim = static_cast<int>(ckpt::read_int(r, "input_dim", 1, INT_MAX, bad));
  a.latent = static_cast<int>(ckpt::read_int(r, "latent", 1, INT_MAX, bad));
  a.likelihood = parse_likelihood(r.read_string_attr("likelihood"));
  if (r.has_attr("posterior")) a.posterior = parse_posterior(r.read_string_attr("posterior"));
  if (a.posterior == Posterior::kFull &&
      (!r.has_attr("lower") || r.read_string_attr("lower") != "relative"))
    throw Error(bad +
                "a full-posterior VAE of an earlier caviar, whose lower triangle is not "
                "relative to sigma; train it again");
  if (r.has_attr("bayesian_decoder")) {
    a.bayesian_decoder = ckpt::read_int(r, "bayesian_decoder", 0, 1, bad) == 1;
    a.prior_scale = r.read_double_attr("prior_scale");
    if (a.bayesian_decoder && (!(a.prior_scale > 0) || !std::isfinite(a.prior_scale)))
      throw Error(bad + "attribute prior_scale must be a positive number");
  }
  return a;
}

// Convolutions as name/W in PyTorch's weight shape ((out, in, k, k) for Conv2d, (in, out, k, k)
// for ConvTranspose2d: both are our row-major out_channels x patch of the convolution `shape`)
// and name/b; batch norms as name/gamma, beta, running_mean, running_var.
void write_conv_parameters(io::FileWriter& w, const Layout& layout, const float* p,
                           const std::vector<double>& running) {
  auto u = [](std::int64_t v) { return static_cast<std::uint64_t>(v); };
  for (const auto* convs : {&layout.conv_encoder, &layout.conv_decoder})
    for (const ConvLayer& c : *convs) {
      const ConvShape& s = c.shape;
      w.write(c.name + "/W", std::vector<double>(p + c.w, p + c.w + s.weights()),
              {u(s.out_channels), u(s.in_channels), u(s.kernel), u(s.kernel)});
      w.write(c.name + "/b", std::vector<double>(p + c.b, p + c.b + c.out_channels()),
              {u(c.out_channels())});
    }
  for (const BatchNormLayer& b : layout.batch_norm) {
    const std::uint64_t n = u(b.channels);
    w.write(b.name + "/gamma", std::vector<double>(p + b.gamma, p + b.gamma + b.channels), {n});
    w.write(b.name + "/beta", std::vector<double>(p + b.beta, p + b.beta + b.channels), {n});
    const double* r = running.data() + b.running;
    w.write(b.name + "/running_mean", std::vector<double>(r, r + b.channels), {n});
    w.write(b.name + "/running_var", std::vector<double>(r + b.channels, r + 2 * b.channels), {n});
  }
}

// Reads what write_conv_parameters wrote, checking every shape.
void read_conv_parameters(const io::FileReader& r, const std::string& file, const Layout& layout,
                          float* p, std::vector<double>& running) {
  auto read = [&](const std::string& name, std::int64_t size, float* to, double* to_d) {
    const std::vector<double> v = r.read(name);
    if (static_cast<std::int64_t>(v.size()) != size)
      throw Error("'" + file + "': " + name + " has the wrong shape for its architecture");
    for (std::int64_t i = 0; i < size; ++i) {
      if (to) to[i] = static_cast<float>(v[i]);
      if (to_d) to_d[i] = v[i];
    }
  };
  for (const auto* convs : {&layout.conv_encoder, &layout.conv_decoder})
    for (const ConvLayer& c : *convs) {
      read(c.name + "/W", c.shape.weights(), p + c.w, nullptr);
      read(c.name + "/b", c.out_channels(), p + c.b, nullptr);
    }
  running.assign(static_cast<std::size_t>(layout.n_running), 0.0);
  for (const BatchNormLayer& b : layout.batch_norm) {
    read(b.name + "/gamma", b.channels, p + b.gamma, nullptr);
    read(b.name + "/beta", b.channels, p + b.beta, nullptr);
    read(b.name + "/running_mean", b.channels, nullptr, running.data() + b.running);
    read(b.name + "/running_var", b.channels, nullptr, running.data() + b.running + b.channels);
    for (int c = 0; c < b.channels; ++c)
      if (!(running[b.running + b.channels + c] >= 0))
        throw Error("'" + file + "': " + b.name + "/running_var has a negative or NaN entry");
  }
}

void write_model(const Comm& comm, const TrainOptions& o, const Layout& layout,
                 const TrainResult& res) {
  comm.on_root([&] {
    io::FileWriter w(o.out);
    write_architecture(w, layout.arch);
    // Weights by layer name; a layer with two heads is saved as two (rows split evenly).
    for (const Dense* d : layout.layers()) {
      std::int64_t row0 = 0;
      for (std::size_t k = 0; k < d->parts.size(); ++k) {
        const int rows = d->rows[k];
        const float* wp = res.params.data() + d->w + row0 * d->in;
        const float* bp = res.params.data() + d->b + row0;
        const io::Dims wdims{static_cast<std::uint64_t>(rows), static_cast<std::uint64_t>(d->in)};
        const std::int64_t nw = static_cast<std::int64_t>(rows) * d->in;
        w.write(d->parts[k] + "/W", std::vector<double>(wp, wp + nw), wdims);
        w.write(d->parts[k] + "/b", std::vector<double>(bp, bp + rows),
                {static_cast<std::uint64_t>(rows)});
        if (d->log_sigma_w >= 0) {  // a Bayesian decoder: W and b are q's means
          const float* lw = res.params.data() + d->log_sigma_w + row0 * d->in;
          const float* lb = res.params.data() + d->log_sigma_b + row0;
          w.write(d->parts[k] + "/W_log_sigma", std::vector<double>(lw, lw + nw), wdims);
          w.write(d->parts[k] + "/b_log_sigma", std::vector<double>(lb, lb + rows),
                  {static_cast<std::uint64_t>(rows)});
        }
        row0 += rows;
      }
    }
    write_conv_parameters(w, layout, res.params.data(), res.running);
    w.write("trace/train_elbo", res.train_trace, {res.train_trace.size()});
    w.write("trace/test_elbo", res.test_trace, {res.test_trace.size()});
    w.attr("train_elbo", res.train_elbo);
    w.attr("test_elbo", res.test_elbo);
    // The weights' KL, counted once per epoch in train_elbo; test_elbo is the data term at q's
    // mean weights (an ELBO per test image would subtract decoder_kl / n_samples).
    if (layout.arch.bayesian_decoder) w.attr("decoder_kl", res.decoder_kl);
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

// The image shape of --image "CxHxW", or 1 x s x s for s^2 columns.
std::array<int, 3> image_shape(const std::string& spec, std::int64_t columns) {
  std::array<int, 3> v{};
  if (spec.empty()) {
    const auto s = static_cast<std::int64_t>(std::llround(std::sqrt(static_cast<double>(columns))));
    if (s * s != columns)
      throw Error("--arch conv: the data's " + std::to_string(columns) +
                  " columns are not a square image; give --image CxHxW");
    return {1, static_cast<int>(s), static_cast<int>(s)};
  }
  int used = 0;
  if (std::sscanf(spec.c_str(), "%dx%dx%d%n", &v[0], &v[1], &v[2], &used) != 3 ||
      used != static_cast<int>(spec.size()) || v[0] < 1 || v[1] < 1 || v[2] < 1)
    throw Error("--image must be CxHxW with positive sizes, e.g. 1x28x28 (got '" + spec + "')");
  if (static_cast<std::int64_t>(v[0]) * v[1] * v[2] != columns)
    throw Error("--image " + spec + " has " +
                std::to_string(static_cast<std::int64_t>(v[0]) * v[1] * v[2]) +
                " values; the data has " + std::to_string(columns) + " columns");
  return v;
}

Architecture architecture(const TrainOptions& o, std::int64_t columns) {
  Architecture a{static_cast<int>(columns), o.hidden, o.latent, parse_likelihood(o.likelihood),
                 parse_posterior(o.posterior)};
  a.bayesian_decoder = o.bayesian_decoder;
  a.prior_scale = o.prior_scale;
  a.stl = uses_stl(o);
  if (o.arch == "conv") {
    a.hidden.clear();
    a.channels = o.channels;
    const auto img = image_shape(o.image, columns);
    a.image_channels = img[0];
    a.height = img[1];
    a.width = img[2];
  }
  return a;
}

// Cheap argument checks, so that bad flags fail before any file is read.
void check_architecture(const TrainOptions& o) {
  if (o.arch != "mlp" && o.arch != "conv")
    throw Error("unknown --arch '" + o.arch + "' (expected mlp or conv)");
  if (o.bayesian_decoder && o.arch != "mlp")
    throw Error("--bayesian-decoder applies to --arch mlp only");
  if (o.bayesian_decoder && (!(o.prior_scale > 0) || !std::isfinite(o.prior_scale)))
    throw Error("--prior-scale must be > 0");
  if (o.arch == "conv") {
    if (o.channels.empty()) throw Error("--channels needs at least one count");
    for (int c : o.channels)
      if (c < 1) throw Error("--channels counts must be >= 1 (got " + std::to_string(c) + ")");
  }
  parse_likelihood(o.likelihood);
  parse_posterior(o.posterior);
  if (o.estimator != "reparam" && o.estimator != "stl" && o.estimator != "auto")
    throw Error("unknown --estimator '" + o.estimator + "' (expected reparam, stl or auto)");
  if (o.latent < 1) throw Error("--latent must be >= 1 (got " + std::to_string(o.latent) + ")");
  if (o.hidden.empty()) throw Error("--hidden needs at least one width");
  for (int h : o.hidden)
    if (h < 1) throw Error("--hidden widths must be >= 1 (got " + std::to_string(h) + ")");
}

engine::GradientSchedule schedule(const TrainOptions& o) {
  engine::GradientSchedule s;
  s.batch_size = o.batch_size;
  s.micro_blocks = o.micro_blocks;
  s.seed = o.seed;
  s.order = Stream::kVaeShuffle;
  s.exact = o.reduction == "exact";
  s.optimizer.adam.lr = o.lr;
  s.optimizer.adam.weight_decay = o.weight_decay;
  return s;
}

// The epoch lines' report: this epoch's seconds (training and evaluation) and rows per second.
engine::Progress epoch_progress(const TrainOptions& o, std::int64_t n, double start,
                                const double* eval_seconds, const EpochProgress& progress) {
  if (!progress) return {};
  auto last = std::make_shared<std::pair<double, double>>(start, 0.0);  // (fit clock, eval)
  return [&o, n, eval_seconds, progress, last](const engine::Report& r) {
    const double train = r.seconds - last->first, eval = *eval_seconds - last->second;
    *last = {r.seconds, *eval_seconds};
    EpochReport rep;
    rep.epoch = r.iteration;
    rep.epochs = o.epochs;
    rep.train_elbo = r.objective;
    rep.test_elbo = r.heldout;
    rep.seconds = train + eval;
    rep.rows_per_second = static_cast<double>(n) / train;
    progress(rep);
  };
}

TrainResult to_result(const engine::RunResult& r, int resumed_epochs, double resumed_seconds,
                      std::int64_t n, double eval_seconds, bool has_test) {
  TrainResult res;
  res.train_trace = r.trace.objective;
  res.test_trace = has_test ? r.trace.heldout
                            : std::vector<double>(r.trace.objective.size(),
                                                  std::numeric_limits<double>::quiet_NaN());
  if (!res.train_trace.empty()) res.train_elbo = res.train_trace.back();
  res.test_elbo =
      res.test_trace.empty() ? std::numeric_limits<double>::quiet_NaN() : res.test_trace.back();
  res.epochs = r.iterations;
  res.epochs_run = r.iterations - resumed_epochs;
  res.steps = r.steps;
  res.n = n;
  res.train_seconds = r.seconds - resumed_seconds;
  res.compute_seconds = r.local_seconds_max;
  res.reduce_seconds = r.reduce_seconds_max;
  res.update_seconds = r.update_seconds_max;
  res.eval_seconds = eval_seconds;
  return res;
}

}  // namespace

TrainResult train(const Comm& comm, const TrainOptions& o, const EpochProgress& progress) {
  const auto t_start = Clock::now();
  check_architecture(o);
  std::vector<std::string> inputs{io::DataRef::parse(o.data).file};
  if (!o.test.empty()) inputs.push_back(io::DataRef::parse(o.test).file);
  if (!o.out.empty()) {
    std::vector<std::string> read = inputs;
    if (!o.resume.empty()) read.push_back(o.resume);
    io::check_output_path(comm, o.out, read);
  }
  // --checkpoint alone: at every epoch's end, as the VAE always did.
  const std::string every =
      o.checkpoint_every.empty() && !o.checkpoint.empty() ? std::string("1") : o.checkpoint_every;
  engine::Checkpointer ck(comm, {o.checkpoint, every, o.resume}, inputs, o.out);

  const io::DataRef ref = io::DataRef::parse(o.data);
  const io::MatrixShape shape = io::inspect_matrix(comm, ref);
  validate(o, shape.rows);
  const Layout layout(architecture(o, shape.cols));
  const Mat<float> data = load_all_rows(comm, ref, shape, layout.arch.likelihood);
  std::optional<FloatShard> test;
  if (!o.test.empty())
    test = load_float_shard(comm, o.test, layout.arch.likelihood, layout.input_dim());
  ck.open(!o.checkpoint.empty() || !o.resume.empty() ? fingerprint(comm, o, ref, shape)
                                                     : ckpt::Fingerprint("vae"));
  const std::int64_t steps_per_epoch = (shape.rows + o.batch_size - 1) / o.batch_size;
  if (static_cast<double>(o.epochs) * steps_per_epoch >= kFirstReservedStep)
    throw Error("too many training steps for the 32-bit noise counter");

  GradientFit model(layout, data, xavier_init(layout, o.seed), o.samples, o.seed);
  engine::GradientRun run;
  run.comm = &comm;
  run.stop = {o.epochs, 0.0};  // no --tol: every epoch runs
  run.checkpoint = &ck;
  run.global_rows = shape.rows;
  run.rows = {0, shape.rows};
  run.schedule = schedule(o);
  double eval_seconds = 0;
  if (test)
    run.heldout = [&] {
      const auto t0 = Clock::now();
      const double e = evaluate_elbo(comm, layout, model.params().data(), model.running().data(),
                                     *test, o.samples, o.seed) /
                       static_cast<double>(test->shape.rows);
      eval_seconds += seconds_since(t0);
      return e;
    };
  run.progress = epoch_progress(o, shape.rows, ck.elapsed(), &eval_seconds, progress);
  const engine::RunResult r = engine::fit_gradient(model, run);
  TrainResult res =
      to_result(r, ck.iteration(), ck.elapsed(), shape.rows, eval_seconds, test.has_value());
  res.decoder_kl = model.decoder_kl();
  res.params = std::move(model.params());
  res.running = model.running();
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
      std::int64_t row0 = 0;
      for (std::size_t k = 0; k < d->parts.size(); ++k) {
        const std::int64_t rows = d->rows[k];
        io::Dims dims;
        const auto w = r.read(d->parts[k] + "/W", &dims);
        const auto b = r.read(d->parts[k] + "/b");
        if (dims != io::Dims{static_cast<std::uint64_t>(rows), static_cast<std::uint64_t>(d->in)} ||
            static_cast<std::int64_t>(b.size()) != rows)
          throw Error("'" + file + "': " + d->parts[k] +
                      " has the wrong shape for its architecture");
        std::copy(w.begin(), w.end(), p.begin() + d->w + row0 * d->in);
        std::copy(b.begin(), b.end(), p.begin() + d->b + row0);
        if (d->log_sigma_w >= 0) {
          const auto lw = r.read(d->parts[k] + "/W_log_sigma");
          const auto lb = r.read(d->parts[k] + "/b_log_sigma");
          if (lw.size() != w.size() || lb.size() != b.size())
            throw Error("'" + file + "': " + d->parts[k] +
                        "'s log sigma has the wrong shape for its architecture");
          std::copy(lw.begin(), lw.end(), p.begin() + d->log_sigma_w + row0 * d->in);
          std::copy(lb.begin(), lb.end(), p.begin() + d->log_sigma_b + row0);
        }
        row0 += rows;
      }
    }
    std::vector<double> running;
    read_conv_parameters(r, file, layout, p.data(), running);
    model.emplace(LoadedModel{std::move(layout), std::move(p), std::move(running)});
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
      struct RemoveTemporary {
        const std::string& f;
        bool on;
        ~RemoveTemporary() {
          std::error_code ec;
          if (on) std::filesystem::remove(f, ec);
        }
      } remove_h5{h5, temporary};
      run_plot_script(script, {"grid", h5, "--png", o.png}, o.png);
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
  Network<float>(m.layout, m.running.data()).decode_mean(m.params.data(), eps, mean);
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
  Network<float> net(m.layout, m.running.data());
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
  Network<float>(m.layout, m.running.data()).decode_mean(m.params.data(), z, mean);
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
  std::vector<Network<float>> nets(static_cast<std::size_t>(threads),
                                   Network<float>(m.layout, m.running.data()));
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

namespace {

// Samples per forward pass of the importance-weighted bound: the pieces a row's k samples are
// computed in, a constant, so the running log-sum-exp is the same at any rank or thread count.
constexpr int kImportancePiece = 128;

// log (1/k) sum_s w_s for one row (Burda, Grosse & Salakhutdinov 2016, eq. 8), its k weights
// computed in pieces and combined by a running log-sum-exp in double.
double importance_log_px(Network<float>& net, const float* params, const Mat<float>& x,
                         std::int64_t row, int k, int z, std::uint64_t seed, Mat<float>& eps,
                         Eigen::MatrixXd& logw) {
  double m = -std::numeric_limits<double>::infinity(), acc = 0;
  for (int first = 0; first < k; first += kImportancePiece) {
    const int count = std::min(kImportancePiece, k - first);
    fill_noise_samples(eps, row, first, count, k, z, seed, kImportanceStep);
    net.log_weights(params, x, eps, count, logw);
    const double piece_max = logw.maxCoeff();
    if (!std::isfinite(piece_max)) return piece_max;  // NaN or -inf: reported by the caller
    if (piece_max > m) {
      acc *= std::exp(m - piece_max);
      m = piece_max;
    }
    acc += (logw.array() - m).exp().sum();
  }
  return m + std::log(acc) - std::log(static_cast<double>(k));
}

}  // namespace

ScoreResult score(const Comm& comm, const ScoreOptions& o) {
  if (o.importance_samples < 1)
    throw Error("--importance-samples must be >= 1 (got " + std::to_string(o.importance_samples) +
                ")");
  if (!o.out.empty())
    io::check_output_path(comm, o.out, {o.model, io::DataRef::parse(o.data).file});
  const auto t0 = Clock::now();
  LoadedModel m = load_model(comm, o.model);
  const FloatShard s =
      load_float_shard(comm, o.data, m.layout.arch.likelihood, m.layout.input_dim());
  ScoreResult r;
  r.n = s.shape.rows;
  r.importance_samples = o.importance_samples;
  r.elbo = evaluate_elbo(comm, m.layout, m.params.data(), m.running.data(), s, 1, o.seed) /
           static_cast<double>(s.shape.rows);

  // Per row, then summed in fixed blocks in block order (as evaluate_elbo): the same total at any
  // rank or thread count.
  const std::int64_t n_blocks = (s.shape.rows + kBlockRows - 1) / kBlockRows;
  std::vector<double> block_sums(static_cast<std::size_t>(n_blocks), 0.0);
  std::vector<double> log_px(static_cast<std::size_t>(s.range.size()));
  const int threads = max_threads(), z = m.layout.latent();
  std::vector<Network<float>> nets(static_cast<std::size_t>(threads),
                                   Network<float>(m.layout, m.running.data()));
  std::vector<Mat<float>> xs(threads), eps(threads);
  std::vector<Eigen::MatrixXd> logw(threads);
  std::atomic<std::int64_t> done{0};
  const bool report = o.progress && comm.is_root();
  auto last = Clock::now();
  parallel_blocks(s.range.size(), kBlockRows, threads, [&](int t, std::int64_t b, std::int64_t e) {
    double sum = 0;
    for (std::int64_t i = b; i < e; ++i) {
      xs[t] = s.x.col(i);
      log_px[i] = importance_log_px(nets[t], m.params.data(), xs[t], s.range.begin + i,
                                    o.importance_samples, z, o.seed, eps[t], logw[t]);
      sum += log_px[i];
    }
    block_sums[(s.range.begin + b) / kBlockRows] = sum;
    done += e - b;
    if (report && t == 0 && seconds_since(last) > 10) {
      last = Clock::now();
      o.progress(static_cast<double>(done.load()) / static_cast<double>(s.range.size()));
    }
  });
  comm.allreduce_sum(std::span<double>(block_sums));
  double total = 0;
  for (double v : block_sums) total += v;
  if (!std::isfinite(total))
    throw Error("the importance-weighted estimate of log p(x) is not finite for some row of " +
                o.data + " (a weight overflowed or the model gives it zero density)");
  r.log_px = total / static_cast<double>(s.shape.rows);
  if (!o.out.empty()) {
    io::ParallelRowWriter w(comm, o.out);
    w.write_rows("log_px", s.shape.rows, s.range, log_px.data(), {});
    w.commit();
  }
  r.seconds = seconds_since(t0);
  return r;
}

}  // namespace caviar::vae
