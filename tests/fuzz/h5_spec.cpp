// The HDF5 C API is used directly here (not through io/): the fuzz inputs need files that caviar's
// writers never produce (any type, rank, size, attribute shape or link), built through the
// library's API so that they are well-formed. Only io's link test is shared (io/h5_handle.hpp).
#include "h5_spec.hpp"

#include <hdf5.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "io/h5_handle.hpp"

namespace caviar::fuzz {

namespace {

class Reader {
 public:
  Reader(const std::uint8_t* d, std::size_t n) : d_(d), n_(n) {}
  bool done() const { return pos_ >= n_; }
  void raw(void* out, std::size_t n) {
    if (n == 0) return;
    auto* o = static_cast<std::uint8_t*>(out);
    const std::size_t have = pos_ < n_ ? std::min(n, n_ - pos_) : 0;
    if (have) std::memcpy(o, d_ + pos_, have);
    std::memset(o + have, 0, n - have);
    pos_ += n;
  }
  std::uint8_t u8() {
    std::uint8_t v;
    raw(&v, 1);
    return v;
  }
  std::uint64_t le(int bytes) {
    std::uint8_t b[8];
    raw(b, static_cast<std::size_t>(bytes));
    std::uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | b[i];
    return v;
  }
  std::uint64_t varint() {  // LEB128, at most 10 bytes
    std::uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      const std::uint8_t b = u8();
      v |= static_cast<std::uint64_t>(b & 0x7F) << shift;
      if (!(b & 0x80)) break;
    }
    return v;
  }
  std::string str8() { return bytes(u8()); }
  std::string bytes(std::uint64_t n) {
    const std::size_t have = pos_ < n_ ? n_ - pos_ : 0;
    std::string s(static_cast<std::size_t>(std::min<std::uint64_t>(n, have)), '\0');
    raw(s.data(), s.size());
    return s;
  }
  // The next n bytes as a reader of their own (fewer if the input ends).
  Reader sub(std::size_t n) {
    const std::size_t have = pos_ < n_ ? std::min(n, n_ - pos_) : 0;
    Reader r(d_ + pos_, have);
    pos_ += n;
    return r;
  }

 private:
  const std::uint8_t* d_;
  std::size_t n_, pos_ = 0;
};

class Writer {
 public:
  void u8(std::uint8_t v) { out.push_back(v); }
  void le(std::uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) out.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
  }
  void varint(std::uint64_t v) {
    do {
      const std::uint8_t b = v & 0x7F;
      v >>= 7;
      out.push_back(static_cast<std::uint8_t>(b | (v ? 0x80 : 0)));
    } while (v);
  }
  void str8(const std::string& s) {
    const std::size_t n = std::min<std::size_t>(s.size(), 0xFF);
    u8(static_cast<std::uint8_t>(n));
    out.insert(out.end(), s.begin(), s.begin() + static_cast<std::ptrdiff_t>(n));
  }
  void var_str(const std::string& s) {
    varint(s.size());
    out.insert(out.end(), s.begin(), s.end());
  }
  std::vector<std::uint8_t> out;
};

std::size_t type_size(Entry::Type t) {
  switch (t) {
    case Entry::kF64:
    case Entry::kI64:
    case Entry::kU64:
      return 8;
    case Entry::kF32:
    case Entry::kI32:
      return 4;
    case Entry::kU8:
      return 1;
    default:
      return 0;  // strings
  }
}

// Closes an HDF5 identifier with the given function when it goes out of scope.
struct Id {
  hid_t id;
  herr_t (*close)(hid_t);
  Id(hid_t i, herr_t (*c)(hid_t)) : id(i), close(c) {}
  ~Id() {
    if (id >= 0) close(id);
  }
  Id(const Id&) = delete;
  Id& operator=(const Id&) = delete;
  bool ok() const { return id >= 0; }
};

