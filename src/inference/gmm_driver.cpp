#include "inference/gmm_driver.hpp"

#include <chrono>
#include <cmath>
#include <limits>
#include <memory>

#include "core/error.hpp"
#include "core/parallel.hpp"
#include "data/block_sum.hpp"
#include "data/minibatch.hpp"
#include "engine/batch.hpp"
#include "engine/checkpoint.hpp"
#include "engine/model_file.hpp"
#include "engine/sampler.hpp"
#include "engine/stochastic.hpp"
#include "inference/gmm_checkpoint.hpp"
#include "inference/gmm_driver_internal.hpp"
#include "inference/shard.hpp"
#include "io/h5.hpp"
#include "io/h5_stream.hpp"
#include "models/gmm/batch.hpp"
#include "models/gmm/init.hpp"
#include "models/gmm/sample.hpp"
#include "models/gmm/svi.hpp"
#include "models/gmm_gibbs/blocked.hpp"

namespace caviar::gmm {

using Eigen::MatrixXd;
using Eigen::VectorXd;
using namespace driver;

Algorithm parse_algorithm(const std::string& s) {
  if (s == "cavi") return Algorithm::kCavi;
  if (s == "svi") return Algorithm::kSvi;
  if (s == "em") return Algorithm::kEm;
  throw Error("unknown algorithm '" + s + "' (expected cavi, svi or em)");
}

std::string to_string(Algorithm a) {
  return a == Algorithm::kCavi ? "cavi" : a == Algorithm::kSvi ? "svi" : "em";
}

Schedule parse_schedule(const std::string& s) {
  if (s == "robbins-monro" || s == "rm") return Schedule::kRobbinsMonro;
  if (s == "adaptive") return Schedule::kAdaptive;
  throw Error("unknown schedule '" + s + "' (expected robbins-monro (rm) or adaptive)");
}

std::string to_string(Schedule s) {
  return s == Schedule::kRobbinsMonro ? "robbins-monro" : "adaptive";
}

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Sums per-block vectors exactly over this rank's chunks and then over ranks (BlockExactSum):
// block(x, r0, r1, out) adds rows [r0, r1) of a chunk (a run of whole global blocks) to out.
template <class Block>
std::vector<double> exact_block_sum(const Comm& comm, const Source& src, std::vector<int> exponents,
                                    Block&& block) {
  BlockExactSum sum(std::move(exponents));
  src.for_each_chunk([&](const RowMatrix& x, std::int64_t) {
    sum.add_run(x.rows(), [&](std::int64_t r0, std::int64_t r1, double* out) {
      block(x, Eigen::Index(r0), Eigen::Index(r1), out);
    });
  });
  return sum.finish(comm);
}

}  // namespace

namespace driver {

// Global mean (and, if asked, covariance) of the data, summed exactly so that the shift c and the
// prior do not depend on the rank count, and the bounds max |x - mean| of the exact statistics.
// Three passes: max |x| (the grid of the mean; a streamed source is also checked for NaN/Inf
// here), the mean, then max |x - mean| and the centred scatter.
Moments data_moments(const Comm& comm, const Source& src, bool with_cov) {
  const Eigen::Index d = src.shape().cols;
  const auto ud = static_cast<std::size_t>(d);
  const double n2 = 2.0 * static_cast<double>(src.shape().rows);
  Moments m;
  VectorXd max_x = VectorXd::Zero(d);
  src.for_each_chunk([&](const RowMatrix& x, std::int64_t first) {
    if (src.streaming()) comm.raise_if_any(find_non_finite(x, first, src.ref()));
    if (x.rows() > 0) max_x = max_x.cwiseMax(x.cwiseAbs().colwise().maxCoeff().transpose());
  });
  comm.allreduce_max(std::span<double>(max_x.data(), ud));
  std::vector<int> e(ud);
  for (std::size_t j = 0; j < ud; ++j) e[j] = bound_exponent(n2 * max_x[Eigen::Index(j)]);
  const std::vector<double> sum = exact_block_sum(
      comm, src, e, [&](const RowMatrix& x, Eigen::Index r0, Eigen::Index r1, double* out) {
        for (Eigen::Index i = r0; i < r1; ++i)
          for (Eigen::Index j = 0; j < d; ++j) out[j] += x(i, j);
      });
  m.mean = Eigen::Map<const VectorXd>(sum.data(), d) / static_cast<double>(src.shape().rows);
  m.max_abs = VectorXd::Zero(d);
  src.for_each_chunk([&](const RowMatrix& x, std::int64_t) {
    if (x.rows() > 0)
      m.max_abs = m.max_abs.cwiseMax(
          (x.rowwise() - m.mean.transpose()).cwiseAbs().colwise().maxCoeff().transpose());
  });
  comm.allreduce_max(std::span<double>(m.max_abs.data(), ud));
  if (!with_cov) return m;
  std::vector<int> ec(ud * ud);
  for (std::size_t i = 0; i < ud; ++i)
    for (std::size_t j = 0; j < ud; ++j)
      ec[i * ud + j] = bound_exponent(n2 * m.max_abs[Eigen::Index(i)] * m.max_abs[Eigen::Index(j)]);
  const std::vector<double> scatter = exact_block_sum(
      comm, src, ec, [&](const RowMatrix& x, Eigen::Index r0, Eigen::Index r1, double* out) {
        const RowMatrix xc = x.middleRows(r0, r1 - r0).rowwise() - m.mean.transpose();
        Eigen::Map<MatrixXd>(out, d, d).noalias() += xc.transpose() * xc;
      });
  m.cov = Eigen::Map<const MatrixXd>(scatter.data(), d, d) /
          std::max<double>(1.0, static_cast<double>(src.shape().rows - 1));
  return m;
}

}  // namespace driver

namespace {

// A fresh statistics buffer: exact (the default; see Stats) on the grid of the data's bounds, or
// plain doubles with --fast-reduce.
Stats new_stats(const FitOptions& o, const Model& model, const Moments& mom, std::int64_t n) {
  Stats s = model.make_stats();
  if (!o.fast_reduce) s.make_exact(model.exact_exponents(static_cast<double>(n), mom.max_abs));
  return s;
}

// Runs f(x, first_row) over the source's chunks; an Error thrown by f on one rank is agreed on
// every rank after the loop (not inside it: a streamed chunk read is collective).
template <class F>
void each_chunk_agreed(const Comm& comm, const Source& src, F&& f) {
  std::string err;
  src.for_each_chunk([&](const RowMatrix& x, std::int64_t first) {
    if (!err.empty()) return;
    try {
      f(x, first);
    } catch (const Error& e) {
      err = e.what();
    }
  });
  comm.raise_if_any(err);
}

}  // namespace

