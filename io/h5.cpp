#include "io/h5.hpp"

#include <hdf5.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <utility>

#include "comm/mpi_native.hpp"
#include "core/error.hpp"
#include "io/h5_handle.hpp"

static_assert(sizeof(hid_t) == sizeof(std::int64_t), "hid_t must be 64-bit (HDF5 >= 1.10)");

namespace caviar::io {

namespace {

// HDF5 prints its own error stack by default; caviar reports one line of its own instead.
void silence_hdf5() {
  static const bool done = [] {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    return true;
  }();
  (void)done;
}

using detail::check;
using detail::checked;
using detail::Handle;
using detail::link_exists;
using detail::open_file;

bool file_exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

std::string tmp_name(const std::string& path) {
  return path + ".tmp-caviar";
}

Handle open_dataset(hid_t file, const std::string& file_name, const std::string& path) {
  if (!link_exists(file, path)) throw Error("no dataset '" + path + "' in '" + file_name + "'");
  H5O_info_t info;
  if (H5Oget_info_by_name(file, path.c_str(), &info, H5P_DEFAULT) < 0 ||
      info.type != H5O_TYPE_DATASET)
    throw Error("'" + path + "' in '" + file_name + "' is not a dataset");
  return checked(H5Dopen2(file, path.c_str(), H5P_DEFAULT), H5Dclose,
                 "cannot open dataset '" + path + "' in '" + file_name + "'");
}

Dims dataset_dims(hid_t dset) {
  Handle space = checked(H5Dget_space(dset), H5Sclose, "cannot read dataspace");
  const int nd = H5Sget_simple_extent_ndims(space.get());
  if (nd < 0) throw Error("cannot read dataspace");
  std::vector<hsize_t> d(static_cast<std::size_t>(nd));
  H5Sget_simple_extent_dims(space.get(), d.data(), nullptr);
  return Dims(d.begin(), d.end());
}

// Creates intermediate groups on the way to a new link, like `mkdir -p`.
Handle link_create_plist() {
  Handle lcpl = checked(H5Pcreate(H5P_LINK_CREATE), H5Pclose, "H5Pcreate failed");
  H5Pset_create_intermediate_group(lcpl.get(), 1);
  return lcpl;
}

Handle simple_space(const Dims& dims) {
  if (dims.empty()) return checked(H5Screate(H5S_SCALAR), H5Sclose, "H5Screate failed");
  std::vector<hsize_t> d(dims.begin(), dims.end());
  return checked(H5Screate_simple(static_cast<int>(d.size()), d.data(), nullptr), H5Sclose,
                 "H5Screate_simple failed");
}

void write_dataset(hid_t file, const std::string& file_name, const std::string& name, hid_t type,
                   const void* data, const Dims& dims) {
  Handle lcpl = link_create_plist();
  Handle space = simple_space(dims);
  Handle dset = checked(
      H5Dcreate2(file, name.c_str(), type, space.get(), lcpl.get(), H5P_DEFAULT, H5P_DEFAULT),
      H5Dclose, "cannot create dataset '" + name + "' in '" + file_name + "'");
  check(H5Dwrite(dset.get(), type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data),
        "cannot write dataset '" + name + "' in '" + file_name + "'");
}

void write_attr(hid_t file, const std::string& name, hid_t type, const void* data) {
  Handle space = checked(H5Screate(H5S_SCALAR), H5Sclose, "H5Screate failed");
  if (H5Aexists(file, name.c_str()) > 0) H5Adelete(file, name.c_str());
  Handle a = checked(H5Acreate2(file, name.c_str(), type, space.get(), H5P_DEFAULT, H5P_DEFAULT),
                     H5Aclose, "cannot create attribute '" + name + "'");
  check(H5Awrite(a.get(), type, data), "cannot write attribute '" + name + "'");
}

Handle utf8_string_type() {
  Handle t = checked(H5Tcopy(H5T_C_S1), H5Tclose, "H5Tcopy failed");
  H5Tset_size(t.get(), H5T_VARIABLE);
  H5Tset_cset(t.get(), H5T_CSET_UTF8);
  return t;
}

}  // namespace

namespace detail {

Handle open_file(const std::string& path, hid_t fapl) {
  if (!file_exists(path)) throw Error("cannot open '" + path + "': no such file");
  if (H5Fis_hdf5(path.c_str()) <= 0)
    throw Error("'" + path + "' is not an HDF5 file (or is truncated/corrupt)");
  return checked(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl), H5Fclose,
                 "cannot open HDF5 file '" + path + "' (truncated or corrupt?)");
}

bool link_exists(hid_t file, const std::string& path) {
  std::size_t pos = 0;
  while (true) {
    pos = path.find('/', pos + 1);
    const std::string prefix = path.substr(0, pos);
    if (!prefix.empty() && prefix != "/" && H5Lexists(file, prefix.c_str(), H5P_DEFAULT) <= 0)
      return false;
    if (pos == std::string::npos) return true;
  }
}

}  // namespace detail

