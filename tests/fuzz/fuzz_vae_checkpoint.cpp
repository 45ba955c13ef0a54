// Fuzz target: `vae train --resume CHECKPOINT` (the engine's checkpoint reader: the fingerprint
// check of inference/checkpoint.cpp, engine::Checkpointer's position and traces, the model's
// "model/params" and the gradient driver's "driver/" state: the optimiser's steps and moments, the
// position inside the epoch), on a structure-aware HDF5 checkpoint (h5_spec.hpp). Training
// continues for one epoch on a small fixed dataset, so that what the reader lets through is also
// used. The inputs in regressions/vae_checkpoint/ were written in the VAE's older layout: they now
// stop at the reader (missing entries), and new seeds are made from the engine's layout.
//
// Input: one configuration byte (which options; see kConfigs), then the checkpoint's entries. The
// seeds are real checkpoints written by vae::train with the same data and options, their
// fingerprint replaced by the placeholder kFingerprint (harness.hpp).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "harness.hpp"
#include "inference/vae_driver.hpp"
#include "io/h5.hpp"

namespace {

using caviar::fuzz::comm;
namespace vae = caviar::vae;

constexpr int kConfigs = 2;

// N = 8 rows of D = 6 values in [0, 1] (/X), and 4 held-out rows (/T). Small on purpose: the
// data's identity in the fingerprint reads 8-row windows, one MPI-IO open each.
const std::string& data_file() {
  static const std::string path = [] {
    const std::string p = caviar::fuzz::scratch("vae_data.h5");
    std::vector<double> x, t;
    for (int i = 0; i < 8 * 6; ++i) x.push_back(0.5 + 0.5 * std::sin(0.9 * i));
    for (int i = 0; i < 4 * 6; ++i) t.push_back(0.5 + 0.5 * std::cos(1.3 * i));
    caviar::io::FileWriter w(p);
    w.write("X", x, {8, 6});
    w.write("T", t, {4, 6});
    w.commit();
    return p;
  }();
  return path;
}

vae::TrainOptions options(int c) {
  vae::TrainOptions o;
  o.data = data_file() + ":/X";
  o.hidden = {5};
  o.latent = 2;
  o.epochs = 2;
  o.batch_size = 4;
  o.micro_blocks = 2;
  o.seed = 3;
  if (c == 1) {  // Gaussian likelihood, two hidden layers, two samples, a test set
    o.likelihood = "gaussian";
    o.hidden = {4, 3};
    o.samples = 2;
    o.test = data_file() + ":/T";
  }
  return o;
}

// A real checkpoint of configuration c, after epoch 1 (2 steps).
caviar::fuzz::CheckpointTarget& target() {
  static caviar::fuzz::CheckpointTarget t(
      kConfigs,
      [](int c, const std::string& path) {
        vae::TrainOptions o = options(c);
        o.checkpoint = path;
        o.epochs = 1;
        vae::train(comm(), o, nullptr);
      },
      [](int c, const std::string& path) {
        vae::TrainOptions o = options(c);
        o.resume = path;
        vae::train(comm(), o, nullptr);
      });
  return t;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  caviar::fuzz::init(target().target());
  data_file();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return target().run(data, size);
}