namespace driver {

Prior make_prior(const FitOptions& o, int d, const Moments& mom) {
  Prior p = default_prior(o.covariance, d, o.components);
  p.weights = o.weights;
  if (o.alpha0) p.alpha0 = *o.alpha0;
  if (o.beta0) p.beta0 = *o.beta0;
  if (o.nu0) p.nu0 = *o.nu0;
  if (!(p.alpha0 > 0)) throw Error("--alpha0 must be > 0");
  if (!(p.beta0 > 0)) throw Error("--beta0 must be > 0");
  // The Wishart needs nu0 > D - 1; the diagonal and spherical models' 1-D Wisharts need nu0 > 0.
  const bool full = full_moments(o.covariance);
  const double min_nu = full ? d - 1.0 : 0.0;
  if (!(p.nu0 > min_nu))
    throw Error("--nu0 must be > " + std::to_string(static_cast<int>(min_nu)) + " (got " +
                std::to_string(p.nu0) + ")");
  if (o.prior_mean == "data")
    p.m0 = mom.mean;
  else if (o.prior_mean != "zero")
    throw Error("--prior-mean must be zero or data");
  if (o.prior_scale == "data") {
    if (full)
      p.W0_inv = mom.cov;
    else if (o.covariance == Covariance::kDiag)
      p.W0_inv = mom.cov.diagonal();
    else  // spherical: the mean variance, as scikit-learn's covariance_prior
      p.W0_inv = VectorXd::Constant(d, mom.cov.diagonal().mean());
    if (Eigen::LLT<MatrixXd>(full ? p.W0_inv : MatrixXd(p.W0_inv.asDiagonal())).info() !=
        Eigen::Success)
      throw Error("--prior-scale data: the data covariance is singular (a constant feature?)");
  } else if (o.prior_scale != "identity") {
    throw Error("--prior-scale must be identity or data");
  }
  return p;
}

}  // namespace driver

namespace {

// Accumulates the statistics of responsibilities made slice by slice (resp(r0, n) for local rows
// [r0, r0 + n) of x), so that no N x K matrix is ever held. Slices are whole 256-row blocks.
template <class Resp>
void accumulate_sliced(const Model& model, const RowMatrix& x, Stats& stats, Resp&& resp) {
  constexpr Eigen::Index kSlice = 32 * kBlockRows;
  for (Eigen::Index r0 = 0; r0 < x.rows(); r0 += kSlice) {
    const Eigen::Index n = std::min(kSlice, x.rows() - r0);
    model.accumulate(x.middleRows(r0, n), resp(r0, n), stats);
  }
}

// The inverse of write_matrices: K matrices (full, tied: D x D; diag, spherical: D x 1) from a
// flat array in scikit-learn's shape of the covariance type, K x D x D, K x D, D x D (one matrix
// shared by the components) or K (one variance for every feature). Nothing if v has another size.
std::optional<std::vector<MatrixXd>> unpack_matrices(const std::vector<double>& v, Covariance cov,
                                                     int k, int d) {
  const std::size_t per = cov == Covariance::kTied        ? 0
                          : cov == Covariance::kSpherical ? 1
                          : cov == Covariance::kFull      ? std::size_t(d) * d
                                                          : std::size_t(d);
  if (v.size() != (cov == Covariance::kTied ? std::size_t(d) * d : per * k)) return std::nullopt;
  std::vector<MatrixXd> out;
  for (int j = 0; j < k; ++j)
    out.push_back(cov == Covariance::kSpherical
                      ? MatrixXd(MatrixXd::Constant(d, 1, v[std::size_t(j)]))
                      : MatrixXd(Eigen::Map<const MatrixXd>(v.data() + j * per, d,
                                                            full_moments(cov) ? d : 1)));
  return out;
}

// The mixture of --init-params: weights, means and covariances read from FILE.h5 (every rank
// reads the small file itself), checked against the fit's K and D, as an EM model whose E-step
// gives the initial responsibilities. /covariances has scikit-learn's shape of any covariance
// type: K x D x D (full), K x D (diag), D x D (tied; with K = D, when the fit is tied) or K
// (spherical).
Model params_model(const Comm& comm, const std::string& file, int k, int d, Covariance fit_cov) {
  std::optional<Model> model;
  comm.agree([&] {
    const std::string what = "--init-params '" + file + "'";
    io::FileReader r(file);
    for (const char* name : {"/weights", "/means", "/covariances"})
      if (!r.has(name))
        throw Error(what + " has no " + name +
                    " (it needs /weights, /means and /covariances, as a model file of gmm fit "
                    "has)");
    const auto shape = [](const io::Dims& dims) {
      std::string s;
      for (auto v : dims) s += (s.empty() ? "" : " x ") + std::to_string(v);
      return s;
    };
    io::Dims wd, md, cd;
    const auto w = r.read("/weights", &wd);
    const auto m = r.read("/means", &md);
    const auto c = r.read("/covariances", &cd);
    const auto uk = static_cast<std::uint64_t>(k), udim = static_cast<std::uint64_t>(d);
    if (wd != io::Dims{uk} || md != io::Dims{uk, udim})
      throw Error(what + ": /weights is " + shape(wd) + " and /means " + shape(md) +
                  "; this fit needs " + std::to_string(k) + " and " + std::to_string(k) + " x " +
                  std::to_string(d) + " (components x features)");
    const bool tied =
        cd == io::Dims{udim, udim} && (cd != io::Dims{uk, udim} || fit_cov == Covariance::kTied);
    const bool spherical = cd == io::Dims{uk};
    const bool full = cd == io::Dims{uk, udim, udim} || tied;
    if (!full && !spherical && cd != io::Dims{uk, udim})
      throw Error(what + ": /covariances is " + shape(cd) + "; expected " + std::to_string(k) +
                  " x " + std::to_string(d) + " x " + std::to_string(d) + " (full), " +
                  std::to_string(k) + " x " + std::to_string(d) + " (diagonal), " +
                  std::to_string(d) + " x " + std::to_string(d) + " (tied) or " +
                  std::to_string(k) + " (spherical)");
    MlParams p;
    p.weights = Eigen::Map<const VectorXd>(w.data(), k);
    if (!p.weights.allFinite() || (p.weights.array() < 0).any() || !(p.weights.sum() > 0))
      throw Error(what + ": /weights are not non-negative numbers with a positive sum");
    p.weights /= p.weights.sum();
    p.means = Eigen::Map<const RowMatrix>(m.data(), k, d);
    if (!p.means.allFinite()) throw Error(what + ": /means are not all finite");
    const Covariance layout = tied        ? Covariance::kTied
                              : spherical ? Covariance::kSpherical
                              : full      ? Covariance::kFull
                                          : Covariance::kDiag;
    const std::vector<MatrixXd> covs = *unpack_matrices(c, layout, k, d);  // the shape is checked
    for (int j = 0; j < k; ++j) {
      const MatrixXd& cj = covs[std::size_t(j)];
      const bool pd =
          full ? cj.isApprox(cj.transpose()) && Eigen::LLT<MatrixXd>(cj).info() == Eigen::Success
               : (cj.array() > 0).all();
      if (!cj.allFinite() || !pd)
        throw Error(what + ": " +
                    (tied ? std::string("the tied covariance")
                          : "the covariance of component " + std::to_string(j)) +
                    " is not " + (spherical ? "positive" : "symmetric positive definite"));
      p.covariances.push_back(cj);
    }
    const Covariance cov = full ? Covariance::kFull : Covariance::kDiag;
    const VectorXd shift = p.means.transpose() * p.weights;
    model.emplace(cov, k, default_prior(cov, d, k), shift, Estimator::kMaximumLikelihood);
    model->set_ml_params(std::move(p));
  });
  return std::move(*model);
}

}  // namespace

