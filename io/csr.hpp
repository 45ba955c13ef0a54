#pragma once
// Bag-of-words corpora in HDF5, in the CSR layout of scipy.sparse.csr_matrix / anndata:
//   <group>/indptr  int64 (D + 1)   document d holds entries [indptr[d], indptr[d+1])
//   <group>/indices int (nnz)       word ids in [0, V)
//   <group>/data    int or float (nnz)  token counts: non-negative integers (floats are accepted
//                                   if they hold integers)
//   <group>/vocab   strings (V)     optional if the group has a "shape" attribute [D, V]
// caviar writes int32 counts, int32 indices, variable-length UTF-8 vocab and shape = [D, V].
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "comm/comm.hpp"
#include "data/corpus.hpp"
#include "io/h5.hpp"

namespace caviar::io {

struct CorpusInfo {
  std::int64_t n_docs = 0, n_words = 0, nnz = 0;
  double tokens = 0;  // total token count
};

// Collective: reads and validates the corpus in group ref.path of ref.file; this rank receives a
// contiguous range of documents balanced by entries (distinct words per document: the cost of
// the E-step; a first read of /data, in 256-document blocks, validates the counts and totals the
// tokens). Any problem (negative or
// non-integer counts, indices out of range, indptr not monotone, mismatched lengths) is one agreed
// caviar::Error on every rank.
Corpus read_corpus(const Comm& comm, const DataRef& ref, CorpusInfo* info = nullptr);

// Collective: reads only the header (sizes), validated as above except the per-entry checks.
CorpusInfo inspect_corpus(const Comm& comm, const DataRef& ref);

// Collective: documents [doc_begin, doc_end) of the corpus, without balancing (streamed reads).
// indptr_global is the whole /indptr (every rank holds it).
Corpus read_corpus_range(const Comm& comm, const DataRef& ref,
                         const std::vector<std::int64_t>& indptr_global, std::int64_t n_words,
                         std::int64_t doc_begin, std::int64_t doc_end);
// The documents [begin, end) of rank r of p in read_corpus's split: contiguous, balanced by
// entries (indptr[d] is the entries before document d).
std::pair<std::int64_t, std::int64_t> document_range(const std::vector<std::int64_t>& indptr, int p,
                                                     int r);
// Collective: the whole /indptr on every rank (validated).
std::vector<std::int64_t> read_indptr(const Comm& comm, const DataRef& ref, CorpusInfo* info);

// Serial: the vocabulary (empty if the group has none).
std::vector<std::string> read_vocab(const DataRef& ref);

// Collective, atomic (temp file, then rename): every rank passes its documents, in rank order of
// the global document order; vocab is taken from rank 0. n_words is V.
void write_corpus(const Comm& comm, const std::string& file, const Corpus& local,
                  std::int64_t n_words, const std::vector<std::string>& vocab);

}  // namespace caviar::io
