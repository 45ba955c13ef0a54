#include "inference/lda_checkpoint.hpp"

#include "core/error.hpp"

namespace caviar::lda {

ckpt::Fingerprint fingerprint(const Comm& comm, const FitOptions& o, const io::DataRef& ref,
                              const io::CorpusInfo& info, const std::vector<std::int64_t>* indptr,
                              const io::DataRef* heldout, double alpha, double eta) {
  ckpt::Fingerprint fp("lda");
  fp.add("algorithm", o.algorithm, "--algorithm");
  fp.add("topics", static_cast<std::int64_t>(o.topics), "--topics");
  fp.add("words", info.n_words, "vocabulary size V =");
  ckpt::add_corpus(fp, comm, "--data", ref, info, indptr);
  if (heldout) {
    io::CorpusInfo hi = io::inspect_corpus(comm, *heldout);
    ckpt::add_corpus(fp, comm, "--heldout", *heldout, hi, nullptr);
  } else {
    fp.add("heldout", std::string("none"), "--heldout");
  }
  fp.add("alpha", alpha, "--alpha");
  fp.add("eta", eta, "--eta");
  fp.add("seed", static_cast<std::int64_t>(o.seed), "--seed");
  fp.add("doc_tol", o.local.tol, "--doc-tol");
  fp.add("doc_max_iter", static_cast<std::int64_t>(o.local.max_iter), "--doc-max-iter");
  // --stream SVI draws other minibatches (runs of 256-document blocks); --stream CAVI equals the
  // in-memory fit, but is kept apart too (never tested across).
  fp.add("stream", static_cast<std::int64_t>(o.stream), "--stream");
  if (o.algorithm == "svi") {
    fp.add("batch_size", static_cast<std::int64_t>(o.batch_size), "--batch-size");
    fp.add("tau0", o.tau0, "--tau0");
    fp.add("kappa", o.kappa, "--kappa");
  }
  return fp;
}

}  // namespace caviar::lda
