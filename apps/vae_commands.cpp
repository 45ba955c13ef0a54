// caviar vae train | sample | reconstruct | manifold | encode
#include <cmath>
#include <cstdio>
#include <memory>
#include <sstream>

#include "app.hpp"
#include "core/error.hpp"
#include "core/parallel.hpp"
#include "inference/vae_driver.hpp"

namespace caviar::app {

namespace {

// "512,256" -> {512, 256}
std::vector<int> parse_widths(const std::string& s, const std::string& flag) {
  std::vector<int> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    std::size_t used = 0;
    int v = 0;
    try {
      v = std::stoi(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size())
      throw Error(flag + " must be a comma-separated list of counts, e.g. 512,256 (got '" + s +
                  "')");
    out.push_back(v);
  }
  if (out.empty()) throw Error(flag + " needs at least one count");
  return out;
}

double json_number(double v) {
  return std::isfinite(v) ? v : 0.0;
}

void add_train_command(CLI::App* vae, Context& ctx) {
  auto o = std::make_shared<vae::TrainOptions>();
  auto hidden = std::make_shared<std::string>("400");
  auto* train = vae->add_subcommand("train", "Train a VAE by minibatch Adam on the ELBO");
  train->add_option("--data", o->data, "Training data FILE.h5[:/path] (default path /X), N x D")
      ->required();
  train->add_option("--test", o->test, "Held-out FILE.h5[:/path], evaluated each epoch");
  auto channels = std::make_shared<std::string>("32,64");
  train
      ->add_option("--arch", o->arch,
                   "mlp | conv (stride-2 4x4 convolutions, ReLU and batch norm; a mirrored "
                   "decoder of transposed convolutions)")
      ->check(CLI::IsMember({"mlp", "conv"}))
      ->capture_default_str();
  train->add_option("--hidden", *hidden, "Hidden widths, comma-separated (e.g. 512,256; mlp)")
      ->capture_default_str();
  train
      ->add_option("--channels", *channels,
                   "Output channels of the stride-2 convolutions, comma-separated (conv)")
      ->capture_default_str();
  train->add_flag("--bayesian-decoder", o->bayesian_decoder,
                  "mlp: a mean-field Gaussian posterior over the decoder's weights (one draw per "
                  "minibatch; its KL counted once per epoch)");
  train
      ->add_option("--prior-scale", o->prior_scale,
                   "With --bayesian-decoder: the weights' prior N(0, s^2)")
      ->capture_default_str();
  train->add_option("--image", o->image,
                    "Image shape CxHxW of a row (conv; default 1 x s x s for s^2 columns)");
  train->add_option("--latent", o->latent, "Latent dimension Z")->capture_default_str();
  train->add_option("--max-iter", o->epochs, "Epochs (total, including resumed ones)")
      ->capture_default_str();
  engine::add_renamed_option(train, "--epochs", "--max-iter", o->epochs, ctx);
  train->add_option("--batch-size", o->batch_size, "Global minibatch size B (split over ranks)")
      ->capture_default_str();
  train->add_option("--lr", o->lr, "Adam learning rate")->capture_default_str();
  train->add_option("--weight-decay", o->weight_decay, "L2 weight decay")->capture_default_str();
  train->add_option("--samples", o->samples, "Reparameterised samples S per row")
      ->capture_default_str();
  train
      ->add_option("--posterior", o->posterior,
                   "Encoder covariance: diagonal | full (Cholesky factor, Kingma & Welling 2019)")
      ->capture_default_str();
  train
      ->add_option("--estimator", o->estimator,
                   "Gradient of the KL term: reparam (closed form) | stl (path derivative, "
                   "'sticking the landing', Roeder et al. 2017; lower variance near the "
                   "posterior) | auto (stl with --posterior full, reparam otherwise)")
      ->capture_default_str();
  train->add_option("--likelihood", o->likelihood, "bernoulli (data in [0,1]) | gaussian")
      ->check(CLI::IsMember({"bernoulli", "gaussian"}))
      ->capture_default_str();
  train->add_option("--seed", o->seed, "Random seed")->capture_default_str();
  train
      ->add_option("--micro-blocks", o->micro_blocks,
                   "Micro-blocks per batch: the unit of work per thread (results depend on it, "
                   "not on the rank count)")
      ->capture_default_str();
  train
      ->add_option("--reduction", o->reduction,
                   "exact (int64 fixed point: identical at any rank count) | fast (double sums)")
      ->check(CLI::IsMember({"exact", "fast"}))
      ->capture_default_str();
  train->add_option("--out", o->out, "Model file to write (HDF5)");
  engine::add_checkpoint_options(train, o->checkpoint, o->checkpoint_every, o->resume,
                                 "epochs; a time is taken at the next step boundary",
                                 "with --checkpoint, 1: every epoch's end");
  train->callback([&ctx, o, hidden, channels, train] {
    ctx.stop_signals = true;  // checkpoints on SIGTERM/SIGUSR1
    // Each architecture's shape flags, refused for the other rather than silently ignored.
    const bool conv_flags = train->count("--channels") > 0 || train->count("--image") > 0;
    ctx.action = [&ctx, o, hidden, channels, conv_flags,
                  hidden_given = train->count("--hidden") > 0] {
      if (o->arch == "conv" && hidden_given)
        throw Error(
            "--hidden applies to --arch mlp (a convolutional VAE's layers are set by --channels)");
      if (o->arch == "mlp" && conv_flags)
        throw Error("--channels and --image apply to --arch conv");
      o->hidden = parse_widths(*hidden, "--hidden");
      o->channels = parse_widths(*channels, "--channels");
      o->command = ctx.command_line;
      o->version = CAVIAR_VERSION;
      const std::string net =
          o->arch == "conv" ? "conv, channels " + *channels : "hidden " + *hidden;
      print_progress(ctx, "caviar vae train: " + o->data + ", " + net + ", latent " +
                              std::to_string(o->latent) + ", batch " +
                              std::to_string(o->batch_size) + ", " +
                              std::to_string(ctx.comm->size()) + " ranks x " +
                              std::to_string(max_threads()) + " threads");
      const auto r = vae::train(*ctx.comm, *o, [&ctx](const vae::EpochReport& e) {
        char line[200];
        std::snprintf(line, sizeof line,
                      "epoch %3d/%d  train elbo %10.3f  test elbo %10.3f  %7.2fs  %8.0f rows/s",
                      e.epoch, e.epochs, e.train_elbo, e.test_elbo, e.seconds, e.rows_per_second);
        print_progress(ctx, line);
      });
      if (!o->out.empty()) print_progress(ctx, "wrote model " + o->out);
      nlohmann::ordered_json j;
      j["train_elbo"] = json_number(r.train_elbo);
      if (!o->test.empty()) j["test_elbo"] = json_number(r.test_elbo);
      if (o->bayesian_decoder) j["decoder_kl"] = r.decoder_kl;
      j["epochs"] = r.epochs;
      j["steps"] = r.steps;
      j["seconds"] = r.seconds;
      j["seconds_train"] = r.train_seconds;
      j["seconds_per_epoch"] = r.epochs_run > 0 ? r.train_seconds / r.epochs_run : 0.0;
      j["seconds_compute"] = r.compute_seconds;
      j["seconds_reduce"] = r.reduce_seconds;
      j["seconds_update"] = r.update_seconds;
      j["seconds_eval"] = r.eval_seconds;
      j["n"] = r.n;
      j["ranks"] = ctx.comm->size();
      j["threads"] = max_threads();
      print_summary(ctx, j);
    };
  });
}

// vae sample | reconstruct | manifold share the image options.
void add_image_commands(CLI::App* vae, Context& ctx) {
  auto img = std::make_shared<vae::ImageOptions>();
  auto n = std::make_shared<int>(64);
  auto data = std::make_shared<std::string>();
  auto grid = std::make_shared<int>(20);
  auto add_image_options = [img](CLI::App* c) {
    c->add_option("--model", img->model, "Model file written by vae train")->required();
    c->add_option("--png", img->png, "PNG grid to write (rendered by scripts/plot_vae.py)");
    c->add_option("--out", img->images_out, "HDF5 file for the pixel arrays (/images)");
  };
  auto report = [&ctx, img](std::int64_t count) {
    nlohmann::ordered_json j;
    j["images"] = count;
    if (!img->png.empty()) j["png"] = img->png;
    if (!img->images_out.empty()) j["out"] = img->images_out;
    print_summary(ctx, j);
  };

  auto* sample = vae->add_subcommand("sample", "Decode z ~ N(0, I) into a grid of images");
  add_image_options(sample);
  sample->add_option("--n", *n, "Number of samples")->capture_default_str();
  sample->add_option("--seed", img->seed, "Random seed")->capture_default_str();
  sample->callback([&ctx, img, n, report] {
    ctx.action = [&ctx, img, n, report] { report(vae::sample(*ctx.comm, *img, *n)); };
  });

  auto* recon =
      vae->add_subcommand("reconstruct", "First rows of a dataset and their reconstructions");
  add_image_options(recon);
  recon->add_option("--data", *data, "Data FILE.h5[:/path]")->required();
  auto n_rows = std::make_shared<int>(20);
  recon->add_option("--n", *n_rows, "Number of rows")->capture_default_str();
  recon->callback([&ctx, img, n_rows, data, report] {
    ctx.action = [&ctx, img, n_rows, data, report] {
      report(vae::reconstruct(*ctx.comm, *img, *data, *n_rows));
    };
  });

  auto* manifold = vae->add_subcommand(
      "manifold", "Decoded latent grid of a Z=2 model (Kingma & Welling 2014, Figure 4)");
  add_image_options(manifold);
  manifold->add_option("--grid", *grid, "Grid points per axis")->capture_default_str();
  manifold->callback([&ctx, img, grid, report] {
    ctx.action = [&ctx, img, grid, report] { report(vae::manifold(*ctx.comm, *img, *grid)); };
  });
}

void add_score_command(CLI::App* vae, Context& ctx) {
  auto so = std::make_shared<vae::ScoreOptions>();
  auto* sc = vae->add_subcommand(
      "score",
      "Mean ELBO and importance-weighted log p(x) per row of a dataset (Burda et al. 2016)");
  sc->add_option("--model", so->model, "Model file written by vae train")->required();
  sc->add_option("--data", so->data, "Data FILE.h5[:/path]")->required();
  sc->add_option("--importance-samples", so->importance_samples,
                 "k: samples of q(z | x) per row for the log p(x) estimate")
      ->capture_default_str();
  sc->add_option("--seed", so->seed, "Seed of the draws (keyed by row and sample)")
      ->capture_default_str();
  sc->add_option("--out", so->out, "Optional HDF5 output: /log_px (N, float64)");
  sc->callback([&ctx, so] {
    ctx.action = [&ctx, so] {
      print_progress(ctx, "caviar vae score: " + so->data + ", " +
                              std::to_string(so->importance_samples) +
                              " importance samples per row");
      so->progress = [&ctx](double f) {
        print_progress(ctx,
                       "  " + std::to_string(static_cast<int>(100 * f)) + "% of rank 0's rows");
      };
      const vae::ScoreResult r = vae::score(*ctx.comm, *so);
      nlohmann::ordered_json j;
      j["n"] = r.n;
      j["importance_samples"] = r.importance_samples;
      j["elbo"] = r.elbo;
      j["log_px"] = r.log_px;
      j["seconds"] = r.seconds;
      print_summary(ctx, j);
    };
  });
}

void add_encode_command(CLI::App* vae, Context& ctx) {
  auto model = std::make_shared<std::string>();
  auto data = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  auto* enc = vae->add_subcommand("encode", "Write each row's posterior mean and log-variance");
  enc->add_option("--model", *model, "Model file written by vae train")->required();
  enc->add_option("--data", *data, "Data FILE.h5[:/path]")->required();
  enc->add_option("--out", *out, "Output HDF5 (/mu, /logvar: N x Z float32)")->required();
  enc->callback([&ctx, model, data, out] {
    ctx.action = [&ctx, model, data, out] {
      const auto rows = vae::encode(*ctx.comm, *model, *data, *out);
      nlohmann::ordered_json j;
      j["n"] = rows;
      j["out"] = *out;
      print_summary(ctx, j);
    };
  });
}

}  // namespace

void add_vae_commands(CLI::App& cli, Context& ctx) {
  auto* vae =
      cli.add_subcommand("vae", "Variational autoencoder, data-parallel (Kingma & Welling 2014)");
  vae->require_subcommand(1);

  add_train_command(vae, ctx);
  add_image_commands(vae, ctx);
  add_score_command(vae, ctx);
  add_encode_command(vae, ctx);
}

}  // namespace caviar::app
