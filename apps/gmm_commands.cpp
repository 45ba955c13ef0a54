// caviar gmm fit | score | predict
#include <cmath>
#include <cstdio>
#include <memory>

#include "app.hpp"
#include "core/parallel.hpp"
#include "inference/gmm_driver.hpp"

namespace caviar::app {

void add_gmm_commands(CLI::App& cli, Context& ctx) {
  auto* gmm = cli.add_subcommand("gmm", "Bayesian Gaussian mixture (variational, CAVI)");
  gmm->require_subcommand(1);

  // fit
  auto o = std::make_shared<gmm::FitOptions>();
  auto cov = std::make_shared<std::string>("full");
  auto algorithm = std::make_shared<std::string>("cavi");
  auto* fit = gmm->add_subcommand("fit", "Fit a mixture by coordinate-ascent VI");
  fit->add_option("--data", o->data, "Input FILE.h5[:/path] (default path /X), N x D")->required();
  fit->add_option("-k,--components", o->components, "Number of components K")->required();
  fit->add_option("--algorithm", *algorithm, "Inference algorithm")->check(CLI::IsMember({"cavi"}));
  fit->add_option("--covariance", *cov, "full | diag")->check(CLI::IsMember({"full", "diag"}));
  fit->add_option("--max-iter", o->max_iter, "Maximum CAVI iterations")->capture_default_str();
  fit->add_option("--tol", o->tol, "Stop when the relative ELBO change is below this (0: never)")
      ->capture_default_str();
  fit->add_option("--seed", o->seed, "Random seed")->capture_default_str();
  fit->add_option("--init", o->init, "kmeans++ | random | FILE.h5:/resp (N x K)")
      ->capture_default_str();
  fit->add_option("--kmeans-iter", o->kmeans_iter, "Lloyd steps after k-means++ seeding")
      ->capture_default_str();
  fit->add_option("--alpha0", o->alpha0, "Dirichlet concentration (default 1/K)");
  fit->add_option("--beta0", o->beta0, "Mean precision scaling (default 1)");
  fit->add_option("--nu0", o->nu0, "Wishart degrees of freedom (default D)");
  fit->add_option("--prior-mean", o->prior_mean, "zero | data (m0 = data mean)")
      ->check(CLI::IsMember({"zero", "data"}))
      ->capture_default_str();
  fit->add_option("--prior-scale", o->prior_scale, "identity | data (W0^-1 = data covariance)")
      ->check(CLI::IsMember({"identity", "data"}))
      ->capture_default_str();
  fit->add_option("--out", o->out, "Model file to write (HDF5)");
  fit->add_option("--labels", o->labels, "Per-row labels file to write (HDF5, /labels)");
  fit->add_flag("--save-responsibilities", o->save_responsibilities,
                "Also write /responsibilities (N x K) to the labels file");
  fit->callback([&ctx, o, cov] {
    ctx.action = [&ctx, o, cov] {
      o->covariance = gmm::parse_covariance(*cov);
      o->command = ctx.command_line;
      o->version = CAVIAR_VERSION;
      print_progress(ctx, "caviar gmm fit: " + o->data + ", K=" + std::to_string(o->components) +
                              ", " + *cov + " covariance, " + std::to_string(ctx.comm->size()) +
                              " ranks x " + std::to_string(max_threads()) + " threads");
      const auto r = gmm::fit(*ctx.comm, *o, [&ctx](const gmm::IterationReport& it) {
        char line[160];
        std::snprintf(line, sizeof line, "iter %4d  elbo % .10e  rel %9.3e  %8.3fs", it.iteration,
                      it.elbo, it.rel_change, it.seconds);
        print_progress(ctx, line);
      });
      if (!o->out.empty()) print_progress(ctx, "wrote model " + o->out);
      if (!o->labels.empty()) print_progress(ctx, "wrote labels " + o->labels);
      nlohmann::ordered_json j;
      j["elbo"] = r.elbo;
      j["iterations"] = r.iterations;
      j["converged"] = r.converged;
      j["seconds"] = r.seconds;
      j["n"] = r.n;
      j["ranks"] = ctx.comm->size();
      j["threads"] = max_threads();
      print_summary(ctx, j);
    };
  });

  // score
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

  // predict
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

}  // namespace caviar::app
