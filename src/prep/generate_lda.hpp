#pragma once
// Synthetic corpora from the LDA generative model, written in parallel as CSR corpora
// (io/csr.hpp). Document d depends only on (seed, d), so the files are identical for any number
// of ranks.
#include <cstdint>
#include <string>

#include "comm/comm.hpp"
#include "models/lda/lda.hpp"

namespace caviar::lda {

struct GenerateOptions {
  std::int64_t docs = 0, words = 0;
  int topics = 0;
  double doc_length = 100;  // tokens per document: uniform on [L/2, 3L/2]
  double alpha = 0.1, eta = 0.05;
  std::uint64_t seed = 0;
  std::string out, truth;
  std::string heldout;  // optional: documents [docs, docs + heldout_docs) of the same model
  std::int64_t heldout_docs = 0;
};
// The true topic-word matrix beta (K x V) of a synthetic corpus: a pure function of the options.
RowMatrix true_topics(const GenerateOptions& o);
// Collective: a corpus from the LDA generative model; document d depends only on (seed, d).
void generate(const Comm& comm, const GenerateOptions& o);

}  // namespace caviar::lda
