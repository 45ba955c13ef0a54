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
#include <benchmark/benchmark.h>

#include <cstdint>
#include <span>
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
  if (Comm::world().is_root()) {
    benchmark::RunSpecifiedBenchmarks();
  } else {
    Silent silent;
    benchmark::RunSpecifiedBenchmarks(&silent);
  }
  benchmark::Shutdown();
  return 0;
}
