#include "models/gmm/gmm.hpp"

#include <array>
#include <cmath>
#include <cstring>
#include <limits>

#ifdef __AVX2__
#include <immintrin.h>
#endif

#include "core/error.hpp"
#include "core/parallel.hpp"
#include "core/partition.hpp"
#include "core/vec4.hpp"
#include "math/special.hpp"

namespace caviar::gmm {

using Eigen::Index;
using Eigen::MatrixXd;
using Eigen::VectorXd;

Covariance parse_covariance(const std::string& s) {
  if (s == "full") return Covariance::kFull;
  if (s == "diag") return Covariance::kDiag;
  if (s == "tied") return Covariance::kTied;
  if (s == "spherical") return Covariance::kSpherical;
  throw Error("unknown covariance type '" + s + "' (expected full, diag, tied or spherical)");
}

std::string to_string(Covariance c) {
  switch (c) {
    case Covariance::kFull:
      return "full";
    case Covariance::kDiag:
      return "diag";
    case Covariance::kTied:
      return "tied";
    case Covariance::kSpherical:
      return "spherical";
  }
  return "?";
}

WeightPrior parse_weight_prior(const std::string& s) {
  if (s == "dirichlet") return WeightPrior::kDirichlet;
  if (s == "stick-breaking") return WeightPrior::kStickBreaking;
  throw Error("unknown weight prior '" + s + "' (expected dirichlet or stick-breaking)");
}

std::string to_string(WeightPrior w) {
  return w == WeightPrior::kDirichlet ? "dirichlet" : "stick-breaking";
}

Precision parse_precision(const std::string& s) {
  if (s == "double") return Precision::kDouble;
  if (s == "single") return Precision::kSingle;
  throw Error("unknown precision '" + s + "' (expected double or single)");
}

std::string to_string(Precision p) {
  return p == Precision::kDouble ? "double" : "single";
}

Prior default_prior(Covariance cov, int dim, int n_components) {
  Prior p;
  p.alpha0 = 1.0 / n_components;
  p.beta0 = 1.0;
  p.nu0 = dim;
  p.m0 = VectorXd::Zero(dim);
  p.W0_inv =
      full_moments(cov) ? MatrixXd(MatrixXd::Identity(dim, dim)) : MatrixXd(MatrixXd::Ones(dim, 1));
  return p;
}

// ---------------------------------------------------------------------------------------------
// Stats

Stats::Stats(int dim, int n_components, Covariance cov)
    : dim_(dim),
      k_(n_components),
      cov_(cov),
      moment_size_(full_moments(cov) ? std::size_t(dim) * (dim + 1) / 2 : std::size_t(dim)),
      buf_(std::size_t(n_components) * (1 + dim + moment_size_) + 2, 0.0) {}

void Stats::set_zero() {
  std::fill(buf_.begin(), buf_.end(), 0.0);
  if (exact_) {
    exact_->sum.set_zero();
    exact_->block_log_norms.clear();
  }
}

Stats& Stats::operator+=(const Stats& o) {
  for (std::size_t i = 0; i < buf_.size(); ++i) buf_[i] += o.buf_[i];
  return *this;
}

Stats& Stats::operator*=(double a) {
  for (double& v : buf_) v *= a;
  return *this;
}

void Stats::interpolate(const Stats& o, double rho) {
  for (std::size_t i = 0; i < buf_.size(); ++i) buf_[i] = (1.0 - rho) * buf_[i] + rho * o.buf_[i];
}

MatrixXd Stats::sxx_matrix(int k) const {
  MatrixXd s(dim_, dim_);
  const double* p = sxx(k);
  for (int i = 0; i < dim_; ++i)
    for (int j = i; j < dim_; ++j) s(i, j) = s(j, i) = *p++;
  return s;
}

void Stats::make_exact(std::vector<int> exponents) {
  if (exponents.size() != buf_.size()) throw Error("exact statistics: wrong number of exponents");
  exact_.emplace(ExactPart{ExactSum(std::move(exponents)), {}, {}});
}

void Stats::load_exact(double log_norm) {
  exact_->sum.result(buf_);
  buf_[buf_.size() - 2] = log_norm;
}

void Stats::finish_exact(std::int64_t n_rows) {
  finish_exact(n_rows, {[](double v) { return v; }, [](std::span<Int128>) {}});
}

void Stats::finish_exact(std::int64_t n_rows, const Combine& combine) {
  auto& part = exact_part();
  double mx = 0;
  bool finite = true;
  for (double v : part.block_log_norms) {
    mx = std::max(mx, std::abs(v));
    finite &= std::isfinite(v);
  }
  if (!finite) mx = std::numeric_limits<double>::infinity();
  mx = combine.max(mx);
  const double max_blocks = static_cast<double>((n_rows + kBlockRows - 1) / kBlockRows);
  const bool ok = std::isfinite(mx) && std::isfinite(2 * max_blocks * mx);
  ExactSum ln({ok ? bound_exponent(2 * max_blocks * mx) : 0});
  if (ok)
    for (double v : part.block_log_norms) ln.add(std::span<const double>(&v, 1));
  std::vector<Int128>& raw = part.wire;  // reused: fresh megabytes each pass cost page faults
  raw.resize(part.sum.size() + 1);
  std::copy(part.sum.raw().begin(), part.sum.raw().end(), raw.begin());
  raw.back() = ln.raw()[0];
  combine.sum(raw);
  std::copy(raw.begin(), raw.end() - 1, part.sum.raw().begin());
  ln.raw()[0] = raw.back();
  load_exact(ok ? ln.result()[0] : std::numeric_limits<double>::quiet_NaN());
}

std::vector<int> Model::exact_exponents(double n_rows, const VectorXd& max_abs) const {
  const int d = dim();
  if (max_abs.size() != d) throw Error("exact statistics: bounds of the wrong dimension");
  Stats s = make_stats();
  std::vector<int> e(s.buffer().size(), bound_exponent(0));
  const double n2 = 2 * n_rows;
  auto at = [&](const double* p) { return static_cast<std::size_t>(p - s.buffer().data()); };
  for (int k = 0; k < n_components(); ++k) {
    e[at(&s.n(k))] = bound_exponent(n2);
    for (int j = 0; j < d; ++j) e[at(s.sx(k) + j)] = bound_exponent(n2 * max_abs[j]);
    std::size_t p = at(s.sxx(k));
    if (full_moments(cov_)) {
      for (int i = 0; i < d; ++i)
        for (int j = i; j < d; ++j) e[p++] = bound_exponent(n2 * max_abs[i] * max_abs[j]);
    } else {
      for (int j = 0; j < d; ++j) e[p++] = bound_exponent(n2 * max_abs[j] * max_abs[j]);
    }
  }
  e[e.size() - 1] = bound_exponent(n2);  // rows; log_norm (e.size() - 2) is summed apart
  return e;
}

// ---------------------------------------------------------------------------------------------
// Per-block statistics and their per-thread sums

namespace {

// Full covariance up to this dimension forms the block's second moments as one GEMM against the
// packed outer products of its rows; above it, one symmetric rank-n update per component (the
// packed features of a block would no longer fit in cache).
constexpr int kMaxFeatureDim = 32;
// From this dimension on, the E-step forms P_k^T (x - c) as a triangular product per component
// rather than one GEMM over a group of components (Model::log_rho).
constexpr int kTriangularMinDim = 64;
// Up to this dimension the full-covariance E-step forms each line P_k^T (x - c) directly (a GEMM
// of depth D would run far below its speed).
constexpr int kMaxDirectLineDim = 4;
// The expanded E-step (Model::refresh_kernel) is used while every component's nu_k ||m_k - c||^2_Wk
// stays below this: 256 standard deviations of the component from the shift c.
constexpr double kMaxExpandedOffset = 65536.0;

// Above kMaxFeatureDim, a thread queues this many blocks (their centred rows and responsibilities)
// and then forms their second moments component by component: component k's sums (D(D+1)/2
// entries; with exact sums, three int64 limbs each: 450 KB at D = 192) are then touched by the
// queued blocks one after another while they are in cache, instead of the whole K-component
// accumulator (13.5 MB at D = 192, K = 30) streaming through memory once per block. Costs
// kQueueBlocks x 256 x (D + K) doubles per thread (3.6 MB at D = 192, K = 30).
constexpr int kQueueBlocks = 8;

// Full second moments with kMaxDirectLineDim < D <= kMaxFeatureDim take the point-major
// features and the sparse statistics below; the other feature paths the transposed features and
// one dense GEMM.
bool point_features(Covariance cov, Index d) {
  return full_moments(cov) && d > kMaxDirectLineDim && d <= kMaxFeatureDim;
}

// F^T = [1, x - c, packed (x - c)(x - c)^T]^T of a block (diag and spherical: [1, x - c,
// (x - c)^2]^T) from its centred rows transposed (xt, D x n): one feature per contiguous row, so
// that every write is contiguous. The statistics are then one GEMM R^T F.
void build_features_t(const RowMatrix& xt, Covariance cov, RowMatrix& f) {
  const Index d = xt.rows(), n = xt.cols();
  const Index m = full_moments(cov) ? d * (d + 1) / 2 : d;
  f.resize(1 + d + m, n);
  f.row(0).setOnes();
  f.middleRows(1, d) = xt;
  if (full_moments(cov)) {
    Index p = 1 + d;
    for (Index i = 0; i < d; ++i)
      for (Index j = i; j < d; ++j) f.row(p++) = xt.row(i).cwiseProduct(xt.row(j));
  } else {
    f.bottomRows(d) = xt.cwiseAbs2();
  }
}

// The same features point-major, F (n x (1 + D + D(D+1)/2) used of kFeaturePad more columns),
// from the centred rows xc (n x D): each point's features contiguous, as the sparse statistics
// read them and as the expanded E-step's GEMM takes them (Theta F^T). Packed row a of y y^T,
// y_a y[a, D), is written four products at a time; a write past its D - a entries is overwritten
// by row a + 1, and the last row's by at most three padding columns (never read).
constexpr Index kFeaturePad = 4;
void build_features_rows(const RowMatrix& xc, RowMatrix& f) {
  const Index n = xc.rows(), d = xc.cols();
  f.resize(n, 1 + d + d * (d + 1) / 2 + kFeaturePad);
  double y[kMaxFeatureDim + 4] = {};  // one row, zero-padded for the last four-wide reads
  for (Index i = 0; i < n; ++i) {
    std::memcpy(y, &xc(i, 0), std::size_t(d) * sizeof(double));
    double* o = &f(i, 0);
    *o++ = 1.0;
    for (Index a = 0; a < d; ++a) *o++ = y[a];
    for (Index a = 0; a < d; ++a) {
      const Vec4 ya = splat<Vec4>(y[a]);
      for (Index b = a; b < d; b += 4) {
        const Vec4 p = ya * vload<Vec4>(y + b);
        std::memcpy(o + (b - a), &p, sizeof p);
      }
      o += d - a;
    }
  }
}

// Responsibilities below this are left out of a block's statistics (see Accumulator::drain for
// why that is below what the exact sums represent).
constexpr double kNegligibleResp = 0x1p-140;

// The i < n with r[i] >= kNegligibleResp, in increasing order, into kept[0, m); returns m. kept
// needs room for n + 4 entries. Branch-free; with AVX2, four rows per step: the comparison's
// four-bit mask selects the kept rows' offsets from a table (about 4% of a full-covariance
// iteration at D = 16 went to the scalar loop).
Index kept_rows(const double* r, Index n, Index* kept) {
  Index m = 0, i = 0;
#ifdef __AVX2__
  static constexpr auto kOffsets = [] {
    std::array<std::array<std::int64_t, 4>, 16> t{};
    for (int mask = 0; mask < 16; ++mask)
      for (int b = 0, j = 0; b < 4; ++b)
        if (mask >> b & 1) t[std::size_t(mask)][std::size_t(j++)] = b;
    return t;
  }();
  static_assert(sizeof(Index) == sizeof(std::int64_t));
  const __m256d threshold = _mm256_set1_pd(kNegligibleResp);
  for (; i + 4 <= n; i += 4) {
    const int mask =
        _mm256_movemask_pd(_mm256_cmp_pd(_mm256_loadu_pd(r + i), threshold, _CMP_GE_OQ));
    const __m256i offsets =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kOffsets[std::size_t(mask)].data()));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(kept + m),
                        _mm256_add_epi64(offsets, _mm256_set1_epi64x(i)));
    m += __builtin_popcount(unsigned(mask));
  }
