#pragma once
// What the fit driver (gmm_driver.cpp) and the chain driver (gmm_sample_driver.cpp) share: where
// the rows come from, the data moments, the prior and the initial statistics. Internal to
// src/inference (no command includes it).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/partition.hpp"
#include "inference/gmm_driver.hpp"
#include "inference/shard.hpp"
#include "io/h5.hpp"
#include "io/h5_stream.hpp"
#include "models/gmm/gmm.hpp"

namespace caviar::gmm::driver {

using Eigen::MatrixXd;
using Eigen::VectorXd;

struct Moments {
  VectorXd mean;
  MatrixXd cov;      // unbiased (N - 1), as numpy.cov and scikit-learn's covariance_prior default
  VectorXd max_abs;  // max_n |x_nj - mean_j|: the bounds of the exact statistic sums
};

// Where a fit's rows come from: this rank's rows held in memory (a Shard), or read from the
// file on demand (--stream) through one open RowStream, so that only a chunk or a minibatch is
// ever in memory.
class Source {
 public:
  Source(const Comm& comm, const io::DataRef& ref, bool stream, std::int64_t chunk_rows)
      : comm_(comm), ref_(ref) {
    if (!stream) {
      shard_ = load_shard(comm, ref);
      shape_ = shard_.shape;
      range_ = shard_.range;
      return;
    }
    shape_ = io::inspect_matrix(comm, ref);
    if (shape_.rows < comm.size())
      throw Error(ref.str() + " has " + std::to_string(shape_.rows) + " rows, fewer than the " +
                  std::to_string(comm.size()) + " MPI ranks");
    range_ = partition_rows(shape_.rows, comm.size(), comm.rank());
    stream_ = std::make_unique<io::RowStream>(comm, ref, shape_);
    // Whole 256-row blocks of about 8 MB, so chunk boundaries never split a block.
    if (chunk_rows <= 0) chunk_rows = (8 << 20) / (8 * std::max<std::int64_t>(1, shape_.cols));
    chunk_rows_ = std::max<std::int64_t>(1, chunk_rows / kBlockRows) * kBlockRows;
  }

  bool streaming() const { return stream_ != nullptr; }
  const io::MatrixShape& shape() const { return shape_; }
  RowRange range() const { return range_; }
  const io::DataRef& ref() const { return ref_; }
  const RowMatrix& rows() const { return shard_.x; }  // in memory only
  const Shard& shard() const { return shard_; }

  // Calls f(x, first_global_row) over this rank's rows, chunk by chunk. f runs the same number of
  // times on every rank (with 0 rows where a rank has run out), so it may make collective calls.
  template <class F>
  void for_each_chunk(F&& f) const {
    if (!stream_) {
      f(shard_.x, range_.begin);
      return;
    }
    const std::int64_t mine = (range_.size() + chunk_rows_ - 1) / chunk_rows_;
    const std::int64_t chunks = comm_.allreduce_max(mine);
    for (std::int64_t c = 0; c < chunks; ++c) {
      const std::int64_t b = std::min(range_.end, range_.begin + c * chunk_rows_);
      const RowRange r{b, std::min(range_.end, b + chunk_rows_)};
      f(stream_->read_range(r), r.begin);
    }
  }

  // Collective: this rank's rows among the sorted global `rows` it owns.
  RowMatrix gather(const std::vector<std::int64_t>& rows) const {
    if (stream_) return stream_->read_rows(rows);
    RowMatrix x(static_cast<Eigen::Index>(rows.size()), shape_.cols);
    for (std::size_t i = 0; i < rows.size(); ++i)
      x.row(static_cast<Eigen::Index>(i)) = shard_.x.row(rows[i] - range_.begin);
    return x;
  }

 private:
  const Comm& comm_;
  io::DataRef ref_;
  Shard shard_;
  io::MatrixShape shape_;
  RowRange range_;
  std::unique_ptr<io::RowStream> stream_;
  std::int64_t chunk_rows_ = 0;
};

// Global mean (and, if asked, covariance) of the data, summed exactly (gmm_driver.cpp).
Moments data_moments(const Comm& comm, const Source& src, bool with_cov);
Prior make_prior(const FitOptions& o, int d, const Moments& mom);
// The statistics of the initial responsibilities, summed over ranks.
Stats initial_stats(const Comm& comm, const FitOptions& o, const std::string& init,
                    const Source& src, const Model& model, const Moments& mom);
// The start as recorded and fingerprinted: params:FILE, the --init value, or the default.
std::string resolve_init(const FitOptions& o);
// The files a fit or chain reads (data, start, held-out rows), after checking (collective) that
// --out and --labels name none of them and can be written.
std::vector<std::string> checked_inputs(const Comm& comm, const FitOptions& o,
                                        const io::DataRef& ref, const std::string& init);

}  // namespace caviar::gmm::driver
