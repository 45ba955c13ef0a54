// Fuzz target: `vae train --resume CHECKPOINT` (read_checkpoint in inference/vae_driver.cpp and the
// fingerprint check of inference/checkpoint.cpp), on a structure-aware HDF5 checkpoint
// (h5_spec.hpp). Training continues for one epoch on a small fixed dataset, so that what the
// reader lets through is also used.
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

// A real checkpoint of configuration c (written once), after epoch 1 (2 steps).
const std::string& checkpoint(int c) {
  static std::string path[kConfigs];
  if (path[c].empty()) {
    vae::TrainOptions o = options(c);
    o.checkpoint = caviar::fuzz::scratch("ck" + std::to_string(c) + ".h5");
    o.epochs = 1;
    vae::train(comm(), o, nullptr);
    path[c] = o.checkpoint;
  }
  return path[c];
}

std::string fingerprint(int c) {
  static std::string fp[kConfigs];
  if (fp[c].empty()) fp[c] = caviar::fuzz::fingerprint_of_file(checkpoint(c));
  return fp[c];
}

void write_seeds(const std::string& dir) {
  for (int c = 0; c < kConfigs; ++c)
    caviar::fuzz::save(
        dir, "config" + std::to_string(c),
        caviar::fuzz::input_of_file(checkpoint(c), {static_cast<std::uint8_t>(c)}, fingerprint(c)));
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  caviar::fuzz::init({write_seeds, fingerprint});
  data_file();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const int c = data[0] % kConfigs;
  const std::string ck = caviar::fuzz::scratch("resume.h5");
  if (!caviar::fuzz::write_input(ck, data + 1, size - 1, fingerprint(c))) return 0;
  vae::TrainOptions o = options(c);
  o.resume = ck;
  try {
    vae::train(comm(), o, nullptr);
  } catch (const caviar::Error& e) {
    caviar::fuzz::refused(e);
  }
  return 0;
}
