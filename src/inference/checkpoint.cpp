#include "inference/checkpoint.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "core/signals.hpp"
#include "io/csr.hpp"

namespace caviar::ckpt {

namespace {
// The corpus's identity, hashed as ckpt::data_identity hashes a matrix (its windows, its hash):
// the shape (documents, vocabulary, entries), then the sampled documents' word ids and counts.
// Collective: every rank reads the same few documents.
std::string corpus_identity(const Comm& comm, const io::DataRef& ref, const io::CorpusInfo& info,
                            const std::vector<std::int64_t>& indptr) {
  IdentityHash h;
  h.word(static_cast<std::uint64_t>(info.n_docs));
  h.word(static_cast<std::uint64_t>(info.n_words));
  h.word(static_cast<std::uint64_t>(info.nnz));
  for (const auto& [b, e] : identity_windows(info.n_docs)) {
    const Corpus c = io::read_corpus_range(comm, ref, indptr, info.n_words, b, e);
    h.word(static_cast<std::uint64_t>(b));
    for (std::int64_t d = 0; d < c.n_docs(); ++d) {
      h.word(static_cast<std::uint64_t>(c.indptr[d + 1] - c.indptr[d]));
      for (std::int64_t j = c.indptr[d]; j < c.indptr[d + 1]; ++j) {
        h.word(static_cast<std::uint64_t>(c.words[j]));
        h.value(c.counts[j]);
      }
    }
  }
  return h.hex();
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

Every parse_every(const std::string& s) {
  Every e;
  if (s.empty()) return e;
  const bool timed = s.back() == 's';
  const std::string num = timed ? s.substr(0, s.size() - 1) : s;
  const auto bad = [&] {
    return Error(
        "--checkpoint-every must be a positive number of iterations (e.g. 10) or of "
        "seconds (e.g. 30s), got '" +
        s + "'");
  };
  if (num.empty()) throw bad();
  std::size_t used = 0;
  try {
    if (timed) {
      e.seconds = std::stod(num, &used);
      if (!(e.seconds > 0) || e.seconds > 1e9) throw bad();
    } else {
      e.iterations = std::stoll(num, &used);
      if (e.iterations < 1) throw bad();
    }
  } catch (const std::logic_error&) {
    throw bad();
  }
  if (used != num.size()) throw bad();
  return e;
}

void Fingerprint::add(const std::string& key, const std::string& value, const std::string& flag,
                      const std::string& why) {
  entries_.push_back({key, value, flag, why});
}
void Fingerprint::add(const std::string& key, std::int64_t value, const std::string& flag) {
  add(key, std::to_string(value), flag);
}
void Fingerprint::add(const std::string& key, double value, const std::string& flag) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", value);
  add(key, std::string(buf), flag);
}

namespace {
template <class Writer>
void write_fingerprint(Writer& w, const std::string& model, const nlohmann::ordered_json& j) {
  w.attr("model", model);
  w.attr("checkpoint", static_cast<std::int64_t>(1));
  w.attr("fingerprint", j.dump());
}
}  // namespace

void Fingerprint::write(io::FileWriter& w) const {
  nlohmann::ordered_json j;
  for (const Entry& e : entries_) j[e.key] = e.value;
  write_fingerprint(w, model_, j);
}

void Fingerprint::write(io::ParallelRowWriter& w) const {
  nlohmann::ordered_json j;
  for (const Entry& e : entries_) j[e.key] = e.value;
  write_fingerprint(w, model_, j);
}

void Fingerprint::check(const io::FileReader& r, const std::string& file) const {
  const std::string where = "--resume " + file + ": ";
  // Model files and the VAE's checkpoints carry "model" too; only checkpoints carry
  // "fingerprint".
  std::string model;
  try {
    model = r.read_string_attr("model");
  } catch (const Error&) {
    throw Error(where + "not a caviar checkpoint (no 'model' attribute)");
  }
  if (model != model_)
    throw Error(where + "it was written by " + model + ", not " + model_ + " (a " + model +
                " checkpoint or model file)");
  std::string text;
  try {
    text = r.read_string_attr("fingerprint");
  } catch (const Error&) {
    throw Error(where + "no fingerprint, so not a checkpoint of this caviar (a " + model +
                " model file, or a checkpoint of an older version)");
  }
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception&) {
    throw Error(where + "its fingerprint is corrupt");
  }
  for (const Entry& e : entries_) {
    if (!j.contains(e.key) || !j[e.key].is_string())
      throw Error(where + "its fingerprint lacks '" + e.key + "' (written by another version?)");
    const std::string was = j[e.key].get<std::string>();
    if (was != e.value && !e.why.empty())
      throw Error(where + e.why + ": " + was + " there, " + e.value + " here");
    if (was != e.value)
      throw Error(where + "it was written with " + e.flag + " " + was + ", this run has " + e.flag +
                  " " + e.value + "; a resume needs the same one");
  }
}

void IdentityHash::word(std::uint64_t w) {
  // FNV-1a, 64 bit: tiny, portable, and byte-order explicit (fed little-endian words).
  for (int i = 0; i < 8; ++i) {
    h_ ^= static_cast<unsigned char>(w >> (8 * i));
    h_ *= 0x100000001b3ull;
  }
}

void IdentityHash::value(double v) {
  std::uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  word(bits);
}

std::string IdentityHash::hex() const {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h_));
  return buf;
}

