#pragma once
// caviar's HDF5 layer: thin RAII over the C API, parallel row reads over MPI-IO, and atomic
// writers (temp file, then rename). The only code that includes <hdf5.h>. Every failure becomes a
// caviar::Error naming the file and dataset; collective functions agree on errors across ranks.
#include <Eigen/Core>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "comm/comm.hpp"
#include "core/partition.hpp"

namespace caviar::io {

using RowMatrix = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Dims = std::vector<std::uint64_t>;

// "FILE.h5:/group/dataset" or "FILE.h5" (then default_path).
struct DataRef {
  std::string file;
  std::string path;
  static DataRef parse(const std::string& spec, const std::string& default_path = "/X");
  std::string str() const { return file + ":" + path; }
};

// Collective: rank 0 checks that the dataset exists, is 2-D, numeric, non-empty and returns
// (rows, cols) on every rank; any problem is thrown on every rank. With allow_1d, a 1-D dataset of
// n values is accepted as n rows of one column (ndims 1), e.g. a sequence of symbols.
struct MatrixShape {
  std::int64_t rows = 0, cols = 0;
  int ndims = 2;
};
MatrixShape inspect_matrix(const Comm& comm, const DataRef& ref, bool allow_1d = false);

// Collective: every rank reads its rows [range.begin, range.end) as double, one hyperslab per
// rank over MPI-IO. Integer and float datasets, contiguous or chunked/compressed, are accepted.
RowMatrix read_rows(const Comm& comm, const DataRef& ref, const MatrixShape& shape, RowRange range);

// Collective: rank 0 checks that `out` can be created and is none of `inputs`; agreed by all.
void check_output_path(const Comm& comm, const std::string& out,
                       const std::vector<std::string>& inputs);

// Serial reads of small whole datasets and attributes (model files).
class FileReader {
 public:
  explicit FileReader(const std::string& path);
  ~FileReader();
  FileReader(const FileReader&) = delete;
  FileReader& operator=(const FileReader&) = delete;
  bool has(const std::string& name) const;
  // Whether the root group carries attribute `name` (optional provenance, e.g. heldout_score).
  bool has_attr(const std::string& name) const;
  std::vector<double> read(const std::string& name, Dims* dims = nullptr) const;
  std::string read_string_attr(const std::string& name) const;
  double read_double_attr(const std::string& name) const;
  // A 1-D dataset of strings (variable-length or fixed-length), e.g. a vocabulary.
  std::vector<std::string> read_strings(const std::string& name) const;

 private:
  std::string path_;
  std::int64_t file_ = -1;
};

// Serial atomic writer for one rank: writes into `path.tmp-caviar`, renamed over `path` by
// commit(). Destroyed without commit, the temp file is removed and `path` is left untouched.
class FileWriter {
 public:
  explicit FileWriter(const std::string& path);
  ~FileWriter();
  FileWriter(const FileWriter&) = delete;
  FileWriter& operator=(const FileWriter&) = delete;
  void write(const std::string& name, std::span<const double> data, const Dims& dims);
  void write(const std::string& name, std::span<const std::int64_t> data, const Dims& dims);
  void write_scalar(const std::string& name, double v) { write(name, std::span(&v, 1), {}); }
  // A 1-D dataset of variable-length UTF-8 strings (h5py reads it as bytes objects).
  void write_strings(const std::string& name, const std::vector<std::string>& strings);
  void attr(const std::string& name, double v);
  void attr(const std::string& name, std::int64_t v);
  void attr(const std::string& name, const std::string& v);
  void commit();

 private:
  std::string path_, tmp_;
  std::int64_t file_ = -1;
};

// Collective atomic writer of per-row outputs: each rank writes its own rows of each dataset
// with one hyperslab. commit() is collective; rank 0 renames when every rank has finished.
class ParallelRowWriter {
 public:
  ParallelRowWriter(const Comm& comm, const std::string& path);
  ~ParallelRowWriter();
  ParallelRowWriter(const ParallelRowWriter&) = delete;
  ParallelRowWriter& operator=(const ParallelRowWriter&) = delete;
  // Dataset of shape (global_rows, row_shape...); data holds this rank's range.size() rows,
  // row-major. row_shape {} gives a 1-D dataset.
  void write_rows(const std::string& name, std::int64_t global_rows, RowRange range,
                  const double* data, const Dims& row_shape);
  void write_rows(const std::string& name, std::int64_t global_rows, RowRange range,
                  const std::int64_t* data, const Dims& row_shape);
  // float32 on disk (e.g. images, VAE codes): half the bytes where double precision is not needed.
  void write_rows(const std::string& name, std::int64_t global_rows, RowRange range,
                  const float* data, const Dims& row_shape);
  // A dataset written in parts (e.g. a streamed pass, chunk by chunk): create_rows once, then
  // write_part any number of times, each rank its rows `range` of the dataset (data: range.size()
  // rows, row-major). Collective: every rank makes the same calls (a range may be empty).
  enum class Type { kDouble, kInt64, kFloat };
  void create_rows(const std::string& name, std::int64_t global_rows, const Dims& row_shape,
                   Type type);
  void write_part(const std::string& name, RowRange range, const double* data);
  void write_part(const std::string& name, RowRange range, const std::int64_t* data);
  // A dataset every rank holds the same copy of (dims[0] rows of dims[1..]): rank 0's is written.
  void write_global(const std::string& name, std::span<const double> data, const Dims& dims);
  // Collective: every rank passes the same value.
  void attr(const std::string& name, double v);
  void attr(const std::string& name, std::int64_t v);
  void attr(const std::string& name, const std::string& v);
  void commit();

 private:
  void write_impl(const std::string& name, std::int64_t global_rows, RowRange range,
                  const void* data, const Dims& row_shape, Type type);
  void part_impl(const std::string& name, RowRange range, const void* data, Type type);
  const Comm& comm_;
  std::string path_, tmp_;
  std::int64_t file_ = -1;
};

}  // namespace caviar::io
