// The allreduce of one CAVI step, alone (docs/performance.md, "Allreduce share of an iteration"):
// the Gaussian mixture's statistics buffer for the three benchmark shapes, as the driver sends it,
// plain doubles (--fast-reduce) and the exact path's Int128 sums (one more entry: the
// log-normalisers). Run it under MPI, e.g.
//
//   mpirun -n 2 build/bench/bench_allreduce
//   mpirun -n 4 --oversubscribe build/bench/bench_allreduce
//
// Every rank runs the same fixed number of iterations (Google Benchmark would otherwise choose
// a count per rank from its own timings, and the ranks' collectives would no longer match);
// rank 0 reports. Counters: bytes/s of the buffer and `entries`.
//
// AllreduceSweepInt64/<entries> and AllreduceSweepInt128/<entries> time one buffer of 1 to 2^20
// entries (every 4x): the message sizes that bench/scaling_study.py fits its latency-bandwidth
// model to. int64 is the native MPI_SUM of the LDA and VAE reductions; Int128 is the user-defined
// op of the Gaussian mixture's exact sums, whose combine is a loop in our code, not MPI's.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "comm/comm.hpp"
#include "core/exact_sum.hpp"
#include "models/gmm/gmm.hpp"

namespace {

using caviar::Comm;
using caviar::Int128;

struct Shape {
  int d, k;
};
constexpr Shape kShapes[] = {{2, 10}, {16, 20}, {192, 30}};

std::size_t stats_size(const Shape& s) {
  return caviar::gmm::Stats(s.d, s.k, caviar::gmm::Covariance::kFull).buffer().size();
}

template <class T>
void run(benchmark::State& state, std::size_t n) {
  const Comm comm = Comm::world();
  std::vector<T> buf(n, T(1));
  // Untimed warm-up: the first collectives of a size pay for connection set-up and buffer
  // allocation inside MPI (about 1 ms here), which would otherwise land on the smallest case.
  for (int i = 0; i < 5; ++i) comm.allreduce_sum(std::span<T>(buf));
  comm.barrier();
  for (auto _ : state) {
    comm.allreduce_sum(std::span<T>(buf));
    benchmark::DoNotOptimize(buf.data());
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * n * sizeof(T)));
  state.counters["entries"] = static_cast<double>(n);
  state.counters["ranks"] = comm.size();
}

void AllreduceFast(benchmark::State& state) {
  run<double>(state, stats_size(kShapes[state.range(0)]));
}

void AllreduceExact(benchmark::State& state) {
  run<Int128>(state, stats_size(kShapes[state.range(0)]) + 1);
}

// Fixed iterations (see above): enough for ~0.1-1 s per case at 2 ranks on one node.
BENCHMARK(AllreduceFast)->Arg(0)->Arg(1)->Arg(2)->Iterations(2000)->UseRealTime();
BENCHMARK(AllreduceExact)->Arg(0)->Arg(1)->Arg(2)->Iterations(2000)->UseRealTime();

// Fixed iterations again (the ranks must agree), fewer for long messages: ~256 MB moved per case,
// at least 20 and at most 2000 repetitions.
void register_sweep() {
  for (std::size_t n = 1; n <= (std::size_t{1} << 20); n *= 4) {
    const auto reps = [n](std::size_t bytes) {
      return static_cast<benchmark::IterationCount>(
          std::clamp<std::size_t>((std::size_t{256} << 20) / (n * bytes), 20, 2000));
    };
    benchmark::RegisterBenchmark(("AllreduceSweepInt64/" + std::to_string(n)).c_str(),
                                 [n](benchmark::State& st) { run<std::int64_t>(st, n); })
        ->Iterations(reps(sizeof(std::int64_t)))
        ->UseRealTime();
    benchmark::RegisterBenchmark(("AllreduceSweepInt128/" + std::to_string(n)).c_str(),
                                 [n](benchmark::State& st) { run<Int128>(st, n); })
        ->Iterations(reps(sizeof(Int128)))
        ->UseRealTime();
  }
}

// Ranks other than 0 run every benchmark (the collectives need them) but print nothing.
class Silent : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

}  // namespace

int main(int argc, char** argv) {
  caviar::Environment env(argc, argv);
  benchmark::Initialize(&argc, argv);
  register_sweep();
  if (Comm::world().is_root()) {
    benchmark::RunSpecifiedBenchmarks();
  } else {
    Silent silent;
    benchmark::RunSpecifiedBenchmarks(&silent);
  }
  benchmark::Shutdown();
  return 0;
}
