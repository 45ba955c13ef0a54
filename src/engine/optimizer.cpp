#include "engine/optimizer.hpp"

#include <algorithm>
#include <cmath>

#include "core/error.hpp"

namespace caviar::engine {

template <class T>
void BasicAdam<T>::begin_step() {
  ++t_;
  const double bc1 = 1.0 - std::pow(cfg_.beta1, static_cast<double>(t_));
  const double bc2 = 1.0 - std::pow(cfg_.beta2, static_cast<double>(t_));
  step_size_ = static_cast<T>(cfg_.lr / bc1);
  inv_sqrt_bc2_ = static_cast<T>(1.0 / std::sqrt(bc2));
}

template <class T>
void BasicAdam<T>::update(T* p, const T* g, std::int64_t begin, std::int64_t end) {
  const T b1 = static_cast<T>(cfg_.beta1), b2 = static_cast<T>(cfg_.beta2);
  const T eps = static_cast<T>(cfg_.eps), wd = static_cast<T>(cfg_.weight_decay);
  // Eigen array expressions, so that sqrt and division are vectorised (element-wise IEEE
  // operations: the vector and scalar paths round identically).
  using Array = Eigen::Array<T, Eigen::Dynamic, 1>;
  using Arr = Eigen::Map<Array>;
  const Eigen::Index n = static_cast<Eigen::Index>(end - begin);
  Arr pa(p + begin, n), m(m_.data() + begin, n), v(v_.data() + begin, n);
  const Eigen::Map<const Array> ga(g + begin, n);
  for (Eigen::Index k = 0; k < n; k += 1024) {  // 1024 at a time: the temporaries stay in L1
    const Eigen::Index len = std::min<Eigen::Index>(1024, n - k);
    auto pk = pa.segment(k, len);
    auto mk = m.segment(k, len);
    auto vk = v.segment(k, len);
    // L2 weight decay: the gradient of wd/2 |theta|^2 is added to g.
    const Array gi = ga.segment(k, len) + wd * pk;
    mk = b1 * mk + (T(1) - b1) * gi;
    vk = b2 * vk + (T(1) - b2) * gi * gi;
    pk -= step_size_ * mk / (vk.sqrt() * inv_sqrt_bc2_ + eps);
  }
}

Method parse_method(const std::string& s) {
  if (s == "adam") return Method::kAdam;
  if (s == "robbins-monro") return Method::kRobbinsMonro;
  throw Error("--optimizer must be adam or robbins-monro, got '" + s + "'");
}

template <class T>
void BasicOptimizer<T>::begin_step() {
  if (cfg_.method == Method::kAdam) return adam_.begin_step();
  adam_.set_steps(adam_.steps() + 1);
  const double t = static_cast<double>(adam_.steps());
  rm_step_ = static_cast<T>(cfg_.adam.lr * std::pow(cfg_.tau0 + t, -cfg_.kappa));
}

template <class T>
void BasicOptimizer<T>::update(T* p, const T* g, std::int64_t begin, std::int64_t end) {
  if (cfg_.method == Method::kAdam) return adam_.update(p, g, begin, end);
  const T wd = static_cast<T>(cfg_.adam.weight_decay);
  for (std::int64_t i = begin; i < end; ++i) p[i] -= rm_step_ * (g[i] + wd * p[i]);
}

template <class T>
void BasicOptimizer<T>::save(StateWriter& w) const {
  w.attr("steps", adam_.steps());
  if (cfg_.method != Method::kAdam) return;
  const Dims dims{static_cast<std::uint64_t>(n_)};
  w.array("adam_m", std::vector<double>(adam_.m().begin(), adam_.m().end()), dims);
  w.array("adam_v", std::vector<double>(adam_.v().begin(), adam_.v().end()), dims);
}

template <class T>
void BasicOptimizer<T>::load(const StateReader& r) {
  adam_.set_steps(r.attr_int("steps", 0, kMaxCount, "the checkpoint's optimiser steps"));
  if (cfg_.method != Method::kAdam) return;
  const Dims dims{static_cast<std::uint64_t>(n_)};
  const std::vector<double> m = r.array("adam_m", dims), v = r.array("adam_v", dims);
  std::copy(m.begin(), m.end(), adam_.m().begin());
  std::copy(v.begin(), v.end(), adam_.v().begin());
  // The Robbins-Monro step size is recomputed by the next begin_step(); Adam's likewise.
}

template class BasicAdam<float>;
template class BasicAdam<double>;
template class BasicOptimizer<float>;
template class BasicOptimizer<double>;

}  // namespace caviar::engine
