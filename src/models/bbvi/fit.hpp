#pragma once
// The black-box VI posterior of a GLM as the draws driver's model (engine/draw_model.hpp): the
// GLM's log joint (glm.hpp), a Gaussian family (family.hpp) and an estimator (estimator.hpp) over
// this rank's rows. No MPI and no files: the driver sums the blocks over ranks.
//
//   gradient draws  S draws theta_s = r(eps_s, lambda), eps keyed by (seed, kBbviNoise, step);
//                   per block and draw the log-likelihood sum and, for reparameterisation, its
//                   gradient in theta; f_s = (N / B) sum + log prior(theta_s), an unbiased
//                   estimate of the log joint (Hoffman et al. 2013)
//   ELBO draws      --elbo-samples draws keyed by (seed, kBbviElbo, step) over every row:
//                   mean_s log p(y, theta_s) + entropy(q) (Kucukelbir et al. 2017)
//   diagnostic      --diagnostic-samples draws keyed by (seed, kBbviElbo, 0): the log importance
//                   ratios log p(y, theta_s) - log q(theta_s) for the Pareto k-hat (psis.hpp)
#include <cstdint>
#include <span>
#include <vector>

#include "engine/draw_model.hpp"
#include "models/bbvi/estimator.hpp"
#include "models/bbvi/family.hpp"
#include "models/bbvi/glm.hpp"

namespace caviar::bbvi {

struct FitConfig {
  Glm glm;
  FamilyKind family = FamilyKind::kMeanField;
  int rank = 0;
  Estimator estimator = Estimator::kReparam;
  int samples = 8, elbo_samples = 100, diagnostic_samples = 1000;
  double init_sd = 0.1;  // the starting marginal standard deviations of q
  std::uint64_t seed = 1;
};

class Posterior {
 public:
  // x: this rank's rows (n x D, row-major), y: their responses.
  Posterior(const FitConfig& cfg, std::span<const double> x, std::span<const double> y);

  engine::BasicParams<double>& params() { return lambda_; }
  const engine::BasicParams<double>& params() const { return lambda_; }
  const Family& family() const { return q_; }

  void set_draws(engine::DrawKind kind, std::int64_t t);
  int n_draws() const { return static_cast<int>(theta_.rows()); }
  std::int64_t width() const { return width_; }
  // The per-row terms (Glm::row_terms) of a run of consecutive groups' rows, kept for their
  // block() calls on this thread: one pass over a thread's rows in a few large kernels, instead
  // of one small call per group (with N >> B most groups are one row, and those calls' fixed
  // costs were most of a step, perf).
  void prepare(std::span<const std::int64_t> rows) const;
  // A group's sums: prepare()'s terms when its rows lie in the last run prepared on this thread
  // for these draws, else prepared here.
  void block(std::span<const std::int64_t> rows, std::span<double> out) const;
  // The sum tree's node over consecutive groups (bounds: engine/draw_model.hpp's block_node),
  // without writing any group's sums.
  void block_node(std::span<const std::int64_t> rows, std::span<const std::int64_t> bounds,
                  std::span<double> out) const;
  double gradient(std::span<const double> sums, std::span<const std::uint8_t> kept, double scale,
                  std::span<double> grad) const;
  double elbo(std::span<const double> sums, std::span<const std::uint8_t> kept, double scale) const;
  // lambda as "lambda" (a checkpoint's model/); load checks its size and finiteness.
  void save(engine::StateWriter& w) const;
  void load(const engine::StateReader& r);
  // After a full pass with set_draws(kDiagnostic, .): log p(y, theta_s) - log q(theta_s) of
  // the kept draws.
  std::vector<double> log_ratios(std::span<const double> sums,
                                 std::span<const std::uint8_t> kept) const;

 private:
  // scale * the log-likelihood sum of draw s + its log prior (scale 1: every row summed).
  double log_joint(std::span<const double> sums, int s, double scale = 1) const;
  FitConfig cfg_;
  Family q_;
  std::span<const double> x_, y_;
  std::int64_t p_;
  engine::BasicParams<double> lambda_;
  RowMatrix eps_, theta_;
  std::int64_t width_ = 1;
  bool with_grad_ = false;
  std::uint64_t pass_ = 0;  // set_draws' call: keys the threads' prepared rows
};

static_assert(engine::DrawModel<Posterior>);

}  // namespace caviar::bbvi
