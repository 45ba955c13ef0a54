#include "prep/text_prep.hpp"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "core/error.hpp"
#include "core/rng.hpp"
#include "io/csr.hpp"
#include "io/h5.hpp"

namespace caviar {

namespace fs = std::filesystem;

const std::vector<std::string>& english_stopwords() {
  // Function words of English (articles, pronouns, auxiliaries, prepositions, conjunctions and
  // the commonest adverbs), written for caviar.
  static const std::vector<std::string> words = {
      "a",          "about",   "above",  "after",    "again",      "against", "all",       "also",
      "am",         "an",      "and",    "any",      "are",        "as",      "at",        "be",
      "because",    "been",    "before", "being",    "below",      "between", "both",      "but",
      "by",         "can",     "cannot", "could",    "did",        "do",      "does",      "doing",
      "done",       "down",    "during", "each",     "either",     "else",    "etc",       "even",
      "ever",       "every",   "few",    "for",      "from",       "further", "get",       "gets",
      "got",        "had",     "has",    "have",     "having",     "he",      "her",       "here",
      "hers",       "herself", "him",    "himself",  "his",        "how",     "however",   "i",
      "if",         "in",      "into",   "is",       "it",         "its",     "itself",    "just",
      "least",      "less",    "let",    "like",     "may",        "me",      "might",     "more",
      "most",       "much",    "must",   "my",       "myself",     "neither", "no",        "nor",
      "not",        "now",     "of",     "off",      "often",      "on",      "once",      "one",
      "only",       "or",      "other",  "others",   "our",        "ours",    "ourselves", "out",
      "over",       "own",     "per",    "quite",    "rather",     "really",  "said",      "same",
      "say",        "says",    "shall",  "she",      "should",     "since",   "so",        "some",
      "still",      "such",    "than",   "that",     "the",        "their",   "theirs",    "them",
      "themselves", "then",    "there",  "these",    "they",       "this",    "those",     "though",
      "through",    "thus",    "to",     "too",      "under",      "until",   "up",        "upon",
      "us",         "very",    "via",    "was",      "we",         "well",    "were",      "what",
      "whatever",   "when",    "where",  "whether",  "which",      "while",   "who",       "whom",
      "whose",      "why",     "will",   "with",     "within",     "without", "would",     "yet",
      "you",        "your",    "yours",  "yourself", "yourselves", "s",       "t",         "re",
      "ve",         "ll",      "d",      "m",        "don",        "doesn",   "didn",      "isn",
      "aren",       "wasn",    "weren",  "won",      "wouldn",     "couldn",  "shouldn",   "hasn",
      "haven",      "hadn"};
  return words;
}

std::vector<std::string> tokenize(const std::string& text, int min_length) {
  std::vector<std::string> out;
  std::string cur;
  bool letter = false;
  auto flush = [&] {
    if (letter && static_cast<int>(cur.size()) >= min_length) out.push_back(cur);
    cur.clear();
    letter = false;
  };
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (c >= 'A' && c <= 'Z') {
      cur.push_back(static_cast<char>(c - 'A' + 'a'));
      letter = true;
    } else if (c >= 'a' && c <= 'z') {
      cur.push_back(static_cast<char>(c));
      letter = true;
    } else if (c >= '0' && c <= '9') {
      cur.push_back(static_cast<char>(c));
    } else {
      flush();
    }
  }
  flush();
  return out;
}

namespace {

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw Error("cannot read '" + p.string() + "'");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string text_field(const std::string& json, const std::string& where) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json);
  } catch (const nlohmann::json::exception& e) {
    throw Error(where + ": not valid JSON (" + e.what() + ")");
  }
  if (!j.is_object() || !j.contains("text") || !j["text"].is_string())
    throw Error(where + ": no string field \"text\"");
  return j["text"].get<std::string>();
}

void read_jsonl(const fs::path& p, std::vector<std::string>& docs) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw Error("cannot read '" + p.string() + "'");
  std::string line;
  for (std::int64_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    docs.push_back(text_field(line, p.string() + ":" + std::to_string(n)));
  }
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

void read_input(const std::string& input, const std::string& extension,
                std::vector<std::string>& docs) {
  const fs::path in(input);
  std::error_code ec;
  if (fs::is_regular_file(in, ec)) {
    read_jsonl(in, docs);
    return;
  }
  if (!fs::is_directory(in, ec))
    throw Error("--input '" + input + "' is neither a folder nor a JSON-lines file");
  std::vector<fs::path> files;
  for (const auto& e : fs::recursive_directory_iterator(in))
    if (e.is_regular_file() && ends_with(e.path().filename().string(), extension))
      files.push_back(e.path());
  std::sort(files.begin(), files.end());
  for (const auto& f : files) {
    const std::string name = f.filename().string();
    if (ends_with(name, ".jsonl"))
      read_jsonl(f, docs);
    else if (ends_with(name, ".json"))
      docs.push_back(text_field(read_file(f), f.string()));
    else
      docs.push_back(read_file(f));
  }
}

std::vector<std::string> read_documents(const TextPrepOptions& o) {
  std::vector<std::string> docs;
  for (const auto& in : o.inputs) read_input(in, o.extension, docs);
  return docs;
}

// Text after the first blank line (mail headers end there); the whole text if there is none.
std::string strip_headers(const std::string& t) {
  std::size_t pos = 0;
  while (true) {
    const std::size_t nl = t.find('\n', pos);
    if (nl == std::string::npos) return t;
    const std::size_t next = t.find('\n', nl + 1);
    const std::string line =
        t.substr(nl + 1, next == std::string::npos ? std::string::npos : next - nl - 1);
    if (line.find_first_not_of("\r") == std::string::npos) return t.substr(nl + 1);
    pos = nl + 1;
  }
}

}  // namespace

