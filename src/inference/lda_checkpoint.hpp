#pragma once
// The fingerprint of an LDA checkpoint (CAVI and SVI both use the engine's checkpoint,
// engine/checkpoint.hpp): what must match for a resume to continue the same fit.
#include <cstdint>
#include <vector>

#include "inference/checkpoint.hpp"
#include "inference/lda_driver.hpp"
#include "io/csr.hpp"
#include "io/h5.hpp"

namespace caviar::lda {

// Model lda, algorithm, K, V, the corpus's shape and sampled-documents identity (and the held-out
// corpus's, which fills the perplexity trace), alpha and eta as resolved, seed, the document fixed
// point's tolerance and sweeps, --stream, and SVI's batch size, tau0 and kappa. Options that only
// decide when to stop (--max-iter, --tol) or what to write (--out) may differ. indptr is
// the corpus's whole /indptr if the caller holds it (--stream), else nullptr (it is read).
ckpt::Fingerprint fingerprint(const Comm& comm, const FitOptions& o, const io::DataRef& ref,
                              const io::CorpusInfo& info, const std::vector<std::int64_t>* indptr,
                              const io::DataRef* heldout, double alpha, double eta);

}  // namespace caviar::lda