namespace driver {

// The statistics of the initial responsibilities, summed over ranks: k-means++ (rows in
// memory), random (keyed by global row), or read from FILE.h5:/resp chunk by chunk.
Stats initial_stats(const Comm& comm, const FitOptions& o, const std::string& init,
                    const Source& src, const Model& model, const Moments& mom) {
  const int k = o.components;
  Stats stats = new_stats(o, model, mom, src.shape().rows);
  if (!o.init_params.empty()) {
    const Model start =
        params_model(comm, o.init_params, k, static_cast<int>(src.shape().cols), o.covariance);
    each_chunk_agreed(comm, src, [&](const RowMatrix& x, std::int64_t) {
      Stats unused = start.make_stats();
      RowMatrix r;
      start.local_step(x, unused, &r);
      model.accumulate(x, r, stats);
    });
  } else if (init == "kmeans++") {
    if (src.streaming())
      throw Error(
          "--init kmeans++ needs the data in memory; with --stream use --init random or "
          "--init FILE.h5:/resp");
    const Eigen::VectorXi label =
        kmeans_labels(comm, src.rows(), src.range(), src.shape().rows, k, o.seed, o.kmeans_iter);
    comm.agree([&] {
      accumulate_sliced(model, src.rows(), stats, [&](Eigen::Index r0, Eigen::Index n) {
        RowMatrix r = RowMatrix::Zero(n, k);
        for (Eigen::Index i = 0; i < n; ++i) r(i, label[r0 + i]) = 1.0;
        return r;
      });
    });
  } else if (init == "random-from-data") {
    // One-hot rows for K distinct points, zero rows elsewhere: the other points carry no weight
    // in the first M-step (scikit-learn's init_params="random_from_data").
    const std::vector<std::int64_t> seeds = random_rows_from_data(src.shape().rows, k, o.seed);
    each_chunk_agreed(comm, src, [&](const RowMatrix& x, std::int64_t first) {
      accumulate_sliced(model, x, stats, [&](Eigen::Index r0, Eigen::Index n) {
        RowMatrix r = RowMatrix::Zero(n, k);
        for (int j = 0; j < k; ++j) {
          const std::int64_t i = seeds[static_cast<std::size_t>(j)] - (first + r0);
          if (i >= 0 && i < n) r(i, j) = 1.0;
        }
        return r;
      });
    });
  } else if (init == "random") {
    each_chunk_agreed(comm, src, [&](const RowMatrix& x, std::int64_t first) {
      accumulate_sliced(model, x, stats, [&](Eigen::Index r0, Eigen::Index n) {
        return random_responsibilities(first + r0, n, k, o.seed);
      });
    });
  } else {
    // Anything else names a dataset of initial responsibilities, N x K.
    const io::DataRef ref = io::DataRef::parse(init, "/resp");
    const io::MatrixShape shape = io::inspect_matrix(comm, ref);
    if (shape.rows != src.shape().rows || shape.cols != k)
      throw Error("--init " + ref.str() + " is " + std::to_string(shape.rows) + " x " +
                  std::to_string(shape.cols) + "; expected " + std::to_string(src.shape().rows) +
                  " x " + std::to_string(k) + " (rows x components)");
    const io::RowStream resp(comm, ref, shape);
    src.for_each_chunk([&](const RowMatrix& x, std::int64_t first) {
      RowMatrix r = resp.read_range({first, first + x.rows()});
      std::string err;
      for (Eigen::Index i = 0; i < r.rows() && err.empty(); ++i) {
        const double sum = r.row(i).sum();
        if (!r.row(i).allFinite() || (r.row(i).array() < 0).any())
          err = "--init " + ref.str() + ": row " + std::to_string(first + i) +
                " is not a set of non-negative weights";
        else if (sum > 0)
          r.row(i) /= sum;
        // A zero row leaves its point out of the first M-step, as scikit-learn's one-hot starts
        // (k-means++, random_from_data) do for every point but the K seeds.
      }
      comm.raise_if_any(err);
      comm.agree([&] { model.accumulate(x, r, stats); });
    });
  }
  reduce(stats, src.shape().rows, engine::Reducer(comm));
  double mass = 0;
  for (int j = 0; j < k; ++j) mass += stats.n(j);
  if (!(mass > 0))
    throw Error("--init " + init + ": every row of the initial responsibilities is zero");
  return stats;
}

}  // namespace driver