#endif
  for (; i < n; ++i) {
    kept[m] = i;
    m += r[i] >= kNegligibleResp;
  }
  return m;
}

// out[0, 4W) = sum_j r[kept[j]] f[kept[j] ld + (0, 4W)], in the order of kept, with W vector
// accumulators held in registers.
template <int W>
void kept_sum(const double* r, const Index* kept, Index m, const double* f, Index ld, double* out) {
  Vec4 acc[W] = {};
  for (Index j = 0; j < m; ++j) {
    const Index i = kept[j];
    const Vec4 ri = splat<Vec4>(r[i]);
    const double* fi = f + i * ld;
#pragma GCC unroll 8
    for (int w = 0; w < W; ++w) acc[w] += ri * vload<Vec4>(fi + 4 * w);
  }
  std::memcpy(out, acc, sizeof acc);
}

// g (K x row, row-major) = sum over the block's points with r_nk >= kNegligibleResp of r_nk F_n,
// for point-major F (n x row, of leading dimension f.cols()). Once a mixture separates, most
// responsibilities are negligible (at (N, D, K) = (2e5, 16, 20), 73% after one iteration from a
// one-hot start, 93% after 12), and a dense GEMM would spend as much on them as on the rest. Each
// component's kept rows are visited in order and summed into 32 of its 1 + D + D(D+1)/2 entries
// at a time, held in registers: one multiply-add per feature and kept (n, k). Which rows are
// kept, and the order of every sum, depend on the block alone: rank- and thread-invariant.
void sparse_moments(const RowMatrix& rt, const RowMatrix& f, Index row, std::vector<Index>& kept,
                    double* g) {
  const Index kk = rt.rows(), n = rt.cols(), ld = f.cols();
  kept.resize(std::size_t(n) + 4);  // kept_rows writes four at a time
  for (Index k = 0; k < kk; ++k) {
    const double* r = &rt(k, 0);
    const Index m = kept_rows(r, n, kept.data());
    double* out = g + k * row;
    Index c = 0;
    for (; c + 32 <= row; c += 32) kept_sum<8>(r, kept.data(), m, f.data() + c, ld, out + c);
    if (c + 16 <= row) kept_sum<4>(r, kept.data(), m, f.data() + c, ld, out + c), c += 16;
    if (c + 8 <= row) kept_sum<2>(r, kept.data(), m, f.data() + c, ld, out + c), c += 8;
    if (c + 4 <= row) kept_sum<1>(r, kept.data(), m, f.data() + c, ld, out + c), c += 4;
    for (; c < row; ++c) {
      double acc = 0;
      for (Index j = 0; j < m; ++j) acc += r[kept[std::size_t(j)]] * f(kept[std::size_t(j)], c);
      out[c] = acc;
    }
  }
}

}  // namespace

namespace detail {

// A thread's running sums and scratch, kept from pass to pass in the Stats they feed (see
// Stats::pass_scratch). Each block's statistics are formed in double and then added: into an
// ExactSum (exact mode: the order of blocks, and of the pieces of a block, is then irrelevant), or
// into the double sums `sum` (fast mode: every entry receives the blocks' values in the thread's
// block order, as one whole-block add would do). Between passes the sums are zero.
struct Accumulator {
  std::vector<double> sum;
  std::optional<ExactSum> exact;
  std::vector<double> block_log_norms;
  std::vector<double> block;  // one block's statistics (small D and diagonal)
  RowMatrix xc, xt, r, y, f;  // scratch: centred block (n x D and D x n), responsibilities
                              // (K x n), E-step products, features (transposed, F^T)
  RowMatrix head;             // scratch: [N_k, Sx_k] of one block (K x (1 + D); large D)
  MatrixXd scatter;           // scratch: one component's D x D second moment (large D)
  MatrixXd z;                 // scratch: sqrt(r)-weighted rows of one component (large D)
  std::vector<RowMatrix> queued_x, queued_r;  // queued blocks: centred rows, responsibilities^T
  std::vector<Index> kept;                    // scratch: sparse_moments' rows of one component
  int queued = 0;

  // Makes the sums fit s (its size and mode; exact: its grid), allocating only on a change.
  void fit(Stats& s) {
    const std::size_t size = s.buffer().size();
    const bool large = s.moment_size() > std::size_t(s.dim()) && s.dim() > kMaxFeatureDim;
    if (large)
      block.clear();
    else if (block.size() != size)
      block.assign(size, 0.0);
    if (s.exact()) {
      sum.clear();
      const ExactSum& grid = s.exact_part().sum;
      if (!exact || &exact->exponents() != &grid.exponents()) exact.emplace(grid.zeros_like());
    } else {
      exact.reset();
      if (sum.size() != size) sum.assign(size, 0.0);
    }
  }