std::vector<std::pair<std::int64_t, std::int64_t>> identity_windows(std::int64_t rows) {
  constexpr std::int64_t kWindows = 8, kRows = 8;
  std::vector<std::pair<std::int64_t, std::int64_t>> out;
  const std::int64_t span = std::max<std::int64_t>(0, rows - kRows);
  std::int64_t prev_end = 0;
  for (std::int64_t w = 0; w < kWindows; ++w) {
    // Window starts at 0, span/7, ..., span; windows of a small file overlap or coincide, so
    // clip each to the rows after the previous one (the result is then the same on every rank).
    std::int64_t b = span * w / (kWindows - 1);
    const std::int64_t e = std::min(rows, b + kRows);
    b = std::max(b, prev_end);
    if (b >= e) continue;
    prev_end = e;
    out.emplace_back(b, e);
  }
  return out;
}

std::string data_identity(const Comm& comm, const io::DataRef& ref, const io::MatrixShape& shape) {
  IdentityHash h;
  h.word(static_cast<std::uint64_t>(shape.rows));
  h.word(static_cast<std::uint64_t>(shape.cols));
  for (const auto& [b, e] : identity_windows(shape.rows)) {
    // Every rank reads the same few rows (a collective read of a tiny hyperslab).
    const io::RowMatrix x = io::read_rows(comm, ref, shape, {b, e});
    h.word(static_cast<std::uint64_t>(b));
    for (Eigen::Index i = 0; i < x.rows(); ++i)
      for (Eigen::Index j = 0; j < x.cols(); ++j) h.value(x(i, j));
  }
  return h.hex();
}

void add_data(Fingerprint& fp, const Comm& comm, const std::string& flag, const io::DataRef& ref,
              const io::MatrixShape& shape) {
  fp.add(flag.substr(2) + "_shape", std::to_string(shape.rows) + "x" + std::to_string(shape.cols),
         flag + " (rows x columns)");
  fp.add(flag.substr(2) + "_identity", data_identity(comm, ref, shape), flag,
         "its data differ from this run's " + flag + " " + ref.str() + " (hash of sampled rows)");
}

void check_paths(const Comm& comm, const std::string& checkpoint, const std::string& every,
                 const std::vector<std::string>& inputs) {
  if (!every.empty() && checkpoint.empty())
    throw Error("--checkpoint-every needs --checkpoint FILE");
  parse_every(every);
  if (!checkpoint.empty()) io::check_output_path(comm, checkpoint, inputs);
}

