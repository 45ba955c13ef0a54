#include "models/hmm/hmm.hpp"

#include <Eigen/Cholesky>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "core/error.hpp"
#include "core/fixed_point.hpp"
#include "core/parallel.hpp"
#include "core/rng.hpp"
#include "core/vec4.hpp"
#include "math/fast.hpp"
#include "math/special.hpp"

namespace caviar::hmm {

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
// Counter indices carry a tag in their top byte, so that different kinds of draws never share one.
constexpr std::uint64_t kTagTrans = 2ull << 56, kTagEmit = 3ull << 56, kTagMean = 4ull << 56;

using Mat = Eigen::MatrixXd;

// KL(Dir(a) || Dir(a0 1)) = ln C(a) - ln C(a0 1) + sum_i (a_i - a0)(psi(a_i) - psi(sum a))
// (Bishop 2006, B.23).
double kl_dirichlet(const Eigen::VectorXd& a, double a0) {
  const double psi_sum = math::digamma(a.sum());
  double s = math::log_dirichlet_norm(a) -
             math::log_dirichlet_norm(Eigen::VectorXd::Constant(a.size(), a0));
  for (Eigen::Index i = 0; i < a.size(); ++i) s += (a[i] - a0) * (math::digamma(a[i]) - psi_sum);
  return s;
}

// The lower Cholesky factor L of an SPD matrix (m = L L'): every inverse the HMM needs is a
// triangular solve against L, never an explicit inverse (Golub & Van Loan 2013, section 4.2).
Mat cholesky(const Mat& m, const std::string& what) {
  const Eigen::LLT<Mat> llt(m);
  if (llt.info() != Eigen::Success) throw Error(what + " is not positive definite");
  return llt.matrixL();
}

// ln|L L'| from the factor.
double logdet_chol(const Mat& l) {
  return 2.0 * l.diagonal().array().log().sum();
}

// What the Normal-Wishart KL needs of W = (L L')^-1 and W0 = (L0 L0')^-1, from the two factors:
// ln|W|, ln|W0|, (m - m0)' W (m - m0) = |L^-1 (m - m0)|^2 and tr(W0^-1 W) = |L^-1 L0|_F^2.
struct WishartTerms {
  double logdet_w, logdet_w0, quad_m, trace_w0inv_w;
};

WishartTerms wishart_terms(const Mat& l, const Mat& l0, const Eigen::VectorXd& dm) {
  const auto lower = l.triangularView<Eigen::Lower>();
  return {-logdet_chol(l), -logdet_chol(l0), lower.solve(dm).squaredNorm(),
          lower.solve(l0).squaredNorm()};
}

// KL(NW(m, beta, W, nu) || NW(m0, beta0, W0, nu0)) in p dimensions, as E[ln q] - E[ln p] with
// Bishop 2006, eqs 10.74 and 10.77 (the Wishart normaliser B.79, entropy B.82, E ln|Lambda| B.81).
double kl_normal_wishart(int p, double beta, double nu, double beta0, double nu0,
                         const WishartTerms& w) {
  const double e_logdet = math::expected_logdet_wishart(w.logdet_w, nu, p);
  const double e_ln_q = 0.5 * e_logdet + 0.5 * p * std::log(beta / (2 * M_PI)) - 0.5 * p -
                        math::wishart_entropy(w.logdet_w, nu, p, e_logdet);
  const double e_ln_p = 0.5 * (p * std::log(beta0 / (2 * M_PI)) + e_logdet - p * beta0 / beta -
                               beta0 * nu * w.quad_m) +
                        math::log_wishart_norm(w.logdet_w0, nu0, p) +
                        0.5 * (nu0 - p - 1) * e_logdet - 0.5 * nu * w.trace_w0inv_w;
  return e_ln_q - e_ln_p;
}
// The widest vector of the build: 512 bits where AVX-512 is enabled (it doubles the FMA peak on
// CPUs with full-width units), 256 otherwise. Fixed at compile time, so a build computes every
// value the same way whatever the thread, the rank or the sequence's place in the shard.
#ifdef __AVX512F__
using VecW = Vec8;
#else
using VecW = Vec4;
#endif
constexpr int kLanes = sizeof(VecW) / sizeof(double);

// y = x' M for a row-major k x k matrix M. Each output block of W columns is summed in registers
// over i = 0..k-1, so M streams through once and y is written once. Every y_j is the same
// sequence of FMAs wherever the vector sits in memory: the results are bitwise independent of the
// thread and of the sequence's place in the shard. The FMAs are written out (vfma, std::fma), as
// in the recursions' other kernels here, so that no inlining decision of the compiler changes them.
template <int W>
void vec_mat_block(const double* x, const double* m, int k, int j0, const double* f, double* y) {
  if constexpr (W % 4 == 0) {
    // Explicit vector accumulators: as an array of doubles, once inlined into the recursion, they
    // were kept on the stack, every FMA waiting on a store and a reload.
    // Fewer than eight registers would leave the recursion waiting on the FMA latency: P
    // interleaved partial sums over i, added in a fixed tree at the end.
    using V = std::conditional_t<W % kLanes == 0, VecW, Vec4>;
    constexpr int L = sizeof(V) / sizeof(double);
    constexpr int NV = W / L, P = NV >= 8 ? 1 : NV >= 4 ? 2 : 4;
    // Zeroed and stored one vector at a time: as whole arrays (`= {}`, one memcpy of acc into y),
    // GCC called memset and memcpy through the PLT on every step, with the accumulators spilled
    // to the stack around them, all on the recursion's critical path.
    V part[P][NV];
    for (int p = 0; p < P; ++p)
      for (int v = 0; v < NV; ++v) part[p][v] = V{};
    int i = 0;
    for (; i + P <= k; i += P)
      for (int p = 0; p < P; ++p) {
        const V xi = splat<V>(x[i + p]);
        const double* r = m + static_cast<std::ptrdiff_t>(i + p) * k + j0;
        for (int v = 0; v < NV; ++v) part[p][v] = vfma(xi, vload<V>(r + L * v), part[p][v]);
      }
    for (; i < k; ++i) {
      const V xi = splat<V>(x[i]);
      const double* r = m + static_cast<std::ptrdiff_t>(i) * k + j0;
      for (int v = 0; v < NV; ++v) part[0][v] = vfma(xi, vload<V>(r + L * v), part[0][v]);
    }
    for (int v = 0; v < NV; ++v) {
      V acc;
      if constexpr (P == 1)
        acc = part[0][v];
      else if constexpr (P == 2)
        acc = part[0][v] + part[1][v];
      else
        acc = (part[0][v] + part[1][v]) + (part[2][v] + part[3][v]);
      if (f) acc *= vload<V>(f + j0 + L * v);
      vstore(y + j0 + L * v, acc);
    }
  } else {
    double acc[W] = {};
    for (int i = 0; i < k; ++i) {
      const double xi = x[i];
      const double* r = m + static_cast<std::ptrdiff_t>(i) * k + j0;
      for (int j = 0; j < W; ++j) acc[j] = std::fma(xi, r[j], acc[j]);
    }
    for (int j = 0; j < W; ++j) y[j0 + j] = f ? acc[j] * f[j0 + j] : acc[j];
  }
}

// y = (x' M) o f, or x' M when f is null.
void vec_mat(const double* x, const double* m, int k, const double* f, double* y) {
  int j = 0;
  // With 32 vector registers (AVX-512), 16 accumulators hold 128 columns: for K <= 128 a row of M
  // is read whole and M streams through in memory order.
  if constexpr (kLanes == 8)
    for (; j + 128 <= k; j += 128) vec_mat_block<128>(x, m, k, j, f, y);
  for (; j + 8 * kLanes <= k; j += 8 * kLanes) vec_mat_block<8 * kLanes>(x, m, k, j, f, y);
  if constexpr (kLanes == 8)
    if (j + 32 <= k) {
      vec_mat_block<32>(x, m, k, j, f, y);
      j += 32;
    }
  if (j + 16 <= k) {
    vec_mat_block<16>(x, m, k, j, f, y);
    j += 16;
  }
  if (j + 8 <= k) {
    vec_mat_block<8>(x, m, k, j, f, y);
    j += 8;
  }
  if (j + 4 <= k) {
    vec_mat_block<4>(x, m, k, j, f, y);
    j += 4;
  }
  for (; j < k; ++j) vec_mat_block<1>(x, m, k, j, f, y);
}

// From this many states on, the forward and the backward recursions run side by side
// (Model::forward_backward) and share each pass over A. At K = 128 a separate product streams A
// (128 KB) from the L2 cache for every 2 K^2 flops, which held it near half the FMA rate; one pass
// that makes both products halves that traffic. Below, A is closer to the L1 cache and the fused
// pass, whose forward sums go through memory, was slower (bench_hmm on Zen 3: at 80 and 96 states
// the long sequences lost up to 22%; at 112 and 128 no case was slower beyond the noise, and
// sequences of 100 steps gained 7-30%).
constexpr int kFuseStates = 112;
// From this many states on, the posteriors alone (no statistics) take that sweep too, and make
// each gamma_t in it (forward_backward): with no second pass over T x K arrays, the shared pass
// over A pays from fewer states (bench_hmm on Zen 3, one sequence of 10^5 steps: 12-27% faster at
// 80 to 112 states; at 64 states 1.4 times slower).
constexpr int kTwoEndedStates = 80;

// Rows [i, i + R) of M's part in y = x' M, and z_i = M_i. u for those rows (row-major k x k M; z
// skipped when u is null). y_j goes through memory from one block of rows to the next; for every
// j it is the chain y_j = fma(x_i, M_ij, y_j) over i = 0, 1, ..., k - 1 from 0, whatever the
// vector it sits in. z_i is summed in lanes (one chain per lane over the row's vectors of
// columns, a four-lane step for the rest where V has eight, one scalar chain for the last k mod
// 4), then the lanes in a fixed order: the same K gives the same order in any build of one vector
// width.
template <int R, class V, bool First = false>
inline void rows_block(const double* x, const double* u, const double* m, int k, int i, double* y,
                       double* z) {
  constexpr int L = sizeof(V) / sizeof(double);
  const double* row[R];
  V xr[R], zr[R];
  Vec4 z4[R];
  double zs[R];
  for (int r = 0; r < R; ++r) {
    row[r] = m + static_cast<std::ptrdiff_t>(i + r) * k;
    xr[r] = splat<V>(x[i + r]);
    zr[r] = V{};
    z4[r] = Vec4{};
    zs[r] = 0;
  }
  int j = 0;
  for (; j + L <= k; j += L) {
    V yj = First ? V{} : vload<V>(y + j);
    if (u) {
      const V uj = vload<V>(u + j);
      for (int r = 0; r < R; ++r) {
        const V a = vload<V>(row[r] + j);
        yj = vfma(xr[r], a, yj);
        zr[r] = vfma(a, uj, zr[r]);
      }
    } else {
      for (int r = 0; r < R; ++r) yj = vfma(xr[r], vload<V>(row[r] + j), yj);
    }
    vstore(y + j, yj);
  }
  if constexpr (L == 8)
    if (j + 4 <= k) {
      Vec4 yj = First ? Vec4{} : vload<Vec4>(y + j);
      const Vec4 uj = u ? vload<Vec4>(u + j) : Vec4{};
      for (int r = 0; r < R; ++r) {
        const Vec4 a = vload<Vec4>(row[r] + j);
        yj = vfma(splat<Vec4>(x[i + r]), a, yj);
        if (u) z4[r] = vfma(a, uj, z4[r]);
      }
      vstore(y + j, yj);
      j += 4;
    }
  if constexpr (First) std::fill(y + j, y + k, 0.0);
  for (; j < k; ++j)
    for (int r = 0; r < R; ++r) {
      y[j] = std::fma(x[i + r], row[r][j], y[j]);
      if (u) zs[r] = std::fma(row[r][j], u[j], zs[r]);
    }
  if (!u) return;
  for (int r = 0; r < R; ++r) {
    double lanes[L];
    std::memcpy(lanes, &zr[r], sizeof lanes);
    double sum = 0;
    if constexpr (L == 8)
      sum = ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) +
            ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
    else
      sum = (lanes[0] + lanes[2]) + (lanes[1] + lanes[3]);
    if constexpr (L == 8) sum += (z4[r][0] + z4[r][2]) + (z4[r][1] + z4[r][3]);
    z[i + r] = sum + zs[r];
  }
}

