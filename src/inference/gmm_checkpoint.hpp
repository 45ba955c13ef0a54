#pragma once
// The fingerprint of a mixture's checkpoint: what a resumed `caviar gmm fit` (CAVI, EM or SVI) or
// Gibbs chain must share with the run that wrote it. The checkpoints themselves are the engine's
// (engine/checkpoint.hpp: the batch fits through engine::fit_batch, SVI through
// engine::fit_stochastic, the chains through engine::run_sampler).
#include <cstdint>
#include <string>
#include <vector>

#include "inference/checkpoint.hpp"
#include "inference/gmm_driver.hpp"
#include "io/h5.hpp"

namespace caviar::gmm {

// What a resumed fit must share with the run that wrote the checkpoint (collective): model gmm,
// algorithm, covariance, weight prior, K, D, the data's shape and sampled-rows identity
// (ckpt::data_identity), seed, init, and every option that changes the result (priors as
// resolved, reg_covar, SVI batch size and schedule, stream and chunk rows, and the engine's
// layout). Options that only decide when to stop (--max-iter, --tol) or what to
// write (--out, --labels, --heldout) may differ.
ckpt::Fingerprint fingerprint(const Comm& comm, const FitOptions& o, const io::DataRef& ref,
                              const io::MatrixShape& shape, const Model& model,
                              const std::string& init);

// The keys every mixture checkpoint shares, fit or chain (collective): K, D, the data's identity,
// seed, init, and the priors as resolved. fingerprint() and the Gibbs chain's add them after
// their own algorithm keys.
void add_mixture_keys(ckpt::Fingerprint& fp, const Comm& comm, const FitOptions& o,
                      const io::DataRef& ref, const io::MatrixShape& shape, const Model& model,
                      const std::string& init);

}  // namespace caviar::gmm