hid_t file_type(const Entry& e) {
  const bool be = e.alt;
  switch (e.type) {
    case Entry::kF64:
      return H5Tcopy(be ? H5T_IEEE_F64BE : H5T_IEEE_F64LE);
    case Entry::kF32:
      return H5Tcopy(be ? H5T_IEEE_F32BE : H5T_IEEE_F32LE);
    case Entry::kI64:
      return H5Tcopy(be ? H5T_STD_I64BE : H5T_STD_I64LE);
    case Entry::kI32:
      return H5Tcopy(be ? H5T_STD_I32BE : H5T_STD_I32LE);
    case Entry::kU8:
      return H5Tcopy(H5T_STD_U8LE);
    case Entry::kU64:
      return H5Tcopy(be ? H5T_STD_U64BE : H5T_STD_U64LE);
    case Entry::kVarString:
    case Entry::kFixedString: {
      const hid_t t = H5Tcopy(H5T_C_S1);
      if (t < 0) return t;
      const std::size_t size = e.type == Entry::kVarString ? H5T_VARIABLE : e.width;
      if (H5Tset_size(t, size) < 0 || H5Tset_cset(t, e.alt ? H5T_CSET_ASCII : H5T_CSET_UTF8) < 0) {
        H5Tclose(t);
        return -1;
      }
      return t;
    }
  }
  return -1;
}

// The buffer H5Dwrite / H5Awrite take for the entry's values, in the file type itself.
struct Buffer {
  std::vector<std::uint8_t> bytes;
  std::vector<const char*> pointers;
  const void* data() const {
    return pointers.empty() ? static_cast<const void*>(bytes.data()) : pointers.data();
  }
};

Buffer buffer(const Entry& e) {
  Buffer b;
  const std::uint64_t n = e.elements();
  if (e.type == Entry::kVarString) {
    for (std::uint64_t i = 0; i < n; ++i)
      b.pointers.push_back(i < e.strings.size() ? e.strings[i].c_str() : "");
    if (b.pointers.empty()) b.pointers.push_back("");
  } else if (e.type == Entry::kFixedString) {
    b.bytes.assign(std::max<std::uint64_t>(n, 1) * e.width, 0);
    for (std::uint64_t i = 0; i < n && i < e.strings.size(); ++i)
      std::memcpy(b.bytes.data() + i * e.width, e.strings[i].data(),
                  std::min<std::size_t>(e.width, e.strings[i].size()));
  } else {
    b.bytes = e.values;
    b.bytes.resize(std::max<std::uint64_t>(n, 1) * type_size(e.type), 0);
  }
  return b;
}

hid_t dataspace(const Entry& e) {
  if (e.dims.empty()) return H5Screate(H5S_SCALAR);
  std::vector<hsize_t> d(e.dims.begin(), e.dims.end());
  if (!e.huge) return H5Screate_simple(static_cast<int>(d.size()), d.data(), nullptr);
  std::vector<hsize_t> max(d.size(), H5S_UNLIMITED);
  return H5Screate_simple(static_cast<int>(d.size()), d.data(), max.data());
}

