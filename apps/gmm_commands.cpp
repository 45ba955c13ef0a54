// caviar gmm fit | score | predict | sample | summarize | compare
#include <cmath>
#include <cstdio>
#include <memory>

#include "app.hpp"
#include "core/parallel.hpp"
#include "engine/compare.hpp"
#include "inference/gmm_driver.hpp"
#include "inference/gmm_summarize.hpp"

namespace caviar::app {

namespace {

// gmm sample --data: a Gibbs chain (inference/gmm_driver.hpp's sample_chain).
void run_chain(Context& ctx, gmm::ChainOptions c, const std::string& cov, const std::string& init,
               std::uint64_t seed, const std::string& out, const engine::CheckpointFiles& files) {
  gmm::FitOptions& o = c.fit;
  o.covariance = gmm::parse_covariance(cov);
  o.seed = seed;
  o.out = out;
  // A keyword or FILE.h5:/dataset (responsibilities) is gmm fit's --init; a bare file is a model.
  if (init == "kmeans++" || init == "random" || init == "random-from-data" ||
      init.find(':') != std::string::npos)
    o.init = init;
  else
    o.init_params = init;
  o.checkpoint = files.checkpoint;
  o.checkpoint_every = files.every;
  o.resume = files.resume;
  o.command = ctx.command_line;
  o.version = CAVIAR_VERSION;
  print_progress(ctx, "caviar gmm sample: " + o.data + ", K=" + std::to_string(o.components) +
                          ", " + c.sampler + " Gibbs, " + cov + " covariance, " +
                          std::to_string(c.sweeps) + " sweeps, " +
                          std::to_string(ctx.comm->size()) + " ranks x " +
                          std::to_string(max_threads()) + " threads");
  const auto r = gmm::sample_chain(*ctx.comm, c, [&ctx](const engine::Report& it) {
    char line[200];
    if (std::isnan(it.heldout))
      std::snprintf(line, sizeof line, "sweep %5d  log joint % .10e  %8.3fs", it.iteration,
                    it.objective, it.seconds);
    else
      std::snprintf(line, sizeof line, "sweep %5d  log joint % .10e  heldout % .6f  %8.3fs",
                    it.iteration, it.objective, it.heldout, it.seconds);
    print_progress(ctx, line);
  });
  if (!o.out.empty()) print_progress(ctx, "wrote chain " + o.out);
  if (!o.labels.empty()) print_progress(ctx, "wrote labels " + o.labels);
  nlohmann::ordered_json j;
  j["sampler"] = c.sampler;
  j["log_joint"] = r.log_joint;
  if (r.heldout) j["heldout"] = *r.heldout;
  j["sweeps"] = r.sweeps;
  j["draws"] = r.draws;
  j["seconds"] = r.seconds;
  j["n"] = r.n;
  j["ranks"] = ctx.comm->size();
  j["threads"] = max_threads();
  print_summary(ctx, j);
}

// gmm fit's choices kept as text until the action parses them, and the options whose presence
// the action checks.
struct FitChoices {
  std::string cov = "full", algorithm = "cavi", weights = "dirichlet", schedule = "robbins-monro",
              precision = "double";
  CLI::Option* reg_covar = nullptr;
  CLI::Option* tau0 = nullptr;
};

// The start of a fit: --seed, --init, --n-init, --init-params, --warm-start, --kmeans-iter.
void add_start_options(CLI::App* fit, gmm::FitOptions& o) {
  fit->add_option("--seed", o.seed, "Random seed")->capture_default_str();
  auto* init = fit->add_option("--init", o.init,
                               "kmeans++ | random | random-from-data (K random points, one "
                               "each) | FILE.h5:/resp (N x K) [default: kmeans++; random "
                               "with --stream]");
  fit->add_option("--n-init", o.n_init,
                  "Starts (each from its own random initialisation, keyed by --seed and the "
                  "start); the fit with the best final bound is kept")
      ->capture_default_str();
  fit->add_option("--init-params", o.init_params,
                  "Start from the responsibilities of a mixture in FILE.h5 (/weights, /means, "
                  "/covariances: given parameters, or a model file of gmm fit; --warm-start "
                  "continues a fit from its whole posterior instead)")
      ->excludes(init);
  fit->add_option("--warm-start", o.warm_start,
                  "Continue the fit in MODEL.h5 (a model file of gmm fit, cavi or em, of the "
                  "same K, D, covariance and weight prior) for --max-iter more iterations, from "
                  "its whole posterior (em: its parameters)");
  fit->add_option("--kmeans-iter", o.kmeans_iter, "Lloyd steps after k-means++ seeding")
      ->capture_default_str();
}

// The Normal-Wishart prior and the weight concentration (gmm fit and the Gibbs samplers).
void add_prior_options(CLI::App* fit, gmm::FitOptions& o) {
  fit->add_option("--alpha0,--concentration", o.alpha0,
                  "Weight concentration: Dirichlet alpha0, or the stick-breaking Beta(1, alpha0) "
                  "concentration (default 1/K)");
  fit->add_option("--beta0", o.beta0, "Mean precision scaling (default 1)");
  fit->add_option("--nu0", o.nu0, "Wishart degrees of freedom (default D)");
  fit->add_option("--prior-mean", o.prior_mean, "zero | data (m0 = data mean)")
      ->check(CLI::IsMember({"zero", "data"}))
      ->capture_default_str();
  fit->add_option("--prior-scale", o.prior_scale, "identity | data (W0^-1 = data covariance)")
      ->check(CLI::IsMember({"identity", "data"}))
      ->capture_default_str();
}

// SVI: minibatch, step-size schedule, full-ELBO diagnostics.
void add_svi_options(CLI::App* fit, gmm::FitOptions& o, FitChoices& c, Context& ctx) {
  fit->add_option("--batch-size", o.batch_size, "SVI minibatch size B")->capture_default_str();
  fit->add_option("--schedule", c.schedule,
                  "SVI step size: robbins-monro (rho_t = (tau0 + t)^-kappa) | adaptive "
                  "(Ranganath et al. 2013)")
      ->check(CLI::IsMember({"robbins-monro", "rm", "adaptive"}))
      ->capture_default_str();
  c.tau0 = fit->add_option("--tau0", o.tau0,
                           "SVI robbins-monro: step size delay, rho_t = (tau0 + t)^-kappa at "
                           "the t-th minibatch (t >= 1), as in lda fit and hmm fit")
               ->capture_default_str();
  fit->add_option("--kappa", o.kappa, "SVI robbins-monro: step size decay, in [0, 1]")
      ->capture_default_str();
  fit->add_option("--adaptive-memory", o.adaptive_memory,
                  "SVI adaptive: the initial memory tau_1 >= 1 of the moving averages")
      ->capture_default_str();
  engine::add_renamed_option(fit, "--omega", "--tau0", o.tau0, ctx);
  engine::add_renamed_option(fit, "--delta", "--kappa", o.kappa, ctx);
  fit->add_option("--full-elbo-every", o.full_elbo_every,
                  "SVI: also compute the full ELBO every S steps (not timed)");
}

// The data path, the arithmetic, and the outputs.
void add_io_options(CLI::App* fit, gmm::FitOptions& o, FitChoices& c) {
  fit->add_flag("--stream", o.stream,
                "Read rows from the file per minibatch / chunk; never hold the whole dataset");
  fit->add_option("--chunk-rows", o.chunk_rows, "Rows per chunk of a streamed full pass");
  fit->add_flag("--fast-reduce", o.fast_reduce,
                "Sum statistics in plain double instead of exactly: faster, but results then "
                "change in their last bits with the number of ranks and threads "
                "(docs/reproducibility.md)");
  fit->add_option("--heldout", o.heldout,
                  "Held-out FILE.h5[:/path]: report its average log predictive density");
  fit->add_option("--out", o.out, "Model file to write (HDF5)");
  fit->add_option("--labels", o.labels, "Per-row labels file to write (HDF5, /labels)");
  fit->add_flag("--save-responsibilities", o.save_responsibilities,
                "Also write /responsibilities (N x K) to the labels file");
  fit->add_option("--precision", c.precision,
                  "double | single: float32 products in the full-covariance E-step, double "
                  "sums (faster at large D; results change by the float rounding)")
      ->check(CLI::IsMember({"double", "single"}))
      ->capture_default_str();
}

nlohmann::ordered_json fit_summary(const Context& ctx, const gmm::FitResult& r,
                                   const std::string& algorithm) {
  const auto alg = gmm::parse_algorithm(algorithm);
  nlohmann::ordered_json j;
  if (alg == gmm::Algorithm::kEm) {
    j["log_likelihood"] = r.elbo;
    j["lower_bound"] = r.elbo / static_cast<double>(r.n);  // sklearn's lower_bound_
  } else {
    j["elbo"] = r.elbo;
  }
  j["algorithm"] = algorithm;
  j["iterations"] = r.iterations;
  if (alg == gmm::Algorithm::kSvi) j["steps"] = r.steps;
  j["stop_reason"] = r.stop_reason;
  if (r.heldout) j["heldout"] = *r.heldout;
  j["converged"] = r.converged;
  if (!r.start_bounds.empty()) {
    j["n_init_bounds"] = r.start_bounds;
    j["best_start"] = r.best_start;
  }
  j["seconds"] = r.seconds;
  j["loop_seconds"] = r.loop_seconds;
  j["allreduce_seconds"] = {r.allreduce_seconds_min, r.allreduce_seconds_max};  // min, max
  j["n"] = r.n;
  j["ranks"] = ctx.comm->size();
  j["threads"] = max_threads();
  return j;
}

void run_fit(Context& ctx, gmm::FitOptions& o, const FitChoices& c) {
  // The variational fits regularise through the Wishart prior; an ignored --reg-covar would
  // leave a user believing their covariances were regularised.
  if (c.reg_covar->count() > 0 && c.algorithm != "em")
    throw Error(
        "--reg-covar applies to --algorithm em only (cavi and svi regularise the "
        "covariances through the prior: --nu0, --prior-scale)");
  o.covariance = gmm::parse_covariance(c.cov);
  o.precision = gmm::parse_precision(c.precision);
  o.algorithm = gmm::parse_algorithm(c.algorithm);
  o.weights = gmm::parse_weight_prior(c.weights);
  o.schedule = gmm::parse_schedule(c.schedule);
  // --tau0 was the adaptive schedule's memory before it became the Robbins-Monro delay of
  // every model: refused there rather than silently ignored.
  if (c.tau0->count() > 0 && o.schedule == gmm::Schedule::kAdaptive)
    throw Error(
        "--tau0 is the robbins-monro step size delay; the adaptive schedule's initial "
        "memory is --adaptive-memory");
  o.command = ctx.command_line;
  o.version = CAVIAR_VERSION;
  print_progress(ctx, "caviar gmm fit: " + o.data + ", K=" + std::to_string(o.components) + ", " +
                          c.algorithm + ", " + c.cov + " covariance, " + c.weights + " weights, " +
                          std::to_string(ctx.comm->size()) + " ranks x " +
                          std::to_string(max_threads()) + " threads");
  const auto alg = o.algorithm;
  const auto r = gmm::fit(*ctx.comm, o, [&ctx, alg](const gmm::IterationReport& it) {
    char line[200];
    if (alg == gmm::Algorithm::kSvi)
      std::snprintf(line, sizeof line,
                    "epoch %4d  avg stochastic elbo % .10e  rel %9.3e  steps %lld  rho %.3e  "
                    "%8.3fs",
                    it.iteration, it.elbo, it.rel_change, static_cast<long long>(it.steps), it.rho,
                    it.seconds);
    else
      std::snprintf(line, sizeof line, "iter %4d  %s % .10e  rel %9.3e  %8.3fs", it.iteration,
                    alg == gmm::Algorithm::kEm ? "loglik" : "elbo", it.elbo, it.rel_change,
                    it.seconds);
    print_progress(ctx, line);
  });
  if (!o.out.empty()) print_progress(ctx, "wrote model " + o.out);
  if (!o.labels.empty()) print_progress(ctx, "wrote labels " + o.labels);
  print_summary(ctx, fit_summary(ctx, r, c.algorithm));
}

void add_fit_command(CLI::App* gmm, Context& ctx) {
  auto o = std::make_shared<gmm::FitOptions>();
  auto c = std::make_shared<FitChoices>();
  auto* fit = gmm->add_subcommand("fit", "Fit a mixture by CAVI, SVI or EM");
  fit->add_option("--data", o->data, "Input FILE.h5[:/path] (default path /X), N x D")->required();
  fit->add_option("-k,--components", o->components, "Number of components K")->required();
  fit->add_option("--algorithm", c->algorithm,
                  "cavi (coordinate ascent) | svi (stochastic, natural gradients) | em (maximum "
                  "likelihood)")
      ->check(CLI::IsMember({"cavi", "svi", "em"}))
      ->capture_default_str();
  fit->add_option("--weights", c->weights,
                  "Weight prior: dirichlet | stick-breaking (truncated Dirichlet process)")
      ->check(CLI::IsMember({"dirichlet", "stick-breaking"}))
      ->capture_default_str();
  fit->add_option("--covariance", c->cov,
                  "full | diag | tied (one covariance shared by the components) | spherical "
                  "(one variance per component)")
      ->check(CLI::IsMember({"full", "diag", "tied", "spherical"}))
      ->capture_default_str();
  fit->add_option("--max-iter", o->max_iter, "Maximum iterations (CAVI, EM) or epochs (SVI)")
      ->capture_default_str();
  fit->add_option("--tol", o->tol,
                  "Stop when the relative change of the ELBO (SVI: epoch-average stochastic "
                  "ELBO; EM: log-likelihood) is below this (0: never)")
      ->capture_default_str();
  add_start_options(fit, *o);
  add_prior_options(fit, *o);
  c->reg_covar =
      fit->add_option("--reg-covar", o->reg_covar, "EM: added to every covariance diagonal")
          ->capture_default_str();
  add_svi_options(fit, *o, *c, ctx);
  add_io_options(fit, *o, *c);
  engine::add_checkpoint_options(fit, o->checkpoint, o->checkpoint_every, o->resume,
                                 "CAVI/EM iterations, SVI epochs");
  fit->callback([&ctx, o, c] {
    ctx.stop_signals = true;  // checkpoints on SIGTERM/SIGUSR1
    ctx.action = [&ctx, o, c] { run_fit(ctx, *o, *c); };
  });
}

void add_score_command(CLI::App* gmm, Context& ctx) {
  auto model = std::make_shared<std::string>();
  auto data = std::make_shared<std::string>();
  auto* score = gmm->add_subcommand("score", "Average held-out log predictive density");
  score->add_option("--model", *model, "Model file written by gmm fit")->required();
  score->add_option("--data", *data, "Data FILE.h5[:/path]")->required();
  score->callback([&ctx, model, data] {
    ctx.action = [&ctx, model, data] {
      const auto r = gmm::score(*ctx.comm, *model, *data);
      nlohmann::ordered_json j;
      j["score"] = r.score;
      j["n"] = r.n;
      print_summary(ctx, j);
    };
  });
}

void add_predict_command(CLI::App* gmm, Context& ctx) {
  auto model = std::make_shared<std::string>();
  auto data = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  auto save_resp = std::make_shared<bool>(false);
  auto* predict = gmm->add_subcommand("predict", "Write the most probable component of each row");
  predict->add_option("--model", *model, "Model file written by gmm fit")->required();
  predict->add_option("--data", *data, "Data FILE.h5[:/path]")->required();
  predict->add_option("--out", *out, "Labels file to write (HDF5, /labels)")->required();
  predict->add_flag("--save-responsibilities", *save_resp, "Also write /responsibilities");
  predict->callback([&ctx, model, data, out, save_resp] {
    ctx.action = [&ctx, model, data, out, save_resp] {
      const auto n = gmm::predict(*ctx.comm, *model, *data, *out, *save_resp);
      nlohmann::ordered_json j;
      j["n"] = n;
      j["out"] = *out;
      print_summary(ctx, j);
    };
  });
}

// An option of the gmm sample mode not chosen, given anyway ("" if none): named, not silently
// ignored. Drawing rows from a model takes only --model, --n, --seed and --out; a chain takes all
// but --model, --n.
std::string stray_option(const CLI::App* sample, bool with_data) {
  for (const auto* opt : sample->get_options()) {
    const std::string& name = opt->get_name();
    const bool rows_only = name == "--model" || name == "--n";
    const bool both = name == "--seed" || name == "--out" || name == "--help";
    if (opt->count() > 0 && !both && rows_only != !with_data) return name;
  }
  return "";
}

// gmm sample: rows from a fitted model (--model), or a Gibbs chain on data (--data).
// The options of a Gibbs chain on --data (gmm sample --data).
void add_chain_options(CLI::App* sample, gmm::ChainOptions& chain, std::string& chain_cov,
                       std::string& chain_init) {
  sample->add_option("--data", chain.fit.data,
                     "Run a Gibbs chain on FILE.h5[:/path] (default path /X), N x D");
  sample->add_option("-k,--components", chain.fit.components, "--data: number of components K");
  sample
      ->add_option("--sampler", chain.sampler,
                   "--data: blocked (labels | parameters, then parameters | labels; exact at "
                   "any rank count) | collapsed (parameters integrated out; labels swept in "
                   "fixed blocks of --block-rows rows, the same bits at any rank count)")
      ->capture_default_str();
  sample->add_option("--covariance", chain_cov, "--data: full | diag")
      ->check(CLI::IsMember({"full", "diag"}))
      ->capture_default_str();
  sample->add_option("--block-rows", chain.block_rows,
                     "--sampler collapsed: rows per block swept against the statistics at the "
                     "start of the sweep plus the block's own moves (default 256; >= N is the "
                     "exact sequential sampler)");
  sample->add_option("--sweeps", chain.sweeps, "--data: sweeps of the chain")
      ->capture_default_str();
  sample->add_option("--burn-in", chain.burn_in, "--data: sweeps before the first recorded draw")
      ->capture_default_str();
  sample->add_option("--thin", chain.thin, "--data: record every thin-th sweep after burn-in")
      ->capture_default_str();
  sample
      ->add_option("--init", chain_init,
                   "--data: the start: kmeans++ | random | random-from-data | MODEL.h5 (a "
                   "model file of gmm fit) | FILE.h5:/resp (N x K)")
      ->capture_default_str();
  sample->add_option("--kmeans-iter", chain.fit.kmeans_iter, "Lloyd steps after k-means++ seeding")
      ->capture_default_str();
  add_prior_options(sample, chain.fit);
  sample->add_option("--heldout", chain.fit.heldout,
                     "--data: held-out FILE.h5[:/path]: its average log predictive density "
                     "under each sweep's parameters (trace/heldout)");
  sample->add_option("--labels", chain.fit.labels,
                     "--data: write the last sweep's labels (HDF5, /labels)");
}

void add_sample_command(CLI::App* gmm, Context& ctx) {
  auto model = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  auto n_rows = std::make_shared<std::int64_t>(0);
  auto seed = std::make_shared<std::uint64_t>(0);
  auto chain = std::make_shared<gmm::ChainOptions>();
  auto chain_cov = std::make_shared<std::string>("full");
  auto chain_init = std::make_shared<std::string>("kmeans++");
  auto* sample = gmm->add_subcommand(
      "sample",
      "Draw rows from a fitted mixture (--model: /X and /labels), or run a Gibbs sampler of the "
      "Bayesian mixture on data (--data: chain file of traces and draws)");
  sample->add_option("--model", *model, "Model file written by gmm fit (draw rows from it)");
  sample->add_option("--n", *n_rows, "With --model: rows to draw");
  sample->add_option("--seed", *seed, "Random seed (no result depends on the rank count)");
  sample
      ->add_option("--out", *out,
                   "File to write (HDF5). --model: /X, /labels; --data: the chain (trace/, "
                   "draws/)")
      ->required();
  add_chain_options(sample, *chain, *chain_cov, *chain_init);
  auto files = std::make_shared<engine::CheckpointFiles>();
  engine::add_checkpoint_options(sample, *files);
  sample->callback([&ctx, sample, model, n_rows, seed, out, chain, chain_cov, chain_init, files] {
    const bool with_data = !chain->fit.data.empty();
    if (with_data) ctx.stop_signals = true;  // checkpoints on SIGTERM/SIGUSR1
    const std::string stray = stray_option(sample, with_data);
    ctx.action = [&ctx, model, n_rows, seed, out, chain, chain_cov, chain_init, files, with_data,
                  stray] {
      if (with_data == !model->empty())
        throw Error(
            "gmm sample needs exactly one of --data (run a Gibbs chain) and --model (draw rows "
            "from a fitted model)");
      if (!stray.empty())
        throw Error(stray + (with_data ? " is for drawing rows from a --model, not for a chain"
                                       : " is for a Gibbs chain on --data, not for --model"));
      if (!with_data) {
        gmm::sample(*ctx.comm, *model, *n_rows, *seed, *out);
        nlohmann::ordered_json j;
        j["n"] = *n_rows;
        j["out"] = *out;
        print_summary(ctx, j);
        return;
      }
      run_chain(ctx, *chain, *chain_cov, *chain_init, *seed, *out, *files);
    };
  });
}

void add_summarize_command(CLI::App* gmm, Context& ctx) {
  auto o = std::make_shared<gmm::SummarizeOptions>();
  auto* cmd = gmm->add_subcommand(
      "summarize",
      "Relabel the draws of a Gibbs chain against a reference fit (Hungarian matching on the "
      "means) and write their posterior means and standard deviations");
  cmd->add_option("--chain", o->chain, "Chain file written by gmm sample --data --out")->required();
  cmd->add_option("--reference", o->reference, "Model file written by gmm fit (e.g. CAVI)")
      ->required();
  cmd->add_option("--out", o->out,
                  "Summary to write (HDF5): weights/, means/, covariances/ (mean, sd), "
                  "reference/, matching")
      ->required();
  cmd->add_option("--plot", o->plot,
                  "PNG to write: the log joint and component counts per sweep, and in 2-D the "
                  "sampled covariance ellipses over the reference's");
  cmd->footer(
      "A collapsed chain's draws are its statistics; each is summarised by the posterior means "
      "of the weights and means given its labels, and it has no covariances.");
  cmd->callback([&ctx, o] {
    ctx.action = [&ctx, o] {
      o->command = ctx.command_line;
      o->version = CAVIAR_VERSION;
      const auto r = gmm::summarize(*ctx.comm, *o);
      if (!ctx.comm->is_root()) return;
      print_progress(ctx, gmm::format_summary_table(r) + "wrote summary " + o->out);
      if (!o->plot.empty()) print_progress(ctx, "wrote " + o->plot);
      const auto& s = r.summary;
      nlohmann::ordered_json j;
      j["sampler"] = r.sampler;
      j["n_draws"] = s.relabelled.n;
      j["k"] = r.reference.k;
      j["d"] = r.reference.d;
      j["max_abs_diff_weight"] = s.max_diff_weight;
      j["max_abs_diff_mean"] = s.max_diff_mean;
      j["max_abs_diff_covariance"] = s.covariances.mean.empty()
                                         ? nlohmann::ordered_json()
                                         : nlohmann::ordered_json(s.max_diff_covariance);
      j["out"] = o->out;
      if (!o->plot.empty()) j["plot"] = o->plot;
      print_summary(ctx, j);
    };
  });
}

}  // namespace

void add_gmm_commands(CLI::App& cli, Context& ctx) {
  auto* gmm = cli.add_subcommand("gmm", "Gaussian mixture: variational Bayes (CAVI, SVI) or EM");
  gmm->require_subcommand(1);
  engine::add_compare_command(gmm, ctx, "gmm");
  add_fit_command(gmm, ctx);
  add_score_command(gmm, ctx);
  add_predict_command(gmm, ctx);
  add_sample_command(gmm, ctx);
  add_summarize_command(gmm, ctx);
}

}  // namespace caviar::app
