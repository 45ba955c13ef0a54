// Google Benchmark of the HMM's forward-backward with statistics (one EM local step, one rank) for
// K = 8, 32, 64, 128 states on categorical (V = 32) and Gaussian (D = 4, full) emissions, in two
// layouts of the same 10^5 steps: one long sequence (one thread can work on it) and 1000
// sequences of 100 steps (OpenMP over sequences, OMP_NUM_THREADS threads).
//
//   OMP_NUM_THREADS=1 build/bench/bench_hmm
//   OMP_NUM_THREADS=2 build/bench/bench_hmm --benchmark_filter='Many'
//
// Three passes: ForwardBackward (the E-step with statistics), Posteriors (the forward-backward
// alone, writing gamma) and LogLikelihood (the forward alone, as `hmm score` runs it).
// Counters (each pass counts its own flops; ForwardBackward's are): "GFLOP/s" against 6 T K^2 flops
// per pass (forward alpha_{t-1}' A, backward A u_t, and the expected transitions sum_t alpha_t
// u_{t+1}': 2 K^2 each per step; emissions and the statistics of order T K are not counted) per
// second of wall time; "GFLOP/cpu-s" the same per second of process CPU time (all threads), and
// "peak" = GFLOP/cpu-s over one core's double precision FMA peak, measured in CPU time at start-up
// by a loop of independent FMAs as wide as the build's vectors (256 bits, or 512 with AVX-512;
// printed first). CPU time rather than wall time because these 2 cores are shared: a thread that is
// descheduled costs wall time but not CPU time, on either side of the ratio.
// "peak_all" counts the order-T K flops as well, as the code performs them, per step and state:
// 3 in the forward (the emission product, the normaliser's sum, the scaling), 4 in the backward
// (u_t = b_t o beta_t / c_t, gamma_t = alpha_t o beta_t, the occupancies); categorical: 1 (the
// expected counts); Gaussian with full covariance: D^2 + 3 D + 1 for the log density (the forward
// substitution, the squared norm, the constant) and 2 (D + D (D + 1) / 2) for the moments. The
// exponentials are not counted (about 35 flops each in math::fast::exp), so this stays a lower
// bound of the work done.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <random>
#include <vector>

#include "core/parallel.hpp"
#include "models/hmm/hmm.hpp"

