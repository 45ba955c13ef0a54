#pragma once
// Per-thread scratch memory that only grows, for kernels called very often on small inputs: the
// draws driver calls a model once per group of rows, and with N >> B most groups hold one row,
// where allocating a kernel's temporaries at every call cost more than their arithmetic. Each tag
// type names its own buffer; Eigen's allocator aligns it as a fresh Eigen matrix would be.
#include <Eigen/Core>
#include <cstddef>
#include <vector>

namespace caviar {

template <class Tag>
double* thread_scratch(std::size_t n) {
  thread_local std::vector<double, Eigen::aligned_allocator<double>> buf;
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}

}  // namespace caviar
