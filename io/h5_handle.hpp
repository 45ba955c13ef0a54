#pragma once
// Internal to io/: RAII ownership of HDF5 identifiers, shared by the readers and writers in
// h5.cpp, h5_stream.cpp and csr.cpp. Includes <hdf5.h>, so only io/ sources may include it.
#include <hdf5.h>

#include <string>
#include <utility>

#include "core/error.hpp"

namespace caviar::io::detail {

// Owns one HDF5 identifier and closes it with the matching H5?close.
class Handle {
 public:
  Handle() = default;
  Handle(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  Handle(Handle&& o) noexcept : id_(std::exchange(o.id_, -1)), close_(o.close_) {}
  Handle& operator=(Handle&& o) noexcept {
    reset();
    id_ = std::exchange(o.id_, -1);
    close_ = o.close_;
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() { reset(); }
  void reset() {
    if (id_ >= 0 && close_) close_(id_);
    id_ = -1;
  }
  hid_t get() const { return id_; }
  hid_t release() { return std::exchange(id_, -1); }

 private:
  hid_t id_ = -1;
  herr_t (*close_)(hid_t) = nullptr;
};

// An identifier from an H5*create/open call, owned; a negative one throws `what`.
inline Handle checked(hid_t id, herr_t (*close)(hid_t), const std::string& what) {
  if (id < 0) throw Error(what);
  return Handle(id, close);
}

// A status from an HDF5 call; a negative one throws `what`.
inline void check(herr_t rc, const std::string& what) {
  if (rc < 0) throw Error(what);
}

// An attribute read into one value must hold exactly one: H5Aread writes every element it holds
// (an array attribute overflowed the reader's variable).
inline void check_single(hid_t attr, const std::string& what) {
  Handle space = checked(H5Aget_space(attr), H5Sclose, "cannot read the dataspace of " + what);
  if (H5Sget_simple_extent_npoints(space.get()) != 1) throw Error(what + " is not a single value");
}

// A dataset of n > 0 elements must hold them: one whose storage is not allocated (a chunked
// dataset whose chunks were never written, a truncated file) reads as the fill value whatever
// size it declares, so its size is no ground for allocating memory. Refused before reading.
inline void check_stored(hid_t dset, unsigned long long n, const std::string& what) {
  H5D_space_status_t status;
  if (n > 0 && (H5Dget_space_status(dset, &status) < 0 || status != H5D_SPACE_STATUS_ALLOCATED))
    throw Error(what + " declares " + std::to_string(n) +
                " elements but the file does not hold their data (truncated or incomplete file?)");
}

// Opens an existing file read-only; `fapl` selects serial or MPI-IO access. A missing file, a
// file that is not HDF5 and a corrupt one each throw their own one-line message.
Handle open_file(const std::string& path, hid_t fapl);

// Does `path` name an existing link, checking every intermediate group (H5Lexists needs that).
bool link_exists(hid_t file, const std::string& path);

}  // namespace caviar::io::detail