namespace {

using caviar::hmm::Emission;
using caviar::hmm::Model;
using caviar::hmm::Sequences;

constexpr std::int64_t kSteps = 100000;
constexpr int kSymbols = 32, kDim = 4;
double g_peak = 0;  // GFLOP per CPU second of the FMA loop: one core's peak

// Independent FMA chains, enough to cover the FMA latency on both pipes (Zen 3: 2 pipes x 4
// cycles); GCC vector extensions contract a * b + c into one vfmadd with -march=native. The
// vectors are as wide as the build allows: 512 bits where AVX-512 is enabled (on Zen 5 they
// measured about 1.7 times the 256-bit rate; on CPUs that split them in two halves, the same).
#ifdef __AVX512F__
constexpr int kLanes = 8;
#else
constexpr int kLanes = 4;
#endif
double fma_peak_gflops() {
  using V = double __attribute__((vector_size(kLanes * sizeof(double))));
  constexpr int kChains = 12;
  constexpr std::int64_t kIters = 20000000;
  const int threads = caviar::max_threads();
  std::vector<double> sink(static_cast<std::size_t>(threads));
  const std::clock_t c0 = std::clock();
#pragma omp parallel num_threads(threads)
  {
    V acc[kChains], m, a;
    for (int l = 0; l < kLanes; ++l) {
      for (int c = 0; c < kChains; ++c) acc[c][l] = 1e-3 * c + l;
      m[l] = 0.999999;
      a[l] = 1e-7;
    }
    for (std::int64_t i = 0; i < kIters; ++i)
      for (int c = 0; c < kChains; ++c) acc[c] = acc[c] * m + a;
    double s = 0;
    for (int c = 0; c < kChains; ++c)
      for (int l = 0; l < kLanes; ++l) s += acc[c][l];
    sink[static_cast<std::size_t>(omp_get_thread_num())] = s;
  }
  const double sec = static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
  benchmark::DoNotOptimize(sink.data());
  return 2.0 * kLanes * kChains * static_cast<double>(kIters) * threads / sec * 1e-9;
}

// Random sequences (n of equal length, kSteps in all) and an EM model at random parameters.
struct Problem {
  Sequences seqs;
  caviar::hmm::SequenceSource source;
  caviar::hmm::DataSummary summary;
  caviar::hmm::Config cfg;
  Problem(Emission e, int k, std::int64_t n) {
    std::mt19937_64 gen(7);
    const std::int64_t len = kSteps / n;
    for (std::int64_t q = 0; q < n; ++q) seqs.offsets.push_back((q + 1) * len);
    if (e == Emission::kCategorical) {
      std::uniform_int_distribution<int> sym(0, kSymbols - 1);
      for (std::int64_t t = 0; t < kSteps; ++t) seqs.symbols.push_back(sym(gen));
    } else {
      std::normal_distribution<double> normal;
      seqs.x.resize(kSteps, kDim);
      for (Eigen::Index i = 0; i < seqs.x.size(); ++i) seqs.x.data()[i] = normal(gen);
      summary.max_abs = seqs.x.cwiseAbs().maxCoeff();
      summary.mean.assign(kDim, 0.0);
      summary.var.assign(kDim, 1.0);
    }
    summary.sequences = n;
    summary.steps = kSteps;
    source.n = n;
    source.for_each = [this](const caviar::hmm::SequenceSource::PieceFn& f) { f(seqs, 0); };
    cfg.states = k;
    cfg.emission = e;
    cfg.symbols = kSymbols;
    cfg.dim = kDim;
  }
};

// Times `pass` (one call per iteration, after one untimed call) and sets the counters: flops and
// flops_all are one pass's counts for "peak" and "peak_all".
template <class Pass>
void time_pass(benchmark::State& state, std::int64_t n, double flops, double flops_all,
               const Pass& pass) {
  // One untimed pass first: a fit reuses its buffers from iteration to iteration, and at K = 128
  // (one timed iteration) the first touch of the T x K arrays' pages was a fifth of the time.
  pass();
  const auto t0 = std::chrono::steady_clock::now();
  const std::clock_t c0 = std::clock();
  for (auto _ : state) pass();
  const double cpu = static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double gflop = flops * static_cast<double>(state.iterations()) * 1e-9;
  const double gflop_all = flops_all * static_cast<double>(state.iterations()) * 1e-9;
  state.counters["GFLOP/s"] = gflop / sec;
  state.counters["GFLOP/cpu-s"] = gflop / cpu;
  state.counters["peak"] = gflop / cpu / g_peak;
  state.counters["peak_all"] = gflop_all / cpu / g_peak;
  state.counters["threads"] = static_cast<double>(std::min<std::int64_t>(caviar::max_threads(), n));
}

// Flops per step and state of the emissions' log densities: Gaussian with full covariance,
// D^2 + 3 D + 1 (the forward substitution, the squared norm, the constant); categorical, none (a
// table lookup). The exponentials are not counted.
double emission_flops(Emission e) {
  return e == Emission::kCategorical ? 0 : kDim * kDim + 3 * kDim + 1;
}

void ForwardBackward(benchmark::State& state, Emission e, std::int64_t n) {
  const int k = static_cast<int>(state.range(0));
  Problem p(e, k, n);
  Model model(p.cfg, &p.source, p.summary);
  model.init_random(1);
  auto stats = model.make_stats();
  std::vector<double> terms(static_cast<std::size_t>(n));
  const double linear = 3 + 4 + emission_flops(e) +
                        (e == Emission::kCategorical ? 1 : 2 * (kDim + kDim * (kDim + 1) / 2));
  time_pass(state, n, 6.0 * k * k * kSteps, (6.0 * k * k + linear * k) * kSteps, [&] {
    stats.set_zero();
    model.local_step(stats, terms);
    benchmark::DoNotOptimize(terms.data());
  });
}

// The forward-backward alone, as `hmm fit --posteriors` and `hmm score` with marginals run it
// (Model::posteriors: alpha, beta and gamma_t = alpha_t o beta_t written out, no statistics), with
// the flop count the HMM's cost is usually quoted in: 4 T K^2 (alpha_{t-1}' A and A u_t, 2 K^2 each
// per step) plus the emissions. "peak_all" adds the order-T K flops as the code performs them, per
// step and state: 3 in the forward, 3 in the backward (u_t = b_t o beta_t / c_t, gamma_t), and for
// Gaussian emissions D^2 + 3 D + 1 for the log density; the exponentials are not counted.
void Posteriors(benchmark::State& state, Emission e, std::int64_t n) {
  const int k = static_cast<int>(state.range(0));
  Problem p(e, k, n);
  Model model(p.cfg, &p.source, p.summary);
  model.init_random(1);
  std::vector<double> gamma(static_cast<std::size_t>(kSteps * k));
  const double emissions = emission_flops(e);
  time_pass(state, n, (4.0 * k * k + emissions * k) * kSteps,
            (4.0 * k * k + (emissions + 6) * k) * kSteps, [&] {
              model.posteriors(p.seqs, gamma);
              benchmark::DoNotOptimize(gamma.data());
            });
}

// The forward alone (Model::log_likelihood, as `hmm score` runs it): two rows of alpha and one
// chunk of emissions, no T x K array. Counted as 2 T K^2 plus the emissions.
void LogLikelihood(benchmark::State& state, Emission e, std::int64_t n) {
  const int k = static_cast<int>(state.range(0));
  Problem p(e, k, n);
  Model model(p.cfg, &p.source, p.summary);
  model.init_random(1);
  std::vector<double> ll(static_cast<std::size_t>(n));
  const double emissions = emission_flops(e);
  time_pass(state, n, (2.0 * k * k + emissions * k) * kSteps,
            (2.0 * k * k + (emissions + 3) * k) * kSteps, [&] {
              model.log_likelihood(p.seqs, ll);
              benchmark::DoNotOptimize(ll.data());
            });
}

// CAVIAR_BENCH_HMM_K="32,96,112" replaces the list of state counts (for a finer sweep).
void args(benchmark::internal::Benchmark* b) {
  std::vector<int> ks = {8, 32, 64, 128};
  if (const char* env = std::getenv("CAVIAR_BENCH_HMM_K")) {
    ks.clear();
    // At least one pass: an empty value fails the parse below rather than running nothing.
    for (const char* c = env; *c || ks.empty();) {
      char* end = nullptr;
      const long k = std::strtol(c, &end, 10);
      if (end == c || k < 1 || k > 4096) {
        std::fprintf(stderr,
                     "bench_hmm: CAVIAR_BENCH_HMM_K must be a comma-separated list of state "
                     "counts, got '%s'\n",
                     env);
        std::exit(2);
      }
      ks.push_back(static_cast<int>(k));
      c = *end == ',' ? end + 1 : end;
    }
  }
  for (int k : ks) b->Arg(k);
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

BENCHMARK_CAPTURE(ForwardBackward, LongCategorical, Emission::kCategorical, 1)->Apply(args);
BENCHMARK_CAPTURE(ForwardBackward, LongGaussian, Emission::kGaussian, 1)->Apply(args);
BENCHMARK_CAPTURE(ForwardBackward, ManyCategorical, Emission::kCategorical, 1000)->Apply(args);
BENCHMARK_CAPTURE(ForwardBackward, ManyGaussian, Emission::kGaussian, 1000)->Apply(args);
BENCHMARK_CAPTURE(Posteriors, LongCategorical, Emission::kCategorical, 1)->Apply(args);
BENCHMARK_CAPTURE(Posteriors, LongGaussian, Emission::kGaussian, 1)->Apply(args);
BENCHMARK_CAPTURE(Posteriors, ManyCategorical, Emission::kCategorical, 1000)->Apply(args);
BENCHMARK_CAPTURE(Posteriors, ManyGaussian, Emission::kGaussian, 1000)->Apply(args);
BENCHMARK_CAPTURE(LogLikelihood, LongCategorical, Emission::kCategorical, 1)->Apply(args);
BENCHMARK_CAPTURE(LogLikelihood, LongGaussian, Emission::kGaussian, 1)->Apply(args);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  g_peak = fma_peak_gflops();
  std::printf("FMA peak (double, %d-bit, one core, %d threads): %.1f GFLOP per CPU second\n",
              64 * kLanes, caviar::max_threads(), g_peak);
  benchmark::RunSpecifiedBenchmarks();
  // Again at the end: on a shared machine the rate available drifts during the run.
  std::printf("FMA peak at the end: %.1f GFLOP per CPU second\n", fma_peak_gflops());
  benchmark::Shutdown();
  return 0;
}