// y = (x' M) o f (f may be null) and, unless u is null, z = M u, in one pass over M by blocks of
// eight rows. For k >= kFuseStates, in place of vec_mat (both recursions, and the forward alone,
// so that a likelihood and a fit's forward take the same operations); for the posteriors alone
// from kTwoEndedStates on.
__attribute__((noinline)) void vec_mat_rows(const double* x, const double* u, const double* m,
                                            int k, const double* f, double* y, double* z) {
  // The first block of rows starts y's chains from zero (rather than from a memset of y: a call
  // into the C library on every step).
  int i = 0;
  if (k >= 8) {
    rows_block<8, VecW, true>(x, u, m, k, 0, y, z);
    i = 8;
  } else {
    std::fill_n(y, k, 0.0);
  }
  for (; i + 8 <= k; i += 8) rows_block<8, VecW>(x, u, m, k, i, y, z);
  if (i + 4 <= k) {
    rows_block<4, VecW>(x, u, m, k, i, y, z);
    i += 4;
  }
  for (; i < k; ++i) rows_block<1, VecW>(x, u, m, k, i, y, z);
  if (f)
    for (int j = 0; j < k; ++j) y[j] *= f[j];
}

// The sum of x[0..k) in a fixed order: eight partial sums (one 256-bit add chain of two
// registers, not one scalar chain of k dependent adds), then a fixed tree.
double sum_fixed(const double* x, int k) {
  double p[8] = {};
  int i = 0;
  for (; i + 8 <= k; i += 8)
    for (int j = 0; j < 8; ++j) p[j] += x[i + j];
  for (int j = 0; i < k; ++i, ++j) p[j] += x[i];
  return ((p[0] + p[4]) + (p[1] + p[5])) + ((p[2] + p[6]) + (p[3] + p[7]));
}

// out += sum_{s < m} a_s u_s' for m pairs of vectors (row-major rows x cols out; xi is K x K):
// each block of NV vectors of columns of an out row is loaded once, takes the m rank-one terms in
// registers and is stored once, so the update runs at the FMA rate rather than at the load/store
// rate of m separate rank-one updates. Every out_ij takes the same FMAs in the same order wherever
// it is computed.
template <int R, int NV, class V>
void outer_block(const double* const* a, const double* const* u, int m, int i, int j0, double* out,
                 int cols) {
  // R rows share every load of u: R NV FMAs per NV loads and R broadcasts. With R = 4, 12 or 16
  // accumulators (NV = kOuterNV) cover the FMA latency on both pipes (8 left the pipes waiting);
  // R and NV do not change which FMAs an out_ij takes, nor their order. The FMAs are explicit
  // (vfma, std::fma in outer_rows' scalar tail): left to the compiler, a * u + acc was fused in
  // one inlined or cloned copy of this code and not in another, so the bits of every statistic
  // changed with edits elsewhere in this file.
  constexpr int L = sizeof(V) / sizeof(double);
  V acc[R][NV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v)
      acc[r][v] = vload<V>(out + static_cast<std::ptrdiff_t>(i + r) * cols + j0 + L * v);
  for (int s = 0; s < m; ++s) {
    V us[NV];
    for (int v = 0; v < NV; ++v) us[v] = vload<V>(u[s] + j0 + L * v);
    for (int r = 0; r < R; ++r) {
      const V av = splat<V>(a[s][i + r]);
      for (int v = 0; v < NV; ++v) acc[r][v] = vfma(av, us[v], acc[r][v]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v)
      vstore(out + static_cast<std::ptrdiff_t>(i + r) * cols + j0 + L * v, acc[r][v]);
}

// Vectors of columns per outer_block: R NV accumulators, NV vectors of u and one broadcast must
// fit the register file (16 registers with AVX2: 4 x 4 spilled four accumulators to the stack,
// each then a store and a reload per term; 32 with AVX-512).
constexpr int kOuterNV = kLanes == 8 ? 4 : 3;

template <int R>
void outer_rows(const double* const* a, const double* const* u, int m, int i, int cols,
                double* out) {
  int j = 0;
  for (; j + kOuterNV * kLanes <= cols; j += kOuterNV * kLanes)
    outer_block<R, kOuterNV, VecW>(a, u, m, i, j, out, cols);
  if (j + 2 * kLanes <= cols) {
    outer_block<R, 2, VecW>(a, u, m, i, j, out, cols);
    j += 2 * kLanes;
  }
  if (j + kLanes <= cols) {
    outer_block<R, 1, VecW>(a, u, m, i, j, out, cols);
    j += kLanes;
  }
  if constexpr (kLanes == 8)
    if (j + 4 <= cols) {
      outer_block<R, 1, Vec4>(a, u, m, i, j, out, cols);
      j += 4;
    }
  for (; j < cols; ++j)
    for (int r = 0; r < R; ++r) {
      double* o = out + static_cast<std::ptrdiff_t>(i + r) * cols + j;
      for (int s = 0; s < m; ++s) *o = std::fma(a[s][i + r], u[s][j], *o);
    }
}

// Not inlined: inlined into the backward recursion, its accumulators were spilled to the stack.
__attribute__((noinline)) void outer_add(const double* const* a, const double* const* u, int m,
                                         int rows, int cols, double* out) {
  int i = 0;
  for (; i + 4 <= rows; i += 4) outer_rows<4>(a, u, m, i, cols, out);
  if (i + 2 <= rows) {
    outer_rows<2>(a, u, m, i, cols, out);
    i += 2;
  }
  if (i < rows) outer_rows<1>(a, u, m, i, cols, out);
}

// Rows of a block of the Gaussian log densities' parameters (Model::refresh lays them out, the
// kernels below read them): mu_i and 1 / L_ii for each i, L_ij for j < i (full covariance), the
// constant and quad_scale / 2, the last two at rows - 2 and rows - 1.
constexpr int gauss_param_rows(int d, bool diag) {
  return 2 * d + (diag ? 0 : d * (d - 1) / 2) + 2;
}

// Log densities of one step under one block's kLanes states (see below): p, the block's R rows of
// kLanes parameters; y: D vectors of scratch for the whitened coordinates. With D and the
// covariance's kind fixed at compile time, every parameter is a load at a fixed offset from p
// (with one row of parameters per quantity, K wide, each needed a register or a spill of its own).
template <int DD, bool kDiag, class V>
inline V gauss_block(const double* xt, int D, const double* p, V* y) {
  const int r_inv = D, r_c = gauss_param_rows(D, kDiag) - 2, r_h = r_c + 1;
  V q = {};
  for (int i = 0, l = 2 * D; i < D; ++i) {
    V r = splat<V>(xt[i]) - vload<V>(p + i * kLanes);
    if (!kDiag)
      for (int j = 0; j < i; ++j, ++l) r = vfma(-vload<V>(p + l * kLanes), y[j], r);
    r *= vload<V>(p + (r_inv + i) * kLanes);
    y[i] = r;
    // One FMA per coordinate after the first, written out: of the two products in r_0^2 + r_1^2
    // the compiler may fuse either, and did so differently as the code around it changed.
    q = i == 0 ? r * r : vfma(r, r, q);
  }
  return vfma(-vload<V>(p + r_h * kLanes), q, vload<V>(p + r_c * kLanes));
}

// Log densities of n steps (x: n x D, row-major) under K Gaussians whose parameters soa holds in
// blocks of kLanes states (Model::refresh), into out (n x K, row-major), a vector of states at a
// time: (x_t - mu_k)' (L_k L_k')^-1 (x_t - mu_k) = |y_t|^2 with L_k y_t = x_t - mu_k by forward
// substitution, each row of out written once, in the order the recursions read it. The last
// block's padding lanes (zero parameters: finite values) are computed and dropped, so every state
// takes the same vector operations. DD > 0 fixes D at compile time (the whitened coordinates stay
// in registers); DD = 0 uses y_mem.
template <int DD, bool kDiag>
void gauss_log_densities(const double* x, std::int64_t n, int d_rt, int K, const double* soa,
                         VecW* y_mem, double* out) {
  const int D = DD > 0 ? DD : d_rt;
  const int R = gauss_param_rows(D, kDiag);
  const int full = K / kLanes, rest = K % kLanes;
  VecW y_reg[DD > 0 ? DD : 1];
  VecW* y = DD > 0 ? y_reg : y_mem;
  for (std::int64_t t = 0; t < n; ++t) {
    const double* xt = x + t * D;
    double* o = out + t * K;
    const double* p = soa;
    for (int b = 0; b < full; ++b, p += R * kLanes) {
      const VecW res = gauss_block<DD, kDiag>(xt, D, p, y);
      std::memcpy(o + b * kLanes, &res, sizeof res);
    }
    if (rest > 0) {  // the padding lanes are computed and dropped
      const VecW res = gauss_block<DD, kDiag>(xt, D, p, y);
      std::memcpy(o + full * kLanes, &res, sizeof(double) * static_cast<std::size_t>(rest));
    }
  }
}
}  // namespace

const char* name(Emission e) {
  return e == Emission::kCategorical ? "categorical" : "gaussian";
}
const char* name(Covariance c) {
  return c == Covariance::kFull ? "full" : "diag";
}
const char* name(Algorithm a) {
  return a == Algorithm::kEm ? "em" : a == Algorithm::kCavi ? "cavi" : "svi";
}

// --- Stats

Stats::Stats(const std::vector<std::int64_t>& sizes, const std::vector<double>& bounds) {
  std::int64_t off = 0;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    sec_.push_back({off, sizes[i], fixed_point_scale(std::max(bounds[i], 1.0))});
    off += sizes[i];
  }
  buf_.assign(static_cast<std::size_t>(off), 0);
}