DataRef DataRef::parse(const std::string& spec, const std::string& default_path) {
  // The dataset path starts at the last ':' followed by '/', so file names may contain ':'.
  const auto pos = spec.rfind(":/");
  DataRef r;
  if (pos == std::string::npos) {
    r.file = spec;
    r.path = default_path;
  } else {
    r.file = spec.substr(0, pos);
    r.path = spec.substr(pos + 1);
  }
  if (r.file.empty()) throw Error("empty file name in '" + spec + "'");
  return r;
}

MatrixShape inspect_matrix(const Comm& comm, const DataRef& ref, bool allow_1d) {
  silence_hdf5();
  std::int64_t dims[3] = {0, 0, 2};
  std::string error;
  if (comm.is_root()) {
    try {
      Handle file = open_file(ref.file, H5P_DEFAULT);
      Handle dset = open_dataset(file.get(), ref.file, ref.path);
      Handle type = checked(H5Dget_type(dset.get()), H5Tclose, "cannot read dataset type");
      const H5T_class_t cls = H5Tget_class(type.get());
      if (cls != H5T_INTEGER && cls != H5T_FLOAT)
        throw Error("dataset " + ref.str() + " has a non-numeric type (need integer or float)");
      Dims d = dataset_dims(dset.get());
      if (allow_1d && d.size() == 1) {
        d.push_back(1);
        dims[2] = 1;
      }
      if (d.size() != 2)
        throw Error("dataset " + ref.str() + " is " + std::to_string(d.size()) +
                    (allow_1d ? "-D; expected a 1-D or 2-D array"
                              : "-D; expected a 2-D (rows x features) array"));
      if (d[0] == 0 || d[1] == 0)
        throw Error("dataset " + ref.str() + " is empty (" + std::to_string(d[0]) + " x " +
                    std::to_string(d[1]) + ")");
      dims[0] = static_cast<std::int64_t>(d[0]);
      dims[1] = static_cast<std::int64_t>(d[1]);
    } catch (const Error& e) {
      error = e.what();
    }
  }
  // Only rank 0 can have failed: broadcast its outcome instead of an allreduce of flags.
  comm.broadcast(error, 0);
  if (!error.empty()) throw Error(error);
  comm.broadcast(std::span<std::int64_t>(dims, 3), 0);
  return {dims[0], dims[1], static_cast<int>(dims[2])};
}

namespace {
// Transparent huge pages for a large shard, asked for before its pages are first written: black-box
// VI's minibatch rows are scattered over the whole array, and with 4 KiB pages nearly every row
// also missed the TLB. Advice only: where huge pages are disabled nothing changes.
void advise_huge_pages(void* p, std::size_t bytes) {
  constexpr std::uintptr_t kPage = 4096, kHuge = std::uintptr_t{2} << 20;
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  const std::uintptr_t begin = (a + kPage - 1) / kPage * kPage, end = (a + bytes) / kPage * kPage;
  if (end > begin + kHuge) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
}
}  // namespace

