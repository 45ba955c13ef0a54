// caviar generate gmm | glm | demo
#include <memory>

#include "app.hpp"
#include "io/h5.hpp"
#include "prep/generate.hpp"
#include "prep/generate_glm.hpp"

namespace caviar::app {

void add_generate_commands(CLI::App& cli, Context& ctx) {
  auto* gen =
      cli.add_subcommand("generate", "Write synthetic datasets (identical for any rank count)");
  gen->require_subcommand(1);

  struct GmmArgs {
    std::int64_t n = 0;
    int dim = 0, components = 0;
    std::uint64_t seed = 0;
    std::string out;
  };
  auto a = std::make_shared<GmmArgs>();
  auto* g = gen->add_subcommand("gmm", "Sample a random Gaussian mixture");
  g->add_option("--n", a->n, "Rows")->required();
  g->add_option("--dim", a->dim, "Features")->required();
  g->add_option("--components", a->components, "Components")->required();
  g->add_option("--seed", a->seed, "Random seed")->capture_default_str();
  g->add_option("--out", a->out, "Output FILE.h5[:/path] (default path /X)")->required();
  g->callback([&ctx, a] {
    ctx.action = [&ctx, a] {
      if (a->n < 1 || a->dim < 1 || a->components < 1)
        throw Error("--n, --dim and --components must be >= 1");
      const auto ref = io::DataRef::parse(a->out);
      write_samples(*ctx.comm, ref.file,
                    {{ref.path, random_mixture(a->dim, a->components, a->seed), a->n}}, a->seed);
      print_progress(ctx, "wrote " + ref.str());
      nlohmann::ordered_json j;
      j["out"] = ref.str();
      j["n"] = a->n;
      j["dim"] = a->dim;
      j["components"] = a->components;
      print_summary(ctx, j);
    };
  });

  auto glm = std::make_shared<GlmSpec>();
  auto glm_out = std::make_shared<std::string>();
  auto glm_family = std::make_shared<std::string>("logistic");
  auto* gl = gen->add_subcommand(
      "glm", "Sample regression data from a known parameter vector: /X, /y and /true/theta");
  gl->add_option("--family", *glm_family, "logistic | linear | poisson | softmax")
      ->capture_default_str();
  gl->add_option("--n", glm->n, "Rows")->required();
  gl->add_option("--dim", glm->model.features, "Features")->required();
  gl->add_option("--classes", glm->model.classes, "Classes (softmax)")->capture_default_str();
  gl->add_option("--noise-sd", glm->model.noise_sd, "Noise standard deviation (linear)")
      ->capture_default_str();
  gl->add_option("--seed", glm->seed, "Random seed")->capture_default_str();
  gl->add_option("--out", *glm_out, "Output FILE.h5")->required();
  gl->callback([&ctx, glm, glm_out, glm_family] {
    ctx.action = [&ctx, glm, glm_out, glm_family] {
      glm->model.likelihood = bbvi::parse_likelihood(*glm_family, "--family");
      write_glm(*ctx.comm, *glm_out, *glm);
      print_progress(ctx, "wrote " + *glm_out + ":/X, /y and /true/theta");
      nlohmann::ordered_json j;
      j["out"] = *glm_out;
      j["family"] = *glm_family;
      j["n"] = glm->n;
      j["dim"] = glm->model.features;
      j["params"] = glm->model.n_params();
      print_summary(ctx, j);
    };
  });

  auto demo_out = std::make_shared<std::string>();
  auto* demo = gen->add_subcommand(
      "demo",
      "The simulation studies of Bruno 2022, section 1.2.3: /three/X (3 clusters, N=1500, "
      "Fig 1.5), /three_heldout/X (1500 more from the same mixture) and /two/X (2 clusters, "
      "N=1000, Fig 1.7)");
  demo->add_option("--out", *demo_out, "Output FILE.h5")->required();
  demo->callback([&ctx, demo_out] {
    ctx.action = [&ctx, demo_out] {
      write_samples(*ctx.comm, *demo_out,
                    {{"/three/X", seed_three_clusters(), 1500},
                     {"/three_heldout/X", seed_three_clusters(), 1500},
                     {"/two/X", seed_two_clusters(), 1000}},
                    0);
      print_progress(ctx, "wrote " + *demo_out + ":/three/X and " + *demo_out + ":/two/X");
      nlohmann::ordered_json j;
      j["out"] = *demo_out;
      print_summary(ctx, j);
    };
  });
}

}  // namespace caviar::app