void write_entry(hid_t file, const Entry& e) {
  Id lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
  if (!lcpl.ok() || H5Pset_create_intermediate_group(lcpl.id, 1) < 0) return;
  if (e.kind == Entry::kGroup) {
    Id g(H5Gcreate2(file, e.name.c_str(), lcpl.id, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
    return;
  }
  if (e.kind == Entry::kLink) {
    H5Lcreate_soft(e.target.c_str(), file, e.name.c_str(), lcpl.id, H5P_DEFAULT);
    return;
  }
  if (e.type == Entry::kFixedString && e.width == 0) return;
  Id type(file_type(e), H5Tclose);
  Id space(dataspace(e), H5Sclose);
  if (!type.ok() || !space.ok()) return;
  if (e.kind == Entry::kAttribute) {
    if (e.huge) return;  // attributes live in the object header: no huge ones
    const std::string obj = e.object.empty() ? "/" : e.object;
    if (!caviar::io::detail::link_exists(file, obj))
      Id g(H5Gcreate2(file, obj.c_str(), lcpl.id, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
    Id o(H5Oopen(file, obj.c_str(), H5P_DEFAULT), H5Oclose);
    if (!o.ok()) return;
    Id a(H5Acreate2(o.id, e.name.c_str(), type.id, space.id, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
    if (!a.ok()) return;
    const Buffer b = buffer(e);
    H5Awrite(a.id, type.id, b.data());
    return;
  }
  Id dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  if (!dcpl.ok()) return;
  if (e.huge && !e.dims.empty()) {
    std::vector<hsize_t> chunk;
    const hsize_t cap = e.dims.size() == 1 ? 64 : 8;
    for (std::uint64_t d : e.dims) chunk.push_back(std::max<hsize_t>(1, std::min<hsize_t>(d, cap)));
    if (H5Pset_chunk(dcpl.id, static_cast<int>(chunk.size()), chunk.data()) < 0) return;
  }
  Id d(H5Dcreate2(file, e.name.c_str(), type.id, space.id, lcpl.id, dcpl.id, H5P_DEFAULT),
       H5Dclose);
  if (!d.ok() || e.huge || e.elements() == 0) return;
  const Buffer b = buffer(e);
  H5Dwrite(d.id, type.id, H5S_ALL, H5S_ALL, H5P_DEFAULT, b.data());
}

// ---- reading a file back into entries (seeds) ----

struct Visit {
  hid_t file;
  std::vector<Entry> entries;
  std::string error;  // exceptions must not unwind through libhdf5's C frames
};

void fill_type(hid_t t, Entry& e) {
  const H5T_class_t cls = H5Tget_class(t);
  const std::size_t size = H5Tget_size(t);
  if (cls == H5T_STRING) {
    if (H5Tis_variable_str(t) > 0) {
      e.type = Entry::kVarString;
    } else {
      e.type = Entry::kFixedString;
      e.width = static_cast<std::uint8_t>(std::min<std::size_t>(size, 255));
    }
    e.alt = H5Tget_cset(t) == H5T_CSET_ASCII;
  } else if (cls == H5T_FLOAT) {
    e.type = size == 4 ? Entry::kF32 : Entry::kF64;
  } else if (cls == H5T_INTEGER) {
    const bool sign = H5Tget_sign(t) == H5T_SGN_2;
    e.type = size == 1 && !sign   ? Entry::kU8
             : size == 8 && !sign ? Entry::kU64
             : size <= 4 && sign  ? Entry::kI32
                                  : Entry::kI64;
  } else {
    throw std::runtime_error("read_file: unsupported type class");
  }
}

void fill_dims(hid_t space, Entry& e) {
  const int nd = H5Sget_simple_extent_ndims(space);
  if (nd < 0 || nd > 3) throw std::runtime_error("read_file: unsupported rank");
  std::vector<hsize_t> d(static_cast<std::size_t>(nd));
  H5Sget_simple_extent_dims(space, d.data(), nullptr);
  e.dims.assign(d.begin(), d.end());
  if (e.elements() > kMaxElements) e.huge = true;
}

// Reads the values of a dataset (is_attr false) or attribute into e.
void fill_values(hid_t obj, bool is_attr, Entry& e) {
  if (e.huge || e.elements() == 0) return;
  Entry mem = e;
  mem.alt = e.type == Entry::kVarString || e.type == Entry::kFixedString ? e.alt : false;
  Id t(file_type(mem), H5Tclose);
  const std::uint64_t n = e.elements();
  auto read = [&](void* buf) {
    const herr_t rc =
        is_attr ? H5Aread(obj, t.id, buf) : H5Dread(obj, t.id, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf);
    if (rc < 0) throw std::runtime_error("read_file: cannot read values");
  };
  if (e.type == Entry::kVarString) {
    std::vector<char*> p(n, nullptr);
    read(p.data());
    for (char* s : p) {
      e.strings.emplace_back(s ? s : "");
      H5free_memory(s);
    }
  } else if (e.type == Entry::kFixedString) {
    std::vector<char> buf(n * e.width);
    read(buf.data());
    for (std::uint64_t i = 0; i < n; ++i)
      e.strings.emplace_back(buf.data() + i * e.width, strnlen(buf.data() + i * e.width, e.width));
  } else {
    e.values.resize(n * type_size(e.type));
    read(e.values.data());
  }
}

herr_t visit_attr(hid_t obj, const char* name, const H5A_info_t*, void* op) try {
  auto& v = *static_cast<std::pair<Visit*, std::string>*>(op);
  Entry e;
  e.kind = Entry::kAttribute;
  e.name = name;
  e.object = v.second == "/" ? "" : v.second;
  Id a(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
  Id t(H5Aget_type(a.id), H5Tclose);
  Id s(H5Aget_space(a.id), H5Sclose);
  fill_type(t.id, e);
  fill_dims(s.id, e);
  e.huge = false;
  fill_values(a.id, true, e);
  v.first->entries.push_back(std::move(e));
  return 0;
} catch (const std::exception& x) {
  static_cast<std::pair<Visit*, std::string>*>(op)->first->error = x.what();
  return -1;
}

void attributes(Visit& v, hid_t obj, const std::string& path) {
  std::pair<Visit*, std::string> op{&v, path};
  hsize_t idx = 0;
  if (H5Aiterate2(obj, H5_INDEX_NAME, H5_ITER_INC, &idx, visit_attr, &op) < 0)
    throw std::runtime_error(v.error.empty() ? "read_file: cannot list attributes of " + path
                                             : v.error);
}

herr_t visit_link(hid_t group, const char* name, const H5L_info_t* info, void* op) try {
  auto& v = *static_cast<Visit*>(op);
  const std::string path = std::string("/") + name;
  Entry e;
  e.name = path;
  if (info->type == H5L_TYPE_SOFT) {
    e.kind = Entry::kLink;
    std::vector<char> buf(info->u.val_size + 1, '\0');
    H5Lget_val(group, name, buf.data(), buf.size(), H5P_DEFAULT);
    e.target = buf.data();
    v.entries.push_back(std::move(e));
    return 0;
  }
  if (info->type != H5L_TYPE_HARD) return 0;
  Id o(H5Oopen(group, name, H5P_DEFAULT), H5Oclose);
  H5O_info_t oi;
  if (!o.ok() || H5Oget_info(o.id, &oi) < 0) throw std::runtime_error("read_file: " + path);
  if (oi.type == H5O_TYPE_GROUP) {
    e.kind = Entry::kGroup;
    v.entries.push_back(std::move(e));
  } else if (oi.type == H5O_TYPE_DATASET) {
    e.kind = Entry::kDataset;
    Id t(H5Dget_type(o.id), H5Tclose);
    Id s(H5Dget_space(o.id), H5Sclose);
    fill_type(t.id, e);
    fill_dims(s.id, e);
    fill_values(o.id, false, e);
    v.entries.push_back(std::move(e));
  }
  attributes(v, o.id, path);
  return 0;
} catch (const std::exception& x) {
  static_cast<Visit*>(op)->error = x.what();
  return -1;
}

}  // namespace

std::uint64_t Entry::elements() const {
  std::uint64_t n = 1;
  for (std::uint64_t d : dims) {
    if (d != 0 && n > UINT64_MAX / d) return UINT64_MAX;
    n *= d;
  }
  return n;
}

namespace {

// A huge dimension m << s, at most 2^62.
std::uint64_t huge_dim(std::uint64_t m, unsigned s) {
  s %= 64;
  const std::uint64_t cap = std::uint64_t{1} << 62;
  return m == 0 ? 0 : (m > (cap >> s) ? cap : m << s);
}

Entry decode_entry(Reader& r) {
  Entry e;
  const std::uint8_t flags = r.u8();
  e.kind = static_cast<Entry::Kind>(flags & 3);
  e.skip = flags & 4;
  e.huge = (flags & 8) && e.kind == Entry::kDataset;
  e.name = r.str8();
  if (e.kind == Entry::kAttribute) e.object = r.str8();
  if (e.kind == Entry::kLink) e.target = r.str8();
  if (e.kind != Entry::kDataset && e.kind != Entry::kAttribute) return e;
  const std::uint8_t t = r.u8();
  e.type = static_cast<Entry::Type>(t & 7);
  e.alt = t & 8;
  if (e.type == Entry::kFixedString) e.width = r.u8();
  const int rank = r.u8() % 4;
  for (int i = 0; i < rank; ++i) {
    if (e.huge) {
      const unsigned shift = r.u8();
      e.dims.push_back(huge_dim(r.varint(), shift));
    } else {
      e.dims.push_back(r.varint());
    }
  }
  const std::uint64_t n = e.elements();
  if (e.huge) return e;
  if (n > kMaxElements) {
    e.skip = true;
    return e;
  }
  if (e.type == Entry::kVarString) {
    for (std::uint64_t i = 0; i < n; ++i) e.strings.push_back(r.bytes(r.varint()));
  } else if (e.type == Entry::kFixedString) {
    for (std::uint64_t i = 0; i < n; ++i) {
      std::string s(e.width, '\0');
      r.raw(s.data(), s.size());
      e.strings.push_back(std::move(s));
    }
  } else {
    e.values.resize(n * type_size(e.type));
    r.raw(e.values.data(), e.values.size());
  }
  return e;
}

void encode_entry(Writer& w, const Entry& e) {
  const bool huge = e.huge && e.kind == Entry::kDataset;
  w.u8(static_cast<std::uint8_t>(e.kind | (e.skip ? 4 : 0) | (huge ? 8 : 0)));
  w.str8(e.name);
  if (e.kind == Entry::kAttribute) w.str8(e.object);
  if (e.kind == Entry::kLink) w.str8(e.target);
  if (e.kind != Entry::kDataset && e.kind != Entry::kAttribute) return;
  w.u8(static_cast<std::uint8_t>(e.type | (e.alt ? 8 : 0)));
  if (e.type == Entry::kFixedString) w.u8(e.width);
  w.u8(static_cast<std::uint8_t>(e.dims.size()));
  for (std::uint64_t d : e.dims) {
    if (huge) {
      unsigned shift = 0;
      while (d != 0 && shift < 63 && !((d >> shift) & 1)) ++shift;
      w.u8(static_cast<std::uint8_t>(shift));
      w.varint(d >> shift);
    } else {
      w.varint(d);
    }
  }
  if (huge) return;
  const std::uint64_t n = e.elements();
  if (n > kMaxElements) return;
  if (e.type == Entry::kVarString || e.type == Entry::kFixedString) {
    for (std::uint64_t i = 0; i < n; ++i) {
      std::string s = i < e.strings.size() ? e.strings[i] : std::string();
      if (e.type == Entry::kVarString) {
        w.var_str(s);
      } else {
        s.resize(e.width, '\0');
        w.out.insert(w.out.end(), s.begin(), s.end());
      }
    }
  } else {
    std::vector<std::uint8_t> v = e.values;
    v.resize(n * type_size(e.type), 0);
    w.out.insert(w.out.end(), v.begin(), v.end());
  }
}

}  // namespace

std::vector<Entry> decode(const std::uint8_t* data, std::size_t size) {
  Reader r(data, size);
  std::vector<Entry> out;
  while (!r.done() && out.size() < kMaxEntries) {
    Reader body = r.sub(static_cast<std::size_t>(r.le(2)));
    out.push_back(decode_entry(body));
  }
  return out;
}

std::vector<std::uint8_t> encode(const std::vector<Entry>& entries) {
  Writer w;
  for (const Entry& e : entries) {
    Writer body;
    encode_entry(body, e);
    if (body.out.size() > 0xFFFF) throw std::runtime_error("encode: entry too large: " + e.name);
    w.le(body.out.size(), 2);
    w.out.insert(w.out.end(), body.out.begin(), body.out.end());
  }
  return w.out;
}

bool write_file(const std::string& path, const std::vector<Entry>& entries) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  Id file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
  if (!file.ok()) return false;
  for (const Entry& e : entries)
    if (!e.skip) write_entry(file.id, e);
  return true;
}

std::vector<Entry> read_file(const std::string& path) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  Id file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!file.ok()) throw std::runtime_error("read_file: cannot open " + path);
  Visit v{file.id, {}, {}};
  attributes(v, file.id, "/");
  if (H5Lvisit(file.id, H5_INDEX_NAME, H5_ITER_INC, visit_link, &v) < 0)
    throw std::runtime_error(v.error.empty() ? "read_file: cannot list " + path : v.error);
  return v.entries;
}

}  // namespace caviar::fuzz
