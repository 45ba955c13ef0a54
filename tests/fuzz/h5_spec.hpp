#pragma once
// Structure-aware fuzzing of caviar's HDF5 readers: fuzz bytes are decoded into the contents of a
// well-formed HDF5 file (which datasets, groups, links and attributes exist, their types, shapes
// and values), written with the HDF5 C API, and the file is handed to caviar's reader. libhdf5's
// own parser of the file format never sees hostile bytes; caviar's validation of what a file
// holds does. read_file() is the inverse, for seeds: a valid file written by caviar encodes to
// bytes that decode back to the same contents.
//
// An input is a sequence of entries (at most kMaxEntries), each a u16 length and that many bytes
// of body, so that a mutation inside one entry (a rank, a type, a size) never shifts the others;
// a body's missing bytes read as zeros, its extra bytes are ignored. A body:
//   u8  flags   bits 0-1 kind: 0 dataset, 1 attribute, 2 group, 3 soft link
//               bit 2 skip: parsed but not written (one bit flip removes an entry)
//               bit 3 huge: a dataset whose dimensions are m << s (u8 s, varint m; at most 2^62),
//                     chunked, no data written (reads give the fill value): a file that claims
//                     any size without holding it
//   str8 name   the path of a dataset, group or link; the name of an attribute
//   attribute:  str8 object (the path it is attached to; "" is "/"; created as a group if missing)
//   link:       str8 target
//   dataset, attribute:
//     u8 type   bits 0-2: 0 f64, 1 f32, 2 i64, 3 i32, 4 u8, 5 u64, 6 variable-length string,
//               7 fixed-length string (then u8 width); bit 3: big-endian numbers, ASCII strings
//     u8 rank   modulo 4; 0 is a scalar
//     dims      rank varints (LEB128); more than kMaxElements elements (not huge) drops the entry
//     values    (not huge) numbers as the type's bytes; strings as a varint length and the bytes
//               (variable) or width bytes (fixed)
// str8 is a u8 length and the bytes; numbers are little-endian unless the type says otherwise.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace caviar::fuzz {

inline constexpr std::size_t kMaxEntries = 64;
inline constexpr std::uint64_t kMaxElements = 4096;

struct Entry {
  enum Kind : std::uint8_t { kDataset = 0, kAttribute = 1, kGroup = 2, kLink = 3 };
  enum Type : std::uint8_t { kF64, kF32, kI64, kI32, kU8, kU64, kVarString, kFixedString };
  Kind kind = kDataset;
  bool skip = false, huge = false;
  std::string name;
  std::string object;  // attribute: the object it is attached to
  std::string target;  // link
  Type type = kF64;
  bool alt = false;                  // big-endian numbers, ASCII strings
  std::uint8_t width = 1;            // fixed-length strings
  std::vector<std::uint64_t> dims;   // empty: scalar
  std::vector<std::uint8_t> values;  // numbers: elements() x type size bytes
  std::vector<std::string> strings;  // strings: elements() of them

  std::uint64_t elements() const;  // product of dims (saturating); 1 for a scalar
};

std::vector<Entry> decode(const std::uint8_t* data, std::size_t size);
std::vector<std::uint8_t> encode(const std::vector<Entry>& entries);

// Writes the entries to a new file at `path` (serial HDF5, truncating). An entry that HDF5 refuses
// (a name that exists, a bad path, a chunk it cannot create) is left out; returns false only if
// the file itself cannot be created.
bool write_file(const std::string& path, const std::vector<Entry>& entries);

// The entries of an existing file (groups, soft links, datasets, attributes), in a form that
// write_file reproduces. Throws std::runtime_error if the file cannot be read.
std::vector<Entry> read_file(const std::string& path);

}  // namespace caviar::fuzz
