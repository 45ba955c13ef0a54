// Fuzz target: `lda fit --resume CHECKPOINT` (engine/checkpoint.cpp's reader, the fingerprint of
// inference/lda_checkpoint.cpp and its check in inference/checkpoint.cpp), on a structure-aware
// HDF5 checkpoint (h5_spec.hpp). The whole fit runs on a small fixed corpus, so that what the
// reader lets through is also used.
//
// Input: one configuration byte (which fit options; see kConfigs), then the checkpoint's entries.
// The seeds are real checkpoints written by lda::fit with the same corpus and options, their
// fingerprint replaced by the placeholder kFingerprint (harness.hpp).
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "harness.hpp"
#include "inference/lda_driver.hpp"
#include "io/csr.hpp"

namespace {

using caviar::fuzz::comm;
namespace lda = caviar::lda;

constexpr int kConfigs = 5;

// A corpus of n_docs documents over 10 words, deterministic. Small on purpose (at most 8
// documents): the corpus's identity in the fingerprint reads 8-document windows, one MPI-IO open
// each, and opens dominate an input's time.
std::string corpus_file(const std::string& name, std::int64_t n_docs, int salt) {
  const std::string p = caviar::fuzz::scratch(name);
  caviar::Corpus c;
  for (std::int64_t d = 0; d < n_docs; ++d) {
    std::vector<std::int32_t> w;
    std::vector<double> k;
    for (std::int64_t j = 0; j < 1 + (d + salt) % 4; ++j) {
      w.push_back(static_cast<std::int32_t>((2 * j + 3 * (d % 2) + salt) % 10));
      k.push_back(static_cast<double>(1 + (d * j + salt) % 3));
    }
    c.add_doc(w, k);
  }
  std::vector<std::string> vocab;
  for (int v = 0; v < 10; ++v) vocab.push_back("w" + std::to_string(v));
  caviar::io::write_corpus(comm(), p, c, 10, vocab);
  return p;
}

const std::string& train_file() {
  static const std::string p = corpus_file("lda_train.h5", 8, 0);
  return p;
}
const std::string& heldout_file() {
  static const std::string p = corpus_file("lda_heldout.h5", 4, 1);
  return p;
}

lda::FitOptions options(int c) {
  lda::FitOptions o;
  o.data = train_file();
  o.topics = 3;
  o.max_iter = 3;
  o.tol = 0;
  o.batch_size = 3;
  o.seed = 5;
  o.local.max_iter = 20;
  switch (c) {
    case 0:  // CAVI in memory
      o.algorithm = "cavi";
      break;
    case 1:  // SVI in memory
      o.algorithm = "svi";
      break;
    case 2:  // SVI streamed
      o.algorithm = "svi";
      o.stream = true;
      break;
    case 3:  // CAVI streamed in pieces
      o.algorithm = "cavi";
      o.stream = true;
      o.stream_piece_docs = 3;
      break;
    default:  // CAVI with a held-out perplexity trace
      o.algorithm = "cavi";
      o.heldout = heldout_file();
      break;
  }
  return o;
}

// A real checkpoint of configuration c: CAVI before iteration 2 (with gammas); SVI (3 minibatches
// a pass, a checkpoint at every minibatch boundary by time) the last one, before the third
// minibatch of pass 2: mid-pass, with its position (driver/) and the pass's terms (rows/).
caviar::fuzz::CheckpointTarget& target() {
  static caviar::fuzz::CheckpointTarget t(
      kConfigs,
      [](int c, const std::string& path) {
        lda::FitOptions o = options(c);
        o.checkpoint = path;
        o.checkpoint_every = o.algorithm == "svi" ? "0.000001s" : "2";
        o.max_iter = 2;
        lda::fit(comm(), o, nullptr);
      },
      [](int c, const std::string& path) {
        lda::FitOptions o = options(c);
        o.resume = path;
        lda::fit(comm(), o, nullptr);
      });
  return t;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  caviar::fuzz::init(target().target());
  train_file();
  heldout_file();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return target().run(data, size);
}