void Stats::set_zero() {
  std::fill(buf_.begin(), buf_.end(), std::int64_t{0});
}

void Stats::add(int section, std::int64_t at, const double* x, std::int64_t n) {
  const Section& s = sec_[static_cast<std::size_t>(section)];
  std::int64_t* out = buf_.data() + s.offset + at;
  for (std::int64_t i = 0; i < n; ++i)
    out[i] += static_cast<std::int64_t>(std::floor(x[i] * s.scale + 0.5));
}

Stats& Stats::operator+=(const Stats& o) {
  for (std::size_t i = 0; i < buf_.size(); ++i) buf_[i] += o.buf_[i];
  return *this;
}

// --- Model

struct Model::Work {
  // T x K: emissions (log, then scaled; Gaussian only, categorical steps read the model's table)
  // and the scaled forward
  RowMatrix b, alpha;
  // T: the forward's scalings c_t, and (Gaussian) the logarithm each step's emissions were
  // divided by
  Eigen::VectorXd c, lmax;
  RowMatrix beta;  // 2 x K: beta_t and beta_{t-1} of the backward recursion
  // K >= kFuseStates: T x K, the backward's beta_t each normalised on its own (forward_backward),
  // and the K values of u_t before they are normalised (the posteriors alone: also two rows each
  // of alpha and of beta~)
  RowMatrix bt;
  std::vector<double> ut;
  RowMatrix u;  // kPairs x K: u_t of the transitions not yet added to xi
  // Gaussian, D > 8: the whitened y_t of a vector of states in the forward substitution
  std::vector<VecW> y;
  RowMatrix xi;                       // K x K
  std::vector<double> occ, g_row;     // sums of gamma_t over t; gamma_t when nothing keeps it
  RowMatrix emit;                     // V x K: one sequence's expected emission counts
  std::vector<std::int32_t> touched;  // the symbols whose rows of emit this sequence added to
  std::vector<char> mark;             // V: whether a symbol is in touched
  // Gaussian moments: f_t = [x_t, upper triangle of x_t x_t'] and gamma_t of the steps not yet
  // added (kPairs rows), their sum over the sequence ((D + D (D + 1) / 2) x K), and as the
  // statistics' K x D and K x D^2
  RowMatrix f, gr, mom, sx, sxx;
  void reserve(std::int64_t t, int k) {
    if (alpha.rows() < t || alpha.cols() != k) {
      b.resize(t, k);
      alpha.resize(t, k);
      c.resize(t);
      lmax.resize(t);
    }
    if (xi.rows() != k) {
      xi.resize(k, k);
      beta.resize(2, k);
    }
  }
};

void Model::WorkDeleter::operator()(Work* w) const {
  delete w;
}

void Model::grow_work(int threads) const {
  while (static_cast<int>(fb_work_.size()) < threads) fb_work_.emplace_back(new Work);
}

Model::Model(const Config& cfg, const SequenceSource* seqs, const DataSummary& data)
    : cfg_(cfg),
      seqs_(seqs),
      data_(data),
      k_(cfg.states),
      d_(cfg.emission == Emission::kGaussian ? cfg.dim : 0),
      v_(cfg.emission == Emission::kCategorical ? cfg.symbols : 0) {
  if (k_ < 1) throw Error("--states must be >= 1 (got " + std::to_string(k_) + ")");
  if (cfg.emission == Emission::kCategorical && v_ < 1) throw Error("the number of symbols is < 1");
  if (cfg.emission == Emission::kGaussian && d_ < 1) throw Error("the data dimension is < 1");
  for (double a : {cfg.prior_start, cfg.prior_trans, cfg.prior_emission, cfg.prior_beta})
    if (!(a > 0) || !std::isfinite(a)) throw Error("every --prior-* must be a finite number > 0");
  if (!(cfg.min_covar >= 0) || !std::isfinite(cfg.min_covar))
    throw Error("--min-covar must be a finite number >= 0");
  p_start_ = Eigen::VectorXd::Constant(k_, 1.0 / k_);
  p_trans_ = RowMatrix::Constant(k_, k_, 1.0 / k_);
  if (v_ > 0) p_emit_ = RowMatrix::Constant(k_, v_, 1.0 / static_cast<double>(v_));
  if (d_ > 0) {
    means_ = RowMatrix::Zero(k_, d_);
    cov_.assign(static_cast<std::size_t>(k_), RowMatrix::Identity(d_, d_));
    beta_ = Eigen::VectorXd::Ones(k_);
    nu_ = Eigen::VectorXd::Constant(k_, d_ + 2.0);
    m0_ = Eigen::VectorXd::Zero(d_);
    w0_inv_ = RowMatrix::Identity(d_, d_) * (d_ + 2.0);
    if (static_cast<int>(data.mean.size()) == d_) {
      for (int j = 0; j < d_; ++j) {
        m0_[j] = data.mean[static_cast<std::size_t>(j)];
        // A constant dimension still needs a proper prior: floor its variance.
        w0_inv_(j, j) = (d_ + 2.0) * std::max(data.var[static_cast<std::size_t>(j)], 1e-12);
      }
    }
    w0_chol_ = cholesky(w0_inv_, "the prior Wishart scale's inverse");
  }
  refresh();
}

void Model::init_random(std::uint64_t seed) {
  const CounterRng rng(seed, Stream::kHmmInit);
  auto u = [&](std::uint64_t i) { return rng.uniform2(i, 0)[0]; };
  const bool vb = variational();
  const double n = static_cast<double>(data_.sequences), t = static_cast<double>(data_.steps);
  // Positive random weights, normalised (EM) or turned into pseudo-counts of the data's size (VB).
  for (int k = 0; k < k_; ++k) p_start_[k] = vb ? cfg_.prior_start + n / k_ : 1.0 / k_;
  for (int i = 0; i < k_; ++i) {
    double s = 0;
    for (int j = 0; j < k_; ++j) s += (p_trans_(i, j) = 0.5 + u(kTagTrans | (i * k_ + j)));
    for (int j = 0; j < k_; ++j)
      p_trans_(i, j) = vb ? cfg_.prior_trans + t / k_ * p_trans_(i, j) / s : p_trans_(i, j) / s;
  }
  if (v_ > 0) {
    for (int k = 0; k < k_; ++k) {
      double s = 0;
      for (std::int64_t v = 0; v < v_; ++v)
        s += (p_emit_(k, v) = 0.5 + u(kTagEmit | static_cast<std::uint64_t>(k * v_ + v)));
      for (std::int64_t v = 0; v < v_; ++v)
        p_emit_(k, v) = vb ? cfg_.prior_emission + t / k_ * p_emit_(k, v) / s : p_emit_(k, v) / s;
    }
  }
  if (d_ > 0) {
    // Means: the data mean plus one standard deviation of noise per dimension; covariances: the
    // data's variances (VB: as the Wishart's expected precision nu W, so W^-1 = nu var).
    for (int k = 0; k < k_; ++k) {
      for (int j = 0; j < d_; ++j) {
        const double z = rng.normal2(kTagMean | static_cast<std::uint64_t>(k * d_ + j), 0)[0];
        means_(k, j) = m0_[j] + std::sqrt(w0_inv_(j, j) / (d_ + 2.0)) * z;
      }
      beta_[k] = cfg_.prior_beta + t / k_;
      nu_[k] = d_ + 2.0 + t / k_;
      RowMatrix c = RowMatrix::Zero(d_, d_);
      for (int j = 0; j < d_; ++j) {
        const double var = w0_inv_(j, j) / (d_ + 2.0);
        c(j, j) = vb ? var * nu_[k] : var;
      }
      cov_[static_cast<std::size_t>(k)] = c;
    }
  }
  refresh();
}