RowMatrix read_rows(const Comm& comm, const DataRef& ref, const MatrixShape& shape,
                    RowRange range) {
  silence_hdf5();
  RowMatrix out(range.size(), shape.cols);
  advise_huge_pages(out.data(), static_cast<std::size_t>(out.size()) * sizeof(double));
  comm.agree([&] {
    Handle fapl = checked(H5Pcreate(H5P_FILE_ACCESS), H5Pclose, "H5Pcreate failed");
    check(H5Pset_fapl_mpio(fapl.get(), native(comm), MPI_INFO_NULL), "H5Pset_fapl_mpio failed");
    Handle file = open_file(ref.file, fapl.get());
    Handle dset = open_dataset(file.get(), ref.file, ref.path);
    Handle fspace = checked(H5Dget_space(dset.get()), H5Sclose, "cannot read dataspace");
    const hsize_t count[2] = {static_cast<hsize_t>(range.size()), static_cast<hsize_t>(shape.cols)};
    Handle mspace = checked(H5Screate_simple(2, count, nullptr), H5Sclose, "H5Screate failed");
    if (range.size() > 0) {
      // A 1-D dataset selects range.size() values into the range.size() x 1 memory block.
      const hsize_t start[2] = {static_cast<hsize_t>(range.begin), 0};
      check(H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start, nullptr, count, nullptr),
            "cannot select rows of " + ref.str());
    } else {
      H5Sselect_none(fspace.get());
      H5Sselect_none(mspace.get());
    }
    Handle dxpl = checked(H5Pcreate(H5P_DATASET_XFER), H5Pclose, "H5Pcreate failed");
    H5Pset_dxpl_mpio(dxpl.get(), H5FD_MPIO_COLLECTIVE);
    check(
        H5Dread(dset.get(), H5T_NATIVE_DOUBLE, mspace.get(), fspace.get(), dxpl.get(), out.data()),
        "cannot read rows of " + ref.str() + " (corrupt file?)");
  });
  return out;
}

void check_output_path(const Comm& comm, const std::string& out,
                       const std::vector<std::string>& inputs) {
  std::string error;
  if (comm.is_root()) {
    namespace fs = std::filesystem;
    std::error_code ec;
    for (const auto& in : inputs) {
      if (fs::exists(out, ec) && fs::exists(in, ec) && fs::equivalent(out, in, ec)) {
        error = "output '" + out + "' is the same file as input '" + in + "'";
        break;
      }
    }
    if (error.empty()) {
      const std::string tmp = tmp_name(out);
      std::FILE* f = std::fopen(tmp.c_str(), "w");
      if (!f) {
        error = "cannot write output '" + out + "': " + std::strerror(errno);
      } else {
        std::fclose(f);
        std::remove(tmp.c_str());
      }
    }
  }
  comm.broadcast(error, 0);
  if (!error.empty()) throw Error(error);
}

// ---------------------------------------------------------------------------------------------

FileReader::FileReader(const std::string& path) : path_(path) {
  silence_hdf5();
  file_ = open_file(path, H5P_DEFAULT).release();  // closed in the destructor
}

FileReader::~FileReader() {
  if (file_ >= 0) H5Fclose(file_);
}

bool FileReader::has(const std::string& name) const {
  return link_exists(file_, name);
}

bool FileReader::has_attr(const std::string& name) const {
  return H5Aexists(file_, name.c_str()) > 0;
}

std::vector<double> FileReader::read(const std::string& name, Dims* dims) const {
  Handle dset = open_dataset(file_, path_, name);
  const Dims d = dataset_dims(dset.get());
  std::size_t n = 1;
  for (auto v : d) n *= v;
  detail::check_stored(dset.get(), n, "'" + name + "' in '" + path_ + "'");
  std::vector<double> out(n);
  if (n > 0)
    check(H5Dread(dset.get(), H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()),
          "cannot read '" + name + "' from '" + path_ + "'");
  if (dims) *dims = d;
  return out;
}

