// Fuzz target: the CSR corpus reader (io/csr.hpp): read_corpus, read_indptr + read_corpus_range
// (the --stream path) and read_vocab, on a structure-aware HDF5 file (h5_spec.hpp).
//
// Input: one configuration byte (bit 0: the corpus is at "/" or in the group "/corpus"), then the
// file's entries. A bad corpus must end in a caviar::Error; what the reader accepts must hold
// what io/csr.hpp promises (checked below: any violation aborts).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "harness.hpp"
#include "io/csr.hpp"

namespace {

using caviar::fuzz::comm;

void check(bool ok) {
  if (!ok) std::abort();  // a broken promise is a crash for libFuzzer
}

void check_corpus(const caviar::Corpus& c, std::int64_t d0, std::int64_t d1, std::int64_t n_words) {
  check(c.doc_begin == d0 && c.n_docs() == d1 - d0 && c.n_words == n_words);
  check(c.indptr.front() == 0 && c.indptr.back() == c.nnz());
  check(c.counts.size() == c.words.size());
  for (std::size_t d = 0; d + 1 < c.indptr.size(); ++d) check(c.indptr[d] <= c.indptr[d + 1]);
  for (std::int32_t w : c.words) check(w >= 0 && w < n_words);
  for (double x : c.counts) check(x >= 0 && std::isfinite(x) && x == std::floor(x));
}

// A valid corpus written by caviar's own writer: documents of words (w * d) mod V, empty ones too.
void write_corpus(const std::string& path, bool with_vocab) {
  const std::int64_t n_docs = 12, n_words = 9;
  caviar::Corpus c;
  for (std::int64_t d = 0; d < n_docs; ++d) {
    std::vector<std::int32_t> w;
    std::vector<double> k;
    for (std::int64_t j = 0; j < d % 5; ++j) {
      w.push_back(static_cast<std::int32_t>((3 * j + d) % n_words));
      k.push_back(static_cast<double>(1 + (d + j) % 3));
    }
    c.add_doc(w, k);
  }
  std::vector<std::string> vocab;
  if (with_vocab)
    for (std::int64_t v = 0; v < n_words; ++v) vocab.push_back("word" + std::to_string(v));
  caviar::io::write_corpus(comm(), path, c, n_words, vocab);
}

void write_seeds(const std::string& dir) {
  using caviar::fuzz::Entry;
  const std::string f = caviar::fuzz::scratch("seed.h5");
  write_corpus(f, true);
  caviar::fuzz::save(dir, "vocab", caviar::fuzz::input_of_file(f, {0}));
  write_corpus(f, false);
  caviar::fuzz::save(dir, "shape_only", caviar::fuzz::input_of_file(f, {0}));
  // The same corpus one group down (--data FILE:/corpus).
  write_corpus(f, true);
  std::vector<Entry> entries = caviar::fuzz::read_file(f);
  for (Entry& e : entries) {
    if (e.kind == Entry::kAttribute)
      e.object = "/corpus" + e.object;
    else
      e.name = "/corpus" + e.name;
  }
  std::vector<std::uint8_t> bytes{1};
  const std::vector<std::uint8_t> body = caviar::fuzz::encode(entries);
  bytes.insert(bytes.end(), body.begin(), body.end());
  caviar::fuzz::save(dir, "group", bytes);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  caviar::fuzz::init({write_seeds});
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const std::string file = caviar::fuzz::scratch("corpus.h5");
  if (!caviar::fuzz::write_input(file, data + 1, size - 1)) return 0;
  const caviar::io::DataRef ref{file, (data[0] & 1) ? "/corpus" : "/"};

  try {
    caviar::io::CorpusInfo info;
    const caviar::Corpus c = caviar::io::read_corpus(comm(), ref, &info);
    check(info.n_docs >= 1 && info.n_words >= 1 && info.nnz == c.nnz());
    check_corpus(c, 0, info.n_docs, info.n_words);  // one rank: every document
    check(info.tokens == c.tokens());
  } catch (const caviar::Error& e) {
    caviar::fuzz::refused(e);
  }

  try {
    caviar::io::CorpusInfo info;
    const std::vector<std::int64_t> indptr = caviar::io::read_indptr(comm(), ref, &info);
    check(static_cast<std::int64_t>(indptr.size()) == info.n_docs + 1);
    // The --stream reads: runs of documents (a few, not all: a corpus may have many).
    const std::int64_t n = info.n_docs;
    const std::int64_t runs[][2] = {{0, std::min<std::int64_t>(n, 5)}, {n / 2, n}, {n, n}};
    for (const auto& [d0, d1] : runs)
      check_corpus(caviar::io::read_corpus_range(comm(), ref, indptr, info.n_words, d0, d1), d0, d1,
                   info.n_words);
  } catch (const caviar::Error& e) {
    caviar::fuzz::refused(e);
  }

  try {
    caviar::io::read_vocab(ref);
  } catch (const caviar::Error& e) {
    caviar::fuzz::refused(e);
  }
  return 0;
}
