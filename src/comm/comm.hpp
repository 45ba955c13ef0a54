#pragma once
// The communication layer: an RAII MPI environment and a communicator that models never see.
// Drivers call one allreduce of one contiguous buffer per step. This header does not include
// <mpi.h>; only comm.cpp (and io/, through mpi_native.hpp) do.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/int128.hpp"

namespace caviar {

// Initialises MPI (thread level FUNNELED: only the main thread calls MPI) and finalises it on
// destruction. Exactly one per program, created first thing in main.
class Environment {
 public:
  Environment(int& argc, char**& argv);
  ~Environment();
  Environment(const Environment&) = delete;
  Environment& operator=(const Environment&) = delete;
};

class Comm {
 public:
  // Borrowed handles: never freed by Comm.
  static Comm world();
  static Comm self();
  Comm(Comm&& other) noexcept;
  Comm& operator=(Comm&& other) noexcept;
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;
  ~Comm();

  int rank() const { return rank_; }
  int size() const { return size_; }
  bool is_root() const { return rank_ == 0; }

  // In-place element-wise sums over all ranks. A single rank returns at once.
  void allreduce_sum(std::span<double> buf) const;
  void allreduce_sum(std::span<std::int64_t> buf) const;
  // Exact integer sums (the reduction of ExactSum, core/exact_sum.hpp): any reduction order gives
  // the same bits, so results do not depend on the rank count.
  void allreduce_sum(std::span<Int128> buf) const;
  double allreduce_max(double v) const;
  void allreduce_max(std::span<double> buf) const;  // element-wise, in place
  // In-place element-wise bitwise or (e.g. the union of per-rank sets held as bitmaps).
  void allreduce_or(std::span<std::uint64_t> buf) const;
  std::int64_t allreduce_min(std::int64_t v) const;
  std::int64_t allreduce_max(std::int64_t v) const;
  void broadcast(std::span<double> buf, int root) const;
  void broadcast(std::span<std::int64_t> buf, int root) const;
  void broadcast(std::string& s, int root) const;
  // Every rank gets every rank's value, in rank order.
  std::vector<double> allgather(double v) const;
  std::vector<std::int64_t> allgather(std::int64_t v) const;
  // Concatenates every rank's `mine` in rank order (sizes may differ), on every rank.
  std::vector<double> allgatherv(std::span<const double> mine) const;
  // The same when every rank already knows every rank's size (counts, in rank order): no
  // exchange of the sizes first.
  std::vector<double> allgatherv(std::span<const double> mine,
                                 std::span<const std::int64_t> counts) const;
  // The same concatenation on `root` only (empty elsewhere): for a checkpoint that rank 0 writes.
  std::vector<double> gatherv(std::span<const double> mine, int root) const;
  void barrier() const;

  // Wall seconds this process has spent inside allreduce calls (any communicator), waiting for
  // slower ranks included: the allreduce share of the performance reports (docs/performance.md).
  static double allreduce_seconds();

  // Error agreement: every rank passes its own error message ("" for none). If any rank has one,
  // every rank throws the same Error, carrying the message of the lowest failing rank. Call it at
  // every point where one rank can fail alone, so that no rank is left waiting in a collective.
  void raise_if_any(const std::string& local_error) const;

  // Runs f and agrees on its outcome: a caviar::Error on any rank becomes one on every rank.
  template <class F>
  void agree(F&& f) const {
    std::string message;
    try {
      f();
    } catch (const Error& e) {
      message = e.what();
      if (message.empty()) message = "unknown error";
    }
    raise_if_any(message);
  }

  // Runs f on rank 0 only (e.g. writing a small file) and agrees on its outcome: a caviar::Error
  // there becomes the same Error on every rank.
  template <class F>
  void on_root(F&& f) const {
    agree([&] {
      if (is_root()) f();
    });
  }

  // Opaque handle for io/ (see mpi_native.hpp).
  const void* native_handle() const { return &handle_; }

 private:
  explicit Comm(std::uint64_t handle, bool owned);
  std::uint64_t handle_ = 0;  // MPI_Comm stored as bytes, so that <mpi.h> stays out of headers
  bool owned_ = false;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace caviar