void Model::refresh() {
  const bool vb = variational();
  // VB: exp E[ln pi_k] = exp(psi(alpha_k) - psi(sum alpha)) (Beal 2003, ch. 3), and likewise
  // for each row of A and of B: sub-normalised.
  auto expected_log = [](const double* a, std::int64_t n, double* out) {
    double s = 0;
    for (std::int64_t i = 0; i < n; ++i) s += a[i];
    const double psi = math::digamma(s);
    for (std::int64_t i = 0; i < n; ++i) out[i] = math::digamma(a[i]) - psi;
  };
  pi_.resize(k_);
  a_.resize(k_, k_);
  if (vb) {
    expected_log(p_start_.data(), k_, pi_.data());
    pi_ = pi_.array().exp();
    for (int i = 0; i < k_; ++i) expected_log(&p_trans_(i, 0), k_, &a_(i, 0));
    a_ = a_.array().exp();
  } else {
    pi_ = p_start_;
    a_ = p_trans_;
  }
  // A' for the backward's own product; from kFuseStates states on, the backward shares the
  // forward's pass over A and A' is never read.
  if (k_ < kFuseStates)
    a_tr_ = a_.transpose();
  else
    a_tr_.resize(0, 0);
  if (v_ > 0) {
    log_b_t_.resize(v_, k_);
    std::vector<double> row(static_cast<std::size_t>(v_));
    for (int k = 0; k < k_; ++k) {
      if (vb)
        expected_log(&p_emit_(k, 0), v_, row.data());
      else
        for (std::int64_t v = 0; v < v_; ++v)
          row[static_cast<std::size_t>(v)] = std::log(p_emit_(k, v));
      for (std::int64_t v = 0; v < v_; ++v) log_b_t_(v, k) = row[static_cast<std::size_t>(v)];
    }
    emit_max_ = log_b_t_.rowwise().maxCoeff();
    emit_scaled_.resize(v_, k_);
    for (std::int64_t v = 0; v < v_; ++v)
      for (int k = 0; k < k_; ++k)
        emit_scaled_(v, k) =
            std::isfinite(emit_max_[v]) ? std::exp(log_b_t_(v, k) - emit_max_[v]) : 0;
  }
  if (d_ > 0) {
    chol_.assign(static_cast<std::size_t>(k_), RowMatrix());
    quad_scale_ = vb ? nu_ : Eigen::VectorXd(Eigen::VectorXd::Ones(k_));
    gauss_const_.resize(k_);
    const bool diag = cfg_.covariance == Covariance::kDiag;
    for (int k = 0; k < k_; ++k) {
      // c is Sigma (EM) or W^-1 (VB): either way ln|c| gives the precision's log-determinant.
      const RowMatrix& c = cov_[static_cast<std::size_t>(k)];
      double logdet_c = 0;
      if (diag) {
        for (int j = 0; j < d_; ++j) {
          if (!(c(j, j) > 0) || !std::isfinite(c(j, j)))
            throw Error("the variance " + std::to_string(j) + " of state " + std::to_string(k) +
                        " is not a finite positive number");
          logdet_c += std::log(c(j, j));
        }
      } else {
        const std::string what = vb ? "the inverse Wishart scale of state " + std::to_string(k)
                                    : "the covariance of state " + std::to_string(k);
        chol_[static_cast<std::size_t>(k)] = cholesky(c, what);
        logdet_c = logdet_chol(chol_[static_cast<std::size_t>(k)]);
      }
      // EM: ln|Sigma^-1| = -ln|Sigma|. VB: E[ln|Lambda|] with ln|W| = -ln|W^-1| (Bishop 2006,
      // eq. 10.65); diagonal VB has one Normal-Gamma per dimension, so one expectation each.
      double logdet_prec = -logdet_c;
      if (vb && diag) {
        logdet_prec = 0;
        for (int j = 0; j < d_; ++j)
          logdet_prec += math::expected_logdet_wishart(-std::log(c(j, j)), nu_[k], 1);
      } else if (vb) {
        logdet_prec = math::expected_logdet_wishart(-logdet_c, nu_[k], d_);
      }
      // ln N(x | mu, Lambda^-1) = 1/2 ln|Lambda| - D/2 ln 2 pi - 1/2 (x - mu)' Lambda (x - mu); VB
      // takes its expectation under the Normal-Wishart (Bishop 2006, eq. 10.64): the extra
      // -D / (2 beta).
      gauss_const_[k] =
          0.5 * logdet_prec - 0.5 * d_ * math::kLog2Pi - (vb ? 0.5 * d_ / beta_[k] : 0.0);
    }
    // The log densities' parameters in blocks of kLanes states (the last block padded with
    // zeros), R rows of kLanes per block: mu_i, 1 / L_ii (diag: 1 / sigma_i), L_ij for j < i row
    // by row (full), the constant, and quad_scale / 2.
    const int rows = gauss_param_rows(d_, diag);
    emit_soa_.setZero(static_cast<Eigen::Index>((k_ + kLanes - 1) / kLanes) * rows, kLanes);
    for (int k = 0; k < k_; ++k) {
      const RowMatrix& l =
          diag ? cov_[static_cast<std::size_t>(k)] : chol_[static_cast<std::size_t>(k)];
      const auto at = [&](int r) -> double& {
        return emit_soa_(k / kLanes * rows + r, k % kLanes);
      };
      for (int i = 0, r = 2 * d_; i < d_; ++i) {
        at(i) = means_(k, i);
        at(d_ + i) = 1.0 / (diag ? std::sqrt(l(i, i)) : l(i, i));
        if (!diag)
          for (int j = 0; j < i; ++j) at(r++) = l(i, j);
      }
      at(rows - 2) = gauss_const_[k];
      at(rows - 1) = 0.5 * quad_scale_[k];
    }
  }
}

Stats Model::make_stats() const {
  const double n = static_cast<double>(data_.sequences), t = static_cast<double>(data_.steps);
  std::vector<std::int64_t> sizes{k_, static_cast<std::int64_t>(k_) * k_, k_};
  std::vector<double> bounds{n, t, t};
  if (v_ > 0) {
    sizes.push_back(v_ * k_);
    bounds.push_back(t);
  } else {
    const std::int64_t second = cfg_.covariance == Covariance::kDiag ? d_ : d_ * d_;
    sizes.push_back(static_cast<std::int64_t>(k_) * d_);
    bounds.push_back(t * data_.max_abs);
    sizes.push_back(k_ * second);
    bounds.push_back(t * data_.max_abs * data_.max_abs);
  }
  return Stats(sizes, bounds);
}

void Model::log_emissions(const Sequences& s, std::int64_t seq, std::int64_t t1, std::int64_t n,
                          Work& w, double* out) const {
  const std::int64_t t0 = s.offsets[seq] + t1;
  if (v_ > 0) {
    for (std::int64_t t = 0; t < n; ++t) {
      const double* lb = &log_b_t_(s.symbols[static_cast<std::size_t>(t0 + t)], 0);
      std::copy_n(lb, k_, out + t * k_);
    }
    return;
  }
  w.y.resize(static_cast<std::size_t>(d_));
  const double* x = &s.x(t0, 0);
  // Small D: the whitened coordinates stay in registers.
  using Kernel = void (*)(const double*, std::int64_t, int, int, const double*, VecW*, double*);
  static constexpr Kernel kFullKernels[] = {
      gauss_log_densities<0, false>, gauss_log_densities<1, false>, gauss_log_densities<2, false>,
      gauss_log_densities<3, false>, gauss_log_densities<4, false>, gauss_log_densities<5, false>,
      gauss_log_densities<6, false>, gauss_log_densities<7, false>, gauss_log_densities<8, false>};
  static constexpr Kernel kDiagKernels[] = {
      gauss_log_densities<0, true>, gauss_log_densities<1, true>, gauss_log_densities<2, true>,
      gauss_log_densities<3, true>, gauss_log_densities<4, true>, gauss_log_densities<5, true>,
      gauss_log_densities<6, true>, gauss_log_densities<7, true>, gauss_log_densities<8, true>};
  const Kernel* kernels = cfg_.covariance == Covariance::kDiag ? kDiagKernels : kFullKernels;
  kernels[d_ <= 8 ? d_ : 0](x, n, d_, k_, emit_soa_.data(), w.y.data(), out);
}

void Model::log_emissions(const Sequences& s, std::int64_t seq, Work& w) const {
  const std::int64_t T = s.length(seq);
  for (std::int64_t t1 = 0; t1 < T; t1 += kEmissionChunk)
    log_emissions(s, seq, t1, std::min(kEmissionChunk, T - t1), w, &w.b(t1, 0));
}

bool Model::scaled_emissions(const Sequences& s, std::int64_t seq, std::int64_t t1, std::int64_t n,
                             Work& w, double* out, double* maxima) const {
  // While the chunk's log emissions are still in the L1 cache: each step's less their maximum,
  // exponentiated (math::fast::exp; the states below e^-708 of the most likely one are set to 0);
  // the maxima go back into the log-likelihood.
  const int K = k_;
  log_emissions(s, seq, t1, n, w, out);
  for (std::int64_t t = 0; t < n; ++t) {
    double* r = out + t * K;
    double m = r[0];  // the maximum: four lanes, then the lanes and the tail
    int k = 0;
    if (K >= 4) {
      Vec4 mv = vload<Vec4>(r);
      for (k = 4; k + 4 <= K; k += 4) {
        const Vec4 v = vload<Vec4>(r + k);
        mv = v > mv ? v : mv;
      }
      m = std::max(std::max(mv[0], mv[1]), std::max(mv[2], mv[3]));
    }
    for (; k < K; ++k) m = std::max(m, r[k]);
    maxima[t] = m;
    if (!std::isfinite(m)) return false;
    for (k = 0; k + kLanes <= K; k += kLanes) {
      const VecW e = math::fast::exp(vload<VecW>(r + k) - m);
      std::memcpy(r + k, &e, sizeof e);
    }
    if (kLanes == 8 && k + 4 <= K) {
      const Vec4 e = math::fast::exp(vload<Vec4>(r + k) - m);
      std::memcpy(r + k, &e, sizeof e);
      k += 4;
    }
    if (k < K) {
      double tail[4] = {};
      std::copy(r + k, r + K, tail);
      const Vec4 e = math::fast::exp(vload<Vec4>(tail) - m);
      std::memcpy(r + k, &e, sizeof(double) * static_cast<std::size_t>(K - k));
    }
  }
  return true;
}