  // Adds v to entries [offset, offset + v.size()) of the sums (exact: within a prepare()d round).
  void put(std::size_t offset, const double* v, std::size_t n) {
    if (exact) {
      exact->add_range(offset, std::span<const double>(v, n));
    } else {
      double* out = sum.data() + offset;
      for (std::size_t i = 0; i < n; ++i) out[i] += v[i];
    }
  }

  // The statistics of one block (Bishop 2006, eqs 10.51-10.53, before normalisation): the rows of
  // R^T F with F = [1, x - c, packed (x - c)(x - c)^T] (diag: [1, x - c, (x - c)^2]).
  // rt holds the block's responsibilities transposed (K x n), xtb the centred rows transposed
  // (D x n). F is formed transposed, one feature per contiguous row of F^T: built column by
  // column in a row-major n x (1 + D + M) matrix, every write was strided by the row length,
  // which cost a fifth of a full-covariance iteration at D = 16. Full second moments at
  // kMaxDirectLineDim < D <= kMaxFeatureDim instead take F point-major and sparse_moments;
  // `ready`, if given, holds that F already (formed by the expanded E-step).
  void add(const RowMatrix& xcb, const RowMatrix& xtb, const RowMatrix& rt, double log_norm,
           Covariance cov, const RowMatrix* ready = nullptr) {
    const Index n = xcb.rows(), d = xcb.cols(), kk = rt.rows();
    const Index m = full_moments(cov) ? d * (d + 1) / 2 : d;
    const Index row = 1 + d + m;
    const std::size_t tail = std::size_t(kk * row);  // log_norm, then rows
    const bool features = !full_moments(cov) || d <= kMaxFeatureDim;
    if (exact) exact->prepare(1);
    if (features) {
      if (point_features(cov, d)) {
        if (!ready) build_features_rows(xcb, f);
        sparse_moments(rt, ready ? *ready : f, row, kept, block.data());
      } else {
        build_features_t(xtb, cov, f);
        Eigen::Map<RowMatrix> g(block.data(), kk, row);
        g.noalias() = rt * f.transpose();
      }
      put(0, block.data(), tail);
    } else {
      f.resize(n, 1 + d);
      f.col(0).setOnes();
      f.middleCols(1, d) = xcb;
      // [N_k, Sx_k] now; the second moments when the queue is full (drain).
      head.noalias() = rt * f;
      for (Index k = 0; k < kk; ++k) put(std::size_t(k * row), &head(k, 0), std::size_t(1 + d));
      if (queued_x.size() < std::size_t(kQueueBlocks)) {
        queued_x.resize(kQueueBlocks);
        queued_r.resize(kQueueBlocks);
      }
      queued_x[queued] = xcb;
      queued_r[queued] = rt;
      if (++queued == kQueueBlocks) drain();
    }
    const double rows = static_cast<double>(n);
    put(tail + 1, &rows, 1);
    if (exact) {
      block_log_norms.push_back(log_norm);  // summed apart (see Stats)
    } else {
      sum[tail] += log_norm;
    }
  }

  // Second moments of the queued blocks (large D), component by component: one symmetric rank-m
  // update on the sqrt(r)-weighted rows (half the flops of a GEMM) per block, whose lower triangle
  // (column i from row i = packed upper row i) is added straight from the D x D result.
  //
  // Only the m rows with r_nk >= kNegligibleResp enter the update. Once a mixture has separated,
  // most responsibilities are astronomically small (on bench/stl_shape.py's histograms 87% are
  // below 1e-300), yet a dense update spends as much on them as on the rows that matter. The
  // dropped rows add at most 256 * 2^-140 * a_i a_j to a block's Sxx_kij (a_j bounds |x_nj - c_j|),
  // while the exact sums' grid unit for that entry exceeds 2 N a_i a_j 2^-118
  // (Model::exact_exponents): below 2^-15 of one grid unit, i.e. below what the sum represents.
  // (The kept rows' block sum is still rounded by the update in double, now over fewer terms, so
  // last bits can differ from a dense update's; they did before between any two kernel orders.)
  // Which rows are kept depends on the block alone, so results stay rank- and thread-invariant.
  // N_k and Sx_k (the GEMM in add) still take every row.
  void drain() {
    if (queued == 0) return;
    const Index d = queued_x[0].cols(), kk = queued_r[0].rows();
    const Index row = 1 + d + d * (d + 1) / 2;
    if (exact) exact->prepare(queued);
    for (Index k = 0; k < kk; ++k) {
      for (int q = 0; q < queued; ++q) {
        const RowMatrix& rt = queued_r[q];
        const RowMatrix& xq = queued_x[q];
        Index m = 0;
        for (Index i = 0; i < rt.cols(); ++i) m += rt(k, i) >= kNegligibleResp;
        // Nothing to add: the block's sums would be below the grid (or exactly zero).
        if (m == 0) continue;
        if (m == rt.cols()) {  // every row kept (dense responsibilities): one vectorised pass
          z = (xq.array().colwise() * rt.row(k).transpose().array().sqrt()).matrix();
        } else {
          z.resize(m, d);
          for (Index i = 0, j = 0; i < rt.cols(); ++i)
            if (rt(k, i) >= kNegligibleResp) z.row(j++) = std::sqrt(rt(k, i)) * xq.row(i);
        }
        scatter.setZero(d, d);
        scatter.selfadjointView<Eigen::Lower>().rankUpdate(z.transpose());
        std::size_t out = std::size_t(k * row + 1 + d);
        for (Index i = 0; i < d; ++i) {
          put(out, &scatter(i, i), std::size_t(d - i));
          out += std::size_t(d - i);
        }
      }
    }
    queued = 0;
  }

  // Adds the sums into s and leaves them zero for the next pass.
  void flush_into(Stats& s) {
    if (exact) {
      s.exact_part().sum.absorb(*exact);
      auto& ln = s.exact_part().block_log_norms;
      ln.insert(ln.end(), block_log_norms.begin(), block_log_norms.end());
      block_log_norms.clear();
    } else {
      double* out = s.buffer().data();
      for (std::size_t i = 0; i < sum.size(); ++i) {
        out[i] += sum[i];
        sum[i] = 0.0;
      }
    }
  }
};

struct PassScratch {
  std::vector<Accumulator> acc;  // one per thread
};

ScratchSlot::ScratchSlot() = default;
ScratchSlot::~ScratchSlot() = default;
ScratchSlot::ScratchSlot(const ScratchSlot&) {}
ScratchSlot& ScratchSlot::operator=(const ScratchSlot&) {
  p_.reset();
  return *this;
}
ScratchSlot::ScratchSlot(ScratchSlot&&) noexcept = default;
ScratchSlot& ScratchSlot::operator=(ScratchSlot&&) noexcept = default;
PassScratch& ScratchSlot::get() {
  if (!p_) p_ = std::make_unique<PassScratch>();
  return *p_;
}
void ScratchSlot::reset() {
  p_.reset();
}

}  // namespace detail

