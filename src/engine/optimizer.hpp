#pragma once
// The optimisers of the gradient driver (engine/gradient.hpp), on float32 parameter buffers:
//
//   Adam           Kingma & Ba 2015, Algorithm 1, with PyTorch's conventions: the bias-corrected
//                  step lr / (1 - b1^t) and the denominator sqrt(v) / sqrt(1 - b2^t) + eps;
//                  optional L2 weight decay added to the gradient.
//   Robbins-Monro  plain stochastic gradient steps theta <- theta - rho_t (g + wd theta) with
//                  rho_t = lr (tau0 + t)^-kappa, t = 1, 2, ... (Robbins & Monro 1951; kappa in
//                  (0.5, 1] gives sum rho_t = inf, sum rho_t^2 < inf).
//
// Each entry's arithmetic is element-wise, so update() may run on disjoint ranges from several
// threads and gives the same bits as one call. No MPI and no files: the state reaches a checkpoint
// through engine/state.hpp.
#include <Eigen/Core>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/state.hpp"

namespace caviar::engine {

// Parameter and gradient buffers: aligned to Eigen's largest packet (64 bytes with AVX-512).
using Params = std::vector<float, Eigen::aligned_allocator<float>>;

struct AdamConfig {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
};
class Adam {
 public:
  Adam(AdamConfig cfg, std::int64_t n) : cfg_(cfg), m_(n, 0.0f), v_(n, 0.0f) {}
  // One step on every parameter: begin_step() then update() of [0, n).
  void step(float* params, const float* g) {
    begin_step();
    update(params, g, 0, static_cast<std::int64_t>(m_.size()));
  }
  void begin_step();
  void update(float* params, const float* g, std::int64_t begin, std::int64_t end);
  std::int64_t steps() const { return t_; }
  Params& m() { return m_; }
  Params& v() { return v_; }
  const Params& m() const { return m_; }
  const Params& v() const { return v_; }
  void set_steps(std::int64_t t) { t_ = t; }

 private:
  AdamConfig cfg_;
  Params m_, v_;
  std::int64_t t_ = 0;
  float step_size_ = 0, inv_sqrt_bc2_ = 0;
};

enum class Method { kAdam, kRobbinsMonro };
Method parse_method(const std::string& s);  // "adam" | "robbins-monro"

struct OptimizerConfig {
  Method method = Method::kAdam;
  AdamConfig adam;               // lr and weight_decay serve Robbins-Monro too
  double tau0 = 1, kappa = 0.7;  // Robbins-Monro: rho_t = lr (tau0 + t)^-kappa
};

class Optimizer {
 public:
  Optimizer(const OptimizerConfig& cfg, std::int64_t n) : cfg_(cfg), adam_(cfg.adam, n), n_(n) {}
  void begin_step();
  void update(float* params, const float* g, std::int64_t begin, std::int64_t end);
  std::int64_t steps() const { return adam_.steps(); }
  // "steps", and for Adam the moments "adam_m" and "adam_v" (float32 values, exact as doubles).
  void save(StateWriter& w) const;
  void load(const StateReader& r);

 private:
  OptimizerConfig cfg_;
  Adam adam_;  // Robbins-Monro uses only its step counter
  std::int64_t n_;
  float rm_step_ = 0;
};

}  // namespace caviar::engine