std::string FileReader::read_string_attr(const std::string& name) const {
  if (H5Aexists(file_, name.c_str()) <= 0)
    throw Error("'" + path_ + "' has no attribute '" + name + "'");
  Handle a = checked(H5Aopen(file_, name.c_str(), H5P_DEFAULT), H5Aclose, "H5Aopen failed");
  detail::check_single(a.get(), "attribute '" + name + "' of '" + path_ + "'");
  Handle type = utf8_string_type();
  char* s = nullptr;
  check(H5Aread(a.get(), type.get(), &s), "cannot read attribute '" + name + "'");
  std::string out = s ? s : "";
  H5free_memory(s);
  return out;
}

double FileReader::read_double_attr(const std::string& name) const {
  if (H5Aexists(file_, name.c_str()) <= 0)
    throw Error("'" + path_ + "' has no attribute '" + name + "'");
  Handle a = checked(H5Aopen(file_, name.c_str(), H5P_DEFAULT), H5Aclose, "H5Aopen failed");
  detail::check_single(a.get(), "attribute '" + name + "' of '" + path_ + "'");
  double v = 0;
  check(H5Aread(a.get(), H5T_NATIVE_DOUBLE, &v), "cannot read attribute '" + name + "'");
  return v;
}

std::vector<std::string> FileReader::read_strings(const std::string& name) const {
  Handle dset = open_dataset(file_, path_, name);
  const Dims d = dataset_dims(dset.get());
  if (d.size() != 1) throw Error("'" + name + "' in '" + path_ + "' is not a 1-D dataset");
  Handle ftype = checked(H5Dget_type(dset.get()), H5Tclose, "cannot read dataset type");
  if (H5Tget_class(ftype.get()) != H5T_STRING)
    throw Error("'" + name + "' in '" + path_ + "' is not a string dataset");
  const std::size_t n = d[0];
  detail::check_stored(dset.get(), n, "'" + name + "' in '" + path_ + "'");
  std::vector<std::string> out(n);
  if (n == 0) return out;
  if (H5Tis_variable_str(ftype.get()) > 0) {
    Handle type = utf8_string_type();
    std::vector<char*> p(n, nullptr);
    check(H5Dread(dset.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, p.data()),
          "cannot read '" + name + "' from '" + path_ + "'");
    for (std::size_t i = 0; i < n; ++i) out[i] = p[i] ? p[i] : "";
    Handle space = checked(H5Dget_space(dset.get()), H5Sclose, "cannot read dataspace");
    H5Dvlen_reclaim(type.get(), space.get(), H5P_DEFAULT, p.data());
  } else {
    const std::size_t width = H5Tget_size(ftype.get());
    Handle type = checked(H5Tcopy(ftype.get()), H5Tclose, "H5Tcopy failed");
    std::vector<char> buf(n * width);
    check(H5Dread(dset.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()),
          "cannot read '" + name + "' from '" + path_ + "'");
    for (std::size_t i = 0; i < n; ++i) {
      const char* s = buf.data() + i * width;
      out[i].assign(s, strnlen(s, width));
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------

FileWriter::FileWriter(const std::string& path) : path_(path), tmp_(tmp_name(path)) {
  silence_hdf5();
  file_ = H5Fcreate(tmp_.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (file_ < 0) throw Error("cannot create output '" + path_ + "'");
}

FileWriter::~FileWriter() {
  if (file_ >= 0) {
    H5Fclose(file_);
    std::remove(tmp_.c_str());
  }
}

void FileWriter::write(const std::string& name, std::span<const double> data, const Dims& dims) {
  write_dataset(file_, path_, name, H5T_NATIVE_DOUBLE, data.data(), dims);
}

void FileWriter::write(const std::string& name, std::span<const std::int64_t> data,
                       const Dims& dims) {
  write_dataset(file_, path_, name, H5T_NATIVE_INT64, data.data(), dims);
}

void FileWriter::write_strings(const std::string& name, const std::vector<std::string>& strings) {
  Handle type = utf8_string_type();
  std::vector<const char*> p(strings.size());
  for (std::size_t i = 0; i < strings.size(); ++i) p[i] = strings[i].c_str();
  write_dataset(file_, path_, name, type.get(), p.data(), {strings.size()});
}

void FileWriter::attr(const std::string& name, double v) {
  write_attr(file_, name, H5T_NATIVE_DOUBLE, &v);
}

void FileWriter::attr(const std::string& name, std::int64_t v) {
  write_attr(file_, name, H5T_NATIVE_INT64, &v);
}

void FileWriter::attr(const std::string& name, const std::string& v) {
  Handle type = utf8_string_type();
  const char* p = v.c_str();
  write_attr(file_, name, type.get(), &p);
}

void FileWriter::commit() {
  const hid_t f = std::exchange(file_, -1);
  if (H5Fclose(f) < 0) {
    std::remove(tmp_.c_str());
    throw Error("cannot finish writing '" + path_ + "'");
  }
  if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(tmp_.c_str());
    throw Error("cannot move output into place at '" + path_ + "': " + why);
  }
}

// ---------------------------------------------------------------------------------------------

ParallelRowWriter::ParallelRowWriter(const Comm& comm, const std::string& path)
    : comm_(comm), path_(path), tmp_(tmp_name(path)) {
  silence_hdf5();
  comm_.agree([&] {
    Handle fapl = checked(H5Pcreate(H5P_FILE_ACCESS), H5Pclose, "H5Pcreate failed");
    check(H5Pset_fapl_mpio(fapl.get(), native(comm_), MPI_INFO_NULL), "H5Pset_fapl_mpio failed");
    file_ = H5Fcreate(tmp_.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get());
    if (file_ < 0) throw Error("cannot create output '" + path_ + "'");
  });
}

ParallelRowWriter::~ParallelRowWriter() {
  if (file_ >= 0) {
    H5Fclose(file_);
    if (comm_.is_root()) std::remove(tmp_.c_str());
  }
}

void ParallelRowWriter::write_rows(const std::string& name, std::int64_t global_rows,
                                   RowRange range, const double* data, const Dims& row_shape) {
  write_impl(name, global_rows, range, data, row_shape, Type::kDouble);
}

void ParallelRowWriter::write_rows(const std::string& name, std::int64_t global_rows,
                                   RowRange range, const std::int64_t* data,
                                   const Dims& row_shape) {
  write_impl(name, global_rows, range, data, row_shape, Type::kInt64);
}

void ParallelRowWriter::write_rows(const std::string& name, std::int64_t global_rows,
                                   RowRange range, const float* data, const Dims& row_shape) {
  write_impl(name, global_rows, range, data, row_shape, Type::kFloat);
}

void ParallelRowWriter::write_global(const std::string& name, std::span<const double> data,
                                     const Dims& dims) {
  if (dims.empty()) throw Error("write_global: '" + name + "' needs at least one dimension");
  const auto rows = static_cast<std::int64_t>(dims[0]);
  const RowRange range = comm_.is_root() ? RowRange{0, rows} : RowRange{0, 0};
  write_impl(name, rows, range, data.data(), Dims(dims.begin() + 1, dims.end()), Type::kDouble);
}

void ParallelRowWriter::attr(const std::string& name, double v) {
  comm_.agree([&] { write_attr(file_, name, H5T_NATIVE_DOUBLE, &v); });
}

void ParallelRowWriter::attr(const std::string& name, std::int64_t v) {
  comm_.agree([&] { write_attr(file_, name, H5T_NATIVE_INT64, &v); });
}

void ParallelRowWriter::attr(const std::string& name, const std::string& v) {
  comm_.agree([&] {
    Handle type = utf8_string_type();
    const char* p = v.c_str();
    write_attr(file_, name, type.get(), &p);
  });
}

void ParallelRowWriter::write_impl(const std::string& name, std::int64_t global_rows,
                                   RowRange range, const void* data, const Dims& row_shape,
                                   Type dtype) {
  create_rows(name, global_rows, row_shape, dtype);
  part_impl(name, range, data, dtype);
}

namespace {
hid_t native_type(ParallelRowWriter::Type t) {
  return t == ParallelRowWriter::Type::kInt64   ? H5T_NATIVE_INT64
         : t == ParallelRowWriter::Type::kFloat ? H5T_NATIVE_FLOAT
                                                : H5T_NATIVE_DOUBLE;
}
}  // namespace

void ParallelRowWriter::create_rows(const std::string& name, std::int64_t global_rows,
                                    const Dims& row_shape, Type dtype) {
  comm_.agree([&] {
    std::vector<hsize_t> gdims{static_cast<hsize_t>(global_rows)};
    for (auto v : row_shape) gdims.push_back(v);
    Handle fspace = checked(H5Screate_simple(static_cast<int>(gdims.size()), gdims.data(), nullptr),
                            H5Sclose, "H5Screate failed");
    Handle lcpl = link_create_plist();
    Handle dset = checked(H5Dcreate2(file_, name.c_str(), native_type(dtype), fspace.get(),
                                     lcpl.get(), H5P_DEFAULT, H5P_DEFAULT),
                          H5Dclose, "cannot create dataset '" + name + "' in '" + path_ + "'");
  });
}

void ParallelRowWriter::write_part(const std::string& name, RowRange range, const double* data) {
  part_impl(name, range, data, Type::kDouble);
}

void ParallelRowWriter::write_part(const std::string& name, RowRange range,
                                   const std::int64_t* data) {
  part_impl(name, range, data, Type::kInt64);
}

void ParallelRowWriter::part_impl(const std::string& name, RowRange range, const void* data,
                                  Type dtype) {
  comm_.agree([&] {
    Handle dset = checked(H5Dopen2(file_, name.c_str(), H5P_DEFAULT), H5Dclose,
                          "cannot open dataset '" + name + "' in '" + path_ + "'");
    Handle fspace = checked(H5Dget_space(dset.get()), H5Sclose, "cannot read dataspace");
    const int rank = H5Sget_simple_extent_ndims(fspace.get());
    std::vector<hsize_t> count(static_cast<std::size_t>(std::max(rank, 1))), start(count.size());
    H5Sget_simple_extent_dims(fspace.get(), count.data(), nullptr);
    count[0] = static_cast<hsize_t>(range.size());
    start[0] = static_cast<hsize_t>(range.begin);
    Handle mspace =
        checked(H5Screate_simple(rank, count.data(), nullptr), H5Sclose, "H5Screate failed");
    if (range.size() > 0) {
      check(H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(),
                                nullptr),
            "cannot select rows of '" + name + "'");
    } else {
      H5Sselect_none(fspace.get());
      H5Sselect_none(mspace.get());
    }
    Handle dxpl = checked(H5Pcreate(H5P_DATASET_XFER), H5Pclose, "H5Pcreate failed");
    H5Pset_dxpl_mpio(dxpl.get(), H5FD_MPIO_COLLECTIVE);
    check(H5Dwrite(dset.get(), native_type(dtype), mspace.get(), fspace.get(), dxpl.get(), data),
          "cannot write '" + name + "' to '" + path_ + "'");
  });
}

void ParallelRowWriter::commit() {
  const hid_t f = std::exchange(file_, -1);
  const herr_t rc = H5Fclose(f);  // collective
  std::string error = rc < 0 ? "cannot finish writing '" + path_ + "'" : "";
  comm_.raise_if_any(error);
  if (comm_.is_root() && std::rename(tmp_.c_str(), path_.c_str()) != 0) {
    error = "cannot move output into place at '" + path_ + "': " + std::strerror(errno);
    std::remove(tmp_.c_str());
  }
  comm_.broadcast(error, 0);
  if (!error.empty()) throw Error(error);
}

}  // namespace caviar::io