namespace {

// One full pass: the E-step over every row, statistics summed over ranks (and, in memory, the
// responsibilities of this rank's rows if resp_out is given).
void full_pass(const Comm& comm, const Source& src, const Model& model, Stats& stats,
               RowMatrix* resp_out) {
  stats.set_zero();
  each_chunk_agreed(
      comm, src, [&](const RowMatrix& x, std::int64_t) { model.local_step(x, stats, resp_out); });
  reduce(stats, src.shape().rows, engine::Reducer(comm));
}

void write_matrices(io::FileWriter& w, const std::string& name, const std::vector<MatrixXd>& ms,
                    Covariance cov) {
  const std::size_t k = ms.size(), d = static_cast<std::size_t>(ms.empty() ? 0 : ms[0].rows());
  std::vector<double> buf;
  buf.reserve(k * d * d);
  // scikit-learn's shapes: tied writes its one shared matrix, spherical one variance per component.
  if (cov == Covariance::kTied) {
    const MatrixXd& m = ms.at(0);
    for (Eigen::Index i = 0; i < m.rows(); ++i)
      for (Eigen::Index j = 0; j < m.cols(); ++j) buf.push_back(m(i, j));
    w.write(name, buf, {d, d});
    return;
  }
  if (cov == Covariance::kSpherical) {
    for (const auto& m : ms) buf.push_back(m(0, 0));
    w.write(name, buf, {k});
    return;
  }
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

void write_vector(io::FileWriter& w, const std::string& name, const std::vector<double>& v) {
  w.write(name, v, {v.size()});
}

void write_model(const Model& model, const FitOptions& o, const std::string& init,
                 const FitResult& r, const Comm& comm) {
  io::FileWriter w(o.out);
  const Covariance cov = model.covariance();
  const std::uint64_t d = static_cast<std::uint64_t>(model.dim());
  const auto dims = full_moments(cov)               ? io::Dims{d, d}
                    : cov == Covariance::kSpherical ? io::Dims{1}
                                                    : io::Dims{d};
  // The scikit-learn-like summary.
  write_vector(w, "weights", model.weights());
  write_rowmatrix(w, "means", model.means());
  write_matrices(w, "covariances", model.covariances(), cov);
  if (model.estimator() == Estimator::kMaximumLikelihood) {
    // GaussianMixture's names: precisions_cholesky_ (upper factor; diag: 1/sigma) and
    // precisions_; lower_bound_ is its per-sample average log-likelihood.
    const auto pc = model.precisions_cholesky();
    write_matrices(w, "precisions_cholesky", pc, cov);
    std::vector<MatrixXd> prec;
    for (const auto& p : pc)
      prec.push_back(full_moments(cov) ? MatrixXd(p * p.transpose()) : MatrixXd(p.cwiseAbs2()));
    write_matrices(w, "precisions", prec, cov);
    write_vector(w, "trace/log_likelihood", r.trace);
    std::vector<double> lb(r.trace);
    for (double& v : lb) v /= static_cast<double>(r.n);
    write_vector(w, "trace/lower_bound", lb);
    w.attr("log_likelihood", r.elbo);
    w.attr("lower_bound", r.elbo / static_cast<double>(r.n));
    w.attr("reg_covar", o.reg_covar);
  } else {
    const Posterior& p = model.posterior();
    // The variational posterior, enough to recompute the ELBO and the predictive density.
    if (model.prior().weights == WeightPrior::kDirichlet) {
      write_vector(w, "posterior/alpha", p.alpha);
    } else {
      write_vector(w, "posterior/stick_a", p.stick_a);
      write_vector(w, "posterior/stick_b", p.stick_b);
    }
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
    // (Spherical: the one scalar W0^-1 of its D equal entries.)
    const auto n_w0 = static_cast<std::size_t>(dims.size() == 2 ? d * d : dims[0]);
    w.write("prior/W0_inv", std::span<const double>(pr.W0_inv.data(), n_w0), dims);
    // W0 for readers who want the scale itself (output only; computations use W0_inv).
    const MatrixXd w0 = full_moments(cov)
                            ? MatrixXd(pr.W0_inv.llt().solve(MatrixXd::Identity(d, d)))
                            : MatrixXd(pr.W0_inv.cwiseInverse());
    w.write("prior/W0", std::span<const double>(w0.data(), n_w0), dims);
    w.write("trace/elbo", r.trace, {r.trace.size()});
    w.attr("elbo", r.elbo);
    w.attr("weight_prior", to_string(pr.weights));
    w.attr("weight_concentration_prior_type",
           std::string(pr.weights == WeightPrior::kDirichlet ? "dirichlet_distribution"
                                                             : "dirichlet_process"));
  }
  write_vector(w, "trace/seconds", r.seconds_trace);
  if (r.algorithm == Algorithm::kSvi) {
    write_vector(w, "trace/epoch_elbo", r.epoch_trace);
    write_vector(w, "trace/rho", r.rho_trace);
    if (!r.full_elbo.empty()) {
      write_vector(w, "trace/full_elbo", r.full_elbo);
      write_vector(w, "trace/full_elbo_seconds", r.full_elbo_seconds);
      write_vector(w, "trace/full_elbo_step", r.full_elbo_step);
    }
    w.attr("steps", r.steps);
    w.attr("batch_size", o.batch_size);
    w.attr("schedule", to_string(o.schedule));
    w.attr("tau0", o.tau0);
    w.attr("kappa", o.kappa);
    w.attr("adaptive_memory", o.adaptive_memory);
    w.attr("stream", static_cast<std::int64_t>(o.stream));
  }
  if (r.heldout) w.attr("heldout_score", *r.heldout);
  if (!r.start_bounds.empty()) {
    // --n-init: every start's final bound, and which one this model is.
    write_vector(w, "n_init_bounds", r.start_bounds);
    w.attr("n_init", static_cast<std::int64_t>(r.start_bounds.size()));
    w.attr("best_start", static_cast<std::int64_t>(r.best_start));
  }
  w.attr("model", std::string("gmm"));
  w.attr("algorithm", to_string(r.algorithm));
  w.attr("covariance_type", to_string(cov));
  w.attr("n_iter", static_cast<std::int64_t>(r.iterations));
  w.attr("converged", static_cast<std::int64_t>(r.converged));
  w.attr("stop_reason", r.stop_reason);
  w.attr("n_samples", r.n);
  w.attr("ranks", static_cast<std::int64_t>(comm.size()));
  w.attr("threads", static_cast<std::int64_t>(max_threads()));
  w.attr("seed", static_cast<std::int64_t>(o.seed));
  w.attr("init", init);
  if (!o.warm_start.empty()) w.attr("warm_start", o.warm_start);
  w.attr("data", o.data);
  w.attr("tol", o.tol);
  w.attr("reduction", std::string(o.fast_reduce ? "fast" : "exact"));
  w.attr("precision", to_string(o.precision));
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
    const bool em = r.has("/precisions_cholesky") && r.has("/means") && r.has("/weights");
    const bool sticks = r.has("/posterior/stick_a");
    if (!em && !((r.has("/posterior/alpha") || sticks) && r.has("/posterior/W_inv")))
      throw Error("'" + file + "' is not a caviar gmm model (no /posterior)");
    const Covariance cov = parse_covariance(r.read_string_attr("covariance_type"));
    io::Dims dims;
    const auto m = r.read(em ? "/means" : "/posterior/m", &dims);
    if (dims.size() != 2) throw Error("'" + file + "': the means are not a K x D matrix");
    const int k = static_cast<int>(dims[0]), d = static_cast<int>(dims[1]);
    auto matrices = [&](const std::vector<double>& v) {
      auto out = unpack_matrices(v, cov, k, d);
      if (!out) throw Error("'" + file + "': inconsistent matrix shapes");
      return std::move(*out);
    };
    auto vec = [&](const std::string& name) {
      const auto v = r.read(name);
      if (v.size() != std::size_t(k))
        throw Error("'" + file + "': " + name + " has the wrong size");
      return VectorXd(Eigen::Map<const VectorXd>(v.data(), k));
    };
    if (em) {
      MlParams p;
      p.weights = vec("/weights");
      p.means = Eigen::Map<const RowMatrix>(m.data(), k, d);
      p.covariances = matrices(r.read("/covariances"));
      const VectorXd shift = p.means.transpose() * p.weights;
      model.emplace(cov, k, default_prior(cov, d, k), shift, Estimator::kMaximumLikelihood);
      model->set_ml_params(std::move(p));
      return;
    }
    Posterior p;
    Prior prior = default_prior(cov, d, k);  // only the weight prior type matters here
    if (sticks) {
      prior.weights = WeightPrior::kStickBreaking;
      p.stick_a = vec("/posterior/stick_a");
      p.stick_b = vec("/posterior/stick_b");
    } else {
      p.alpha = vec("/posterior/alpha");
    }
    p.beta = vec("/posterior/beta");
    p.nu = vec("/posterior/nu");
    p.m = Eigen::Map<const RowMatrix>(m.data(), k, d);
    p.W_inv = matrices(r.read("/posterior/W_inv"));
    // The shift only conditions the arithmetic; the weighted mean of the means is a good one.
    const VectorXd w = vec("/weights");
    const VectorXd shift = p.m.transpose() * (w / w.sum());
    model.emplace(cov, k, prior, shift);
    model->set_posterior(std::move(p));
  });
  return std::move(*model);
}

