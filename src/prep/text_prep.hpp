#pragma once
// caviar prep text: raw text into a CSR bag-of-words corpus (io/csr.hpp layout).
//   Input: folders (every regular file below it, in path order, is one document: .json files
//   contribute their "text" field, .jsonl files one document per line with a "text" field, other
//   files their whole contents) and/or .jsonl files.
//   Tokens: maximal runs of ASCII letters and digits, lowercased, at least min_length characters,
//   with at least one letter; other bytes (punctuation, non-ASCII) separate tokens.
//   Vocabulary: words of the training documents minus stopwords, kept if they occur in at least
//   min_df documents and at most max_df of them (a fraction), sorted alphabetically.
//   Counts are written as int32.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "comm/comm.hpp"

namespace caviar {

struct TextPrepOptions {
  std::vector<std::string> inputs;  // folders and/or JSON-lines files, read in this order
  std::string out;
  std::string heldout;            // optional held-out corpus (same vocabulary)
  double heldout_fraction = 0.1;  // documents drawn at random (keyed by seed and index)
  std::uint64_t seed = 0;
  int min_df = 5;
  double max_df = 0.5;
  std::string stopwords = "english";  // english | none
  int min_length = 2;
  std::string extension;       // folders: only files whose name ends with this ("" = all)
  bool strip_headers = false;  // mail: keep only the text after the first blank line
};

struct TextPrepResult {
  std::int64_t documents = 0, heldout_documents = 0, words = 0, empty_documents = 0;
  double tokens = 0;
  double seconds = 0;
};

// Lowercased tokens of one text (exposed for tests).
std::vector<std::string> tokenize(const std::string& text, int min_length);
// caviar's English stopword list.
const std::vector<std::string>& english_stopwords();

// Collective: rank 0 reads, tokenises and writes; errors are agreed on every rank.
TextPrepResult prep_text(const Comm& comm, const TextPrepOptions& o,
                         const std::function<void(const std::string&)>& progress);

}  // namespace caviar