double Model::forward_backward(const Sequences& s, std::int64_t seq, Work& w, Stats* stats,
                               double* gamma) const {
  const std::int64_t T = s.length(seq), t0 = s.offsets[seq];
  const int K = k_;
  w.reserve(T, K);
  const std::int32_t* sym = v_ > 0 ? s.symbols.data() + t0 : nullptr;
  // The sum of the logarithms of each step's largest emission probability, which the scaled
  // emissions are divided by. Categorical steps read the table of B' with each symbol's row
  // divided by its largest entry (made once per refresh: no logarithm or exponential per step).
  double ll = 0;
  if (sym) {
    for (std::int64_t t = 0; t < T; ++t) ll += emit_max_[sym[t]];
    if (!std::isfinite(ll)) return -kInf;  // no state can emit some symbol
  }
  // The log-likelihood alone (no statistics, no gamma) needs only alpha_{t-1} and b_t at step t:
  // two rows of alpha (beta's, unused until the backward) in turn, and one chunk of Gaussian
  // emissions, all of which stay in the L1 cache.
  const bool ring = !stats && !gamma;
  const auto b_row = [&](std::int64_t t) { return &w.b(ring ? t % kEmissionChunk : t, 0); };
  const auto emission = [&](std::int64_t t) -> const double* {
    return sym ? &emit_scaled_(sym[t], 0) : b_row(t);
  };
  // Where gamma is written out and no statistics are asked for (Model::posteriors), and alpha
  // would not stay in the caches (a long sequence), the forward keeps alpha_t in gamma's own rows
  // and the backward turns each into gamma_t = alpha_t o beta_t in place (it needs alpha_{t-1}
  // only for the expected transitions): one T x K array goes to memory and back instead of two.
  // A short sequence keeps alpha in the thread's array, which stays in the cache from one
  // sequence to the next, and writes gamma once. The values are the same either way.
  constexpr std::int64_t kInPlaceBytes = 256 << 10;
  const bool in_place = gamma && !stats && T * K * std::int64_t{sizeof(double)} > kInPlaceBytes;
  double* const alpha = in_place ? gamma : w.alpha.data();
  const auto alpha_row = [&](std::int64_t t) { return ring ? &w.beta(t & 1, 0) : alpha + t * K; };
  constexpr std::int64_t kAhead = 8;
  // Forward, scaled (Rabiner 1989, section V.A; Bishop 2006, eq. 13.59): alpha_t = c_t^-1
  // (alpha_{t-1}' A) o b_t, with c_t making alpha_t sum to one.
  // Gaussian emissions are made a chunk at a time as the forward reaches them, and read from the
  // cache: the T x K array of them (kept for the backward) is written once and read once.
  //
  // From kFuseStates states on, and where the backward follows, it runs in the same sweep (the
  // forward at step t, the backward at step T - t), so that one pass over A makes both products
  // (vec_mat_rows). It cannot use the forward's scaling, which is not known yet at T - t: each
  // beta~_{t-1} = A u~_t, u~_t = b_t o beta~_t / s_t, is scaled by s_t, the sum of b_t o beta~_t
  // (any positive scaling leaves beta_t's direction as it is), and kept (T x K). The backward
  // sweep below takes Bishop's beta_t from it as beta~_t / (alpha_t . beta~_t), the scaling under
  // which alpha_t . beta_t = 1 (Bishop 2006, eq. 13.64 with gamma_t summing to one).
  const bool two_ended = gamma && !stats && K >= kTwoEndedStates;
  const bool fuse = K >= kFuseStates || two_ended, paired = fuse && !ring;
  if (paired) {
    if (!two_ended) {
      if (w.bt.rows() < T || w.bt.cols() != K) w.bt.resize(T, K);
      w.ut.resize(static_cast<std::size_t>(K));
      std::fill_n(&w.bt(T - 1, 0), K, 1.0);
    }
    // Every emission first: the backward reads them from the sequence's end.
    if (!sym && !two_ended)
      for (std::int64_t t1 = 0; t1 < T; t1 += kEmissionChunk)
        if (!scaled_emissions(s, seq, t1, std::min(kEmissionChunk, T - t1), w, b_row(t1),
                              &w.lmax[t1]))
          return -kInf;  // no state can emit some x_t
  }
  // The backward's u~_t = b_t o beta~_t / s_t into ut, s_t being the sum of b_t o beta~_t; false
  // where s_t is zero (no path through the sequence's last T - t steps).
  const auto backward_u = [K](const double* b, const double* bt, double* ut) {
    for (int k = 0; k < K; ++k) ut[k] = b[k] * bt[k];
    const double st = sum_fixed(ut, K);
    if (!(st > 0)) return false;
    const double inv = 1.0 / st;
    for (int k = 0; k < K; ++k) ut[k] *= inv;
    return true;
  };
  // alpha_t divided by c_t, its sum (kept in w.c); false where c_t is zero (the sequence is
  // impossible under the parameters).
  const auto scale_alpha = [K, &w](double* a, std::int64_t t) {
    const double c = sum_fixed(a, K);
    if (!(c > 0)) return false;
    w.c[t] = c;
    const double inv = 1.0 / c;
    for (int k = 0; k < K; ++k) a[k] *= inv;
    return true;
  };
  // log p(x_1..T) = sum_t ln c_t (Bishop 2006, eq. 13.63) plus the maxima taken out of the
  // emissions: the Gaussian's (kept per step) first, then the ln c_t, each step by step.
  const auto add_log_scales = [&] {
    if (!sym)
      for (std::int64_t t = 0; t < T; ++t) ll += w.lmax[t];
    for (std::int64_t t = 0; t < T; ++t) ll += std::log(w.c[t]);
  };
  if (two_ended) {
    // The marginals alone (Model::posteriors): no statistics need the backward sweep below, so
    // each gamma_t is made in this sweep, as soon as both alpha_t (the forward, at step t) and
    // beta~_t (the backward, at step T - 1 - t) exist. Gamma's row t keeps whichever of the two
    // came first; the second turns it into gamma_t. The sweep's second half thus reads each row
    // once and writes it once, and there is no second pass over T x K arrays (alpha, beta~ and
    // the emissions). The values are those of the backward sweep below: gamma_t = alpha_t o
    // beta~_t / (alpha_t . beta~_t), and gamma_{T-1} = alpha_{T-1} (beta_{T-1} = 1).
    w.ut.resize(static_cast<std::size_t>(5 * K));
    double* ut = w.ut.data();
    double* ar[2] = {ut + K, ut + 2 * K};      // alpha_{t-1} and alpha_t
    double* br[2] = {ut + 3 * K, ut + 4 * K};  // beta~_{T-t} and beta~_{T-1-t}
    double* tmp = &w.beta(0, 0);
    // Row t of gamma from alpha_t (a) and beta~_t (bt); false if alpha_t . beta~_t underflowed.
    const auto join = [&](const double* a, const double* bt, double* g) {
      for (int k = 0; k < K; ++k) tmp[k] = a[k] * bt[k];
      const double r = sum_fixed(tmp, K);
      if (!(r > 0)) return false;
      const double inv_r = 1.0 / r;
      for (int k = 0; k < K; ++k) g[k] = a[k] * (bt[k] * inv_r);
      return true;
    };
    // Gaussian emissions: rows [0, lo) and [hi, T) are made. Each end makes the next chunk of
    // them as it reaches it, so that a row is read from the cache by the end that comes to it
    // first and from memory only by the other.
    std::int64_t lo = 0, hi = T;
    const auto in_memory = [&](std::int64_t r) { return !sym && (r < lo || r >= hi); };
    // Row r made: if it is not yet, the next chunk from lo up (up) or from hi down, which holds it;
    // false if no state can emit one of its steps.
    const auto made = [&](std::int64_t r, bool up) {
      if (sym || in_memory(r)) return true;
      const std::int64_t r0 = up ? lo : std::max(lo, hi - kEmissionChunk);
      const std::int64_t r1 = up ? std::min(hi, lo + kEmissionChunk) : hi;
      (up ? lo : hi) = up ? r1 : r0;
      return scaled_emissions(s, seq, r0, r1 - r0, w, b_row(r0), &w.lmax[r0]);
    };
    if (!made(0, true)) return -kInf;
    const double* b0 = emission(0);
    for (int k = 0; k < K; ++k) ar[0][k] = pi_[k] * b0[k];
    std::fill_n(br[0], K, 1.0);
    for (std::int64_t t = 0; t < T; ++t) {
      double* a = ar[t & 1];
      if (t > 0) {
        const std::int64_t tb = T - t;  // the backward: beta~_{tb-1} from beta~_tb
        if (t + kAhead < T) {
          // Both ends run through arrays larger than the caches, the backward downwards: ask for
          // the rows they reach kAhead steps later (of the emissions, those the other end made).
          const double* fa = in_memory(t + kAhead) ? &w.b(t + kAhead, 0) : nullptr;
          const double* fb = in_memory(tb - kAhead) ? &w.b(tb - kAhead, 0) : nullptr;
          for (int k = 0; k < K; k += 8) {
            if (fa) __builtin_prefetch(fa + k);
            if (fb) __builtin_prefetch(fb + k);
            __builtin_prefetch(gamma + (t + kAhead) * K + k, 1);
            __builtin_prefetch(gamma + (tb - 1 - kAhead) * K + k, 1);
          }
        }
        if (!made(tb, false) || !made(t, true)) return -kInf;
        if (!backward_u(emission(tb), br[(t - 1) & 1], ut)) return -kInf;
        vec_mat_rows(ar[(t - 1) & 1], ut, a_.data(), K, emission(t), a, br[t & 1]);
      }
      if (!scale_alpha(a, t)) return -kInf;
      // alpha_t: row t holds beta~_t already where T - 1 - t < t.
      double* g = gamma + t * K;
      if (t == T - 1 || T - 1 - t >= t)
        std::copy_n(a, K, g);
      else if (!join(a, g, g))
        return -kInf;
      // beta~_{T-1-t} (t > 0; beta~_{T-1} = 1 is not kept): row T - 1 - t holds alpha already
      // where T - 1 - t <= t.
      if (t == 0) continue;
      const std::int64_t tr = T - 1 - t;
      double* gr = gamma + tr * K;
      if (tr > t)
        std::copy_n(br[t & 1], K, gr);
      else if (!join(gr, br[t & 1], gr))
        return -kInf;
    }
    add_log_scales();
    return ll;
  }
  for (std::int64_t t = 0; t < T; ++t) {
    if (!paired && !sym && t % kEmissionChunk == 0 &&
        !scaled_emissions(s, seq, t, std::min(kEmissionChunk, T - t), w, b_row(t), &w.lmax[t]))
      return -kInf;  // no state can emit some x_t
    double* a = alpha_row(t);
    const double* b = emission(t);
    if (t == 0) {
      for (int k = 0; k < K; ++k) a[k] = pi_[k] * b[k];
    } else if (paired) {
      const std::int64_t tb = T - t;
      double* ut = w.ut.data();
      if (!backward_u(emission(tb), &w.bt(tb, 0), ut)) return -kInf;
      vec_mat_rows(alpha_row(t - 1), ut, a_.data(), K, b, a, &w.bt(tb - 1, 0));
    } else if (fuse) {
      vec_mat_rows(alpha_row(t - 1), nullptr, a_.data(), K, b, a, nullptr);
    } else {
      vec_mat(alpha_row(t - 1), a_.data(), K, b, a);
    }
    if (!scale_alpha(a, t)) return -kInf;
  }
  add_log_scales();
  if (!stats && !gamma) return ll;
  // Backward with the same scaling (Bishop 2006, eq. 13.62): beta_{t-1} = A u_t with u_t = b_t o
  // beta_t / c_t, a vector-matrix product against A' as the forward's is against A. In the same
  // sweep, while beta_t is in registers or the L1 cache: gamma_t = alpha_t o beta_t (Bishop
  // 13.64) and its sums, and the expected transitions (Bishop 13.65) summed over t,
  //   sum_t xi_t(i, j) = A_ij sum_t alpha_{t-1}(i) u_t(j),
  // added kPairs steps at a time (outer_add); so are the Gaussian moments (Bishop 2006, eqs
  // 13.20-13.21 need sum_t gamma_t(k) x_t and sum_t gamma_t(k) x_t x_t'), as sum_t f_t gamma_t'
  // with f_t = [x_t, the upper triangle of x_t x_t'] (diag: the squares of x_t). Only alpha (and
  // gamma where it is asked for, in the same rows for a long sequence) is a T x K array, read once
  // here: one pass instead of one per quantity.
  const bool moments = stats && v_ == 0;
  const bool diag = cfg_.covariance == Covariance::kDiag;
  // Full covariances keep the upper triangle of x_t x_t' (packed row by row), diag its diagonal.
  const int second = diag ? d_ : d_ * d_, nf = d_ + (diag ? d_ : d_ * (d_ + 1) / 2);
  if (stats) {
    w.xi.setZero();
    w.occ.assign(static_cast<std::size_t>(K), 0.0);
    if (v_ > 0 && (w.emit.rows() != v_ || w.emit.cols() != K)) {
      w.emit = RowMatrix::Zero(v_, K);
      w.mark.assign(static_cast<std::size_t>(v_), 0);
      w.touched.clear();
    }
    if (moments) {
      w.mom.setZero(nf, K);
      w.f.resize(kPairs, nf);
      w.gr.resize(kPairs, K);
    }
  }
  if (w.u.rows() != kPairs || w.u.cols() != K) w.u.resize(kPairs, K);
  if (!gamma) w.g_row.resize(static_cast<std::size_t>(K));
  const double* pa[kPairs];
  const double* pu[kPairs];
  const double* pf[kPairs];
  const double* pg[kPairs];
  int pending = 0, mpending = 0;
  const double* x = moments ? &s.x(t0, 0) : nullptr;
  double* be = &w.beta(0, 0);
  double* be_prev = &w.beta(1, 0);
  std::fill_n(be, K, 1.0);
  // gamma, where it is written out apart from alpha, goes to memory outside the caches, row by
  // row in descending order: its rows are asked for, for writing, kAhead steps ahead as well, and
  // the sweep's first kAhead before it starts. Over many short sequences the hardware prefetchers
  // never caught up with these short descending streams of stores.
  double* const gamma_apart = gamma && !in_place ? gamma : nullptr;
  if (gamma_apart)
    for (std::int64_t t = std::max<std::int64_t>(0, T - kAhead); t < T; ++t)
      for (int k = 0; k < K; k += 8) __builtin_prefetch(gamma_apart + t * K + k, 1);
  for (std::int64_t t = T - 1; t >= 0; --t) {
    const double* a = alpha + t * K;
    double* g = gamma ? gamma + t * K : moments ? &w.gr(mpending, 0) : w.g_row.data();
    for (int k = 0; k < K; ++k) g[k] = a[k] * be[k];
    if (stats) {
      for (int k = 0; k < K; ++k) w.occ[static_cast<std::size_t>(k)] += g[k];
      if (sym) {
        double* e = &w.emit(sym[t], 0);
        if (!w.mark[static_cast<std::size_t>(sym[t])]) {
          w.mark[static_cast<std::size_t>(sym[t])] = 1;
          w.touched.push_back(sym[t]);
        }
        for (int k = 0; k < K; ++k) e[k] += g[k];
      }
      if (moments) {
        const double* xt = x + t * d_;
        double* f = &w.f(mpending, 0);
        for (int i = 0; i < d_; ++i) f[i] = xt[i];  // (a few values: no library call)
        for (int i = 0, p = d_; i < d_; ++i) {
          if (diag)
            f[p++] = xt[i] * xt[i];
          else
            for (int j = i; j < d_; ++j) f[p++] = xt[i] * xt[j];
        }
        pf[mpending] = f;
        pg[mpending] = g;
        if (++mpending == kPairs) {
          outer_add(pf, pg, mpending, nf, K, w.mom.data());
          mpending = 0;
        }
      }
      if (t == 0) stats->add(kStart, 0, g, K);
    }
    if (t == 0) break;
    if (t >= kAhead) {
      // The sweep runs backwards through arrays larger than the caches: ask for the rows it
      // reaches kAhead steps later (the hardware prefetchers follow descending streams late).
      const double* ra = alpha + (t - kAhead) * K;
      const double* rb = sym ? nullptr : &w.b(t - kAhead, 0);
      const double* rt = paired ? &w.bt(t - kAhead, 0) : nullptr;
      double* rg = gamma_apart ? gamma_apart + (t - kAhead) * K : nullptr;
      for (int k = 0; k < K; k += 8) {
        if (in_place)
          __builtin_prefetch(ra + k, 1);  // the row becomes gamma_t: asked for, for writing
        else
          __builtin_prefetch(ra + k);
        if (rb) __builtin_prefetch(rb + k);
        if (rt) __builtin_prefetch(rt + k);
        if (rg) __builtin_prefetch(rg + k, 1);
      }
    }
    const double* b = emission(t);
    const double inv = 1.0 / w.c[t];
    double* u = &w.u(pending, 0);
    for (int j = 0; j < K; ++j) u[j] = b[j] * be[j] * inv;
    if (paired) {
      // beta_{t-1} = beta~_{t-1} / (alpha_{t-1} . beta~_{t-1}), the dot product in sum_fixed's
      // order (be_prev as its scratch).
      const double* ap = alpha + (t - 1) * K;
      const double* bp = &w.bt(t - 1, 0);
      for (int k = 0; k < K; ++k) be_prev[k] = ap[k] * bp[k];
      const double r = sum_fixed(be_prev, K);
      if (!(r > 0)) {
        // Zero only by underflow (alpha_t . beta~_t is p(x) over positive scalings): no
        // statistics were added yet, but the symbols' rows of w.emit must be left clean.
        for (const std::int32_t v : w.touched) {
          std::fill_n(&w.emit(v, 0), K, 0.0);
          w.mark[static_cast<std::size_t>(v)] = 0;
        }
        w.touched.clear();
        return -kInf;
      }
      const double inv_r = 1.0 / r;
      for (int k = 0; k < K; ++k) be_prev[k] = bp[k] * inv_r;
    } else {
      vec_mat(u, a_tr_.data(), K, nullptr, be_prev);
    }
    std::swap(be, be_prev);
    if (!stats) continue;
    pa[pending] = alpha + (t - 1) * K;
    pu[pending] = u;
    if (++pending == kPairs) {
      outer_add(pa, pu, pending, K, K, w.xi.data());
      pending = 0;
    }
  }
  if (!stats) return ll;
  if (pending > 0) outer_add(pa, pu, pending, K, K, w.xi.data());
  w.xi.array() *= a_.array();
  stats->add(kTrans, 0, w.xi.data(), static_cast<std::int64_t>(K) * K);
  stats->add(kOcc, 0, w.occ.data(), K);
  if (v_ > 0) {
    // The sequence's expected counts per symbol, summed in double and added once per symbol
    // rather than once per step.
    for (const std::int32_t v : w.touched) {
      double* e = &w.emit(v, 0);
      stats->add(kEmit, v * static_cast<std::int64_t>(K), e, K);
      std::fill_n(e, K, 0.0);
      w.mark[static_cast<std::size_t>(v)] = 0;
    }
    w.touched.clear();
    return ll;
  }
  if (mpending > 0) outer_add(pf, pg, mpending, nf, K, w.mom.data());
  w.sx = w.mom.topRows(d_).transpose();
  w.sxx.resize(K, second);
  for (int i = 0, p = d_; i < d_; ++i) {
    if (diag) {
      w.sxx.col(i) = w.mom.row(p++).transpose();
      continue;
    }
    for (int j = i; j < d_; ++j, ++p) {
      w.sxx.col(i * d_ + j) = w.mom.row(p).transpose();
      w.sxx.col(j * d_ + i) = w.mom.row(p).transpose();
    }
  }
  stats->add(kSx, 0, w.sx.data(), K * d_);
  stats->add(kSxx, 0, w.sxx.data(), K * second);
  return ll;
}