TextPrepResult prep_text(const Comm& comm, const TextPrepOptions& o,
                         const std::function<void(const std::string&)>& progress) {
  const auto t0 = std::chrono::steady_clock::now();
  if (o.min_df < 1) throw Error("--min-df must be >= 1");
  if (!(o.max_df > 0 && o.max_df <= 1)) throw Error("--max-df must be in (0, 1]");
  if (o.min_length < 1) throw Error("--min-length must be >= 1");
  if (o.stopwords != "english" && o.stopwords != "none")
    throw Error("--stopwords must be english or none");
  if (!o.heldout.empty() && !(o.heldout_fraction > 0 && o.heldout_fraction < 1))
    throw Error("--heldout-fraction must be in (0, 1)");
  if (o.inputs.empty()) throw Error("--input is required");
  io::check_output_path(comm, o.out, o.inputs);
  if (!o.heldout.empty()) io::check_output_path(comm, o.heldout, o.inputs);
  if (!o.heldout.empty() && o.heldout == o.out) throw Error("--out and --heldout are the same");

  TextPrepResult res;
  std::string err;
  if (comm.is_root()) {
    try {
      const std::vector<std::string> texts = read_documents(o);
      if (texts.empty()) throw Error("--input holds no documents");
      if (progress) progress("read " + std::to_string(texts.size()) + " documents");
      const std::unordered_set<std::string> stop =
          o.stopwords == "english" ? std::unordered_set<std::string>(english_stopwords().begin(),
                                                                     english_stopwords().end())
                                   : std::unordered_set<std::string>{};
      // Provisional ids in order of first appearance; documents as (id, count) lists.
      std::unordered_map<std::string, std::int32_t> ids;
      std::vector<std::string> names;
      std::vector<std::vector<std::pair<std::int32_t, double>>> docs(texts.size());
      std::vector<bool> held(texts.size(), false);
      const CounterRng rng(o.seed, Stream::kLdaGenerate);
      std::vector<std::int64_t> df;
      std::int64_t n_train = 0;
      for (std::size_t d = 0; d < texts.size(); ++d) {
        held[d] = !o.heldout.empty() && rng.uniform2((5ull << 56) | d, 0)[0] < o.heldout_fraction;
        const auto tokens =
            tokenize(o.strip_headers ? strip_headers(texts[d]) : texts[d], o.min_length);
        std::unordered_map<std::int32_t, double> counts;
        for (const auto& t : tokens) {
          if (stop.count(t)) continue;
          auto [it, added] = ids.emplace(t, static_cast<std::int32_t>(names.size()));
          if (added) {
            names.push_back(t);
            df.push_back(0);
          }
          counts[it->second] += 1;
        }
        if (!held[d]) {
          ++n_train;
          for (const auto& [id, c] : counts) ++df[id];
        }
        docs[d].assign(counts.begin(), counts.end());
      }
      // Document-frequency pruning on the training documents only.
      const auto max_docs = static_cast<std::int64_t>(o.max_df * static_cast<double>(n_train));
      std::vector<std::int32_t> kept;
      for (std::size_t id = 0; id < names.size(); ++id)
        if (df[id] >= o.min_df && df[id] <= max_docs) kept.push_back(static_cast<std::int32_t>(id));
      std::sort(kept.begin(), kept.end(),
                [&](std::int32_t a, std::int32_t b) { return names[a] < names[b]; });
      if (kept.empty())
        throw Error("no word survives --min-df " + std::to_string(o.min_df) + " and --max-df " +
                    std::to_string(o.max_df));
      std::vector<std::int32_t> remap(names.size(), -1);
      std::vector<std::string> vocab;
      for (std::size_t i = 0; i < kept.size(); ++i) {
        remap[kept[i]] = static_cast<std::int32_t>(i);
        vocab.push_back(names[kept[i]]);
      }
      Corpus train, test;
      train.n_words = test.n_words = static_cast<std::int64_t>(vocab.size());
      std::vector<std::int32_t> w;
      std::vector<double> c;
      for (std::size_t d = 0; d < docs.size(); ++d) {
        std::vector<std::pair<std::int32_t, double>> entries;
        for (const auto& [id, cnt] : docs[d])
          if (remap[id] >= 0) entries.emplace_back(remap[id], cnt);
        std::sort(entries.begin(), entries.end());
        w.clear();
        c.clear();
        for (const auto& [id, cnt] : entries) {
          w.push_back(id);
          c.push_back(cnt);
          res.tokens += held[d] ? 0 : cnt;
        }
        res.empty_documents += entries.empty();
        (held[d] ? test : train).add_doc(w, c);
      }
      res.documents = train.n_docs();
      res.heldout_documents = test.n_docs();
      res.words = static_cast<std::int64_t>(vocab.size());
      const Comm self = Comm::self();
      io::write_corpus(self, o.out, train, res.words, vocab);
      if (!o.heldout.empty()) io::write_corpus(self, o.heldout, test, res.words, vocab);
    } catch (const Error& e) {
      err = e.what();
    }
  }
  comm.broadcast(err, 0);
  if (!err.empty()) throw Error(err);
  std::int64_t v[4] = {res.documents, res.heldout_documents, res.words, res.empty_documents};
  comm.broadcast(std::span<std::int64_t>(v, 4), 0);
  double tok = res.tokens;
  comm.broadcast(std::span<double>(&tok, 1), 0);
  res = {v[0], v[1], v[2], v[3], tok, 0};
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

}  // namespace caviar