void check_resume(const Comm& comm, const std::string& resume) {
  if (resume.empty()) return;
  comm.on_root([&] {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(resume, ec))
      throw Error("--resume " + resume + ": no such file");
  });
}

StopPoller::StopPoller(const Comm& comm, Every every)
    : comm_(comm), every_(every), last_save_(now_seconds()) {}

StopPoller::Decision StopPoller::poll(std::int64_t done, std::int64_t propose) {
  // Encoded as 2 * signal + due, so that one max carries both: any signal wins (and implies a
  // save); otherwise only rank 0 contributes `due`. The second value is rank 0's proposal (the
  // others send 0; a max of small integers in doubles is exact).
  std::int64_t due = 0;
  if (comm_.is_root() && every_.seconds > 0 && now_seconds() - last_save_ >= every_.seconds)
    due = 1;
  const std::int64_t mine = 2 * static_cast<std::int64_t>(StopSignals::received()) + due;
  const double proposal =
      comm_.is_root() ? static_cast<double>(std::clamp<std::int64_t>(propose, 0, kMaxProposal)) : 0;
  double buf[2] = {static_cast<double>(mine), proposal};
  comm_.allreduce_max(std::span<double>(buf, 2));
  const auto all = static_cast<std::int64_t>(buf[0]);
  Decision d;
  d.proposed = static_cast<std::int64_t>(buf[1]);
  d.signal = static_cast<int>(all / 2);
  d.save = d.signal != 0 || (all & 1) != 0 ||
           (every_.iterations > 0 && done > 0 && done != skip_ && done % every_.iterations == 0);
  return d;
}

void StopPoller::saved() {
  last_save_ = now_seconds();
}

std::string signal_name(int sig) {
  if (sig == SIGTERM) return "SIGTERM";
  if (sig == SIGUSR1) return "SIGUSR1";
  return "signal " + std::to_string(sig);
}

std::int64_t read_int(const io::FileReader& r, const std::string& name, std::int64_t lo,
                      std::int64_t hi, const std::string& bad) {
  return checked_int(r.read_double_attr(name), lo, hi, bad + "its attribute '" + name + "'");
}

void stop(int sig, const std::string& where, const std::string& checkpoint) {
  throw Preempted("caviar: stopped by " + signal_name(sig) + " " + where + "; " +
                  (checkpoint.empty() ? std::string("no --checkpoint given, nothing saved")
                                      : "wrote checkpoint " + checkpoint +
                                            " (continue with --resume " + checkpoint + ")") +
                  "; exit code " + std::to_string(kExitPreempted));
}

void write_vec(io::FileWriter& w, const std::string& name, std::span<const double> v) {
  if (!v.empty()) w.write(name, v, {v.size()});
}

std::vector<double> read_vec(const io::FileReader& r, const std::string& name) {
  return r.has(name) ? r.read(name) : std::vector<double>{};
}

void add_corpus(Fingerprint& fp, const Comm& comm, const std::string& flag, const io::DataRef& ref,
                const io::CorpusInfo& info, const std::vector<std::int64_t>* indptr) {
  std::vector<std::int64_t> read;
  if (!indptr) {
    io::CorpusInfo again;
    read = io::read_indptr(comm, ref, &again);
    indptr = &read;
  }
  fp.add(flag.substr(2) + "_shape",
         std::to_string(info.n_docs) + "x" + std::to_string(info.n_words) + "x" +
             std::to_string(info.nnz),
         flag + " (documents x vocabulary x entries)");
  fp.add(flag.substr(2) + "_identity", corpus_identity(comm, ref, info, *indptr), flag,
         "its corpus differs from this run's " + flag + " " + ref.str() +
             " (hash of sampled documents)");
}

}  // namespace caviar::ckpt
