// caviar prep fashion-mnist: public datasets into caviar's HDF5 layout.
#include <memory>

#include "app.hpp"
#include "prep/prep.hpp"

namespace caviar::app {

void add_prep_commands(CLI::App& cli, Context& ctx) {
  auto* prep = cli.add_subcommand("prep", "Convert public datasets into HDF5 files");
  prep->require_subcommand(1);

  auto opt = std::make_shared<PrepOptions>();
  auto* fm = prep->add_subcommand(
      "fashion-mnist",
      "Fashion-MNIST from Debian's dataset-fashion-mnist: /train/images, /train/labels, "
      "/test/images, /test/labels (and /pca/..., /train/pca, /test/pca with --pca D)");
  fm->add_option("--out", opt->out, "Output FILE.h5")->required();
  fm->add_option("--pca", opt->pca,
                 "Also store the projection on the first D principal components");
  fm->add_option("--source", opt->source, "Directory of the IDX files")->capture_default_str();
  fm->callback([&ctx, opt] {
    ctx.action = [&ctx, opt] {
      const PrepResult r = prep_fashion_mnist(
          *ctx.comm, *opt, [&ctx](const std::string& s) { print_progress(ctx, s); });
      nlohmann::ordered_json j;
      j["out"] = opt->out;
      j["train"] = r.train;
      j["test"] = r.test;
      j["pixels"] = r.pixels;
      j["pca"] = r.pca;
      if (r.pca > 0) j["pca_variance_fraction"] = r.pca_variance_fraction;
      j["seconds"] = r.seconds;
      print_summary(ctx, j);
    };
  });
}

}  // namespace caviar::app