// Average log predictive density (EM: log-likelihood) per row of `data`, read in memory or, with
// stream, chunk by chunk.
double heldout_score(const Comm& comm, const Model& model, const std::string& data, bool stream,
                     std::int64_t chunk_rows, std::int64_t* n_out) {
  const Source src(comm, io::DataRef::parse(data), stream, chunk_rows);
  if (src.shape().cols != model.dim())
    throw Error("data " + src.ref().str() + " has " + std::to_string(src.shape().cols) +
                " features but the model has " + std::to_string(model.dim()));
  // Per-block partial sums, summed exactly (as the log-normalisers in reduce) so that the score
  // does not depend on the rank count.
  std::vector<double> blocks;
  src.for_each_chunk([&](const RowMatrix& x, std::int64_t first) {
    if (stream) comm.raise_if_any(find_non_finite(x, first, src.ref()));
    model.log_predictive_sum(x, &blocks);
  });
  Stats total(0, 0, model.covariance());  // just log_norm and rows
  total.make_exact({bound_exponent(0), bound_exponent(0)});
  total.exact_part().block_log_norms = std::move(blocks);
  reduce(total, src.shape().rows, engine::Reducer(comm));
  if (!std::isfinite(total.log_norm())) throw Error("the held-out score is not finite");
  if (n_out) *n_out = src.shape().rows;
  return total.log_norm() / static_cast<double>(src.shape().rows);
}

}  // namespace

namespace driver {

std::string resolve_init(const FitOptions& o) {
  if (!o.warm_start.empty()) return "warm-start:" + o.warm_start;
  if (!o.init_params.empty()) return "params:" + o.init_params;  // recorded, and fingerprinted
  if (!o.init.empty()) return o.init;
  return o.stream ? "random" : "kmeans++";
}

std::vector<std::string> checked_inputs(const Comm& comm, const FitOptions& o,
                                        const io::DataRef& ref, const std::string& init) {
  std::vector<std::string> inputs{ref.file};
  if (!o.warm_start.empty())
    inputs.push_back(o.warm_start);
  else if (!o.init_params.empty())
    inputs.push_back(o.init_params);
  else if (init != "random" && init != "kmeans++" && init != "random-from-data")
    inputs.push_back(io::DataRef::parse(init).file);
  if (!o.heldout.empty()) inputs.push_back(io::DataRef::parse(o.heldout).file);
  if (!o.out.empty()) io::check_output_path(comm, o.out, inputs);
  if (!o.labels.empty()) io::check_output_path(comm, o.labels, inputs);
  return inputs;
}

}  // namespace driver

namespace {

// Start s > 0 of --n-init draws its RNG seed from one Philox call keyed by (--seed, s), so starts
// do not share the draws of neighbouring --seed values.
std::uint64_t start_seed(std::uint64_t seed, int s) {
  const auto w = philox4x32_10(
      {static_cast<std::uint32_t>(s), 0, 0, static_cast<std::uint32_t>(Stream::kGmmStarts)},
      {static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)});
  return (static_cast<std::uint64_t>(w[0]) << 32) | w[1];
}

// One start of a fit (--n-init runs several): the model from the start's initial
// responsibilities, then the CAVI/EM iterations or the SVI epochs. Returns the fitted model and,
// with --labels, the responsibilities of this rank's rows.
struct Start {
  FitResult res;
  std::optional<Model> model;
  RowMatrix resp;
};

// What every start of a fit shares: the data, its moments, the checkpoint, and when it began.
struct Setup {
  const Comm& comm;
  const io::DataRef& ref;
  const std::string& init;
  const Source& src;
  const Moments& mom;
  engine::Checkpointer& ck;
  std::chrono::steady_clock::time_point t0;
};

double rel_change(double now, double before) {
  return std::abs(now - before) / std::max(std::abs(now), 1e-300);
}

// The allreduce share of the iterations (docs/performance.md): the rank that waits least is
// closest to the pure cost of communication, the one that waits most adds the load imbalance.
void allreduce_share(const Comm& comm, double allreduce_start, FitResult& res) {
  const auto waits = comm.allgather(Comm::allreduce_seconds() - allreduce_start);
  res.allreduce_seconds_min = *std::min_element(waits.begin(), waits.end());
  res.allreduce_seconds_max = *std::max_element(waits.begin(), waits.end());
}

