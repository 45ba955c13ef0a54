// Fuzz target: `gmm fit --resume CHECKPOINT` (the engine's checkpoint, engine/checkpoint.cpp,
// with the statistics read by models/gmm/batch.hpp (CAVI, EM) or the SVI state read by
// models/gmm/svi.cpp; the fingerprint check of inference/checkpoint.cpp), on a
// structure-aware HDF5 checkpoint (h5_spec.hpp). The whole fit runs on a small fixed dataset, so
// that what the reader lets through is also used: a resumed position, trace or statistics that
// the fit cannot continue from must be refused by the reader.
//
// Input: one configuration byte (which fit options; see kConfigs), then the checkpoint's entries.
// The seeds are real checkpoints written by gmm::fit with the same data and options, their
// fingerprint replaced by the placeholder kFingerprint (harness.hpp).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "harness.hpp"
#include "inference/gmm_driver.hpp"
#include "io/h5.hpp"

namespace {

using caviar::fuzz::comm;
namespace gmm = caviar::gmm;

constexpr int kConfigs = 8;

// The options of configuration c, resuming from `resume` (or writing `checkpoint`).
gmm::FitOptions options(int c, const std::string& data) {
  gmm::FitOptions o;
  o.data = data + ":/X";
  o.components = 2;
  o.max_iter = 3;
  o.tol = 0;
  o.seed = 7;
  switch (c) {
    case 0:  // CAVI, full covariance, k-means++
      break;
    case 1:  // SVI, Robbins-Monro, full-ELBO checks
      o.algorithm = gmm::Algorithm::kSvi;
      o.batch_size = 3;
      o.full_elbo_every = 2;
      break;
    case 2:  // SVI, adaptive schedule, diagonal
      o.algorithm = gmm::Algorithm::kSvi;
      o.schedule = gmm::Schedule::kAdaptive;
      o.covariance = caviar::gmm::Covariance::kDiag;
      o.batch_size = 3;
      o.tau0 = 4;
      break;
    case 3:  // EM
      o.algorithm = gmm::Algorithm::kEm;
      break;
    case 4:  // CAVI, diagonal, stick-breaking, random init
      o.covariance = caviar::gmm::Covariance::kDiag;
      o.weights = caviar::gmm::WeightPrior::kStickBreaking;
      o.init = "random";
      break;
    case 5:  // CAVI streamed in chunks
      o.stream = true;
      o.chunk_rows = 3;
      break;
    case 6:  // SVI streamed
      o.algorithm = gmm::Algorithm::kSvi;
      o.stream = true;
      o.batch_size = 3;
      break;
    default:  // CAVI with plain double sums
      o.fast_reduce = true;
      o.prior_mean = "data";
      o.prior_scale = "data";
      break;
  }
  return o;
}

// N = 8 rows in D = 2, two clusters, deterministic. Small on purpose: the data's identity in the
// fingerprint reads 8-row windows, one MPI-IO open each, and opens dominate an input's time.
std::string data_file() {
  static const std::string path = [] {
    const std::string p = caviar::fuzz::scratch("gmm_data.h5");
    std::vector<double> x;
    for (int i = 0; i < 8; ++i) {
      const double c = (i % 2) * 4.0, t = 0.37 * i;
      x.push_back(c + std::sin(t));
      x.push_back(-c + std::cos(1.7 * t));
    }
    caviar::io::FileWriter w(p);
    w.write("X", x, {8, 2});
    w.commit();
    return p;
  }();
  return path;
}

// A real checkpoint of configuration c: CAVI/EM before iteration 2; SVI (3 steps an epoch) after
// epoch 1 (--checkpoint-every counts SVI epochs; the fuzzer varies the position inside the
// epoch, driver.step_in_epoch, from there).
caviar::fuzz::CheckpointTarget& target() {
  static caviar::fuzz::CheckpointTarget t(
      kConfigs,
      [](int c, const std::string& path) {
        gmm::FitOptions o = options(c, data_file());
        o.checkpoint = path;
        o.checkpoint_every = o.algorithm == gmm::Algorithm::kSvi ? "1" : "2";
        o.max_iter = 2;
        gmm::fit(comm(), o, nullptr);
      },
      [](int c, const std::string& path) {
        gmm::FitOptions o = options(c, data_file());
        o.resume = path;
        gmm::fit(comm(), o, nullptr);
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
