#include "inference/gmm_driver.hpp"

#include <chrono>
#include <cmath>
#include <limits>

#include "core/error.hpp"
#include "core/parallel.hpp"
#include "inference/init.hpp"
#include "inference/shard.hpp"
#include "io/h5.hpp"

namespace caviar::gmm {

using Eigen::MatrixXd;
using Eigen::VectorXd;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct Moments {
  VectorXd mean;
  MatrixXd cov;  // unbiased (N - 1), as numpy.cov and scikit-learn's covariance_prior default
};

// Global mean and covariance in two passes (mean first, then the centred scatter), one allreduce
// each.
Moments data_moments(const Comm& comm, const Shard& s) {
  const Eigen::Index d = s.x.cols();
  Moments m;
  m.mean = s.x.colwise().sum().transpose();
  comm.allreduce_sum(std::span<double>(m.mean.data(), d));
  m.mean /= static_cast<double>(s.shape.rows);
  const RowMatrix xc = s.x.rowwise() - m.mean.transpose();
  m.cov = xc.transpose() * xc;
  comm.allreduce_sum(std::span<double>(m.cov.data(), d * d));
  m.cov /= std::max<double>(1.0, static_cast<double>(s.shape.rows - 1));
  return m;
}

Prior make_prior(const FitOptions& o, int d, const Moments& mom) {
  Prior p = default_prior(o.covariance, d, o.components);
  if (o.alpha0) p.alpha0 = *o.alpha0;
  if (o.beta0) p.beta0 = *o.beta0;
  if (o.nu0) p.nu0 = *o.nu0;
  if (!(p.alpha0 > 0)) throw Error("--alpha0 must be > 0");
  if (!(p.beta0 > 0)) throw Error("--beta0 must be > 0");
  // The Wishart needs nu0 > D - 1; the diagonal model's 1-D Wisharts need nu0 > 0.
  const double min_nu = o.covariance == Covariance::kFull ? d - 1.0 : 0.0;
  if (!(p.nu0 > min_nu))
    throw Error("--nu0 must be > " + std::to_string(static_cast<int>(min_nu)) + " (got " +
                std::to_string(p.nu0) + ")");
  if (o.prior_mean == "data")
    p.m0 = mom.mean;
  else if (o.prior_mean != "zero")
    throw Error("--prior-mean must be zero or data");
  if (o.prior_scale == "data") {
    if (o.covariance == Covariance::kFull)
      p.W0_inv = mom.cov;
    else
      p.W0_inv = mom.cov.diagonal();
    if (Eigen::LLT<MatrixXd>(o.covariance == Covariance::kFull ? p.W0_inv
                                                               : MatrixXd(p.W0_inv.asDiagonal()))
            .info() != Eigen::Success)
      throw Error("--prior-scale data: the data covariance is singular (a constant feature?)");
  } else if (o.prior_scale != "identity") {
    throw Error("--prior-scale must be identity or data");
  }
  return p;
}

RowMatrix initial_responsibilities(const Comm& comm, const FitOptions& o, const Shard& s) {
  const int k = o.components;
  if (o.init == "random") return random_responsibilities(s.range.begin, s.x.rows(), k, o.seed);
  if (o.init == "kmeans++")
    return kmeans_responsibilities(comm, s.x, s.range, s.shape.rows, k, o.seed, o.kmeans_iter);
  // Anything else names a dataset of initial responsibilities, N x K.
  const io::DataRef ref = io::DataRef::parse(o.init, "/resp");
  const io::MatrixShape shape = io::inspect_matrix(comm, ref);
  if (shape.rows != s.shape.rows || shape.cols != k)
    throw Error("--init " + ref.str() + " is " + std::to_string(shape.rows) + " x " +
                std::to_string(shape.cols) + "; expected " + std::to_string(s.shape.rows) + " x " +
                std::to_string(k) + " (rows x components)");
  RowMatrix r = io::read_rows(comm, ref, shape, s.range);
  std::string err;
  for (Eigen::Index i = 0; i < r.rows() && err.empty(); ++i) {
    const double sum = r.row(i).sum();
    if (!r.row(i).allFinite() || (r.row(i).array() < 0).any() || !(sum > 0))
      err = "--init " + ref.str() + ": row " + std::to_string(s.range.begin + i) +
            " is not a set of non-negative weights with a positive sum";
    else
      r.row(i) /= sum;
  }
  comm.raise_if_any(err);
  return r;
}

void write_matrices(io::FileWriter& w, const std::string& name, const std::vector<MatrixXd>& ms,
                    Covariance cov) {
  const std::size_t k = ms.size(), d = static_cast<std::size_t>(ms.empty() ? 0 : ms[0].rows());
  std::vector<double> buf;
  buf.reserve(k * d * d);
  for (const auto& m : ms) {
    // Row-major on disk: element (i, j) at i * D + j. Symmetric matrices read the same either way.
    for (Eigen::Index i = 0; i < m.rows(); ++i)
      for (Eigen::Index j = 0; j < m.cols(); ++j) buf.push_back(m(i, j));
  }
  if (cov == Covariance::kFull)
    w.write(name, buf, {k, d, d});
  else
    w.write(name, buf, {k, d});
}

void write_vector(io::FileWriter& w, const std::string& name, const VectorXd& v) {
  w.write(name, std::span<const double>(v.data(), v.size()),
          {static_cast<std::uint64_t>(v.size())});
}

void write_rowmatrix(io::FileWriter& w, const std::string& name, const RowMatrix& m) {
  w.write(name, std::span<const double>(m.data(), m.size()),
          {static_cast<std::uint64_t>(m.rows()), static_cast<std::uint64_t>(m.cols())});
}

void write_model(const Model& model, const FitOptions& o, const FitResult& r, const Comm& comm) {
  io::FileWriter w(o.out);
  const Covariance cov = model.covariance();
  const Posterior& p = model.posterior();
  // The scikit-learn-like summary.
  write_vector(w, "weights", model.weights());
  write_rowmatrix(w, "means", p.m);
  write_matrices(w, "covariances", model.covariances(), cov);
  // The variational posterior, enough to recompute the ELBO and the predictive density.
  write_vector(w, "posterior/alpha", p.alpha);
  write_vector(w, "posterior/beta", p.beta);
  write_rowmatrix(w, "posterior/m", p.m);
  write_matrices(w, "posterior/W", model.scale_matrices(), cov);
  write_matrices(w, "posterior/W_inv", p.W_inv, cov);  // exact natural parameter, for reloading
  write_vector(w, "posterior/nu", p.nu);
  const Prior& pr = model.prior();
  w.write_scalar("prior/alpha0", pr.alpha0);
  w.write_scalar("prior/beta0", pr.beta0);
  w.write_scalar("prior/nu0", pr.nu0);
  write_vector(w, "prior/m0", pr.m0);
  const std::uint64_t d = static_cast<std::uint64_t>(model.dim());
  const auto dims = cov == Covariance::kFull ? io::Dims{d, d} : io::Dims{d};
  w.write("prior/W0_inv", std::span<const double>(pr.W0_inv.data(), pr.W0_inv.size()), dims);
  // W0 for readers who want the scale itself (output only; computations use W0_inv).
  const MatrixXd w0 = cov == Covariance::kFull
                          ? MatrixXd(pr.W0_inv.llt().solve(MatrixXd::Identity(d, d)))
                          : MatrixXd(pr.W0_inv.cwiseInverse());
  w.write("prior/W0", std::span<const double>(w0.data(), w0.size()), dims);
  w.write("trace/elbo", r.trace, {r.trace.size()});
  w.attr("model", std::string("gmm"));
  w.attr("algorithm", std::string("cavi"));
  w.attr("covariance_type", to_string(cov));
  w.attr("elbo", r.elbo);
  w.attr("n_iter", static_cast<std::int64_t>(r.iterations));
  w.attr("converged", static_cast<std::int64_t>(r.converged));
  w.attr("n_samples", r.n);
  w.attr("ranks", static_cast<std::int64_t>(comm.size()));
  w.attr("threads", static_cast<std::int64_t>(max_threads()));
  w.attr("seed", static_cast<std::int64_t>(o.seed));
  w.attr("init", o.init);
  w.attr("data", o.data);
  w.attr("tol", o.tol);
  w.attr("version", o.version);
  w.attr("command", o.command);
  w.commit();
}

void write_labels(const Comm& comm, const std::string& out, const Shard& s, const RowMatrix& resp,
                  bool save_resp) {
  std::vector<std::int64_t> labels(static_cast<std::size_t>(resp.rows()));
  for (Eigen::Index i = 0; i < resp.rows(); ++i) {
    Eigen::Index k;
    resp.row(i).maxCoeff(&k);
    labels[static_cast<std::size_t>(i)] = k;
  }
  io::ParallelRowWriter w(comm, out);
  w.write_rows("labels", s.shape.rows, s.range, labels.data(), {});
  if (save_resp)
    w.write_rows("responsibilities", s.shape.rows, s.range, resp.data(),
                 {static_cast<std::uint64_t>(resp.cols())});
  w.commit();
}

// Reads a model file written by fit (every rank reads the small file itself).
Model load_model(const Comm& comm, const std::string& file) {
  std::optional<Model> model;
  comm.agree([&] {
    io::FileReader r(file);
    if (!r.has("/posterior/alpha") || !r.has("/posterior/W_inv"))
      throw Error("'" + file + "' is not a caviar gmm model (no /posterior)");
    const Covariance cov = parse_covariance(r.read_string_attr("covariance_type"));
    io::Dims dims;
    const auto alpha = r.read("/posterior/alpha", &dims);
    const int k = static_cast<int>(alpha.size());
    const auto m = r.read("/posterior/m", &dims);
    if (dims.size() != 2 || dims[0] != static_cast<std::uint64_t>(k))
      throw Error("'" + file + "': /posterior/m has the wrong shape");
    const int d = static_cast<int>(dims[1]);
    Posterior p;
    p.alpha = Eigen::Map<const VectorXd>(alpha.data(), k);
    const auto beta = r.read("/posterior/beta");
    const auto nu = r.read("/posterior/nu");
    const auto winv = r.read("/posterior/W_inv");
    const std::size_t per = cov == Covariance::kFull ? std::size_t(d) * d : std::size_t(d);
    if (beta.size() != std::size_t(k) || nu.size() != std::size_t(k) || winv.size() != per * k)
      throw Error("'" + file + "': inconsistent posterior shapes");
    p.beta = Eigen::Map<const VectorXd>(beta.data(), k);
    p.nu = Eigen::Map<const VectorXd>(nu.data(), k);
    p.m = Eigen::Map<const RowMatrix>(m.data(), k, d);
    for (int j = 0; j < k; ++j) {
      if (cov == Covariance::kFull)
        p.W_inv.push_back(Eigen::Map<const MatrixXd>(winv.data() + j * per, d, d));
      else
        p.W_inv.push_back(Eigen::Map<const MatrixXd>(winv.data() + j * per, d, 1));
    }
    // The shift only conditions the arithmetic; the weighted mean of the means is a good one.
    const VectorXd shift = p.m.transpose() * (p.alpha / p.alpha.sum());
    Prior prior = default_prior(cov, d, k);  // not used for scoring or prediction
    model.emplace(cov, k, prior, shift);
    model->set_posterior(std::move(p));
  });
  return std::move(*model);
}

}  // namespace

