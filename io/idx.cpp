#include "io/idx.hpp"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "core/error.hpp"

namespace caviar::io {

namespace {

// Owns a zlib file handle.
class GzFile {
 public:
  explicit GzFile(const std::string& path) : path_(path) {
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) throw Error("cannot open '" + path + "': no such file");
    if (std::filesystem::is_directory(path, ec))
      throw Error("cannot open '" + path + "': it is a directory");
    errno = 0;
    f_ = gzopen(path.c_str(), "rb");
    if (!f_)
      throw Error("cannot open '" + path +
                  "': " + (errno ? std::strerror(errno) : "out of memory in zlib"));
    gzbuffer(f_, 1 << 17);
  }
  ~GzFile() {
    if (f_) gzclose_r(f_);
  }
  GzFile(const GzFile&) = delete;
  GzFile& operator=(const GzFile&) = delete;

  // Reads up to n bytes; returns how many were read (fewer only at the end of the data).
  std::size_t read(std::uint8_t* buf, std::size_t n) {
    std::size_t got = 0;
    while (got < n) {
      // gzread takes an unsigned int length; read in chunks well below its limit.
      const auto want = static_cast<unsigned>(std::min<std::size_t>(n - got, 1u << 24));
      const int r = gzread(f_, buf + got, want);
      if (r < 0) {
        int code = 0;
        const char* msg = gzerror(f_, &code);
        throw Error("cannot read '" + path_ + "': corrupt gzip data (" + (msg ? msg : "?") + ")");
      }
      if (r == 0) break;
      got += static_cast<std::size_t>(r);
    }
    // A gzip stream cut short reads as a short count; zlib flags it as Z_BUF_ERROR.
    int code = Z_OK;
    gzerror(f_, &code);
    if (code != Z_OK && code != Z_STREAM_END)
      throw Error("cannot read '" + path_ + "': truncated or corrupt gzip data");
    return got;
  }

 private:
  std::string path_;
  gzFile f_ = nullptr;
};

std::string hex32(std::uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

std::uint32_t big_endian32(const std::uint8_t* p) {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) |
         std::uint32_t{p[3]};
}

}  // namespace

IdxArray read_idx(const std::string& path, int ndim) {
  GzFile f(path);
  const std::uint32_t expected_magic = 0x00000800u | static_cast<std::uint32_t>(ndim);
  std::uint8_t head[4];
  if (f.read(head, 4) != 4)
    throw Error("'" + path + "' is not an IDX file: shorter than its 4-byte magic number");
  const std::uint32_t magic = big_endian32(head);
  if (magic != expected_magic)
    throw Error("'" + path + "' is not an IDX file of unsigned bytes with " + std::to_string(ndim) +
                " dimension" + (ndim == 1 ? "" : "s") + ": magic number " + hex32(magic) +
                ", expected " + hex32(expected_magic));

  IdxArray a;
  std::vector<std::uint8_t> sizes(4 * static_cast<std::size_t>(ndim));
  if (f.read(sizes.data(), sizes.size()) != sizes.size())
    throw Error("'" + path + "' is truncated: its IDX header ends before the dimension sizes");
  std::uint64_t total = 1;
  for (int i = 0; i < ndim; ++i) {
    const std::uint32_t s = big_endian32(&sizes[4 * static_cast<std::size_t>(i)]);
    if (s == 0) throw Error("'" + path + "' has an IDX dimension of size 0");
    a.dims.push_back(s);
    // 2^40 bytes is far beyond any IDX dataset, and keeps the product from overflowing.
    total *= s;
    if (total > (std::uint64_t{1} << 40))
      throw Error("'" + path + "' declares an implausibly large IDX array (corrupt header?)");
  }

  // Grow the buffer as data arrives, so that a corrupt header cannot trigger a huge allocation.
  constexpr std::size_t kChunk = std::size_t{1} << 24;
  a.data.reserve(static_cast<std::size_t>(std::min<std::uint64_t>(total, kChunk)));
  while (a.data.size() < total) {
    const std::size_t old = a.data.size();
    const auto want = static_cast<std::size_t>(std::min<std::uint64_t>(total - old, kChunk));
    a.data.resize(old + want);
    const std::size_t got = f.read(a.data.data() + old, want);
    if (got < want) {
      throw Error("'" + path + "' is truncated: its IDX header declares " + std::to_string(total) +
                  " bytes of data, found " + std::to_string(old + got));
    }
  }
  std::uint8_t extra;
  if (f.read(&extra, 1) != 0)
    throw Error("'" + path + "' has data beyond the " + std::to_string(total) +
                " bytes its IDX header declares (corrupt file?)");
  return a;
}

}  // namespace caviar::io
