#include "inference/gmm_checkpoint.hpp"

#include "core/error.hpp"

namespace caviar::gmm {

void add_mixture_keys(ckpt::Fingerprint& fp, const Comm& comm, const FitOptions& o,
                      const io::DataRef& ref, const io::MatrixShape& shape, const Model& model,
                      const std::string& init) {
  const Prior& pr = model.prior();
  fp.add("components", static_cast<std::int64_t>(o.components), "--components");
  fp.add("dim", static_cast<std::int64_t>(shape.cols), "data dimension D =");
  ckpt::add_data(fp, comm, "--data", ref, shape);
  fp.add("seed", static_cast<std::int64_t>(o.seed), "--seed");
  fp.add("init", init, "--init");
  if (init == "kmeans++")
    fp.add("kmeans_iter", static_cast<std::int64_t>(o.kmeans_iter), "--kmeans-iter");
  fp.add("alpha0", pr.alpha0, "--alpha0");
  fp.add("beta0", pr.beta0, "--beta0");
  fp.add("nu0", pr.nu0, "--nu0");
  fp.add("prior_mean", o.prior_mean, "--prior-mean");
  fp.add("prior_scale", o.prior_scale, "--prior-scale");
}

ckpt::Fingerprint fingerprint(const Comm& comm, const FitOptions& o, const io::DataRef& ref,
                              const io::MatrixShape& shape, const Model& model,
                              const std::string& init) {
  ckpt::Fingerprint fp("gmm");
  fp.add("algorithm", to_string(o.algorithm), "--algorithm");
  fp.add("covariance", to_string(o.covariance), "--covariance");
  fp.add("weights", to_string(model.prior().weights), "--weights");
  add_mixture_keys(fp, comm, o, ref, shape, model, init);
  if (o.algorithm == Algorithm::kEm) fp.add("reg_covar", o.reg_covar, "--reg-covar");
  if (o.algorithm == Algorithm::kSvi) {
    fp.add("batch_size", static_cast<std::int64_t>(o.batch_size), "--batch-size");
    fp.add("schedule", to_string(o.schedule), "--schedule");
    // Named as in lda fit and hmm fit since the Robbins-Monro delay and decay became --tau0 and
    // --kappa (they were --omega and --delta, and --tau0 was the adaptive memory): checkpoints
    // written before lack these keys and are refused.
    fp.add("tau0", o.tau0, "--tau0");
    fp.add("kappa", o.kappa, "--kappa");
    fp.add("adaptive_memory", o.adaptive_memory, "--adaptive-memory");
    fp.add("full_elbo_every", static_cast<std::int64_t>(o.full_elbo_every), "--full-elbo-every");
  }
  // Plain double sums change with the summation order, hence the last bits.
  fp.add("fast_reduce", static_cast<std::int64_t>(o.fast_reduce), "--fast-reduce");
  fp.add("precision", to_string(o.precision), "--precision");
  // Streaming changes how rows are grouped into partial sums (with --fast-reduce).
  fp.add("stream", static_cast<std::int64_t>(o.stream), "--stream");
  if (o.stream) fp.add("chunk_rows", static_cast<std::int64_t>(o.chunk_rows), "--chunk-rows");
  // The checkpoints are the engine's (engine/checkpoint.hpp: the statistics under model/stats;
  // SVI's position under driver/). Older ones kept their own layout (the statistics at /stats):
  // they lack this entry, and a resume from one stops with "its fingerprint lacks 'layout'
  // (written by another version?)".
  fp.add("layout", std::string("engine"), "the checkpoint layout");
  return fp;
}

}  // namespace caviar::gmm