// The engine's per-iteration report as the GMM's progress line (with the relative change from
// the previous iteration, also across a resume). SVI (svi given): epochs counted from 1, with
// the last step size and the steps so far.
engine::Progress fit_progress(const engine::Checkpointer& ck, const Progress& progress,
                              const SviFit* svi = nullptr) {
  if (!progress) return {};
  const std::vector<double> before = ck.trace().objective;
  auto prev = std::make_shared<double>(before.empty() ? std::numeric_limits<double>::quiet_NaN()
                                                      : before.back());
  return [progress, prev, svi](const engine::Report& r) {
    const double rel = std::isnan(*prev) ? *prev : rel_change(r.objective, *prev);
    *prev = r.objective;
    if (!svi) return progress({r.iteration, r.objective, rel, r.seconds});
    const double rho = svi->traces().rho.empty() ? 0.0 : svi->traces().rho.back();
    progress({r.iteration + 1, r.objective, rel, r.seconds, rho, svi->steps()});
  };
}

// --warm-start: sets model to the fitted state of a model file of gmm fit, checked against this
// fit. The state is the whole variational posterior q(pi) q(mu, Lambda) (Bishop 2006, eqs
// 10.57-10.63; stick-breaking: Blei & Jordan 2006), or EM's point estimate (Bishop 2006, eqs
// 9.24-9.26), so the first E-step is the one the fit that wrote the file would have taken next.
// The prior and the shift are this fit's own (the same as the first fit's for the same data
// and options).
void warm_start(const Comm& comm, const FitOptions& o, int d, Model& model) {
  const std::string what = "--warm-start '" + o.warm_start + "'";
  std::string algorithm;
  std::optional<Model> from;
  try {
    comm.agree([&] {
      const io::FileReader r(o.warm_start);
      if (r.has_attr("algorithm")) algorithm = r.read_string_attr("algorithm");
    });
    from.emplace(load_model(comm, o.warm_start));
  } catch (const Error& e) {
    throw Error(what + ": " + e.what());
  }
  const auto mismatch = [&](const std::string& name, const std::string& file,
                            const std::string& fit) {
    if (file != fit)
      throw Error(what + " has " + name + " " + file + "; this fit has " + fit +
                  " (a warm start continues the same model)");
  };
  mismatch("algorithm", algorithm, to_string(o.algorithm));
  mismatch("covariance type", to_string(from->covariance()), to_string(o.covariance));
  mismatch("K =", std::to_string(from->n_components()), std::to_string(o.components));
  mismatch("D =", std::to_string(from->dim()), std::to_string(d));
  mismatch("weight prior", to_string(from->prior().weights), to_string(o.weights));
  comm.agree([&] {
    if (o.algorithm == Algorithm::kEm)
      model.set_ml_params(from->ml_params());
    else
      model.set_posterior(from->posterior());
  });
}

// CAVI (Bishop 2006, section 10.2) or EM (Bishop 2006, section 9.2) on the engine's batch driver:
// the E-step over all rows, the exact reduction, the M-step (models/gmm/batch.hpp).
FitResult fit_cavi_em(const Setup& su, const FitOptions& o, const Progress& progress, Model& model,
                      RowMatrix* resp) {
  const Comm& comm = su.comm;
  const std::int64_t n = su.src.shape().rows;
  engine::Checkpointer& ck = su.ck;
  const auto each = [&](const std::function<void(const RowMatrix&)>& f) {
    each_chunk_agreed(comm, su.src, [&](const RowMatrix& x, std::int64_t) { f(x); });
  };
  BatchFit fit(model, n, su.src.range().size(),
               o.fast_reduce ? std::vector<int>{}
                             : model.exact_exponents(static_cast<double>(n), su.mom.max_abs),
               each, resp);
  // lambda_0: the M-step from the initial responsibilities (a resumed fit loads its own; a warm
  // start takes the posterior of its model file, and cannot be resumed).
  if (!o.warm_start.empty()) {
    warm_start(comm, o, static_cast<int>(su.src.shape().cols), model);
  } else if (!ck.resuming()) {
    const Stats start = initial_stats(comm, o, su.init, su.src, model, su.mom);
    comm.agree([&] { fit.update(start); });
  }
  engine::BatchRun run;
  run.comm = &comm;
  run.stop = {o.max_iter, o.tol};
  run.checkpoint = &ck;
  run.rows = su.src.range();
  run.global_rows = n;
  run.progress = fit_progress(ck, progress);
  run.objective_name = o.algorithm == Algorithm::kEm ? "log-likelihood" : "ELBO";
  const double allreduce_start = Comm::allreduce_seconds();
  engine::RunResult r = engine::fit_batch(fit, run);
  FitResult res;
  res.trace = std::move(r.trace.objective);
  res.seconds_trace = std::move(r.trace.seconds);
  res.iterations = r.iterations;
  res.converged = r.converged;
  res.stop_reason = r.converged ? "tol" : "max-iter";
  res.elbo = res.trace.back();
  res.loop_seconds = r.seconds;  // continued across a resume, as the trace's seconds
  res.seconds = seconds_since(su.t0) + ck.elapsed();
  allreduce_share(comm, allreduce_start, res);
  return res;
}

// The rows of an SVI minibatch for the model's local step; every rank calls it at every step, so
// it may be collective (a streamed read). Exact sums (the default): `rows` are every global row
// of the minibatch (Schedule::every_rank); each rank reads those it owns and every rank receives
// all of them, in global row order (ranks own increasing row ranges): only the B x D rows
// travel, never the K x D^2 statistics. --fast-reduce: `rows` are this rank's own (local
// indices). f runs under comm.agree, so an error on one rank stops every rank.
SviFit::WithRows svi_rows(const Comm& comm, const Source& src, bool whole) {
  return [&comm, &src, whole](std::span<const std::int64_t> rows,
                              const std::function<void(const RowMatrix&)>& f) {
    const RowRange own = src.range();
    std::vector<std::int64_t> mine;
    for (const std::int64_t r : rows)
      if (!whole)
        mine.push_back(own.begin + r);
      else if (r >= own.begin && r < own.end)
        mine.push_back(r);
    RowMatrix x = src.gather(mine);
    if (whole) {
      const std::vector<double> all =
          comm.allgatherv(std::span<const double>(x.data(), static_cast<std::size_t>(x.size())));
      const Eigen::Index cols = src.shape().cols;
      x = Eigen::Map<const RowMatrix>(all.data(), static_cast<Eigen::Index>(all.size()) / cols,
                                      cols);
    }
    comm.agree([&] { f(x); });
  };
}