FitResult fit(const Comm& comm, const FitOptions& o, const Progress& progress) {
  const auto t0 = std::chrono::steady_clock::now();
  const io::DataRef ref = io::DataRef::parse(o.data);
  if (o.components < 1)
    throw Error("--components must be >= 1 (got " + std::to_string(o.components) + ")");
  if (o.max_iter < 0) throw Error("--max-iter must be >= 0");
  if (!(o.tol >= 0) || !std::isfinite(o.tol)) throw Error("--tol must be a finite number >= 0");
  std::vector<std::string> inputs{ref.file};
  if (o.init != "random" && o.init != "kmeans++") inputs.push_back(io::DataRef::parse(o.init).file);
  if (!o.out.empty()) io::check_output_path(comm, o.out, inputs);
  if (!o.labels.empty()) io::check_output_path(comm, o.labels, inputs);
  if (!o.out.empty() && o.out == o.labels) throw Error("--out and --labels name the same file");

  Shard shard = load_shard(comm, ref);
  if (o.components > shard.shape.rows)
    throw Error("--components " + std::to_string(o.components) + " exceeds the number of rows (" +
                std::to_string(shard.shape.rows) + ") in " + ref.str());
  const int d = static_cast<int>(shard.shape.cols);
  const Moments mom = data_moments(comm, shard);
  Model model(o.covariance, o.components, make_prior(o, d, mom), mom.mean);

  Stats stats = model.make_stats();
  {
    const RowMatrix r0 = initial_responsibilities(comm, o, shard);
    model.accumulate(shard.x, r0, stats);
  }
  comm.allreduce_sum(stats.buffer());
  comm.agree([&] { model.update(stats); });

  FitResult res;
  res.n = shard.shape.rows;
  RowMatrix resp;
  RowMatrix* resp_out = o.labels.empty() ? nullptr : &resp;
  for (int it = 0;; ++it) {
    stats.set_zero();
    model.local_step(shard.x, stats, resp_out);
    comm.allreduce_sum(stats.buffer());
    const double elbo = model.elbo(stats);
    const double rel = res.trace.empty()
                           ? std::numeric_limits<double>::quiet_NaN()
                           : std::abs(elbo - res.trace.back()) / std::max(std::abs(elbo), 1e-300);
    res.trace.push_back(elbo);
    res.iterations = it;
    if (progress) progress({it, elbo, rel, seconds_since(t0)});
    if (!std::isfinite(elbo))
      throw Error("the ELBO is not finite at iteration " + std::to_string(it));
    if (it > 0 && rel < o.tol) {
      res.converged = true;
      break;
    }
    if (it >= o.max_iter) break;
    comm.agree([&] { model.update(stats); });
  }
  res.elbo = res.trace.back();
  res.seconds = seconds_since(t0);

  if (!o.out.empty()) {
    std::string err;
    if (comm.is_root()) {
      try {
        write_model(model, o, res, comm);
      } catch (const Error& e) {
        err = e.what();
      }
    }
    comm.broadcast(err, 0);
    if (!err.empty()) throw Error(err);
  }
  if (!o.labels.empty()) write_labels(comm, o.labels, shard, resp, o.save_responsibilities);
  return res;
}

