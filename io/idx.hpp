#pragma once
// Reader of IDX files, the format of MNIST and Fashion-MNIST (http://yann.lecun.com/exdb/mnist/):
// a big-endian header (two zero bytes, a type code, the number of dimensions, then one 32-bit
// size per dimension) followed by the values in row-major order. Only unsigned bytes (type 0x08)
// are supported, which is all these datasets use. Files may be gzip-compressed or plain; zlib
// reads both. Serial: call it on every rank that needs the data (inside Comm::agree).
#include <cstdint>
#include <string>
#include <vector>

namespace caviar::io {

struct IdxArray {
  std::vector<std::uint32_t> dims;  // e.g. {images, rows, cols} or {labels}
  std::vector<std::uint8_t> data;   // prod(dims) values, row-major
};

// Reads the whole file and checks that its magic number is 0x0000080<ndim> (unsigned bytes,
// `ndim` dimensions), that no size is zero and that the data is exactly prod(dims) bytes long.
// Any problem, including a missing file, throws one caviar::Error naming the file.
IdxArray read_idx(const std::string& path, int ndim);

}  // namespace caviar::io
