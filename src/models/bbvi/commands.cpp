// caviar bbvi fit: the GLM posterior (fit.hpp) on the draws driver, rows sharded over ranks.
#include "models/bbvi/commands.hpp"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/parallel.hpp"
#include "engine/draws.hpp"
#include "engine/model_file.hpp"
#include "inference/checkpoint.hpp"
#include "inference/shard.hpp"
#include "io/h5.hpp"
#include "models/bbvi/fit.hpp"
#include "models/bbvi/predict.hpp"
#include "models/bbvi/psis.hpp"

namespace caviar::bbvi {

namespace {

struct FitOptions {
  std::string model = "logistic", data, response, family = "meanfield", estimator = "reparam";
  std::string optimizer = "adam", lr = "0.01", out;
  FitConfig cfg;
  engine::StopRule stop{20000, 0.01};
  std::int64_t batch_size = 1024;
  int elbo_every = 100;
  std::int64_t elbo_rows = 20000;
  int adapt_iter = 50;             // steps of each trial of --lr auto
  std::int64_t average_from = -1;  // --average-from (-1: the last iterate)
  engine::CheckpointFiles files;
};

// --lr auto, after Stan's step-size adaptation (Kucukelbir et al. 2017, section 3.3): a short
// trial of adapt_iter steps from the same start for each rate, largest first, and the rate whose
// ELBO estimate at the trial's end is highest. A trial whose draws or ELBO turn non-finite (the
// driver's agreed error) counts as diverged. Every rank computes the same trials, so the choice is
// the same everywhere and at any rank count.
double adapt_lr(const engine::Context& ctx, const FitOptions& o, const engine::DrawRun& base,
                std::span<const double> x, std::span<const double> y) {
  const double rates[] = {0.1, 0.03, 0.01, 0.003, 0.001};
  double best = 0, best_elbo = -std::numeric_limits<double>::infinity();
  for (double lr : rates) {
    Posterior trial(o.cfg, x, y);
    engine::Checkpointer none(*base.comm, {}, {}, "");  // a trial is never checkpointed
    engine::DrawRun run = base;
    run.checkpoint = &none;
    run.stop = {o.adapt_iter, 0.0};
    run.schedule.elbo_every = o.adapt_iter;
    run.schedule.optimizer.adam.lr = lr;
    run.progress = {};
    run.diverging = {};
    double elbo = -std::numeric_limits<double>::infinity();
    try {
      elbo = engine::fit_draws(trial, run).trace.objective.back();
    } catch (const Error&) {
    }
    char line[120];
    std::snprintf(line, sizeof line, "--lr auto: %g for %d steps: elbo % .6e", lr, o.adapt_iter,
                  elbo);
    print_progress(ctx, line);
    if (elbo > best_elbo) {
      best_elbo = elbo;
      best = lr;
    }
  }
  if (best == 0)
    throw Error(
        "--lr auto: every trial rate diverged (0.1 to 0.001); check the data or give a "
        "smaller --lr");
  return best;
}

// Collective: this rank's responses, the rows of `shard`, checked by the likelihood.
std::vector<double> load_responses(const Comm& comm, const io::DataRef& ref, const Shard& x,
                                   const Glm& glm) {
  const io::MatrixShape shape = io::inspect_matrix(comm, ref, true);
  if (shape.rows != x.shape.rows || shape.cols != 1)
    throw Error(ref.str() + " has " + std::to_string(shape.rows) + " x " +
                std::to_string(shape.cols) + " values; need one response per row of " +
                x.ref.str() + " (" + std::to_string(x.shape.rows) + ")");
  const io::RowMatrix y = io::read_rows(comm, ref, shape, x.range);
  std::vector<double> v(y.data(), y.data() + y.size());
  std::string err;
  try {
    glm.check_responses(v, x.range.begin);
  } catch (const Error& e) {
    err = ref.str() + ": " + e.what();
  }
  comm.raise_if_any(err);  // the lowest failing rank holds the lowest bad row
  return v;
}

void check_options(FitOptions& o) {
  o.cfg.glm.likelihood = parse_likelihood(o.model);
  o.cfg.family = parse_family(o.family);
  o.cfg.estimator = parse_estimator(o.estimator);
  if (o.adapt_iter < 1) throw Error("--adapt-iter must be >= 1");
  if (o.lr != "auto") try {
      std::size_t used = 0;
      const double lr = std::stod(o.lr, &used);
      if (used != o.lr.size() || !(lr > 0) || !std::isfinite(lr)) throw std::invalid_argument("");
    } catch (const std::exception&) {
      throw Error("--lr must be a positive number, got '" + o.lr + "'");
    }
  if (!(o.cfg.glm.prior_scale > 0) || !std::isfinite(o.cfg.glm.prior_scale))
    throw Error("--prior-scale must be positive and finite");
  if (!(o.cfg.glm.noise_sd > 0) || !std::isfinite(o.cfg.glm.noise_sd))
    throw Error("--noise-sd must be positive and finite");
  if (o.cfg.glm.likelihood == Likelihood::kSoftmax && o.cfg.glm.classes < 2)
    throw Error("--classes must be >= 2 for --model softmax");
  if (o.cfg.family != FamilyKind::kLowRank && o.cfg.rank != 0)
    throw Error("--rank applies to --family lowrank only");
  if (o.cfg.family == FamilyKind::kLowRank && o.cfg.rank < 1)
    throw Error("--family lowrank needs --rank >= 1");
  if (o.cfg.samples < 1) throw Error("--samples must be >= 1");
  if (o.cfg.elbo_samples < 1) throw Error("--elbo-samples must be >= 1");
  if (o.cfg.diagnostic_samples < 0) throw Error("--diagnostic-samples must be >= 0");
  if (o.batch_size < 1) throw Error("--batch-size must be >= 1");
  if (o.elbo_every < 1) throw Error("--elbo-every must be >= 1");
  if (o.elbo_rows < 1) throw Error("--elbo-rows must be >= 1");
  if (o.stop.max_iter < 1) throw Error("--max-iter must be >= 1");
  if (o.average_from < -1) throw Error("--average-from must be >= 0");
  if (o.average_from >= o.stop.max_iter)
    throw Error("--average-from must be below --max-iter (" + std::to_string(o.stop.max_iter) +
                ")");
}

// The posterior summary of q: /mean, /sd, and /covariance (fullrank) or /factor and /diag
// (lowrank); /elbo_trace; the attributes of the fit.
void save_posterior(engine::StateWriter& w, const Posterior& m, const FitOptions& o,
                    const engine::DrawResult& res, double k_hat, std::int64_t n) {
  const Family& q = m.family();
  const std::span<const double> lambda{m.params().data(), m.params().size()};
  const auto p = static_cast<std::uint64_t>(q.dim());
  const Eigen::VectorXd mean = q.mean(lambda), sd = q.marginal_sd(lambda);
  w.array("mean", {mean.data(), std::size_t(p)}, {p});
  w.array("sd", {sd.data(), std::size_t(p)}, {p});
  if (q.kind() == FamilyKind::kFullRank) {
    const Eigen::MatrixXd c = q.covariance(lambda);  // symmetric: storage order does not matter
    w.array("covariance", {c.data(), std::size_t(c.size())}, {p, p});
  } else if (q.kind() == FamilyKind::kLowRank) {
    // lambda = (mu, B row-major P x r, log c)
    const auto r = static_cast<std::uint64_t>(q.rank());
    w.array("factor", lambda.subspan(p, p * r), {p, r});
    std::vector<double> c(p);
    for (std::uint64_t j = 0; j < p; ++j) c[j] = std::exp(2 * lambda[p + p * r + j]);
    w.array("diag", c, {p});
  }
  w.array("elbo_trace", res.trace.objective, {res.trace.objective.size()});
  // What bbvi predict needs to draw from q again: lambda and the model's shape.
  w.array("lambda", lambda, {lambda.size()});
  w.attr("features", static_cast<std::int64_t>(o.cfg.glm.features));
  w.attr("classes", static_cast<std::int64_t>(o.cfg.glm.classes));
  w.attr("noise_sd", o.cfg.glm.noise_sd);
  w.attr("rank", static_cast<std::int64_t>(q.rank()));
  w.attr("k_hat", k_hat);
  w.attr("steps", res.steps);
  w.attr("averaged_iterates", res.averaged);
  w.attr("dropped_draws", res.dropped);
  w.attr("family", o.family);
  w.attr("estimator", o.estimator);
  w.attr("elbo_rows", std::min(o.elbo_rows, n));
  w.attr("likelihood", o.model);
  w.attr("lr", std::stod(o.lr));  // the one chosen, with --lr auto
  w.attr("prior_scale", o.cfg.glm.prior_scale);
}

// What a resume must share with the run that wrote the checkpoint: the data, and every option
// that changes the sequence of draws, minibatches and updates.
ckpt::Fingerprint fingerprint(const Comm& comm, const FitOptions& o, const io::DataRef& xref,
                              const Shard& x) {
  ckpt::Fingerprint fp("bbvi");
  ckpt::add_data(fp, comm, "--data", xref, x.shape);
  const io::DataRef yref = io::DataRef::parse(o.response, "/y");
  ckpt::add_data(fp, comm, "--response", yref, io::inspect_matrix(comm, yref, true));
  fp.add("model", o.model, "--model");
  fp.add("classes", static_cast<std::int64_t>(o.cfg.glm.classes), "--classes");
  fp.add("noise_sd", o.cfg.glm.noise_sd, "--noise-sd");
  fp.add("prior_scale", o.cfg.glm.prior_scale, "--prior-scale");
  fp.add("family", o.family, "--family");
  fp.add("rank", static_cast<std::int64_t>(o.cfg.rank), "--rank");
  fp.add("estimator", o.estimator, "--estimator");
  fp.add("samples", static_cast<std::int64_t>(o.cfg.samples), "--samples");
  fp.add("batch_size", o.batch_size, "--batch-size");
  fp.add("optimizer", o.optimizer, "--optimizer");
  fp.add("lr", o.lr, "--lr");
  fp.add("elbo_every", static_cast<std::int64_t>(o.elbo_every), "--elbo-every");
  fp.add("elbo_samples", static_cast<std::int64_t>(o.cfg.elbo_samples), "--elbo-samples");
  fp.add("elbo_rows", o.elbo_rows, "--elbo-rows");
  fp.add("average_from", o.average_from, "--average-from");
  fp.add("seed", static_cast<std::int64_t>(o.cfg.seed), "--seed");
  return fp;
}

void run_fit(engine::Context& ctx, FitOptions o) {
  const Comm& comm = *ctx.comm;
  check_options(o);
  const io::DataRef xref = io::DataRef::parse(o.data), yref = io::DataRef::parse(o.response, "/y");
  io::check_output_path(comm, o.out, {xref.file, yref.file});
  engine::Checkpointer ck(comm, o.files, {xref.file, yref.file}, o.out);
  const Shard x = load_shard(comm, xref);
  o.cfg.glm.features = static_cast<int>(x.shape.cols);
  const std::vector<double> y = load_responses(comm, yref, x, o.cfg.glm);
  const std::int64_t dim = o.cfg.glm.n_params();
  if (o.cfg.family == FamilyKind::kLowRank && o.cfg.rank >= dim)
    throw Error("--rank must be below the number of parameters (" + std::to_string(dim) + ")");
  Posterior model(o.cfg, {x.x.data(), std::size_t(x.x.size())}, y);
  print_progress(ctx, "caviar bbvi fit: " + o.data + ", " + o.model + ", " + o.family + ", " +
                          o.estimator + ", " + std::to_string(comm.size()) + " ranks x " +
                          std::to_string(max_threads()) + " threads");
  if (!o.files.checkpoint.empty() || !o.files.resume.empty())
    ck.open(fingerprint(comm, o, xref, x));
  engine::DrawRun run;
  run.comm = &comm;
  run.checkpoint = &ck;
  run.stop = o.stop;
  run.rows = x.range;
  run.global_rows = x.shape.rows;
  run.progress = [&](const engine::Report& r) {
    char line[160];
    std::snprintf(line, sizeof line, "step %6d  elbo % .10e  %8.3fs", r.iteration, r.objective,
                  r.seconds);
    print_progress(ctx, line);
  };
  run.diverging = [&](std::int64_t step) {
    engine::note(ctx, "the ELBO may be diverging at step " + std::to_string(step) +
                          " (its relative changes average above 0.5); inspect elbo_trace, or "
                          "give a smaller --lr");
  };
  run.schedule.batch_size = o.batch_size;
  run.schedule.seed = o.cfg.seed;
  run.schedule.elbo_every = o.elbo_every;
  run.schedule.elbo_rows = o.elbo_rows;
  run.schedule.optimizer.method =
      o.optimizer == "adam" ? engine::Method::kAdam : engine::Method::kRobbinsMonro;
  if (o.lr == "auto") {
    const double lr = adapt_lr(ctx, o, run, {x.x.data(), std::size_t(x.x.size())}, y);
    print_progress(ctx, "--lr auto: chose " + std::to_string(lr));
    o.lr = std::to_string(lr);
  }
  run.schedule.optimizer.adam.lr = std::stod(o.lr);
  run.schedule.average_from = o.average_from;  // after --lr auto: its trials keep the last iterate
  engine::DrawResult res = engine::fit_draws(model, run);
  double k_hat = std::nan("");
  if (o.cfg.diagnostic_samples > 0) {
    const auto d = engine::full_pass(comm, model, run, engine::DrawKind::kDiagnostic, 0);
    res.dropped += d.dropped;
    k_hat = pareto_k_hat(model.log_ratios(d.sums, d.kept));
    // Its usual reading (Yao, Vehtari, Simpson & Gelman 2018, section 3.3): above 0.7 the
    // importance ratios of p to q have too heavy a tail for q's moments to be trusted.
    if (k_hat > 0.7) {
      char line[200];
      std::snprintf(line, sizeof line,
                    "Pareto k-hat %.2f > 0.7: q is a poor fit to this posterior; its means and "
                    "sds may be far off (try --family fullrank, more --max-iter, a smaller --lr)",
                    k_hat);
      engine::note(ctx, line);
    }
  }
  engine::Provenance p{"bbvi",         o.estimator, o.data, ctx.command_line,
                       CAVIAR_VERSION, o.cfg.seed,  "elbo"};
  engine::write_model_file(
      comm, o.out,
      [&](engine::StateWriter& w) { save_posterior(w, model, o, res, k_hat, x.shape.rows); }, res,
      p);
  auto j = engine::summary(ctx, res);
  j["steps"] = res.steps;
  j["dropped_draws"] = res.dropped;
  j["averaged_iterates"] = res.averaged;
  j["k_hat"] = std::isfinite(k_hat) ? nlohmann::ordered_json(k_hat) : nlohmann::ordered_json();
  j["out"] = o.out;
  print_summary(ctx, j);
}

struct PredictOptions {
  std::string model, data, response, out;
  int samples = 1000;
  std::uint64_t seed = 0;
};

// A fitted posterior read back (every rank reads the small file).
struct Fitted {
  Glm glm;
  FamilyKind family = FamilyKind::kMeanField;
  int rank = 0;
  std::vector<double> lambda;
};

Fitted read_fitted(const Comm& comm, const std::string& file) {
  Fitted f;
  comm.agree([&] {
    io::FileReader r(file);
    if (!r.has_attr("model") || r.read_string_attr("model") != "bbvi" || !r.has("lambda"))
      throw Error("'" + file + "' is not a posterior written by caviar bbvi fit");
    const std::string bad = "'" + file + "': ";
    f.glm.likelihood = parse_likelihood(r.read_string_attr("likelihood"));
    f.glm.features = static_cast<int>(ckpt::read_int(r, "features", 1, INT_MAX, bad));
    f.glm.classes = static_cast<int>(ckpt::read_int(r, "classes", 2, INT_MAX, bad));
    f.glm.noise_sd = r.read_double_attr("noise_sd");
    f.family = parse_family(r.read_string_attr("family"));
    f.rank = static_cast<int>(ckpt::read_int(r, "rank", 0, INT_MAX, bad));
    f.lambda = r.read("lambda");
    const Family q(f.family, static_cast<int>(f.glm.n_params()), f.rank);
    if (static_cast<std::int64_t>(f.lambda.size()) != q.n_params())
      throw Error(bad + "lambda has the wrong size for its family");
    for (double v : f.lambda)
      if (!std::isfinite(v)) throw Error(bad + "lambda holds a value that is not finite");
  });
  return f;
}

// The draws of bbvi predict: step 2^32 - 1 of the ELBO stream, which no fit reaches.
RowMatrix predictive_draws(const Fitted& f, int samples, std::uint64_t seed) {
  const Family q(f.family, static_cast<int>(f.glm.n_params()), f.rank);
  const RowMatrix eps = draw_noise(seed, 0xFFFFFFFFu, samples, q.n_noise(), Stream::kBbviElbo);
  RowMatrix theta(samples, f.glm.n_params());
  q.draw(f.lambda, {eps.data(), std::size_t(eps.size())},
         {theta.data(), std::size_t(theta.size())});
  return theta;
}

void run_predict(engine::Context& ctx, const PredictOptions& o) {
  const Comm& comm = *ctx.comm;
  if (o.samples < 1) throw Error("--samples must be >= 1 (got " + std::to_string(o.samples) + ")");
  const io::DataRef xref = io::DataRef::parse(o.data);
  std::vector<std::string> inputs{o.model, xref.file};
  if (!o.response.empty()) inputs.push_back(io::DataRef::parse(o.response, "/y").file);
  io::check_output_path(comm, o.out, inputs);
  const Fitted f = read_fitted(comm, o.model);
  const Shard x = load_shard(comm, xref);
  if (x.shape.cols != f.glm.features)
    throw Error(xref.str() + " has " + std::to_string(x.shape.cols) + " columns; the posterior " +
                "was fitted to " + std::to_string(f.glm.features));
  std::vector<double> y;
  if (!o.response.empty()) y = load_responses(comm, io::DataRef::parse(o.response, "/y"), x, f.glm);
  const RowMatrix theta = predictive_draws(f, o.samples, o.seed);
  const std::int64_t n = x.range.size(), d = f.glm.features, c = f.glm.outputs();
  // Decided from the options, never from this rank's (possibly empty) share of the rows: every
  // rank must make the same collective calls.
  const bool with_sd =
      f.glm.likelihood == Likelihood::kLinear || f.glm.likelihood == Likelihood::kPoisson;
  const bool with_y = !o.response.empty();
  std::vector<double> mean(static_cast<std::size_t>(n * c)), sd, logd;
  if (with_sd) sd.resize(static_cast<std::size_t>(n));
  if (with_y) logd.resize(static_cast<std::size_t>(n));
  parallel_blocks(n, kBlockRows, max_threads(), [&](int, std::int64_t b, std::int64_t e) {
    const Prediction p =
        predict(f.glm, theta, {x.x.data() + b * d, std::size_t((e - b) * d)},
                with_y ? std::span<const double>(y).subspan(b, e - b) : std::span<const double>{});
    std::copy(p.mean.data(), p.mean.data() + p.mean.size(), mean.begin() + b * c);
    if (with_sd) std::copy(p.sd.begin(), p.sd.end(), sd.begin() + b);
    if (with_y) std::copy(p.log_density.begin(), p.log_density.end(), logd.begin() + b);
  });
  io::ParallelRowWriter w(comm, o.out);
  w.write_rows("mean", x.shape.rows, x.range, mean.data(),
               c == 1 ? io::Dims{} : io::Dims{static_cast<std::uint64_t>(c)});
  if (with_sd) w.write_rows("sd", x.shape.rows, x.range, sd.data(), {});
  if (with_y) w.write_rows("log_density", x.shape.rows, x.range, logd.data(), {});
  w.commit();
  nlohmann::ordered_json j;
  j["n"] = x.shape.rows;
  j["samples"] = o.samples;
  if (with_y) {
    // The mean log predictive density, summed exactly (the same at any rank count), and for
    // classifiers the accuracy of the most probable class.
    j["log_predictive_density"] = engine::exact_sum(comm, logd) / static_cast<double>(x.shape.rows);
    if (f.glm.likelihood == Likelihood::kLogistic || f.glm.likelihood == Likelihood::kSoftmax) {
      std::vector<double> correct(static_cast<std::size_t>(n));
      for (std::int64_t i = 0; i < n; ++i) {
        const double* row = mean.data() + i * c;
        const std::int64_t label =
            c == 1 ? (row[0] > 0.5 ? 1 : 0) : std::max_element(row, row + c) - row;
        correct[static_cast<std::size_t>(i)] = label == static_cast<std::int64_t>(y[i]) ? 1 : 0;
      }
      j["accuracy"] = engine::exact_sum(comm, correct) / static_cast<double>(x.shape.rows);
    }
  }
  j["out"] = o.out;
  print_summary(ctx, j);
}

}  // namespace

void add_commands(CLI::App& cli, engine::Context& ctx) {
  auto* b = cli.add_subcommand("bbvi", "Black-box variational inference of Bayesian GLMs");
  b->require_subcommand(1);
  auto o = std::make_shared<FitOptions>();
  auto* f = b->add_subcommand("fit", "Fit a Gaussian q to a GLM posterior (rows sharded)");
  f->add_option("--model", o->model, "logistic | linear | poisson | softmax")
      ->capture_default_str();
  f->add_option("--data", o->data, "Features FILE.h5:/X (N x D)")->required();
  f->add_option("--response", o->response, "Responses FILE.h5:/y (N)")->required();
  f->add_option("--classes", o->cfg.glm.classes, "softmax: classes C")->capture_default_str();
  f->add_option("--noise-sd", o->cfg.glm.noise_sd, "linear: the known noise sd")
      ->capture_default_str();
  f->add_option("--prior-scale", o->cfg.glm.prior_scale, "Prior N(0, s^2 I) on every parameter")
      ->capture_default_str();
  f->add_option("--family", o->family, "meanfield | fullrank | lowrank")->capture_default_str();
  f->add_option("--rank", o->cfg.rank, "lowrank: columns of the factor B");
  f->add_option("--estimator", o->estimator, "score | score-cv | reparam")->capture_default_str();
  f->add_option("--samples", o->cfg.samples, "Draws of q per step (S)")->capture_default_str();
  f->add_option(
       "--batch-size", o->batch_size,
       "Rows per global minibatch (B; one drawn uniformly in each of B equal strata of the rows)")
      ->capture_default_str();
  f->add_option("--optimizer", o->optimizer, "adam | rm (Robbins-Monro)")
      ->check(CLI::IsMember({"adam", "rm"}))
      ->capture_default_str();
  f->add_option("--lr", o->lr,
                "Step size, or auto: the best ELBO after --adapt-iter steps of 0.1, 0.03, 0.01, "
                "0.003, 0.001")
      ->capture_default_str();
  f->add_option("--adapt-iter", o->adapt_iter, "Steps of each --lr auto trial")
      ->capture_default_str();
  engine::add_stop_options(f, o->stop);
  f->get_option("--max-iter")->description("At most this many optimiser steps");
  f->get_option("--tol")->description(
      "Stop when the mean or median relative change of the ELBO estimate over a window is below "
      "this");
  f->add_option("--elbo-every", o->elbo_every, "Steps between ELBO estimates")
      ->capture_default_str();
  f->add_option("--average-from", o->average_from,
                "Return q at the average of the iterates after this many steps (Polyak-Ruppert "
                "averaging: far less noisy than the last iterate under a constant --lr); the ELBO "
                "trace stays that of the iterates. Default: the last iterate");
  f->add_option("--elbo-rows", o->elbo_rows,
                "Rows of each ELBO estimate: drawn once and kept, their log-likelihood scaled "
                "by N / rows (all N if N is smaller)")
      ->capture_default_str();
  f->add_option("--elbo-samples", o->cfg.elbo_samples, "Draws per ELBO estimate")
      ->capture_default_str();
  f->add_option("--diagnostic-samples", o->cfg.diagnostic_samples,
                "Draws for the Pareto k-hat (0: none)")
      ->capture_default_str();
  f->add_option("--seed", o->cfg.seed, "Random seed")->capture_default_str();
  f->add_option("--out", o->out, "Posterior FILE.h5")->required();
  engine::add_checkpoint_options(f, o->files);

  auto po = std::make_shared<PredictOptions>();
  auto* pr = b->add_subcommand(
      "predict", "Posterior predictive of a fitted GLM posterior, by Monte Carlo over q");
  pr->add_option("--model", po->model, "Posterior FILE.h5 written by bbvi fit")->required();
  pr->add_option("--data", po->data, "Rows FILE.h5[:/path] to predict, N x D")->required();
  pr->add_option("--response", po->response,
                 "Their responses FILE.h5[:/path]: adds /log_density and the mean log "
                 "predictive density (and accuracy for classifiers) to the summary");
  pr->add_option("--samples", po->samples, "Draws of q")->capture_default_str();
  pr->add_option("--seed", po->seed, "Seed of the draws")->capture_default_str();
  pr->add_option("--out", po->out,
                 "FILE.h5: /mean (N, or N x C class probabilities), /sd (linear, poisson), "
                 "/log_density")
      ->required();
  pr->callback([&ctx, po] { ctx.action = [&ctx, po] { run_predict(ctx, *po); }; });
  f->callback([&ctx, o] {
    ctx.stop_signals = true;  // checkpoints on SIGTERM/SIGUSR1
    ctx.action = [&ctx, o] { run_fit(ctx, *o); };
  });
}

}  // namespace caviar::bbvi
