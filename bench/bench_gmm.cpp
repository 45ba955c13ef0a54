// Google Benchmark of the Gaussian-mixture kernels on one rank: one CAVI iteration (E-step with
// statistics, M-step, ELBO) and its parts, at the three benchmark shapes of docs/performance.md,
// plus the machine's DGEMM rate measured in the same run (the yardstick for GFLOP/s).
//
//   OMP_NUM_THREADS=2 build/bench/bench_gmm                 # all shapes
//   build/bench/bench_gmm --benchmark_filter='Cavi.*/2/'     # one shape (/0: fast, /1: exact sums)
//
// Counters: "NK/s" = points x components per second of one iteration; "GFLOP/s" against a
// dense-equivalent flop count per point and component: full covariance 3 D^2 below D = 64 (2 D^2
// for the E-step GEMM with the D x D Cholesky factors, D^2 for the scatter) and 2 D^2 from D = 64
// (the E-step becomes a triangular product); diagonal 5 D. Above D = 32 the scatter skips rows
// with negligible responsibilities, so on separated data the rate counts work avoided too. These
// make shapes and implementations comparable; they are not hardware counters.
#include <benchmark/benchmark.h>

#include <Eigen/Core>
#include <memory>
#include <random>
#include <vector>

#include "core/exact_sum.hpp"
#include "core/parallel.hpp"
#include "models/gmm/gmm.hpp"