ScoreResult score(const Comm& comm, const std::string& model_file, const std::string& data) {
  const Model model = load_model(comm, model_file);
  const io::DataRef ref = io::DataRef::parse(data);
  const Shard shard = load_shard(comm, ref);
  if (shard.shape.cols != model.dim())
    throw Error("data " + ref.str() + " has " + std::to_string(shard.shape.cols) +
                " features but the model has " + std::to_string(model.dim()));
  double sum = model.log_predictive_sum(shard.x);
  comm.allreduce_sum(std::span<double>(&sum, 1));
  return {sum / static_cast<double>(shard.shape.rows), shard.shape.rows};
}

std::int64_t predict(const Comm& comm, const std::string& model_file, const std::string& data,
                     const std::string& out, bool save_responsibilities) {
  const io::DataRef ref = io::DataRef::parse(data);
  io::check_output_path(comm, out, {ref.file, model_file});
  const Model model = load_model(comm, model_file);
  const Shard shard = load_shard(comm, ref);
  if (shard.shape.cols != model.dim())
    throw Error("data " + ref.str() + " has " + std::to_string(shard.shape.cols) +
                " features but the model has " + std::to_string(model.dim()));
  Stats stats = model.make_stats();
  RowMatrix resp;
  model.local_step(shard.x, stats, &resp);
  write_labels(comm, out, shard, resp, save_responsibilities);
  return shard.shape.rows;
}

}  // namespace caviar::gmm
