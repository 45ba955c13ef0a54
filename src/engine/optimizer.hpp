#pragma once
// The optimisers of the gradient drivers, on float32 (engine/gradient.hpp) or double
// (engine/draws.hpp) parameter buffers:
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
template <class T>
using BasicParams = std::vector<T, Eigen::aligned_allocator<T>>;
using Params = BasicParams<float>;

struct AdamConfig {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
};
template <class T>
class BasicAdam {
 public:
  BasicAdam(AdamConfig cfg, std::int64_t n) : cfg_(cfg), m_(n, T(0)), v_(n, T(0)) {}
  // One step on every parameter: begin_step() then update() of [0, n).
  void step(T* params, const T* g) {
    begin_step();
    update(params, g, 0, static_cast<std::int64_t>(m_.size()));
  }
  void begin_step();
  void update(T* params, const T* g, std::int64_t begin, std::int64_t end);
  std::int64_t steps() const { return t_; }
  BasicParams<T>& m() { return m_; }
  BasicParams<T>& v() { return v_; }
  const BasicParams<T>& m() const { return m_; }
  const BasicParams<T>& v() const { return v_; }
  void set_steps(std::int64_t t) { t_ = t; }

 private:
  AdamConfig cfg_;
  BasicParams<T> m_, v_;
  std::int64_t t_ = 0;
  T step_size_ = 0, inv_sqrt_bc2_ = 0;
};
using Adam = BasicAdam<float>;

enum class Method { kAdam, kRobbinsMonro };
Method parse_method(const std::string& s);  // "adam" | "robbins-monro"

struct OptimizerConfig {
  Method method = Method::kAdam;
  AdamConfig adam;               // lr and weight_decay serve Robbins-Monro too
  double tau0 = 1, kappa = 0.7;  // Robbins-Monro: rho_t = lr (tau0 + t)^-kappa
};

template <class T>
class BasicOptimizer {
 public:
  BasicOptimizer(const OptimizerConfig& cfg, std::int64_t n)
      : cfg_(cfg), adam_(cfg.adam, n), n_(n) {}
  void begin_step();
  void update(T* params, const T* g, std::int64_t begin, std::int64_t end);
  std::int64_t steps() const { return adam_.steps(); }
  // "steps", and for Adam the moments "adam_m" and "adam_v" (values exact as doubles).
  void save(StateWriter& w) const;
  void load(const StateReader& r);

 private:
  OptimizerConfig cfg_;
  BasicAdam<T> adam_;  // Robbins-Monro uses only its step counter
  std::int64_t n_;
  T rm_step_ = 0;
};
using Optimizer = BasicOptimizer<float>;

extern template class BasicAdam<float>;
extern template class BasicAdam<double>;
extern template class BasicOptimizer<float>;
extern template class BasicOptimizer<double>;

}  // namespace caviar::engine