namespace {

using caviar::gmm::Covariance;
using caviar::gmm::Model;
using caviar::gmm::RowMatrix;

struct Shape {
  std::int64_t n;
  int d, k;
};
// (N, D, K) of the benchmark: low-D/many-points, medium, and the STL-10 shape (Bruno 2022).
constexpr Shape kShapes[] = {{1000000, 2, 10}, {200000, 16, 20}, {30000, 192, 30}};

// A random well-separated mixture and a posterior one step away from random responsibilities,
// so that every component is populated (as in a real fit after initialisation).
struct Problem {
  RowMatrix x;
  Model model;
  Problem(Shape s, Covariance cov)
      : x(s.n, s.d),
        model(cov, s.k, caviar::gmm::default_prior(cov, s.d, s.k), Eigen::VectorXd::Zero(s.d)) {
    std::mt19937_64 gen(42);
    std::normal_distribution<double> normal;
    RowMatrix centres(s.k, s.d);
    for (Eigen::Index i = 0; i < centres.size(); ++i) centres.data()[i] = 4 * normal(gen);
    std::uniform_int_distribution<int> pick(0, s.k - 1);
    for (std::int64_t i = 0; i < s.n; ++i) {
      const int c = pick(gen);
      for (int j = 0; j < s.d; ++j) x(i, j) = centres(c, j) + normal(gen);
    }
    RowMatrix resp = RowMatrix::Zero(s.n, s.k);
    for (std::int64_t i = 0; i < s.n; ++i) resp(i, pick(gen)) = 1;
    auto stats = model.make_stats();
    stats.set_zero();
    model.accumulate(x, resp, stats);
    model.update(stats);
  }
};

Problem& problem(int shape, Covariance cov) {
  static std::vector<std::unique_ptr<Problem>> cache(2 * std::size(kShapes));
  auto& p = cache[static_cast<std::size_t>(2 * shape + (cov == Covariance::kDiag))];
  if (!p) p = std::make_unique<Problem>(kShapes[shape], cov);
  return *p;
}

double nominal_flops(Shape s, Covariance cov) {
  const double per = cov == Covariance::kFull ? (s.d >= 64 ? 2.0 : 3.0) * s.d * s.d : 5.0 * s.d;
  return per * static_cast<double>(s.n) * s.k;
}

void set_counters(benchmark::State& state, Shape s, Covariance cov, double flops) {
  const auto iters = static_cast<double>(state.iterations());
  state.counters["NK/s"] =
      benchmark::Counter(iters * static_cast<double>(s.n) * s.k, benchmark::Counter::kIsRate);
  state.counters["GFLOP/s"] = benchmark::Counter(iters * flops * 1e-9, benchmark::Counter::kIsRate);
  state.counters["threads"] = caviar::max_threads();
  (void)cov;
}

// One whole CAVI iteration as the driver runs it on one rank: E-step + statistics, ELBO, M-step.
// Second argument 1: exact statistic sums (the default of `caviar gmm fit`; see Stats), 0: plain
// double sums (--fast-reduce). Their ratio is the cost of bitwise reproducibility.
void CaviIteration(benchmark::State& state, Covariance cov) {
  const int si = static_cast<int>(state.range(0));
  const bool exact = state.range(1) != 0;
  Problem& p = problem(si, cov);
  Model model = p.model;
  auto stats = model.make_stats();
  if (exact) {
    const Eigen::VectorXd max_abs = p.x.cwiseAbs().colwise().maxCoeff().transpose();
    stats.make_exact(model.exact_exponents(static_cast<double>(p.x.rows()), max_abs));
  }
  for (auto _ : state) {
    stats.set_zero();
    model.local_step(p.x, stats);
    if (exact) stats.finish_exact(p.x.rows());  // one rank: no allreduce
    benchmark::DoNotOptimize(model.elbo(stats));
    model.update(stats);
  }
  set_counters(state, kShapes[si], cov, nominal_flops(kShapes[si], cov));
  state.counters["exact"] = exact;
}

// The E-step alone with its statistics (everything that touches the data).
void LocalStep(benchmark::State& state, Covariance cov) {
  const int si = static_cast<int>(state.range(0));
  Problem& p = problem(si, cov);
  auto stats = p.model.make_stats();
  for (auto _ : state) {
    stats.set_zero();
    p.model.local_step(p.x, stats);
    benchmark::ClobberMemory();
  }
  set_counters(state, kShapes[si], cov, nominal_flops(kShapes[si], cov));
}

// The M-step's data part alone: weighted first and second moments from given responsibilities.
void Scatter(benchmark::State& state, Covariance cov) {
  const int si = static_cast<int>(state.range(0));
  const Shape s = kShapes[si];
  Problem& p = problem(si, cov);
  RowMatrix resp = RowMatrix::Constant(s.n, s.k, 1.0 / s.k);
  auto stats = p.model.make_stats();
  for (auto _ : state) {
    stats.set_zero();
    p.model.accumulate(p.x, resp, stats);
    benchmark::ClobberMemory();
  }
  set_counters(state, s, cov,
               (cov == Covariance::kFull ? 1.0 * s.d * s.d : 2.0 * s.d) * double(s.n) * s.k);
}

// The exact-sum kernel alone (core/exact_sum.hpp): one addend per entry into `entries` entries,
// the size of one component's second moments at D = 192 (18721, in cache) and of a whole block's
// statistics at (D, K) = (192, 30) (561660, streaming from memory). "entries/s" is the rate.
void ExactSumAdd(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  std::vector<int> e(n);
  std::vector<double> v(n);
  std::mt19937_64 gen(1);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  for (std::size_t i = 0; i < n; ++i) {
    e[i] = 20 + static_cast<int>(i % 7);
    v[i] = u(gen) * 1000.0;
  }
  caviar::ExactSum s(e);
  for (auto _ : state) {
    s.add(v);
    benchmark::ClobberMemory();
  }
  state.counters["entries/s"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * static_cast<double>(n),
                         benchmark::Counter::kIsRate);
}

// The machine's yardstick: Eigen's DGEMM (the library caviar's kernels use), one independent
// 1536^3 product per thread at once, so the rate is that of all the cores this process may use.
void Dgemm(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  const int threads = caviar::max_threads();
  std::vector<Eigen::MatrixXd> a(threads), b(threads), c(threads);
  for (int t = 0; t < threads; ++t) {
    a[t] = Eigen::MatrixXd::Random(n, n);
    b[t] = Eigen::MatrixXd::Random(n, n);
    c[t] = Eigen::MatrixXd::Zero(n, n);
  }
  for (auto _ : state) {
#pragma omp parallel for num_threads(threads) schedule(static, 1)
    for (int t = 0; t < threads; ++t) c[t].noalias() = a[t] * b[t];
    benchmark::ClobberMemory();
  }
  state.counters["GFLOP/s"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * 2.0 * n * n * n * threads * 1e-9,
                         benchmark::Counter::kIsRate);
  state.counters["threads"] = threads;
}

}  // namespace

BENCHMARK(ExactSumAdd)->Arg(18721)->Arg(561660);
BENCHMARK(Dgemm)->Arg(1536)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(2);
BENCHMARK_CAPTURE(CaviIteration, full, Covariance::kFull)
    ->ArgsProduct({{0, 1, 2}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(LocalStep, full, Covariance::kFull)
    ->DenseRange(0, 2)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(Scatter, full, Covariance::kFull)
    ->DenseRange(0, 2)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(CaviIteration, diag, Covariance::kDiag)
    ->ArgsProduct({{0, 1, 2}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

BENCHMARK_MAIN();
