#include "io/h5_stream.hpp"

#include <hdf5.h>

#include <vector>

#include "comm/mpi_native.hpp"
#include "core/error.hpp"
#include "io/h5_handle.hpp"

namespace caviar::io {

namespace {

using detail::check;
using detail::Handle;

}  // namespace

RowStream::RowStream(const Comm& comm, const DataRef& ref, MatrixShape shape)
    : comm_(comm), ref_(ref), shape_(shape) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  comm.agree([&] {
    Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
    check(H5Pset_fapl_mpio(fapl.get(), native(comm), MPI_INFO_NULL), "H5Pset_fapl_mpio failed");
    file_ = H5Fopen(ref.file.c_str(), H5F_ACC_RDONLY, fapl.get());
    if (file_ < 0) throw Error("cannot open HDF5 file '" + ref.file + "'");
    dset_ = H5Dopen2(file_, ref.path.c_str(), H5P_DEFAULT);
    if (dset_ < 0) throw Error("cannot open dataset " + ref.str());
  });
}

RowStream::~RowStream() {
  if (dset_ >= 0) H5Dclose(dset_);
  if (file_ >= 0) H5Fclose(file_);
}

RowMatrix RowStream::read_range(RowRange range) const {
  std::vector<std::int64_t> none;
  RowMatrix out(range.size(), shape_.cols);
  comm_.agree([&] {
    Handle fspace(H5Dget_space(dset_), H5Sclose);
    // A 1-D dataset selects range.size() values into the range.size() x 1 memory block.
    const hsize_t count[2] = {static_cast<hsize_t>(range.size()),
                              static_cast<hsize_t>(shape_.cols)};
    Handle mspace(H5Screate_simple(2, count, nullptr), H5Sclose);
    if (range.size() > 0) {
      const hsize_t start[2] = {static_cast<hsize_t>(range.begin), 0};
      check(H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start, nullptr, count, nullptr),
            "cannot select rows of " + ref_.str());
    } else {
      H5Sselect_none(fspace.get());
      H5Sselect_none(mspace.get());
    }
    Handle dxpl(H5Pcreate(H5P_DATASET_XFER), H5Pclose);
    H5Pset_dxpl_mpio(dxpl.get(), H5FD_MPIO_COLLECTIVE);
    check(H5Dread(dset_, H5T_NATIVE_DOUBLE, mspace.get(), fspace.get(), dxpl.get(), out.data()),
          "cannot read rows of " + ref_.str());
  });
  return out;
}

RowMatrix RowStream::read_rows(std::span<const std::int64_t> rows) const {
  RowMatrix out(static_cast<Eigen::Index>(rows.size()), shape_.cols);
  comm_.agree([&] {
    Handle fspace(H5Dget_space(dset_), H5Sclose);
    const hsize_t mcount[2] = {static_cast<hsize_t>(rows.size()),
                               static_cast<hsize_t>(shape_.cols)};
    Handle mspace(H5Screate_simple(2, mcount, nullptr), H5Sclose);
    // One point selection of every (row, column): linear in its size, whereas OR-ing thousands
    // of one-row hyperslabs is quadratic in HDF5 (measured: ~28 s per 20000-row step). Points are
    // read in the order listed, into the contiguous memory block.
    if (rows.empty()) {
      H5Sselect_none(fspace.get());
      H5Sselect_none(mspace.get());
    } else {
      // A 1-D dataset (ndims 1: n values as n rows of one column) has one coordinate per point.
      const std::size_t rank = shape_.ndims == 1 ? 1 : 2;
      std::vector<hsize_t> coords;
      coords.reserve(rows.size() * static_cast<std::size_t>(shape_.cols) * rank);
      for (std::size_t i = 0; i < rows.size(); ++i) {
        if (rows[i] < 0 || rows[i] >= shape_.rows || (i > 0 && rows[i] <= rows[i - 1]))
          throw Error("internal: row selection out of range or unsorted in " + ref_.str());
        for (std::int64_t j = 0; j < shape_.cols; ++j) {
          coords.push_back(static_cast<hsize_t>(rows[i]));
          if (rank == 2) coords.push_back(static_cast<hsize_t>(j));
        }
      }
      check(H5Sselect_elements(fspace.get(), H5S_SELECT_SET, coords.size() / rank, coords.data()),
            "cannot select rows of " + ref_.str());
    }
    Handle dxpl(H5Pcreate(H5P_DATASET_XFER), H5Pclose);
    H5Pset_dxpl_mpio(dxpl.get(), H5FD_MPIO_COLLECTIVE);
    check(H5Dread(dset_, H5T_NATIVE_DOUBLE, mspace.get(), fspace.get(), dxpl.get(), out.data()),
          "cannot read rows of " + ref_.str());
  });
  return out;
}

}  // namespace caviar::io
