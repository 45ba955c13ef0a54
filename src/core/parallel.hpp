#pragma once
// The home of OpenMP. Models describe work per block of rows; this file decides how blocks map to
// threads. Exceptions thrown inside a parallel region are captured and rethrown after it, since
// an exception escaping an OpenMP region terminates the program.
#include <omp.h>

#include <cstdint>
#include <exception>
#include <mutex>

namespace caviar {

inline int max_threads() {
  return omp_get_max_threads();
}

namespace detail {
// Keeps the first exception thrown by any block of a parallel region, to rethrow after it.
class FirstError {
 public:
  template <class F>
  void run(F&& f) noexcept {
    try {
      f();
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error_) error_ = std::current_exception();
    }
  }
  void rethrow() const {
    if (error_) std::rethrow_exception(error_);
  }

 private:
  std::exception_ptr error_;
  std::mutex mutex_;
};
}  // namespace detail

// Calls body(thread_id, block_begin, block_end) for consecutive blocks of `block` items in
// [0, n). Static schedule: a block's thread is a function of (n, block, thread count) only.
template <class Body>
void parallel_blocks(std::int64_t n, std::int64_t block, int n_threads, Body&& body) {
  const std::int64_t n_blocks = (n + block - 1) / block;
  detail::FirstError error;
#pragma omp parallel for schedule(static) num_threads(n_threads)
  for (std::int64_t b = 0; b < n_blocks; ++b)
    error.run([&] { body(omp_get_thread_num(), b * block, std::min(n, (b + 1) * block)); });
  error.rethrow();
}

// As parallel_blocks, but blocks go to whichever thread is free (schedule(dynamic)): for blocks of
// very unequal cost, such as documents of different lengths. Which thread runs a block is then not
// reproducible, so the body's results must not depend on it (e.g. integer sums, per-item outputs).
template <class Body>
void parallel_blocks_dynamic(std::int64_t n, std::int64_t block, int n_threads, Body&& body) {
  const std::int64_t n_blocks = (n + block - 1) / block;
  detail::FirstError error;
#pragma omp parallel for schedule(dynamic, 1) num_threads(n_threads)
  for (std::int64_t b = 0; b < n_blocks; ++b)
    error.run([&] { body(omp_get_thread_num(), b * block, std::min(n, (b + 1) * block)); });
  error.rethrow();
}

}  // namespace caviar
