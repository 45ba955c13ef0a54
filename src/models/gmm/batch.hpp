#pragma once
// The mixture's batch fits, CAVI (Bishop 2006, section 10.2) and EM (Bishop 2006, section 9.2),
// with Dirichlet or stick-breaking weights (Blei & Jordan 2006), as a model of the engine's batch
// driver (engine/batch.hpp): the local step is the E-step over the rank's rows, the reduction is
// the statistics' own exact sum (Stats::finish_exact through the engine's Reducer, or plain
// doubles with --fast-reduce), the objective is the ELBO or the log-likelihood of the summed
// statistics (Model::objective), and the global update is the M-step.
//
// The global state is the summed statistics the model was last updated from: update() is a
// deterministic, history-free function of (prior, shift, statistics), and the prior and the shift
// are recomputed from the same data and options, so saving the statistics and updating from them
// again on load gives back the same bits. There is no per-row state.
//
// The rows come in pieces (the rank's rows in memory, or chunks read again at every pass with
// --stream) through the caller's callback: the model knows nothing of files or MPI.
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "engine/reduce.hpp"
#include "engine/state.hpp"
#include "models/gmm/gmm.hpp"

namespace caviar::gmm {

// Completes a pass: sums s over the contributors (n_rows rows in all). Exact statistics:
// Stats::finish_exact, one max for the grid of the blocks' log-normalisers and one Int128 sum;
// otherwise one sum of the doubles.
inline void reduce(Stats& s, std::int64_t n_rows, const engine::Reducer& r) {
  if (!s.exact()) return r.sum(s.buffer());
  s.finish_exact(n_rows,
                 {[&](double v) { return r.max(v); }, [&](std::span<Int128> v) { r.sum(v); }});
}

// The mixture's statistics, and the number of rows they are summed over (every rank's): the
// engine's reducible statistics of every GMM fit or sampler.
struct SummedStats {
  gmm::Stats s;
  std::int64_t n_rows = 0;
  void set_zero() { s.set_zero(); }
  void reduce(const engine::Reducer& r) { gmm::reduce(s, n_rows, r); }
};

// Zeroed statistics over n_rows rows: exact on the grid of `exponents` (Model::exact_exponents),
// or plain doubles if it is empty (--fast-reduce).
inline SummedStats summed_stats(const Model& model, std::int64_t n_rows,
                                const std::vector<int>& exponents) {
  SummedStats s{model.make_stats(), n_rows};
  if (!exponents.empty()) s.s.make_exact(exponents);
  return s;
}

class BatchFit {
 public:
  using Stats = SummedStats;
  // each(f) calls f(x) on each piece of the rank's rows in order, the same number of times on
  // every rank (a streamed read is collective); pieces start at global 256-row block boundaries.
  using EachPiece = std::function<void(const std::function<void(const RowMatrix&)>&)>;

  // model: its prior and shift set; exponents: the grid of exact sums (Model::exact_exponents),
  // empty for plain double sums; resp: if given, receives the responsibilities of the last local
  // step (rows in memory, one piece).
  BatchFit(Model& model, std::int64_t n_rows, std::int64_t local_rows, std::vector<int> exponents,
           EachPiece each, RowMatrix* resp = nullptr)
      : model_(model),
        n_rows_(n_rows),
        local_rows_(local_rows),
        exponents_(std::move(exponents)),
        each_(std::move(each)),
        resp_(resp),
        last_(model.make_stats()) {}

  Stats make_stats() const { return summed_stats(model_, n_rows_, exponents_); }
  std::int64_t n_local_rows() const { return local_rows_; }
  void local_step(Stats& s, std::span<double>) {
    each_([&](const RowMatrix& x) { model_.local_step(x, s.s, resp_); });
  }
  double objective(const Stats& s) const { return model_.objective(s.s); }
  void update(const Stats& s) { update(s.s); }
  // The M-step from summed statistics (also the first one, from the initial responsibilities').
  void update(const gmm::Stats& s) {
    std::copy(s.buffer().begin(), s.buffer().end(), last_.buffer().begin());
    model_.update(last_);
  }
  void save(engine::StateWriter& w) const {
    w.array("stats", last_.buffer(), {last_.buffer().size()});
  }
  void load(const engine::StateReader& r) {
    const std::vector<double> v = r.array("stats", {last_.buffer().size()});
    gmm::Stats s = model_.make_stats();
    std::copy(v.begin(), v.end(), s.buffer().begin());
    update(s);
  }
  std::vector<engine::LocalState> local_states() { return {}; }

 private:
  Model& model_;
  std::int64_t n_rows_, local_rows_;
  std::vector<int> exponents_;
  EachPiece each_;
  RowMatrix* resp_;
  gmm::Stats last_;
};

}  // namespace caviar::gmm