namespace {

using detail::Accumulator;

// Runs body(acc, r0, r1) over blocks of rows on all threads, then adds the thread sums into
// stats (exact: in any order; fast: in thread order, a fixed order for a fixed thread count).
// The accumulators live in stats (sized on each thread's first block, so that each thread first
// touches its own); after an error they are dropped, since they may hold part of a pass.
template <class Body>
void for_blocks(Index n_rows, Stats& stats, Body&& body) {
  const int n_threads =
      std::max(1, std::min<int>(max_threads(), (n_rows + kBlockRows - 1) / kBlockRows));
  auto& acc = stats.pass_scratch().acc;
  if (acc.size() < std::size_t(n_threads)) acc.resize(std::size_t(n_threads));
  try {
    std::vector<char> fitted(std::size_t(n_threads), 0);
    const auto run = [&](int t, std::int64_t r0, std::int64_t r1) {
      if (!fitted[std::size_t(t)]) {
        acc[std::size_t(t)].fit(stats);
        fitted[std::size_t(t)] = 1;
      }
      body(acc[std::size_t(t)], r0, r1);
    };
    // Exact sums do not depend on which thread adds which block, so blocks go to whichever
    // thread is free (the sparse statistics make blocks unequal in cost); the plain double sums
    // need the fixed static order.
    if (stats.exact())
      parallel_blocks_dynamic(n_rows, kBlockRows, n_threads, run);
    else
      parallel_blocks(n_rows, kBlockRows, n_threads, run);
    // Each thread's queued blocks, one accumulator per thread again.
    parallel_blocks(n_threads, 1, n_threads, [&](int, std::int64_t i, std::int64_t) {
      if (fitted[std::size_t(i)]) acc[std::size_t(i)].drain();
    });
    for (int t = 0; t < n_threads; ++t)
      if (fitted[std::size_t(t)]) acc[std::size_t(t)].flush_into(stats);
  } catch (...) {
    acc.clear();
    throw;
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Model

Model::Model(Covariance cov, int n_components, Prior prior, VectorXd shift, Estimator est,
             double reg_covar)
    : cov_(cov),
      k_(n_components),
      prior_(std::move(prior)),
      shift_(std::move(shift)),
      est_(est),
      reg_covar_(reg_covar) {}

void Model::accumulate(const RowMatrix& x, const RowMatrix& resp, Stats& stats) const {
  for_blocks(x.rows(), stats, [&](Accumulator& a, Index r0, Index r1) {
    a.xc = x.middleRows(r0, r1 - r0).rowwise() - shift_.transpose();
    a.r = resp.middleRows(r0, r1 - r0).transpose();
    a.xt = a.xc.transpose();
    a.add(a.xc, a.xt, a.r, 0.0, cov_);
  });
}

void Model::log_rho(const RowMatrix& xc, const RowMatrix& xt, RowMatrix& y, RowMatrix& out) const {
  // Bishop 2006, eq. 10.46 with 10.64-10.66:
  //   ln rho_nk = E[ln pi_k] + E[ln|Lambda_k|]/2 - D/2 ln 2pi
  //   - D/(2 beta_k) - nu_k/2 (x_n - m_k)^T W_k (x_n - m_k).   xt here is (x - c)^T, D x n.
  // EM (Bishop 9.23): ln pi_k + ln|Lambda_k|/2 - D/2 ln 2pi - 1/2 (x_n - mu_k)^T Lambda_k (.),
  // the same form with beta_k -> infinity and nu_k W_k -> Lambda_k (see refresh_ml).
  // Everything runs along rows (contiguous, n per line), so it vectorises for any D and K.
  const Index n = xt.cols();
  const int kk = n_components(), d = dim();
  out.resize(kk, n);
  Eigen::ArrayXd quad(n);
  if (full_moments(cov_)) {
    // (x - m)^T W (x - m) = ||P^T (x - c) - P^T (m - c)||^2 with P P^T = W, for a group of
    // components at once: one GEMM [P_k ... P_k+g]^T (x - c)^T, then sums of D squared lines.
    // Groups keep the product block (gD x n) within ~1 MB of cache.
    if (precision_ == Precision::kSingle) {
      // float32 products, double sums (--precision single, docs/performance.md). Each component's
      // rows are centred on m_k in double and rounded once to float, so the product P_k^T (x - m_k)
      // is of small numbers and nothing cancels afterwards; forming P^T (x - c) - P^T (m - c) in
      // float instead would subtract two large rounded values for points far from c. The squares
      // are summed in double. Relative error of the quadratic form: about sqrt(D) x 2^-24.
      thread_local Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> xf, yf;
      for (int k = 0; k < kk; ++k) {
        xf = (xt.colwise() - m_shifted_.row(k).transpose()).cast<float>();
        if (d >= kTriangularMinDim)
          yf.noalias() = prec_chol_t_f_[std::size_t(k)].triangularView<Eigen::Lower>() * xf;
        else
          yf.noalias() = prec_chol_t_f_[std::size_t(k)] * xf;
        quad.setZero();
        for (int j = 0; j < d; ++j) quad += yf.row(j).cast<double>().array().square();
        out.row(k) = log_rho_base_[k] - 0.5 * quad_scale_[k] * quad;
      }
      return;
    }
    // ln rho_nk of component k from its lines P_k^T (x - c), rows [r0, r0 + D) of y.
    const auto from_lines = [&](int k, Index r0) {
      quad.setZero();
      for (int j = 0; j < d; ++j)
        quad += (y.row(r0 + j).array() - offset_all_[Index(k) * d + j]).square();
      out.row(k) = log_rho_base_[k] - 0.5 * quad_scale_[k] * quad;
    };
    if (cov_ == Covariance::kTied) {
      // One shared P: its lines P^T (x - c) are formed once for all K components.
      if (d >= kTriangularMinDim)
        y.noalias() = prec_chol_[0].transpose().triangularView<Eigen::Lower>() * xt;
      else
        y.noalias() = prec_chol_[0].transpose() * xt;
      for (int k = 0; k < kk; ++k) from_lines(k, 0);
      return;
    }
    if (theta_.size() != 0) {
      // Expanded: ln rho_nk = Theta_k . F_n, one GEMM against the block's features (left in y
      // for the statistics, which take the same F; see refresh_kernel).
      build_features_rows(xc, y);
      out.noalias() = theta_ * y.leftCols(theta_.cols()).transpose();
      return;
    }
    if (d <= kMaxDirectLineDim) {
      // Tiny D: the GEMM's depth would be D, so form each line P_k^T (x - c) directly.
      for (int k = 0; k < kk; ++k) {
        quad.setZero();
        for (int j = 0; j < d; ++j) {
          Eigen::ArrayXd t = Eigen::ArrayXd::Constant(n, -offset_all_[Index(k) * d + j]);
          for (int i = 0; i < d; ++i) t += prec_all_(i, Index(k) * d + j) * xt.row(i).array();
          quad += t.square();
        }
        out.row(k) = log_rho_base_[k] - 0.5 * quad_scale_[k] * quad;
      }
      return;
    }
    const int group = std::max(1, 512 / d);
    for (int k0 = 0; k0 < kk; k0 += group) {
      const int g = std::min(group, kk - k0);
      if (d >= kTriangularMinDim) {
        // P_k^T is lower triangular: a triangular product does half the GEMM's flops (D^2 instead
        // of 2 D^2 per point and component), which pays once D is large enough for Eigen's
        // blocked triangular kernel to run near GEMM speed.
        y.resize(Index(g) * d, n);
        for (int k = 0; k < g; ++k)
          y.middleRows(Index(k) * d, d).noalias() =
              prec_chol_[std::size_t(k0 + k)].transpose().triangularView<Eigen::Lower>() * xt;
      } else {
        y.noalias() = prec_all_.middleCols(Index(k0) * d, Index(g) * d).transpose() * xt;
      }
      for (int k = 0; k < g; ++k) from_lines(k0 + k, Index(k) * d);
    }
  } else {
    for (int k = 0; k < kk; ++k) {
      quad.setZero();
      for (int j = 0; j < d; ++j)
        quad += w_diag_(k, j) * (xt.row(j).array() - m_shifted_(k, j)).square();
      out.row(k) = log_rho_base_[k] - 0.5 * quad_scale_[k] * quad;
    }
  }
}

void Model::local_step(const RowMatrix& x, Stats& stats, RowMatrix* resp_out) const {
  if (resp_out) resp_out->resize(x.rows(), n_components());
  for_blocks(x.rows(), stats, [&](Accumulator& a, Index r0, Index r1) {
    const Index n = r1 - r0;
    a.xc = x.middleRows(r0, n).rowwise() - shift_.transpose();
    if (theta_.size() == 0) a.xt = a.xc.transpose();  // the expanded E-step reads xc only
    log_rho(a.xc, a.xt, a.y, a.r);
    // Bishop 2006, eq. 10.49, by log-sum-exp: r_nk = exp(ln rho_nk - ln sum_j rho_nj), with the
    // maxima over k subtracted first and the exponentials of the whole K x n block taken at once.
    const Eigen::RowVectorXd mx = a.r.colwise().maxCoeff();
    a.r.rowwise() -= mx;
    a.r = a.r.array().exp();
    const Eigen::RowVectorXd sums = a.r.colwise().sum();
    a.r.array().rowwise() /= sums.array();
    const double log_norm = (mx.array() + sums.array().log()).sum();
    if (resp_out) resp_out->middleRows(r0, n) = a.r.transpose();
    a.add(a.xc, a.xt, a.r, log_norm, cov_, theta_.size() != 0 ? &a.y : nullptr);
  });
}

void Model::update(const Stats& s) {
  if (est_ == Estimator::kMaximumLikelihood) return update_ml(s);
  // Natural-parameter form of Bishop (10.58), (10.60)-(10.63), in coordinates shifted by c:
  //   alpha_k = alpha0 + N_k,  beta_k = beta0 + N_k,  nu_k = nu0 + N_k,
  //   beta_k m_k = beta0 m0 + Sx_k,
  //   W_k^-1 = W0^-1 + beta0 m0 m0^T + Sxx_k - beta_k m_k m_k^T,
  // which equals (10.62) (N_k S_k + beta0 N_k/(beta0 + N_k) (xbar - m0)(xbar - m0)^T) without
  // dividing by N_k, so empty components need no special case.
  // Tied: the Wishart's terms summed over components, nu = nu0 + N, W^-1 = W0^-1 + sum_k (beta0
  // m0 m0^T + Sxx_k - beta_k m_k m_k^T). Spherical: summed over dimensions, nu_k = nu0 + D N_k,
  // W_k^-1 = W0^-1 + sum_d (beta0 m0_d^2 + Sxx_kd - beta_k m_kd^2). (See the header.)
  const int d = dim(), kk = s.n_components();
  const VectorXd m0c = prior_.m0 - shift_;
  Posterior p;
  p.alpha.resize(kk);
  p.beta.resize(kk);
  p.nu.resize(kk);
  p.m.resize(kk, d);
  p.W_inv.resize(kk);
  RowMatrix m_shifted(kk, d);  // m_k - c, kept exactly: see refresh()
  MatrixXd pooled;             // tied: the components' summed scatter terms
  if (cov_ == Covariance::kTied) pooled.setZero(d, d);
  double n_total = 0;
  if (prior_.weights == WeightPrior::kStickBreaking) {
    // Blei & Jordan (2006): a_k = 1 + N_k, b_k = alpha0 + sum_{j>k} N_j.
    p.alpha.resize(0);
    p.stick_a.resize(kk);
    p.stick_b.resize(kk);
    double tail = 0;
    for (int k = kk - 1; k >= 0; --k) {
      p.stick_a[k] = 1.0 + s.n(k);
      p.stick_b[k] = prior_.alpha0 + tail;
      tail += s.n(k);
    }
  }
  for (int k = 0; k < kk; ++k) {
    const double nk = s.n(k);
    if (prior_.weights == WeightPrior::kDirichlet) p.alpha[k] = prior_.alpha0 + nk;
    p.beta[k] = prior_.beta0 + nk;
    p.nu[k] = prior_.nu0 + (cov_ == Covariance::kSpherical ? d * nk : nk);
    n_total += nk;
    const VectorXd mc = (prior_.beta0 * m0c + Eigen::Map<const VectorXd>(s.sx(k), d)) / p.beta[k];
    p.m.row(k) = (mc + shift_).transpose();
    m_shifted.row(k) = mc.transpose();
    switch (cov_) {
      case Covariance::kFull: {
        MatrixXd wi = prior_.W0_inv + prior_.beta0 * m0c * m0c.transpose() + s.sxx_matrix(k) -
                      p.beta[k] * mc * mc.transpose();
        p.W_inv[k] = 0.5 * (wi + wi.transpose());
        break;
      }
      case Covariance::kDiag:
        p.W_inv[k] = prior_.W0_inv + prior_.beta0 * m0c.cwiseAbs2() +
                     Eigen::Map<const VectorXd>(s.sxx(k), d) - p.beta[k] * mc.cwiseAbs2();
        break;
      case Covariance::kTied:
        pooled += prior_.beta0 * m0c * m0c.transpose() + s.sxx_matrix(k) -
                  p.beta[k] * mc * mc.transpose();
        break;
      case Covariance::kSpherical: {
        const double wi = prior_.W0_inv(0, 0) +
                          (prior_.beta0 * m0c.cwiseAbs2() +
                           Eigen::Map<const VectorXd>(s.sxx(k), d) - p.beta[k] * mc.cwiseAbs2())
                              .sum();
        p.W_inv[k] = VectorXd::Constant(d, wi);
        break;
      }
    }
  }
  if (cov_ == Covariance::kTied) {
    pooled += prior_.W0_inv;
    const MatrixXd wi = 0.5 * (pooled + pooled.transpose());
    for (int k = 0; k < kk; ++k) {
      p.W_inv[k] = wi;
      p.nu[k] = prior_.nu0 + n_total;
    }
  }
  post_ = std::move(p);
  m_shifted_ = std::move(m_shifted);
  refresh();
}

namespace {
[[noreturn]] void throw_singular(int k) {
  throw Error("EM: the covariance of component " + std::to_string(k) +
              " is singular (its points collapsed onto a point or a subspace); add a small "
              "--reg-covar, e.g. 1e-6, or use fewer components");
}

// The maximum-likelihood covariance c + reg_covar I, symmetrised, where c = raw - (the means'
// outer product) as the caller formed it (inline, so that the compiler may fuse its products
// and subtractions as before); nothing if it is singular. It is a difference of raw moments: a
// collapsed component (all its points equal) leaves round-off of size eps * raw instead of an
// exact zero, so "singular" means a Cholesky pivot below that round-off level, not only a failed
// factorisation.
std::optional<MatrixXd> ml_covariance(MatrixXd c, const MatrixXd& raw, double reg) {
  const double eps = std::numeric_limits<double>::epsilon();
  c.diagonal().array() += reg;
  c = 0.5 * (c + c.transpose());
  Eigen::LLT<MatrixXd> llt(c);
  const double floor = 100 * eps * (raw.diagonal().maxCoeff() + reg);
  if (llt.info() != Eigen::Success ||
      MatrixXd(llt.matrixL()).diagonal().cwiseAbs2().minCoeff() <= floor)
    return std::nullopt;
  return c;
}
}  // namespace

void Model::update_ml(const Stats& s) {
  // Bishop (9.24)-(9.26) in coordinates shifted by c: pi_k = N_k / N, mu_k - c = Sx_k / N_k,
  // Sigma_k = Sxx_k / N_k - (mu_k - c)(mu_k - c)^T + reg_covar I. As scikit-learn, N_k gets
  // 10 machine epsilons so that an empty component gives a finite (then singular) estimate.
  const int d = dim(), kk = s.n_components();
  const double eps = std::numeric_limits<double>::epsilon();
  MlParams p;
  p.weights.resize(kk);
  p.means.resize(kk, d);
  RowMatrix m_shifted(kk, d);  // mu_k - c, kept exactly: see refresh()
  p.covariances.resize(kk);
  MatrixXd tied_raw, tied_means;  // tied: sum_k Sxx_k and sum_k N_k mc_k mc_k^T
  if (cov_ == Covariance::kTied) {
    tied_raw.setZero(d, d);
    tied_means.setZero(d, d);
  }
  double n_total = 0;
  for (int k = 0; k < kk; ++k) {
    const double nk = s.n(k) + 10 * eps;
    p.weights[k] = nk;
    const VectorXd mc = Eigen::Map<const VectorXd>(s.sx(k), d) / nk;
    p.means.row(k) = (mc + shift_).transpose();
    m_shifted.row(k) = mc.transpose();
    if (cov_ == Covariance::kTied) {
      // Pooled below: the maximum-likelihood shared covariance is the within-component scatter,
      // Sigma = (sum_k Sxx_k - sum_k N_k mc_k mc_k^T) / sum_k N_k, + reg_covar I (as
      // scikit-learn's "tied", whose N_k carry the same 10 eps).
      tied_raw += s.sxx_matrix(k);
      tied_means += nk * mc * mc.transpose();
      n_total += nk;
    } else if (cov_ == Covariance::kSpherical) {
      // sigma_k^2 = mean_d (Sxx_kd / N_k - mc_kd^2) + reg_covar (scikit-learn's "spherical").
      const VectorXd raw = Eigen::Map<const VectorXd>(s.sxx(k), d) / nk;
      const double var = (raw - mc.cwiseAbs2()).mean() + reg_covar_;
      if (!(var > 100 * eps * (raw.mean() + reg_covar_))) throw_singular(k);
      p.covariances[k] = VectorXd::Constant(d, var);
    } else if (cov_ == Covariance::kFull) {
      const MatrixXd raw = s.sxx_matrix(k) / nk;
      auto c = ml_covariance(raw - mc * mc.transpose(), raw, reg_covar_);
      if (!c) throw_singular(k);
      p.covariances[k] = std::move(*c);
    } else {
      const VectorXd raw = Eigen::Map<const VectorXd>(s.sxx(k), d) / nk;
      p.covariances[k] = raw - mc.cwiseAbs2();
      p.covariances[k].array() += reg_covar_;
      if ((p.covariances[k].array() <= 100 * eps * (raw.array() + reg_covar_)).any())
        throw_singular(k);
    }
  }
  if (cov_ == Covariance::kTied) {
    const MatrixXd raw = tied_raw / n_total;
    const auto c = ml_covariance(raw - tied_means / n_total, raw, reg_covar_);
    if (!c)
      throw Error(
          "EM: the tied covariance is singular (the points lie in a subspace); add a small "
          "--reg-covar, e.g. 1e-6");
    for (int k = 0; k < kk; ++k) p.covariances[k] = *c;
  }
  p.weights /= p.weights.sum();
  ml_ = std::move(p);
  m_shifted_ = std::move(m_shifted);
  refresh_ml();
}

void Model::set_ml_params(MlParams p) {
  if (p.weights.size() != k_) throw Error("parameters have the wrong number of components");
  ml_ = std::move(p);
  m_shifted_ = ml_.means.rowwise() - shift_.transpose();
  refresh_ml();
}

void Model::refresh_ml() {
  const int d = dim(), kk = n_components();
  e_log_pi_ = ml_.weights.array().log().matrix();
  e_logdet_.resize(kk);
  logdet_w_.resize(kk);
  log_rho_base_.resize(kk);
  quad_scale_ = VectorXd::Ones(kk);
  prec_chol_.assign(full_moments(cov_) ? kk : 0, MatrixXd());
  w_diag_.resize(full_moments(cov_) ? 0 : kk, d);
  for (int k = 0; k < kk; ++k) {
    if (full_moments(cov_)) {
      Eigen::LLT<MatrixXd> llt(ml_.covariances[k]);
      if (llt.info() != Eigen::Success) throw_singular(k);
      const MatrixXd l = llt.matrixL();
      prec_chol_[k] = l.transpose().triangularView<Eigen::Upper>().solve(MatrixXd::Identity(d, d));
      logdet_w_[k] = -2.0 * l.diagonal().array().log().sum();  // ln |Lambda_k|
    } else {
      const Eigen::ArrayXd c = ml_.covariances[k].col(0).array();
      if (!(c > 0).all()) throw_singular(k);
      w_diag_.row(k) = c.inverse().matrix().transpose();
      logdet_w_[k] = -c.log().sum();
    }
    e_logdet_[k] = logdet_w_[k];
    log_rho_base_[k] = e_log_pi_[k] + 0.5 * logdet_w_[k] - 0.5 * d * math::kLog2Pi;
  }
  refresh_kernel();
}

void Model::set_posterior(Posterior post) {
  const Eigen::Index kw =
      prior_.weights == WeightPrior::kDirichlet ? post.alpha.size() : post.stick_a.size();
  if (kw != k_ || post.beta.size() != k_)
    throw Error("posterior has the wrong number of components");
  post_ = std::move(post);
  // Means from outside (a model file) exist only in absolute coordinates. The M-steps instead
  // overwrite m_shifted_ with the exact m_k - c they computed: re-deriving it from m_k loses
  // everything below ulp(c), which is all of it for data far from the origin relative to their
  // spread (found by tests/unit/test_fuzz_gmm.cpp).
  m_shifted_ = post_.m.rowwise() - shift_.transpose();
  refresh();
}

void Model::refresh() {
  const int d = dim(), kk = n_components();
  e_log_pi_.resize(kk);
  if (prior_.weights == WeightPrior::kDirichlet) {
    const double digamma_sum = math::digamma(post_.alpha.sum());
    for (int k = 0; k < kk; ++k)
      e_log_pi_[k] = math::digamma(post_.alpha[k]) - digamma_sum;  // Bishop 2006, eq. 10.65
  } else {
    // E[ln pi_k] = E[ln v_k] + sum_{j<k} E[ln(1 - v_j)] (Blei & Jordan 2006, eq. 21).
    double tail = 0;
    for (int k = 0; k < kk; ++k) {
      const double ds = math::digamma(post_.stick_a[k] + post_.stick_b[k]);
      e_log_pi_[k] = math::digamma(post_.stick_a[k]) - ds + tail;
      tail += math::digamma(post_.stick_b[k]) - ds;
    }
  }
  e_logdet_.resize(kk);
  logdet_w_.resize(kk);
  prec_chol_.assign(full_moments(cov_) ? kk : 0, MatrixXd());
  w_diag_.resize(full_moments(cov_) ? 0 : kk, d);
  for (int k = 0; k < kk; ++k) {
    if (full_moments(cov_)) {
      Eigen::LLT<MatrixXd> llt(post_.W_inv[k]);
      if (llt.info() != Eigen::Success)
        throw Error("component " + std::to_string(k) +
                    ": posterior scale matrix is not positive definite");
      const MatrixXd l = llt.matrixL();
      // P = L^-T: a triangular solve, so P P^T = (L L^T)^-1 = W without inverting W^-1.
      prec_chol_[k] = l.transpose().triangularView<Eigen::Upper>().solve(MatrixXd::Identity(d, d));
      logdet_w_[k] = -2.0 * l.diagonal().array().log().sum();
      // Bishop 2006, eq. 10.66.
      e_logdet_[k] = math::expected_logdet_wishart(logdet_w_[k], post_.nu[k], d);
    } else {
      const Eigen::ArrayXd wi = post_.W_inv[k].col(0).array();
      if (!(wi > 0).all())
        throw Error("component " + std::to_string(k) +
                    ": posterior scale is not positive (numerical breakdown)");
      w_diag_.row(k) = wi.inverse().matrix().transpose();
      logdet_w_[k] = -wi.log().sum();
      // Each dimension is a 1-D Wishart: E[ln lambda_d] = psi(nu/2) + ln 2 + ln w_d.
      e_logdet_[k] = d * (math::digamma(0.5 * post_.nu[k]) + math::kLog2) + logdet_w_[k];
    }
  }
  log_rho_base_ = e_log_pi_.array() + 0.5 * e_logdet_.array() - 0.5 * d * math::kLog2Pi -
                  0.5 * d / post_.beta.array();
  quad_scale_ = post_.nu;
  refresh_kernel();
}

void Model::set_precision(Precision p) {
  if (p == Precision::kSingle && !full_moments(cov_))
    throw Error(
        "--precision single needs --covariance full or tied (the diagonal and spherical "
        "E-steps have no products to speed up)");
  precision_ = p;
  if (prec_chol_.size() == std::size_t(k_)) refresh_kernel();
}

void Model::refresh_kernel() {
  if (!full_moments(cov_)) return;
  const int d = dim(), kk = n_components();
  prec_chol_t_f_.clear();
  if (precision_ == Precision::kSingle)
    for (int k = 0; k < kk; ++k) prec_chol_t_f_.push_back(prec_chol_[k].transpose().cast<float>());
  prec_all_.resize(d, Index(kk) * d);
  offset_all_.resize(Index(kk) * d);
  for (int k = 0; k < kk; ++k) {
    prec_all_.middleCols(Index(k) * d, d) = prec_chol_[k];
    offset_all_.segment(Index(k) * d, d) = m_shifted_.row(k) * prec_chol_[k];
  }
  // The expanded E-step. With y = x - c, mu = m_k - c and W_k = P_k P_k^T, the quadratic form of
  // Bishop 2006, eq. 10.64 expands to
  //   -nu_k/2 (y - mu)^T W_k (y - mu)
  //       = -nu_k/2 mu^T W_k mu + nu_k (W_k mu)^T y - nu_k/2 sum_i W_k,ii y_i^2
  //         - nu_k sum_{i<j} W_k,ij y_i y_j,
  // linear in the block's features F = [1, y, packed y y^T], which the statistics form anyway
  // (Bishop 2006, eqs 10.51-10.53). So ln rho = Theta F^T is one GEMM of depth 1 + D + D(D+1)/2:
  // at D = 16, 152 multiply-adds per point and component instead of the D^2 = 256 of the lines
  // P_k^T (y - c) and a pass over their K x D values afterwards (scikit-learn expands its
  // diagonal-covariance E-step the same way). The price is cancellation: the three terms are of
  // size s_k = nu_k ||mu||^2_Wk for points near m_k, so ln rho_nk carries an absolute error of a
  // few s_k ulp instead of a few sqrt(s_k) ulp. Below kMaxExpandedOffset that is under ~1e-10;
  // beyond it (a component hundreds of standard deviations from the shift) the lines are used.
  // The choice depends on the global parameters alone, so every rank and thread makes the same.
  theta_.resize(0, 0);
  if (cov_ != Covariance::kFull || precision_ != Precision::kDouble || d <= kMaxDirectLineDim ||
      d > kMaxFeatureDim)
    return;
  for (int k = 0; k < kk; ++k)
    if (!(quad_scale_[k] * offset_all_.segment(Index(k) * d, d).squaredNorm() <=
          kMaxExpandedOffset))
      return;
  theta_.resize(kk, 1 + d + Index(d) * (d + 1) / 2);
  const std::vector<MatrixXd> ws = scale_matrices();
  for (int k = 0; k < kk; ++k) {
    const double q = quad_scale_[k];
    const Eigen::RowVectorXd off = offset_all_.segment(Index(k) * d, d);
    const MatrixXd& w = ws[std::size_t(k)];
    theta_(k, 0) = log_rho_base_[k] - 0.5 * q * off.squaredNorm();
    theta_.row(k).segment(1, d) = q * (prec_chol_[k] * off.transpose()).transpose();
    Index p = 1 + d;
    for (int i = 0; i < d; ++i) {
      theta_(k, p++) = -0.5 * q * w(i, i);
      for (int j = i + 1; j < d; ++j) theta_(k, p++) = -q * w(i, j);
    }
  }
}

double Model::weight_kl_terms() const {
  const int kk = n_components();
  if (prior_.weights == WeightPrior::kDirichlet) {
    // E[ln p(pi)] - E[ln q(pi)]: Bishop (10.73) - (10.76).
    return math::log_dirichlet_norm(VectorXd::Constant(kk, prior_.alpha0)) -
           math::log_dirichlet_norm(post_.alpha) +
           ((prior_.alpha0 - post_.alpha.array()) * e_log_pi_.array()).sum();
  }
  // Sum over sticks of E[ln Beta(v_k | 1, alpha0)] - E[ln Beta(v_k | a_k, b_k)], with
  // ln B(1, alpha0) = -ln alpha0, E[ln v] = psi(a) - psi(a + b), E[ln(1-v)] = psi(b) - psi(a + b).
  double l = 0;
  for (int k = 0; k < kk; ++k) {
    const double a = post_.stick_a[k], b = post_.stick_b[k];
    const double ds = math::digamma(a + b);
    const double elv = math::digamma(a) - ds, el1v = math::digamma(b) - ds;
    const double log_beta_ab = std::lgamma(a) + std::lgamma(b) - std::lgamma(a + b);
    l += std::log(prior_.alpha0) + (prior_.alpha0 - 1) * el1v;
    l -= -log_beta_ab + (a - 1) * elv + (b - 1) * el1v;
  }
  return l;
}

double Model::objective(const Stats& s) const {
  // EM: the data term is the whole log-likelihood, sum_n ln sum_k pi_k N(x_n | mu_k, Sigma_k).
  return est_ == Estimator::kMaximumLikelihood ? s.log_norm() : elbo(s);
}

double Model::natural_inner(const Stats& g, const Stats& h) const {
  // Natural parameters and their dependence on the statistics (all affine with unit slope):
  //   Dirichlet alpha_k - 1 <- N_k;  sticks (a_k - 1, b_k - 1) <- (N_k, sum_{j>k} N_j);
  //   beta_k <- N_k;  beta_k m_k <- Sx_k;  W_k^-1 + beta_k m_k m_k^T <- Sxx_k;  nu_k <- N_k.
  // Sxx is a symmetric matrix stored packed (full): off-diagonal entries count twice.
  // Tied: one nu <- sum_k N_k and one W^-1 + sum_k beta_k m_k m_k^T <- sum_k Sxx_k. Spherical:
  // nu_k <- D N_k and the scalar W_k^-1 + beta_k ||m_k||^2 <- sum_d Sxx_kd.
  const int d = dim(), kk = n_components();
  double s = 0, tail_g = 0, tail_h = 0;
  const bool pooled = cov_ == Covariance::kTied || cov_ == Covariance::kSpherical;
  if (cov_ == Covariance::kTied) {
    const std::size_t m = g.moment_size();
    std::vector<double> sg(m, 0.0), sh(m, 0.0);
    double ng = 0, nh = 0;
    for (int k = 0; k < kk; ++k) {
      ng += g.n(k);
      nh += h.n(k);
      for (std::size_t i = 0; i < m; ++i) {
        sg[i] += g.sxx(k)[i];
        sh[i] += h.sxx(k)[i];
      }
    }
    s += ng * nh;
    std::size_t p = 0;
    for (int i = 0; i < d; ++i)
      for (int j = i; j < d; ++j, ++p) s += (i == j ? 1.0 : 2.0) * sg[p] * sh[p];
  }
  for (int k = kk - 1; k >= 0; --k) {
    if (!pooled) {
      s += 3.0 * g.n(k) * h.n(k);  // weights, beta, nu
    } else {
      s += 2.0 * g.n(k) * h.n(k);  // weights, beta
      if (cov_ == Covariance::kSpherical) {
        s += double(d) * d * g.n(k) * h.n(k);  // nu_k
        double sg = 0, sh = 0;
        for (int j = 0; j < d; ++j) {
          sg += g.sxx(k)[j];
          sh += h.sxx(k)[j];
        }
        s += sg * sh;
      }
    }
    if (prior_.weights == WeightPrior::kStickBreaking) {
      s += tail_g * tail_h;
      tail_g += g.n(k);
      tail_h += h.n(k);
    }
    for (int j = 0; j < d; ++j) s += g.sx(k)[j] * h.sx(k)[j];
    const double *pg = g.sxx(k), *ph = h.sxx(k);
    if (pooled) continue;
    if (cov_ == Covariance::kFull) {
      for (int i = 0; i < d; ++i)
        for (int j = i; j < d; ++j) s += (i == j ? 1.0 : 2.0) * (*pg++) * (*ph++);
    } else {
      for (int j = 0; j < d; ++j) s += pg[j] * ph[j];
    }
  }
  return s;
}

double Model::elbo(const Stats& s) const {
  // With optimal responsibilities, E[ln p(X|Z,mu,Lambda)] + E[ln p(Z|pi)] - E[ln q(Z)] collapses
  // to sum_n ln sum_k rho_nk (Bishop 10.71, 10.72, 10.75): the log_norm statistic.
  if (est_ == Estimator::kMaximumLikelihood) throw Error("EM has no ELBO (use objective)");
  const int d = dim(), kk = n_components();
  double l = s.log_norm();
  l += weight_kl_terms();
  // E[ln p(mu, Lambda)] - E[ln q(mu, Lambda)]: Bishop (10.74) - (10.77).
  const double b0 = prior_.beta0;
  double logdet_w0 = 0;
  Eigen::LLT<MatrixXd> llt0;
  if (full_moments(cov_)) {
    llt0.compute(prior_.W0_inv);
    logdet_w0 = -2.0 * MatrixXd(llt0.matrixL()).diagonal().array().log().sum();
  }
  for (int k = 0; k < kk; ++k) {
    const double bk = post_.beta[k], nuk = post_.nu[k];
    // (m_k - c) - (m0 - c): both small when the data sit far from the origin.
    const VectorXd dm = m_shifted_.row(k).transpose() - (prior_.m0 - shift_);
    // Gaussian parts; the E[ln|Lambda_k|]/2 of (10.74) and (10.77) cancel.
    // Tied: the Wishart's own terms (the trace term and those below) enter once, not per
    // component.
    const bool wishart_terms = cov_ != Covariance::kTied || k == 0;
    double quad_m, tr_w0inv_w = 0;
    if (full_moments(cov_)) {
      quad_m = (prec_chol_[k].transpose() * dm).squaredNorm();  // (m_k - m0)^T W_k (m_k - m0)
      if (wishart_terms) {
        const MatrixXd w = prec_chol_[k] * prec_chol_[k].transpose();
        tr_w0inv_w = prior_.W0_inv.cwiseProduct(w).sum();
      }
    } else if (cov_ == Covariance::kDiag) {
      quad_m = (dm.cwiseAbs2().array() * w_diag_.row(k).transpose().array()).sum();
      tr_w0inv_w = (prior_.W0_inv.col(0).array() * w_diag_.row(k).transpose().array()).sum();
    } else {  // spherical: E[ln p(lambda_k)] holds -W0^-1 E[lambda_k] / 2 once, not per dimension
      quad_m = w_diag_(k, 0) * dm.squaredNorm();
      tr_w0inv_w = prior_.W0_inv(0, 0) * w_diag_(k, 0);
    }
    l += 0.5 * (d * std::log(b0 / (2 * M_PI)) - d * b0 / bk - b0 * nuk * quad_m);
    l -= 0.5 * d * std::log(bk / (2 * M_PI)) - 0.5 * d;
    if (!wishart_terms) continue;
    l -= 0.5 * nuk * tr_w0inv_w;
    // Wishart parts: ln B(W0, nu0) + (nu0 - p - 1)/2 E[ln|Lambda|] + H[Lambda], per Wishart block.
    if (cov_ == Covariance::kSpherical) {
      const double logw = std::log(w_diag_(k, 0));
      const double elog = math::expected_logdet_wishart(logw, nuk, 1);
      l += math::log_wishart_norm(-std::log(prior_.W0_inv(0, 0)), prior_.nu0, 1) +
           0.5 * (prior_.nu0 - 2) * elog + math::wishart_entropy(logw, nuk, 1, elog);
    } else if (full_moments(cov_)) {
      l += math::log_wishart_norm(logdet_w0, prior_.nu0, d) +
           0.5 * (prior_.nu0 - d - 1) * e_logdet_[k] +
           math::wishart_entropy(logdet_w_[k], nuk, d, e_logdet_[k]);
    } else {
      for (int j = 0; j < d; ++j) {
        const double logw = std::log(w_diag_(k, j));
        const double elog = math::expected_logdet_wishart(logw, nuk, 1);
        l += math::log_wishart_norm(-std::log(prior_.W0_inv(j, 0)), prior_.nu0, 1) +
             0.5 * (prior_.nu0 - 2) * elog + math::wishart_entropy(logw, nuk, 1, elog);
      }
    }
  }
  return l;
}

double Model::log_predictive_sum(const RowMatrix& x, std::vector<double>* blocks) const {
  // Bishop 2006, eq. 10.81: p(x) ~ sum_k (alpha_k / alpha_hat) St(x | m_k, L_k, nu_k + 1 - D) with
  // L_k = (nu_k + 1 - D) beta_k / (1 + beta_k) W_k. The diagonal model factorises over
  // dimensions into 1-D Student-t densities with nu_k degrees of freedom. Tied is the full case
  // with the shared W and nu. Spherical, integrating the one lambda_k shared by the D dimensions:
  // x | lambda ~ N(m_k, (1 + beta_k)/(beta_k lambda) I) and lambda ~ Gamma(nu_k/2, 1/(2 w_k)) give
  // a D-dimensional Student-t with nu_k degrees of freedom and L_k = nu_k beta_k/(1 + beta_k) w_k
  // I.
  const Index n_blocks = (x.rows() + kBlockRows - 1) / kBlockRows;
  std::vector<double> partial(static_cast<std::size_t>(n_blocks), 0.0);
  auto finish = [&] {
    double total = 0;
    for (double p : partial) total += p;
    if (blocks) blocks->insert(blocks->end(), partial.begin(), partial.end());
    return total;
  };
  if (est_ == Estimator::kMaximumLikelihood) {
    // EM: the E-step's log-normalisers, sum_n ln sum_k pi_k N(x_n | mu_k, Sigma_k).
    parallel_blocks(x.rows(), kBlockRows, max_threads(),
                    [&](int, std::int64_t r0, std::int64_t r1) {
                      const RowMatrix xc = x.middleRows(r0, r1 - r0).rowwise() - shift_.transpose();
                      const RowMatrix xt = xc.transpose();
                      RowMatrix y, lp;
                      log_rho(xc, xt, y, lp);
                      double sum = 0;
                      for (Index i = 0; i < lp.cols(); ++i) sum += math::log_sum_exp(lp.col(i));
                      partial[static_cast<std::size_t>(r0 / kBlockRows)] = sum;
                    });
    return finish();
  }
  const int d = dim(), kk = n_components();
  // E[pi_k]: alpha_k / alpha_hat (Dirichlet), or the renormalised stick-breaking expectation.
  const VectorXd log_w = weights().array().log().matrix();
  Eigen::VectorXd base(kk), scale(kk), dof(kk);
  for (int k = 0; k < kk; ++k) {
    const double nup = full_moments(cov_) ? post_.nu[k] + 1 - d : post_.nu[k];
    const double c = nup * post_.beta[k] / (1 + post_.beta[k]);
    dof[k] = nup;
    scale[k] = c;
    const int dims_per_t = cov_ == Covariance::kDiag ? 1 : d;
    const int n_t = cov_ == Covariance::kDiag ? d : 1;
    base[k] = log_w[k] +
              n_t * (std::lgamma(0.5 * (nup + dims_per_t)) - std::lgamma(0.5 * nup) -
                     0.5 * dims_per_t * std::log(M_PI * nup) + 0.5 * dims_per_t * std::log(c)) +
              0.5 * logdet_w_[k];
  }
  parallel_blocks(x.rows(), kBlockRows, max_threads(), [&](int, std::int64_t r0, std::int64_t r1) {
    const Index n = r1 - r0;
    const RowMatrix xc = x.middleRows(r0, n).rowwise() - shift_.transpose();
    RowMatrix lp(n, kk);
    for (int k = 0; k < kk; ++k) {
      if (full_moments(cov_)) {
        RowMatrix y = xc * prec_chol_[k];
        y.rowwise() -= m_shifted_.row(k) * prec_chol_[k];
        const Eigen::ArrayXd delta2 = scale[k] * y.rowwise().squaredNorm().array();
        lp.col(k) = (base[k] - 0.5 * (dof[k] + d) * (delta2 / dof[k]).log1p()).matrix();
      } else if (cov_ == Covariance::kSpherical) {
        const Eigen::ArrayXd delta2 =
            scale[k] * w_diag_(k, 0) *
            (xc.rowwise() - m_shifted_.row(k)).rowwise().squaredNorm().array();
        lp.col(k) = (base[k] - 0.5 * (dof[k] + d) * (delta2 / dof[k]).log1p()).matrix();
      } else {
        const Eigen::ArrayXXd delta2 =
            scale[k] * ((xc.rowwise() - m_shifted_.row(k)).array().square().rowwise() *
                        w_diag_.row(k).array());
        lp.col(k) =
            (base[k] - 0.5 * (dof[k] + 1) * (delta2 / dof[k]).log1p().rowwise().sum()).matrix();
      }
    }
    double sum = 0;
    for (Index i = 0; i < n; ++i) sum += math::log_sum_exp(lp.row(i));
    partial[static_cast<std::size_t>(r0 / kBlockRows)] = sum;
  });
  return finish();
}

VectorXd Model::weights() const {
  if (est_ == Estimator::kMaximumLikelihood) return ml_.weights;
  if (prior_.weights == WeightPrior::kDirichlet) return post_.alpha / post_.alpha.sum();
  // E[pi_k] = E[v_k] prod_{j<k} E[1 - v_j], renormalised over k = 1..K (as scikit-learn).
  const int kk = n_components();
  VectorXd w(kk);
  double rest = 1;
  for (int k = 0; k < kk; ++k) {
    const double ab = post_.stick_a[k] + post_.stick_b[k];
    w[k] = rest * post_.stick_a[k] / ab;
    rest *= post_.stick_b[k] / ab;
  }
  return w / w.sum();
}

RowMatrix Model::means() const {
  return est_ == Estimator::kMaximumLikelihood ? ml_.means : post_.m;
}

std::vector<MatrixXd> Model::precisions_cholesky() const {
  std::vector<MatrixXd> p(static_cast<std::size_t>(n_components()));
  for (int k = 0; k < n_components(); ++k)
    p[k] = full_moments(cov_) ? prec_chol_[k] : MatrixXd(w_diag_.row(k).transpose().cwiseSqrt());
  return p;
}

std::vector<MatrixXd> Model::covariances() const {
  if (est_ == Estimator::kMaximumLikelihood) return ml_.covariances;
  std::vector<MatrixXd> c(post_.W_inv.size());
  for (std::size_t k = 0; k < c.size(); ++k) c[k] = post_.W_inv[k] / post_.nu[Index(k)];
  return c;
}

std::vector<MatrixXd> Model::scale_matrices() const {
  std::vector<MatrixXd> w(static_cast<std::size_t>(n_components()));
  for (int k = 0; k < n_components(); ++k)
    w[k] = full_moments(cov_) ? MatrixXd(prec_chol_[k] * prec_chol_[k].transpose())
                              : MatrixXd(w_diag_.row(k).transpose());
  return w;
}

}  // namespace caviar::gmm