void Model::local_step(Stats& stats, std::span<double> terms) {
  seqs_->for_each([&](const Sequences& piece, std::int64_t first) {
    local_step(piece, stats,
               terms.subspan(static_cast<std::size_t>(first), static_cast<std::size_t>(piece.n())));
  });
}

void Model::local_step(Stats& stats, std::span<double> terms, std::span<const std::int64_t> rows) {
  local_step(seqs_->select(rows), stats, terms);
}

void Model::local_step(const Sequences& s, Stats& stats, std::span<double> terms) {
  const std::int64_t n = s.n();
  const int n_threads =
      static_cast<int>(std::min<std::int64_t>(max_threads(), std::max<std::int64_t>(n, 1)));
  // Threads other than the first count into their own statistics, added afterwards: integers, so
  // the totals do not depend on which thread took which sequence.
  while (static_cast<int>(work_.size()) < n_threads - 1) work_.push_back(make_stats());
  for (int t = 0; t < n_threads - 1; ++t) work_[static_cast<std::size_t>(t)].set_zero();
  grow_work(n_threads);
  parallel_blocks_dynamic(n, 1, n_threads, [&](int tid, std::int64_t s0, std::int64_t s1) {
    Stats& acc = tid == 0 ? stats : work_[static_cast<std::size_t>(tid - 1)];
    Work& w = *fb_work_[static_cast<std::size_t>(tid)];
    for (std::int64_t q = s0; q < s1; ++q)
      terms[static_cast<std::size_t>(q)] = forward_backward(s, q, w, &acc, nullptr);
  });
  for (int t = 0; t < n_threads - 1; ++t) stats += work_[static_cast<std::size_t>(t)];
}

void Model::update(const Stats& st) {
  set_target(st, 1.0);
  refresh();
}

void Model::set_target(const Stats& stats, double scale) {
  const bool vb = variational();
  // The statistics times `scale` (N / |B| for a minibatch; exactly themselves for a full batch).
  struct Scaled {
    const Stats& s;
    double scale;
    double value(int section, std::int64_t i) const { return scale * s.value(section, i); }
  } st{stats, scale};
  // Start and transitions: EM normalises the expected counts (Bishop 2006, eqs 13.18-13.19); VB
  // adds them to the Dirichlet prior (Beal 2003, ch. 3). A row no count reached keeps its
  // EM estimate.
  double total = 0;
  for (int k = 0; k < k_; ++k) total += st.value(kStart, k);
  for (int k = 0; k < k_; ++k)
    p_start_[k] = vb ? cfg_.prior_start + st.value(kStart, k)
                     : (total > 0 ? st.value(kStart, k) / total : p_start_[k]);
  for (int i = 0; i < k_; ++i) {
    double row = 0;
    for (int j = 0; j < k_; ++j) row += st.value(kTrans, i * k_ + j);
    for (int j = 0; j < k_; ++j) {
      const double c = st.value(kTrans, i * k_ + j);
      if (vb)
        p_trans_(i, j) = cfg_.prior_trans + c;
      else if (row > 0)
        p_trans_(i, j) = c / row;
    }
  }
  if (v_ > 0) {
    for (int k = 0; k < k_; ++k) {
      double row = 0;
      for (std::int64_t v = 0; v < v_; ++v) row += st.value(kEmit, v * k_ + k);
      for (std::int64_t v = 0; v < v_; ++v) {
        const double c = st.value(kEmit, v * k_ + k);
        if (vb)
          p_emit_(k, v) = cfg_.prior_emission + c;
        else if (row > 0)
          p_emit_(k, v) = c / row;
      }
    }
  } else {
    const bool diag = cfg_.covariance == Covariance::kDiag;
    const int second = diag ? d_ : d_ * d_;
    for (int k = 0; k < k_; ++k) {
      const double n = st.value(kOcc, k);
      Eigen::VectorXd sx(d_);
      Mat sxx = Mat::Zero(d_, d_);
      for (int i = 0; i < d_; ++i) {
        sx[i] = st.value(kSx, k * d_ + i);
        if (diag)
          sxx(i, i) = st.value(kSxx, k * second + i);
        else
          for (int j = 0; j < d_; ++j) sxx(i, j) = st.value(kSxx, k * second + i * d_ + j);
      }
      if (diag) {
        // Only the diagonal is used: keep the off-diagonal statistics at exactly zero.
      } else {
        sxx = 0.5 * (sxx + sxx.transpose()).eval();
      }
      RowMatrix& c = cov_[static_cast<std::size_t>(k)];
      if (!vb) {
        // Bishop 2006, eqs 13.20-13.21, with min_covar added to the diagonal.
        if (!(n > 0)) continue;
        const Eigen::VectorXd mu = sx / n;
        Mat cov = sxx / n - mu * mu.transpose();
        if (diag) cov = Mat(cov.diagonal().asDiagonal());
        cov.diagonal().array() += cfg_.min_covar;
        means_.row(k) = mu.transpose();
        c = cov;
        continue;
      }
      // Normal-Wishart update (Bishop 2006, eqs 10.60-10.63), written with N S = S_xx - N xbar
      // xbar' so that an empty state (N = 0) gets the prior back.
      const double beta0 = cfg_.prior_beta, nu0 = d_ + 2.0;
      beta_[k] = beta0 + n;
      nu_[k] = nu0 + n;
      Mat w_inv = w0_inv_;
      Eigen::VectorXd m = m0_;
      if (n > 0) {
        const Eigen::VectorXd xbar = sx / n;
        const Eigen::VectorXd dm = xbar - m0_;
        m = (beta0 * m0_ + sx) / beta_[k];
        w_inv += sxx - n * xbar * xbar.transpose() + (beta0 * n / beta_[k]) * dm * dm.transpose();
      }
      means_.row(k) = m.transpose();
      if (diag)
        c = RowMatrix(w_inv.diagonal().asDiagonal());
      else
        c = 0.5 * (w_inv + w_inv.transpose());
    }
  }
}