// The adaptive rate's first averages: the noisy natural gradients of min(adaptive memory, one
// epoch) minibatches at lambda_0, drawn from an order of their own keyed by (seed, epoch
// 2^32 - 1) (Ranganath et al. 2013; Bruno 2022, section 2.2.2).
void init_adaptive(const FitOptions& o, SviFit& fit, const engine::StochasticRun& run) {
  const std::int64_t n = run.global_rows, b = run.schedule.batch_size;
  const auto n_mc =
      std::min<std::int64_t>(static_cast<std::int64_t>(o.adaptive_memory), (n + b - 1) / b);
  engine::PassOrder order(n, o.seed, 0xFFFFFFFFu);
  auto stats = fit.make_stats();
  std::vector<double> terms;
  for (std::int64_t i = 0; i < n_mc; ++i) {
    const std::int64_t p0 = i * b, p1 = std::min(n, p0 + b);
    engine::minibatch_stats(fit, stats, run, order.batch(p0, p1), terms);
    fit.add_first_gradient(stats, static_cast<double>(n) / static_cast<double>(p1 - p0));
  }
  fit.finish_first_gradients(n_mc);
}

// The stochastic driver's run of gmm fit --algorithm svi: minibatches of --batch-size keyed by
// (seed, epoch), Robbins-Monro rho_t = (tau0 + t)^-kappa from t = 1, every rank computing whole
// minibatches unless --fast-reduce, and the stopping rule of Bruno 2022, section 2.2.2 (Figure
// 2.4): --tol, or three decreasing epoch averages in a row.
engine::StochasticRun svi_run(const Setup& su, const FitOptions& o) {
  engine::StochasticRun run;
  run.comm = &su.comm;
  run.stop = {o.max_iter, o.tol};
  run.checkpoint = &su.ck;
  run.rows = su.src.range();
  run.global_rows = su.src.shape().rows;
  engine::Schedule& sc = run.schedule;
  sc.batch_size = std::min<std::int64_t>(o.batch_size, run.global_rows);
  sc.tau0 = o.tau0;
  sc.kappa = o.kappa;
  sc.seed = o.seed;
  sc.every_rank = !o.fast_reduce;
  sc.max_decreases = 3;
  return run;
}

// SVI (Hoffman et al. 2013) with the Robbins-Monro or the adaptive step size, on the engine's
// stochastic driver and checkpoint (models/gmm/svi.hpp); then one full pass under the final
// lambda for the final ELBO and --labels.
FitResult fit_svi(const Setup& su, const FitOptions& o, const Progress& progress, Model& model,
                  RowMatrix* resp_out) {
  const Comm& comm = su.comm;
  const std::int64_t n = su.src.shape().rows;
  engine::Checkpointer& ck = su.ck;
  Stats full = new_stats(o, model, su.mom, n);  // of the full passes
  SviFit fit(model, n,
             o.fast_reduce ? std::vector<int>{}
                           : model.exact_exponents(static_cast<double>(n), su.mom.max_abs),
             svi_rows(comm, su.src, !o.fast_reduce),
             [&] {
               full_pass(comm, su.src, model, full, nullptr);
               return model.elbo(full);
             },
             {o.schedule == Schedule::kAdaptive, o.adaptive_memory, o.full_elbo_every});
  engine::StochasticRun run = svi_run(su, o);
  run.progress = fit_progress(ck, progress, &fit);
  // lambda_0: the M-step from the initial responsibilities (a resumed fit loads its own).
  if (!ck.resuming()) {
    const Stats start = initial_stats(comm, o, su.init, su.src, model, su.mom);
    comm.agree([&] { model.update(start); });
    fit.start(start);
    if (o.schedule == Schedule::kAdaptive) init_adaptive(o, fit, run);
  }
  const double allreduce_start = Comm::allreduce_seconds();
  const engine::RunResult r = engine::fit_stochastic(fit, run);
  FitResult res;
  res.trace = fit.traces().elbo;
  res.seconds_trace = fit.traces().seconds;
  res.rho_trace = fit.traces().rho;
  res.full_elbo = fit.traces().full_elbo;
  res.full_elbo_seconds = fit.traces().full_elbo_seconds;
  res.full_elbo_step = fit.traces().full_elbo_step;
  res.epoch_trace = r.trace.objective;
  res.steps = fit.steps();
  res.iterations = r.iterations;
  res.converged = r.stop_reason != "max-iter";
  res.stop_reason = r.stop_reason == "objective-decreased" ? "elbo-decreased" : r.stop_reason;
  full_pass(comm, su.src, model, full, resp_out);
  res.elbo = model.elbo(full);
  res.loop_seconds = r.seconds;
  res.seconds = seconds_since(su.t0) + ck.elapsed();
  allreduce_share(comm, allreduce_start, res);
  return res;
}

// The options --warm-start excludes. scikit-learn ignores n_init when it warm-starts; here a
// given --n-init > 1 is refused rather than silently ignored.
void check_warm_start(const FitOptions& o) {
  if (o.warm_start.empty()) return;
  if (o.algorithm == Algorithm::kSvi)
    throw Error(
        "--warm-start applies to --algorithm cavi and em (svi keeps its state as statistics "
        "and a step-size schedule, which a model file does not hold)");
  if (!o.init.empty() || !o.init_params.empty())
    throw Error("--warm-start starts from its model: not with --init or --init-params");
  if (o.n_init > 1)
    throw Error("--n-init > 1 with --warm-start: a warm start has one start, its model's");
  if (!o.checkpoint.empty() || !o.resume.empty())
    throw Error(
        "--warm-start cannot be checkpointed or resumed yet (a checkpoint holds statistics, a "
        "warm start a posterior)");
}

Start fit_start(const Setup& su, const FitOptions& o, const Progress& progress) {
  const int d = static_cast<int>(su.src.shape().cols);
  const Estimator est =
      o.algorithm == Algorithm::kEm ? Estimator::kMaximumLikelihood : Estimator::kVariational;
  Model model(o.covariance, o.components, make_prior(o, d, su.mom), su.mom.mean, est, o.reg_covar);
  model.set_precision(o.precision);
  Start out;
  RowMatrix* resp = o.labels.empty() ? nullptr : &out.resp;
  // The data's identity is read only when a checkpoint is written or resumed from.
  su.ck.open(o.checkpoint.empty() && o.resume.empty()
                 ? ckpt::Fingerprint("gmm")
                 : fingerprint(su.comm, o, su.ref, su.src.shape(), model, su.init));
  out.res = o.algorithm == Algorithm::kSvi ? fit_svi(su, o, progress, model, resp)
                                           : fit_cavi_em(su, o, progress, model, resp);
  out.res.algorithm = o.algorithm;
  out.res.n = su.src.shape().rows;
  out.model.emplace(std::move(model));
  return out;
}

}  // namespace

