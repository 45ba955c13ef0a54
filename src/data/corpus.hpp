#pragma once
// A rank's documents of a bag-of-words corpus, in CSR form (the scipy/anndata layout): document d
// holds entries [indptr[d], indptr[d+1]) of (word id, count). Counts are integers stored as double
// (validated on reading). Documents are contiguous and global ids are doc_begin + local index.
// Read and written by io/csr.hpp; used by every bag-of-words model (models/lda).
#include <cstdint>
#include <vector>

namespace caviar {

struct Corpus {
  std::int64_t doc_begin = 0;           // global index of the first local document
  std::int64_t n_words = 0;             // vocabulary size V
  std::vector<std::int64_t> indptr{0};  // local offsets, indptr[0] = 0, size n_docs() + 1
  std::vector<std::int32_t> words;      // word id of each entry
  std::vector<double> counts;           // token count of each entry

  std::int64_t n_docs() const { return static_cast<std::int64_t>(indptr.size()) - 1; }
  std::int64_t nnz() const { return static_cast<std::int64_t>(words.size()); }
  double doc_tokens(std::int64_t d) const {
    double s = 0;
    for (std::int64_t j = indptr[d]; j < indptr[d + 1]; ++j) s += counts[j];
    return s;
  }
  double tokens() const {
    double s = 0;
    for (double c : counts) s += c;
    return s;
  }
  void add_doc(const std::vector<std::int32_t>& w, const std::vector<double>& c) {
    words.insert(words.end(), w.begin(), w.end());
    counts.insert(counts.end(), c.begin(), c.end());
    indptr.push_back(static_cast<std::int64_t>(words.size()));
  }
};

// Document completion, the held-out estimator of the topic models (Wallach et al. 2009): each
// document's tokens, taken in entry order, are observed at even positions and held out at odd
// ones. The observed part of an entry of `count` tokens starting at token position `start`.
inline double observed_part(std::int64_t start, std::int64_t count) {
  return static_cast<double>((count + (start % 2 == 0 ? 1 : 0)) / 2);
}

}  // namespace caviar
