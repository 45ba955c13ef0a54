#include "models/lda/batch.hpp"

#include <algorithm>
#include <numeric>

namespace caviar::lda {

BatchFit::BatchFit(Model& model, Pieces pieces, double tokens, const LocalOptions& local, bool warm)
    : model_(model), pieces_(std::move(pieces)), tokens_(tokens), local_(local), warm_(warm) {
  const std::int64_t n = pieces_.ranges.empty() ? 0 : pieces_.ranges.back().end;
  gamma_ = RowMatrix::Ones(n, model_.n_topics());
}

Stats BatchFit::make_stats() const {
  // Every expected count lies in [0, total tokens]: one scale serves every step and rank.
  return Stats(model_.n_topics(), model_.n_words(), fixed_point_scale(std::max(tokens_, 1.0)));
}

void BatchFit::local_step(Stats& s, std::span<double> terms) {
  const bool one_piece = pieces_.ranges.size() == 1 && pieces_.calls == 1;
  for (std::int64_t i = 0; i < pieces_.calls; ++i) {
    const Corpus& c = pieces_.read(i);
    if (i >= static_cast<std::int64_t>(pieces_.ranges.size())) continue;
    const RowRange r = pieces_.ranges[static_cast<std::size_t>(i)];
    docs_.resize(static_cast<std::size_t>(c.n_docs()));
    std::iota(docs_.begin(), docs_.end(), std::int64_t{0});
    const auto piece_terms =
        terms.subspan(static_cast<std::size_t>(r.begin), static_cast<std::size_t>(r.size()));
    // Warm-started from the previous gammas, every sweep is a coordinate ascent step, so the ELBO
    // can only increase (Model::local_step).
    if (one_piece) {
      sweeps_ += model_.local_step(c, docs_, gamma_, warm_, &s, piece_terms, local_);
    } else {
      piece_gamma_ = gamma_.middleRows(r.begin, r.size());
      sweeps_ += model_.local_step(c, docs_, piece_gamma_, warm_, &s, piece_terms, local_);
      gamma_.middleRows(r.begin, r.size()) = piece_gamma_;
    }
  }
  warm_ = true;
}

}  // namespace caviar::lda