FitResult fit(const Comm& comm, const FitOptions& o, const Progress& progress) {
  const auto t0 = std::chrono::steady_clock::now();
  const io::DataRef ref = io::DataRef::parse(o.data);
  const std::string init = resolve_init(o);
  if (o.components < 1)
    throw Error("--components must be >= 1 (got " + std::to_string(o.components) + ")");
  if (o.max_iter < 0) throw Error("--max-iter must be >= 0");
  if (!(o.tol >= 0) || !std::isfinite(o.tol)) throw Error("--tol must be a finite number >= 0");
  if (o.algorithm == Algorithm::kEm && o.weights != WeightPrior::kDirichlet)
    throw Error("--weights stick-breaking is a prior: it applies to cavi and svi, not em");
  if (!(o.reg_covar >= 0)) throw Error("--reg-covar must be >= 0");
  if (o.n_init < 1) throw Error("--n-init must be >= 1 (got " + std::to_string(o.n_init) + ")");
  if (o.n_init > 1 && !(o.checkpoint.empty() && o.resume.empty()))
    throw Error(
        "--n-init > 1 cannot be checkpointed yet: run the starts as separate fits "
        "(--seed), or use --n-init 1");
  if (o.algorithm == Algorithm::kSvi) {
    if (o.batch_size < 1) throw Error("--batch-size must be >= 1");
    if (!(o.kappa >= 0 && o.kappa <= 1)) throw Error("--kappa must be in [0, 1]");
    if (!(o.tau0 >= 0) || !std::isfinite(o.tau0))
      throw Error("--tau0 must be a finite number >= 0");
    if (!(o.adaptive_memory >= 1) || !std::isfinite(o.adaptive_memory))
      throw Error("--adaptive-memory must be a finite number >= 1");
    if (o.max_iter < 1) throw Error("--max-iter (epochs) must be >= 1 for svi");
  }
  if (o.stream && !o.labels.empty())
    throw Error("--labels needs the responsibilities of every row in memory; not with --stream");
  check_warm_start(o);
  const std::vector<std::string> inputs = checked_inputs(comm, o, ref, init);
  if (!o.out.empty() && o.out == o.labels) throw Error("--out and --labels name the same file");
  // Checkpoint/resume and stop signals: the engine's (engine/checkpoint.hpp).
  if (!o.checkpoint.empty() && !o.labels.empty() && o.checkpoint == o.labels)
    throw Error("--checkpoint and --labels name the same file");
  if (!o.resume.empty() && (o.resume == o.out || o.resume == o.labels))
    throw Error("--resume names the same file as --out or --labels");
  engine::Checkpointer ck(comm, {o.checkpoint, o.checkpoint_every, o.resume}, inputs, o.out);

  const Source src(comm, ref, o.stream, o.chunk_rows);
  const std::int64_t n = src.shape().rows;
  if (o.components > n)
    throw Error("--components " + std::to_string(o.components) + " exceeds the number of rows (" +
                std::to_string(n) + ") in " + ref.str());
  const Moments mom = data_moments(comm, src, o.prior_scale == "data");
  // Start s is keyed by (seed, s): start 0 is the fit of --seed itself, so --n-init 1 is the
  // plain fit. The best final bound wins; ties go to the earliest start.
  Start best;
  std::vector<double> bounds;
  int best_start = 0;
  for (int s = 0; s < o.n_init; ++s) {
    FitOptions os = o;
    if (s > 0) os.seed = start_seed(o.seed, s);
    Start st = fit_start({comm, ref, init, src, mom, ck, t0}, os, progress);
    bounds.push_back(st.res.elbo);
    if (s == 0 || st.res.elbo > best.res.elbo) {
      best = std::move(st);
      best_start = s;
    }
  }
  FitResult& res = best.res;
  const Model& model = *best.model;
  const RowMatrix& resp = best.resp;
  if (o.n_init > 1) {
    res.start_bounds = bounds;
    res.best_start = best_start;
    res.seconds = seconds_since(t0);
  }
  if (!o.heldout.empty())
    res.heldout = heldout_score(comm, model, o.heldout, o.stream, o.chunk_rows, nullptr);

  if (!o.out.empty()) comm.on_root([&] { write_model(model, o, init, res, comm); });
  if (!o.labels.empty()) write_labels(comm, o.labels, src.shard(), resp, o.save_responsibilities);
  return res;
}

ScoreResult score(const Comm& comm, const std::string& model_file, const std::string& data) {
  const Model model = load_model(comm, model_file);
  ScoreResult r;
  r.score = heldout_score(comm, model, data, false, 0, &r.n);
  return r;
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

void sample(const Comm& comm, const std::string& model_file, std::int64_t n, std::uint64_t seed,
            const std::string& out) {
  if (n < 1) throw Error("--n must be >= 1 (got " + std::to_string(n) + ")");
  io::check_output_path(comm, out, {model_file});
  const Model model = load_model(comm, model_file);
  Mixture mix{model.weights(), model.means(), {}};
  mix.weights /= mix.weights.sum();  // sums to 1 up to round-off; the draws take it as exact
  const auto covs = model.covariances();
  for (std::size_t k = 0; k < covs.size(); ++k) {
    const MatrixXd c =
        full_moments(model.covariance()) ? covs[k] : MatrixXd(covs[k].col(0).asDiagonal());
    const Eigen::LLT<MatrixXd> llt(c);
    if (llt.info() != Eigen::Success || !c.allFinite())
      throw Error("'" + model_file + "': the covariance of component " + std::to_string(k) +
                  " is not positive definite");
    mix.chol.push_back(llt.matrixL());
  }
  const RowRange range = partition_rows(n, comm.size(), comm.rank());
  RowMatrix x(range.size(), model.dim());
  std::vector<std::int64_t> z;
  draw_rows(mix, CounterRng(seed, Stream::kGmmSample), 0, range.begin, x, z);
  io::ParallelRowWriter w(comm, out);
  w.write_rows("X", n, range, x.data(), {static_cast<std::uint64_t>(model.dim())});
  w.write_rows("labels", n, range, z.data(), {});
  w.attr("model", model_file);
  w.attr("seed", static_cast<std::int64_t>(seed));
  w.commit();
}

}  // namespace caviar::gmm