// The state as the natural parameters that SVI averages (Hoffman et al. 2013, section 2.4; Foti et
// al. 2014): the Dirichlet concentrations (their natural parameter alpha - 1 differs by a constant
// that a convex combination keeps), and per Gaussian state the Normal-Wishart's (beta,
// beta (m - m0), W^-1 + beta (m - m0)(m - m0)', nu) (Bishop 2006, eqs 10.60-10.63 are their sums
// with the statistics). They are taken about the prior mean m0: a linear change of coordinates of
// the natural parameters, so the average is the same, but W^-1 recovered by the subtraction below
// loses only bits of the data's spread about m0, not of their distance from the origin.
struct Model::Natural {
  Eigen::VectorXd start, beta, nu;
  RowMatrix trans, emit, bm;      // bm: beta (m - m0), K x D
  std::vector<RowMatrix> second;  // W^-1 + beta (m - m0)(m - m0)' (diagonal for diag)
};

Model::Natural Model::natural() const {
  Natural n{p_start_, beta_, nu_, p_trans_, p_emit_, RowMatrix(), {}};
  if (d_ == 0) return n;
  const bool diag = cfg_.covariance == Covariance::kDiag;
  n.bm.resize(k_, d_);
  for (int k = 0; k < k_; ++k) {
    const Eigen::VectorXd dm = means_.row(k).transpose() - m0_;
    n.bm.row(k) = beta_[k] * dm.transpose();
    RowMatrix c = cov_[static_cast<std::size_t>(k)];
    if (diag)
      c.diagonal() += beta_[k] * dm.cwiseAbs2();
    else
      c += beta_[k] * dm * dm.transpose();
    n.second.push_back(std::move(c));
  }
  return n;
}

void Model::set_natural(const Natural& n) {
  p_start_ = n.start;
  p_trans_ = n.trans;
  p_emit_ = n.emit;
  if (d_ == 0) return;
  beta_ = n.beta;
  nu_ = n.nu;
  const bool diag = cfg_.covariance == Covariance::kDiag;
  for (int k = 0; k < k_; ++k) {
    const Eigen::VectorXd bm = n.bm.row(k).transpose();
    means_.row(k) = (m0_ + bm / beta_[k]).transpose();
    RowMatrix& c = cov_[static_cast<std::size_t>(k)];
    c = n.second[static_cast<std::size_t>(k)];
    if (diag) {
      c.diagonal() -= bm.cwiseAbs2() / beta_[k];
    } else {
      c -= bm * bm.transpose() / beta_[k];
      c = (0.5 * (c + c.transpose())).eval();
    }
  }
}

void Model::update_stochastic(const Stats& st, double rho, double scale) {
  // lambda <- (1 - rho) lambda + rho lambda_hat, where lambda_hat = prior + scale * statistics is
  // the CAVI update as if the minibatch were the whole data set repeated N / |B| times (Hoffman et
  // al. 2013, section 2.4).
  const Natural old = natural();
  set_target(st, scale);
  const Natural hat = natural();
  auto mix = [rho](const auto& a, const auto& b) { return ((1 - rho) * a + rho * b).eval(); };
  Natural n{mix(old.start, hat.start),
            mix(old.beta, hat.beta),
            mix(old.nu, hat.nu),
            mix(old.trans, hat.trans),
            mix(old.emit, hat.emit),
            mix(old.bm, hat.bm),
            {}};
  for (std::size_t k = 0; k < old.second.size(); ++k)
    n.second.push_back(mix(old.second[k], hat.second[k]));
  set_natural(n);
  refresh();
}

double Model::global_objective() const {
  if (!variational()) return 0.0;
  // Serial, in a fixed order: the same on every rank.
  double kl = kl_dirichlet(p_start_, cfg_.prior_start);
  for (int i = 0; i < k_; ++i) kl += kl_dirichlet(p_trans_.row(i).transpose(), cfg_.prior_trans);
  if (v_ > 0) {
    for (int k = 0; k < k_; ++k)
      kl += kl_dirichlet(p_emit_.row(k).transpose(), cfg_.prior_emission);
    return -kl;
  }
  const double nu0 = d_ + 2.0;
  for (int k = 0; k < k_; ++k) {
    const RowMatrix& c = cov_[static_cast<std::size_t>(k)];  // W^-1
    if (cfg_.covariance == Covariance::kDiag) {
      // One Normal-Gamma per dimension: the 1 x 1 terms directly.
      for (int j = 0; j < d_; ++j) {
        const double dm = means_(k, j) - m0_[j];
        kl += kl_normal_wishart(1, beta_[k], nu_[k], cfg_.prior_beta, nu0,
                                {-std::log(c(j, j)), -std::log(w0_inv_(j, j)), dm * dm / c(j, j),
                                 w0_inv_(j, j) / c(j, j)});
      }
    } else {
      const Eigen::VectorXd dm = means_.row(k).transpose() - m0_;
      kl += kl_normal_wishart(d_, beta_[k], nu_[k], cfg_.prior_beta, nu0,
                              wishart_terms(chol_[static_cast<std::size_t>(k)], w0_chol_, dm));
    }
  }
  return -kl;
}

void Model::point_params(Eigen::VectorXd& pi, RowMatrix& a, RowMatrix& b, RowMatrix& means,
                         std::vector<RowMatrix>& cov) const {
  const bool vb = variational();
  pi = vb ? Eigen::VectorXd(p_start_ / p_start_.sum()) : p_start_;
  a = p_trans_;
  if (vb)
    for (int i = 0; i < k_; ++i) a.row(i) /= a.row(i).sum();
  b = p_emit_;
  if (vb && v_ > 0)
    for (int k = 0; k < k_; ++k) b.row(k) /= b.row(k).sum();
  means = means_;
  cov = cov_;
  if (vb && d_ > 0)  // the inverse of the expected precision, (nu W)^-1 = W^-1 / nu
    for (int k = 0; k < k_; ++k) cov[static_cast<std::size_t>(k)] /= nu_[k];
}

namespace {
using U = std::uint64_t;
void write_cov(engine::StateWriter& w, const std::string& name, const std::vector<RowMatrix>& c,
               bool diag) {
  const U k = c.size(), d = static_cast<U>(c.front().rows());
  std::vector<double> out;
  for (const RowMatrix& m : c)
    for (U i = 0; i < d; ++i)
      if (diag)
        out.push_back(m(static_cast<Eigen::Index>(i), static_cast<Eigen::Index>(i)));
      else
        for (U j = 0; j < d; ++j)
          out.push_back(m(static_cast<Eigen::Index>(i), static_cast<Eigen::Index>(j)));
  if (diag)
    w.array(name, out, {k, d});
  else
    w.array(name, out, {k, d, d});
}

std::vector<RowMatrix> read_cov(const engine::StateReader& r, const std::string& name, int k, int d,
                                bool diag) {
  const std::vector<double> v =
      diag ? r.array(name, {U(k), U(d)}) : r.array(name, {U(k), U(d), U(d)});
  std::vector<RowMatrix> out(static_cast<std::size_t>(k), RowMatrix::Zero(d, d));
  for (int s = 0; s < k; ++s)
    for (int i = 0; i < d; ++i)
      if (diag)
        out[static_cast<std::size_t>(s)](i, i) = v[static_cast<std::size_t>(s * d + i)];
      else
        for (int j = 0; j < d; ++j)
          out[static_cast<std::size_t>(s)](i, j) = v[static_cast<std::size_t>((s * d + i) * d + j)];
  for (double x : v)
    if (!std::isfinite(x)) throw Error("its " + name + " holds a value that is not finite");
  return out;
}

std::vector<double> flat(const RowMatrix& m) {
  return {m.data(), m.data() + m.size()};
}
}  // namespace

void Model::save(engine::StateWriter& w) const {
  const U K = static_cast<U>(k_);
  const bool diag = cfg_.covariance == Covariance::kDiag;
  Eigen::VectorXd pi;
  RowMatrix a, b, means;
  std::vector<RowMatrix> cov;
  point_params(pi, a, b, means, cov);
  w.array("startprob", std::span<const double>(pi.data(), K), {K});
  w.array("transmat", flat(a), {K, K});
  if (v_ > 0)
    w.array("emissionprob", flat(b), {K, U(v_)});
  else {
    w.array("means", flat(means), {K, U(d_)});
    write_cov(w, "covariances", cov, diag);
  }
  w.attr("emission", std::string(name(cfg_.emission)));
  if (d_ > 0) w.attr("covariance", std::string(name(cfg_.covariance)));
  w.attr("inference", std::string(name(cfg_.algorithm)));
  w.attr("n_states", static_cast<std::int64_t>(k_));
  if (v_ > 0) w.attr("n_symbols", v_);
  if (d_ > 0) w.attr("n_features", static_cast<std::int64_t>(d_));
  if (!variational()) {
    if (d_ > 0) w.attr("min_covar", cfg_.min_covar);
    return;
  }
  w.array("posterior/start", std::span<const double>(p_start_.data(), K), {K});
  w.array("posterior/trans", flat(p_trans_), {K, K});
  w.attr("prior_start", cfg_.prior_start);
  w.attr("prior_trans", cfg_.prior_trans);
  if (v_ > 0) {
    w.array("posterior/emission", flat(p_emit_), {K, U(v_)});
    w.attr("prior_emission", cfg_.prior_emission);
    return;
  }
  w.array("posterior/m", flat(means_), {K, U(d_)});
  w.array("posterior/beta", std::span<const double>(beta_.data(), K), {K});
  w.array("posterior/nu", std::span<const double>(nu_.data(), K), {K});
  // The file keeps hmmlearn's and Bishop's posterior/W, which users read: the one place W itself
  // is formed, from the factor (W = L^-T L^-1, triangular solves against the identity). The state
  // is W^-1 (posterior/W_inv), which load() reads, so a resume continues from the same bits.
  std::vector<RowMatrix> scale(static_cast<std::size_t>(k_));
  for (int k = 0; k < k_; ++k) {
    const RowMatrix& c = cov_[static_cast<std::size_t>(k)];
    RowMatrix& out = scale[static_cast<std::size_t>(k)];
    if (diag) {
      out = RowMatrix::Zero(d_, d_);
      for (int j = 0; j < d_; ++j) out(j, j) = 1.0 / c(j, j);
    } else {
      const Mat l_inv = chol_[static_cast<std::size_t>(k)].triangularView<Eigen::Lower>().solve(
          Mat::Identity(d_, d_));
      out = l_inv.transpose() * l_inv;
    }
  }
  write_cov(w, "posterior/W", scale, diag);
  write_cov(w, "posterior/W_inv", cov_, diag);
  w.array("prior/m", std::span<const double>(m0_.data(), U(d_)), {U(d_)});
  w.array("prior/W_inv", flat(w0_inv_), {U(d_), U(d_)});
  w.attr("prior_beta", cfg_.prior_beta);
  w.attr("prior_nu", d_ + 2.0);
}

void Model::load(const engine::StateReader& r) {
  if (!variational()) {
    load_point(r);
    return;
  }
  const U K = static_cast<U>(k_);
  const bool diag = cfg_.covariance == Covariance::kDiag;
  auto get = [&](const std::string& n, const engine::Dims& d) {
    std::vector<double> v = r.array(n, d);
    for (double x : v)
      if (!(x > 0) || !std::isfinite(x)) throw Error("its " + n + " holds a value that is not > 0");
    return v;
  };
  std::vector<double> v = get("posterior/start", {K});
  p_start_ = Eigen::Map<const Eigen::VectorXd>(v.data(), k_);
  v = get("posterior/trans", {K, K});
  p_trans_ = Eigen::Map<const RowMatrix>(v.data(), k_, k_);
  if (v_ > 0) {
    v = get("posterior/emission", {K, U(v_)});
    p_emit_ = Eigen::Map<const RowMatrix>(v.data(), k_, v_);
  } else {
    v = r.array("posterior/m", {K, U(d_)});
    means_ = Eigen::Map<const RowMatrix>(v.data(), k_, d_);
    v = get("posterior/beta", {K});
    beta_ = Eigen::Map<const Eigen::VectorXd>(v.data(), k_);
    v = get("posterior/nu", {K});
    nu_ = Eigen::Map<const Eigen::VectorXd>(v.data(), k_);
    cov_ = read_cov(r, "posterior/W_inv", k_, d_, diag);
  }
  refresh();
}

void Model::load_point(const engine::StateReader& r) {
  const U K = static_cast<U>(k_);
  auto prob = [&](const std::string& n, const engine::Dims& d, std::int64_t rows,
                  std::int64_t cols) {
    const std::vector<double> v = r.array(n, d);
    for (std::int64_t i = 0; i < rows; ++i) {
      double s = 0;
      for (std::int64_t j = 0; j < cols; ++j) {
        const double x = v[static_cast<std::size_t>(i * cols + j)];
        if (!(x >= 0 && x <= 1)) throw Error("its " + n + " holds a value outside [0, 1]");
        s += x;
      }
      if (!(std::abs(s - 1) < 1e-6)) throw Error("a row of its " + n + " does not sum to 1");
    }
    return RowMatrix(Eigen::Map<const RowMatrix>(v.data(), rows, cols));
  };
  p_start_ = prob("startprob", {K}, 1, k_).row(0).transpose();
  p_trans_ = prob("transmat", {K, K}, k_, k_);
  if (v_ > 0) {
    p_emit_ = prob("emissionprob", {K, U(v_)}, k_, v_);
  } else {
    const std::vector<double> m = r.array("means", {K, U(d_)});
    for (double x : m)
      if (!std::isfinite(x)) throw Error("its means hold a value that is not finite");
    means_ = Eigen::Map<const RowMatrix>(m.data(), k_, d_);
    cov_ = read_cov(r, "covariances", k_, d_, cfg_.covariance == Covariance::kDiag);
  }
  refresh();
}

void Model::log_likelihood(const Sequences& s, std::span<double> out) const {
  grow_work(max_threads());
  parallel_blocks_dynamic(s.n(), 1, max_threads(), [&](int tid, std::int64_t s0, std::int64_t s1) {
    Work& w = *fb_work_[static_cast<std::size_t>(tid)];
    for (std::int64_t q = s0; q < s1; ++q)
      out[static_cast<std::size_t>(q)] = forward_backward(s, q, w, nullptr, nullptr);
  });
}

void Model::posteriors(const Sequences& s, std::span<double> out) const {
  grow_work(max_threads());
  parallel_blocks_dynamic(s.n(), 1, max_threads(), [&](int tid, std::int64_t s0, std::int64_t s1) {
    Work& w = *fb_work_[static_cast<std::size_t>(tid)];
    for (std::int64_t q = s0; q < s1; ++q) {
      double* g = out.data() + s.offsets[q] * k_;
      if (!std::isfinite(forward_backward(s, q, w, nullptr, g)))
        std::fill_n(g, s.length(q) * k_, std::numeric_limits<double>::quiet_NaN());
    }
  });
}

void Model::viterbi(const Sequences& s, std::span<std::int64_t> out) const {
  RowMatrix log_a = a_.array().log().matrix();
  Eigen::VectorXd log_pi = pi_.array().log().matrix();
  grow_work(max_threads());
  parallel_blocks_dynamic(s.n(), 1, max_threads(), [&](int tid, std::int64_t s0, std::int64_t s1) {
    Work& w = *fb_work_[static_cast<std::size_t>(tid)];
    std::vector<int> back;
    std::vector<double> prev(static_cast<std::size_t>(k_)), cur(prev.size());
    for (std::int64_t q = s0; q < s1; ++q) {
      const std::int64_t T = s.length(q), t0 = s.offsets[q];
      w.reserve(T, k_);
      log_emissions(s, q, w);
      back.assign(static_cast<std::size_t>(T * k_), 0);
      // delta_t(j) = max_i [delta_{t-1}(i) + ln A_ij] + ln b_j(x_t) (Rabiner 1989, section III.B,
      // in logarithms); ties go to the lowest state.
      for (int k = 0; k < k_; ++k) prev[static_cast<std::size_t>(k)] = log_pi[k] + w.b(0, k);
      for (std::int64_t t = 1; t < T; ++t) {
        for (int j = 0; j < k_; ++j) {
          double best = -kInf;
          int arg = 0;
          for (int i = 0; i < k_; ++i) {
            const double v = prev[static_cast<std::size_t>(i)] + log_a(i, j);
            if (v > best) {
              best = v;
              arg = i;
            }
          }
          cur[static_cast<std::size_t>(j)] = best + w.b(t, j);
          back[static_cast<std::size_t>(t * k_ + j)] = arg;
        }
        std::swap(prev, cur);
      }
      int state = 0;
      for (int k = 1; k < k_; ++k)
        if (prev[static_cast<std::size_t>(k)] > prev[static_cast<std::size_t>(state)]) state = k;
      for (std::int64_t t = T - 1; t >= 0; --t) {
        out[static_cast<std::size_t>(t0 + t)] = state;
        if (t > 0) state = back[static_cast<std::size_t>(t * k_ + state)];
      }
    }
  });
}

void Model::sample(std::uint64_t seed, std::int64_t n, std::int64_t length,
                   std::vector<std::int64_t>& states, std::vector<std::int64_t>& symbols,
                   RowMatrix& x) const {
  const CounterRng rng(seed, Stream::kHmmSample);
  Eigen::VectorXd pi;
  RowMatrix a, b, means;
  std::vector<RowMatrix> cov;
  point_params(pi, a, b, means, cov);
  std::vector<Mat> chol;  // Sigma_k = L L'
  for (const RowMatrix& c : cov) {
    const Eigen::LLT<Mat> llt{Mat(c)};
    if (llt.info() != Eigen::Success) throw Error("a covariance is not positive definite");
    chol.push_back(llt.matrixL());
  }
  // Inverse-CDF draw from row p of n probabilities.
  auto draw = [](const double* p, std::int64_t size, double u) {
    double c = 0;
    for (std::int64_t i = 0; i < size; ++i)
      if (u < (c += p[i])) return i;
    return size - 1;
  };
  const std::int64_t total = n * length;
  states.assign(static_cast<std::size_t>(total), 0);
  symbols.assign(v_ > 0 ? static_cast<std::size_t>(total) : 0, 0);
  x.resize(d_ > 0 ? total : 0, d_);
  std::vector<double> z(static_cast<std::size_t>(d_));
  for (std::int64_t s = 0; s < n; ++s) {
    std::int64_t k = 0;
    for (std::int64_t t = s * length; t < (s + 1) * length; ++t) {
      // Step t's draws: its state (step 0), its emission (step 1), its Gaussian noise (2, 3, ...).
      const auto i = static_cast<std::uint64_t>(t);
      const double u = rng.uniform2(i, 0)[0];
      k = t == s * length ? draw(pi.data(), k_, u) : draw(&a(k, 0), k_, u);
      states[static_cast<std::size_t>(t)] = k;
      if (v_ > 0) {
        symbols[static_cast<std::size_t>(t)] = draw(&b(k, 0), v_, rng.uniform2(i, 1)[0]);
        continue;
      }
      for (int j = 0; j < d_; j += 2) {
        const auto g = rng.normal2(i, static_cast<std::uint32_t>(2 + j / 2));
        z[static_cast<std::size_t>(j)] = g[0];
        if (j + 1 < d_) z[static_cast<std::size_t>(j + 1)] = g[1];
      }
      const Mat& l = chol[static_cast<std::size_t>(k)];
      for (int r = 0; r < d_; ++r) {
        double v = means(k, r);
        for (int c = 0; c <= r; ++c) v += l(r, c) * z[static_cast<std::size_t>(c)];
        x(t, r) = v;
      }
    }
  }
}

}  // namespace caviar::hmm
