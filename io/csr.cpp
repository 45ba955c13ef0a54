#include "io/csr.hpp"

#include <hdf5.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <utility>

#include "comm/mpi_native.hpp"
#include "core/error.hpp"
#include "core/partition.hpp"
#include "io/h5_handle.hpp"

namespace caviar::io {

namespace {

using detail::check;
using detail::checked;
using detail::Handle;

std::string join(const std::string& group, const std::string& name) {
  if (group.empty() || group == "/") return "/" + name;
  return (group.back() == '/' ? group : group + "/") + name;
}

std::string where(const DataRef& ref, const std::string& name) {
  return ref.file + ":" + join(ref.path, name);
}

Handle open_parallel(const Comm& comm, const std::string& path) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  Handle fapl = checked(H5Pcreate(H5P_FILE_ACCESS), H5Pclose, "H5Pcreate failed");
  check(H5Pset_fapl_mpio(fapl.get(), native(comm), MPI_INFO_NULL), "H5Pset_fapl_mpio failed");
  return detail::open_file(path, fapl.get());
}

using detail::link_exists;

// Opens a 1-D numeric dataset and returns its length.
Handle open_1d(hid_t file, const DataRef& ref, const std::string& name, std::int64_t* length,
               bool numeric = true) {
  const std::string p = join(ref.path, name);
  if (!link_exists(file, p))
    throw Error("no dataset '" + p + "' in '" + ref.file +
                "' (a corpus needs indptr, indices and data: the scipy CSR layout)");
  Handle d = checked(H5Dopen2(file, p.c_str(), H5P_DEFAULT), H5Dclose,
                     "'" + p + "' in '" + ref.file + "' is not a dataset");
  Handle space = checked(H5Dget_space(d.get()), H5Sclose, "cannot read dataspace");
  if (H5Sget_simple_extent_ndims(space.get()) != 1)
    throw Error(where(ref, name) + " must be a 1-D array");
  hsize_t n = 0;
  H5Sget_simple_extent_dims(space.get(), &n, nullptr);
  detail::check_stored(d.get(), n, where(ref, name));
  if (numeric) {
    Handle type = checked(H5Dget_type(d.get()), H5Tclose, "cannot read dataset type");
    const H5T_class_t cls = H5Tget_class(type.get());
    if (cls != H5T_INTEGER && cls != H5T_FLOAT)
      throw Error(where(ref, name) + " has a non-numeric type");
  }
  *length = static_cast<std::int64_t>(n);
  return d;
}

// Collective read of elements [begin, end) of a 1-D dataset into memory type `mem`.
void read_slice(hid_t dset, hid_t mem, std::int64_t begin, std::int64_t end, void* out,
                const std::string& what) {
  Handle fspace = checked(H5Dget_space(dset), H5Sclose, "cannot read dataspace");
  const hsize_t count = static_cast<hsize_t>(end - begin);
  const hsize_t mcount = std::max<hsize_t>(count, 1);
  Handle mspace = checked(H5Screate_simple(1, &mcount, nullptr), H5Sclose, "H5Screate failed");
  if (count > 0) {
    const hsize_t start = static_cast<hsize_t>(begin);
    check(H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, &start, nullptr, &count, nullptr),
          "cannot select " + what);
  } else {
    H5Sselect_none(fspace.get());
    H5Sselect_none(mspace.get());
  }
  Handle dxpl = checked(H5Pcreate(H5P_DATASET_XFER), H5Pclose, "H5Pcreate failed");
  H5Pset_dxpl_mpio(dxpl.get(), H5FD_MPIO_COLLECTIVE);
  double dummy = 0;
  check(H5Dread(dset, mem, mspace.get(), fspace.get(), dxpl.get(), count > 0 ? out : &dummy),
        "cannot read " + what + " (corrupt file?)");
}

// The vocabulary size: the length of <group>/vocab, else the group's "shape" attribute [D, V].
std::int64_t vocab_size(hid_t file, const DataRef& ref, std::int64_t n_docs) {
  std::int64_t v_vocab = -1, v_shape = -1;
  if (link_exists(file, join(ref.path, "vocab"))) open_1d(file, ref, "vocab", &v_vocab, false);
  const std::string g = ref.path.empty() ? "/" : ref.path;
  if (H5Aexists_by_name(file, g.c_str(), "shape", H5P_DEFAULT) > 0) {
    Handle a = checked(H5Aopen_by_name(file, g.c_str(), "shape", H5P_DEFAULT, H5P_DEFAULT),
                       H5Aclose, "cannot open attribute 'shape'");
    Handle space = checked(H5Aget_space(a.get()), H5Sclose, "cannot read attribute space");
    if (H5Sget_simple_extent_npoints(space.get()) != 2)
      throw Error(ref.file + ":" + g + " has a 'shape' attribute that is not [documents, words]");
    std::int64_t shape[2];
    check(H5Aread(a.get(), H5T_NATIVE_INT64, shape), "cannot read attribute 'shape'");
    if (shape[0] != n_docs)
      throw Error(ref.file + ":" + g + " attribute shape[0] = " + std::to_string(shape[0]) +
                  " but indptr describes " + std::to_string(n_docs) + " documents");
    v_shape = shape[1];
  }
  if (v_vocab >= 0 && v_shape >= 0 && v_vocab != v_shape)
    throw Error(where(ref, "vocab") + " has " + std::to_string(v_vocab) +
                " words but the shape attribute says " + std::to_string(v_shape));
  const std::int64_t v = v_vocab >= 0 ? v_vocab : v_shape;
  if (v < 0) throw Error(ref.file + ":" + g + " has neither a vocab dataset nor a shape attribute");
  if (v < 1) throw Error(ref.file + ":" + g + " has an empty vocabulary");
  if (v > std::int64_t{1} << 31) throw Error(ref.file + ":" + g + " has more than 2^31 words");
  return v;
}

std::string num(double x) {
  std::ostringstream s;
  s.precision(17);
  s << x;
  return s.str();
}

// Document of entry j (indptr is non-decreasing): the last d with indptr[d] <= j.
std::int64_t doc_of(const std::vector<std::int64_t>& indptr, std::int64_t j) {
  auto it = std::upper_bound(indptr.begin(), indptr.end(), j);
  // Skip back over empty documents that share the same offset.
  return static_cast<std::int64_t>(it - indptr.begin()) - 1;
}

// "" if the counts of entries [e0, e0 + n) are non-negative integers; else the message.
std::string check_counts(const DataRef& ref, const std::vector<std::int64_t>& indptr,
                         std::int64_t e0, const std::vector<double>& data) {
  for (std::size_t i = 0; i < data.size(); ++i) {
    const double x = data[i];
    if (!(x >= 0) || !std::isfinite(x) || x != std::floor(x) || x > 2147483647.0) {
      const std::int64_t j = e0 + static_cast<std::int64_t>(i);
      const std::string why = !std::isfinite(x) ? "is not finite"
                              : x < 0           ? "is negative"
                              : x > 2147483647  ? "is too large"
                                                : "is not an integer";
      return where(ref, "data") + "[" + std::to_string(j) + "] = " + num(x) + " (document " +
             std::to_string(doc_of(indptr, j)) + ") " + why +
             "; token counts must be non-negative integers";
    }
  }
  return "";
}

}  // namespace

std::vector<std::int64_t> read_indptr(const Comm& comm, const DataRef& ref, CorpusInfo* info) {
  std::vector<std::int64_t> indptr;
  CorpusInfo ci;
  comm.agree([&] {
    Handle file = open_parallel(comm, ref.file);
    std::int64_t n_ptr = 0, n_ind = 0, n_dat = 0;
    Handle dp = open_1d(file.get(), ref, "indptr", &n_ptr);
    open_1d(file.get(), ref, "indices", &n_ind);
    open_1d(file.get(), ref, "data", &n_dat);
    if (n_ptr < 2)
      throw Error(where(ref, "indptr") + " has " + std::to_string(n_ptr) +
                  " entries; a corpus of D >= 1 documents needs D + 1");
    if (n_ind != n_dat)
      throw Error(where(ref, "indices") + " has " + std::to_string(n_ind) + " entries but " +
                  where(ref, "data") + " has " + std::to_string(n_dat));
    ci.n_docs = n_ptr - 1;
    ci.nnz = n_ind;
    ci.n_words = vocab_size(file.get(), ref, ci.n_docs);
    indptr.resize(static_cast<std::size_t>(n_ptr));
    read_slice(dp.get(), H5T_NATIVE_INT64, 0, n_ptr, indptr.data(), where(ref, "indptr"));
  });
  // Every rank holds the same indptr, so every rank reaches the same verdict.
  if (indptr[0] != 0)
    throw Error(where(ref, "indptr") + "[0] = " + std::to_string(indptr[0]) + "; it must be 0");
  for (std::int64_t d = 0; d < ci.n_docs; ++d)
    if (indptr[d + 1] < indptr[d])
      throw Error(where(ref, "indptr") + " is not monotone: indptr[" + std::to_string(d + 1) +
                  "] = " + std::to_string(indptr[d + 1]) + " < indptr[" + std::to_string(d) +
                  "] = " + std::to_string(indptr[d]));
  if (indptr.back() != ci.nnz)
    throw Error(where(ref, "indptr") + " ends at " + std::to_string(indptr.back()) + " but " +
                where(ref, "indices") + " and data have " + std::to_string(ci.nnz) + " entries");
  if (info) *info = ci;
  return indptr;
}

CorpusInfo inspect_corpus(const Comm& comm, const DataRef& ref) {
  CorpusInfo ci;
  read_indptr(comm, ref, &ci);
  return ci;
}

Corpus read_corpus_range(const Comm& comm, const DataRef& ref,
                         const std::vector<std::int64_t>& indptr, std::int64_t n_words,
                         std::int64_t d0, std::int64_t d1) {
  Corpus c;
  c.doc_begin = d0;
  c.n_words = n_words;
  const std::int64_t e0 = indptr[d0], e1 = indptr[d1];
  std::vector<std::int64_t> idx(static_cast<std::size_t>(e1 - e0));
  c.counts.resize(static_cast<std::size_t>(e1 - e0));
  comm.agree([&] {
    Handle file = open_parallel(comm, ref.file);
    std::int64_t n = 0;
    Handle di = open_1d(file.get(), ref, "indices", &n);
    Handle dd = open_1d(file.get(), ref, "data", &n);
    read_slice(di.get(), H5T_NATIVE_INT64, e0, e1, idx.data(), where(ref, "indices"));
    read_slice(dd.get(), H5T_NATIVE_DOUBLE, e0, e1, c.counts.data(), where(ref, "data"));
  });
  std::string err = check_counts(ref, indptr, e0, c.counts);
  for (std::size_t i = 0; i < idx.size() && err.empty(); ++i) {
    if (idx[i] < 0 || idx[i] >= n_words) {
      const std::int64_t j = e0 + static_cast<std::int64_t>(i);
      err = where(ref, "indices") + "[" + std::to_string(j) + "] = " + std::to_string(idx[i]) +
            " (document " + std::to_string(doc_of(indptr, j)) + ") is outside the vocabulary [0, " +
            std::to_string(n_words) + ")";
    }
  }
  // Ranks hold increasing document ranges: the lowest failing rank has the first bad entry.
  comm.raise_if_any(err);
  c.words.assign(idx.begin(), idx.end());
  c.indptr.resize(static_cast<std::size_t>(d1 - d0 + 1));
  for (std::int64_t d = d0; d <= d1; ++d) c.indptr[d - d0] = indptr[d] - e0;
  return c;
}

namespace {

// Contiguous runs of items (blocks or documents) with about equal weight: rank r starts at the
// first item whose cumulative weight reaches r W / P; the last rank ends at the last item.
std::pair<std::int64_t, std::int64_t> balanced_blocks(const std::vector<std::int64_t>& w, int p,
                                                      int r) {
  std::vector<std::int64_t> cum(w.size() + 1, 0);
  for (std::size_t b = 0; b < w.size(); ++b) cum[b + 1] = cum[b] + w[b];
  // Weights (entries, tokens) total far below 2^63 / P, so these int64 products cannot overflow.
  const std::int64_t total = cum.back();
  auto start = [&](int q) -> std::int64_t {
    if (q == 0) return 0;
    if (q == p) return static_cast<std::int64_t>(w.size());
    // The first b with cum[b] * p >= total * q (cum is non-decreasing).
    return static_cast<std::int64_t>(
        std::partition_point(cum.begin(), cum.end(),
                             [&](std::int64_t c) { return c * p < total * q; }) -
        cum.begin());
  };
  return {start(r), start(r + 1)};
}

}  // namespace

std::pair<std::int64_t, std::int64_t> document_range(const std::vector<std::int64_t>& indptr, int p,
                                                     int r) {
  std::vector<std::int64_t> entries(indptr.size() - 1);
  for (std::size_t d = 0; d + 1 < indptr.size(); ++d) entries[d] = indptr[d + 1] - indptr[d];
  return balanced_blocks(entries, p, r);
}

Corpus read_corpus(const Comm& comm, const DataRef& ref, CorpusInfo* info) {
  CorpusInfo ci;
  const std::vector<std::int64_t> indptr = read_indptr(comm, ref, &ci);
  const std::int64_t n_blocks = (ci.n_docs + kBlockRows - 1) / kBlockRows;
  auto block_docs = [&](std::int64_t b) {
    return std::pair(std::min(ci.n_docs, b * kBlockRows),
                     std::min(ci.n_docs, (b + 1) * kBlockRows));
  };
  // Pass 1: blocks balanced by entries (known from indptr alone); each rank reads and validates
  // its part of /data and counts its tokens (one allreduce for the total).
  std::vector<std::int64_t> weight(static_cast<std::size_t>(n_blocks));
  for (std::int64_t b = 0; b < n_blocks; ++b) {
    const auto [d0, d1] = block_docs(b);
    weight[b] = indptr[d1] - indptr[d0];
  }
  {
    const auto [b0, b1] = balanced_blocks(weight, comm.size(), comm.rank());
    const std::int64_t e0 = b1 > b0 ? indptr[block_docs(b0).first] : 0;
    const std::int64_t e1 = b1 > b0 ? indptr[block_docs(b1 - 1).second] : 0;
    std::vector<double> data(static_cast<std::size_t>(e1 - e0));
    comm.agree([&] {
      Handle file = open_parallel(comm, ref.file);
      std::int64_t n = 0;
      Handle dd = open_1d(file.get(), ref, "data", &n);
      read_slice(dd.get(), H5T_NATIVE_DOUBLE, e0, e1, data.data(), where(ref, "data"));
    });
    comm.raise_if_any(check_counts(ref, indptr, e0, data));
    double t = 0;
    for (double v : data) t += v;
    std::int64_t tokens = static_cast<std::int64_t>(t);
    comm.allreduce_sum(std::span<std::int64_t>(&tokens, 1));
    ci.tokens = static_cast<double>(tokens);
  }
  // Pass 2: documents balanced by entries (distinct words), which is what the E-step's cost
  // follows (each sweep is a product over the document's entries). Token counts did not: on the
  // Spam Assassin corpus, two ranks with equal tokens had 351 000 and 234 000 entries (3663 short
  // mailing-list messages against 1770 spam messages with many repeated tokens), and the first
  // took 1.45 times as long (docs/experiments/lda.md).
  const auto [d0, d1] = document_range(indptr, comm.size(), comm.rank());
  Corpus c = read_corpus_range(comm, ref, indptr, ci.n_words, d0, d1);
  if (info) *info = ci;
  return c;
}

std::vector<std::string> read_vocab(const DataRef& ref) {
  FileReader r(ref.file);
  const std::string p = join(ref.path, "vocab");
  if (!r.has(p)) return {};
  return r.read_strings(p);
}

void write_corpus(const Comm& comm, const std::string& path, const Corpus& local,
                  std::int64_t n_words, const std::vector<std::string>& vocab) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  const std::string tmp = path + ".tmp-caviar";
  const std::vector<std::int64_t> docs = comm.allgather(local.n_docs());
  const std::vector<std::int64_t> nnzs = comm.allgather(local.nnz());
  std::int64_t n_docs = 0, nnz = 0, doc_off = 0, nnz_off = 0;
  for (int r = 0; r < comm.size(); ++r) {
    if (r == comm.rank()) {
      doc_off = n_docs;
      nnz_off = nnz;
    }
    n_docs += docs[r];
    nnz += nnzs[r];
  }
  // The last rank with documents also writes the final indptr entry.
  int last = comm.size() - 1;
  while (last > 0 && docs[last] == 0) --last;
  std::vector<std::int64_t> ptr(local.indptr.begin(), local.indptr.end());
  for (auto& p : ptr) p += nnz_off;
  if (comm.rank() != last) ptr.pop_back();
  std::vector<std::int32_t> cnt(local.counts.size());
  for (std::size_t i = 0; i < cnt.size(); ++i) cnt[i] = static_cast<std::int32_t>(local.counts[i]);

  try {
    comm.agree([&] {
      Handle fapl = checked(H5Pcreate(H5P_FILE_ACCESS), H5Pclose, "H5Pcreate failed");
      check(H5Pset_fapl_mpio(fapl.get(), native(comm), MPI_INFO_NULL), "H5Pset_fapl_mpio failed");
      Handle file = checked(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()),
                            H5Fclose, "cannot create output '" + path + "'");
      auto write = [&](const char* name, hid_t type, std::int64_t total, std::int64_t off,
                       std::int64_t n, const void* data) {
        const hsize_t g = static_cast<hsize_t>(total);
        Handle fspace = checked(H5Screate_simple(1, &g, nullptr), H5Sclose, "H5Screate failed");
        Handle d = checked(
            H5Dcreate2(file.get(), name, type, fspace.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
            H5Dclose, std::string("cannot create ") + name + " in '" + path + "'");
        const hsize_t count = static_cast<hsize_t>(n), mcount = std::max<hsize_t>(count, 1);
        Handle mspace =
            checked(H5Screate_simple(1, &mcount, nullptr), H5Sclose, "H5Screate failed");
        if (n > 0) {
          const hsize_t start = static_cast<hsize_t>(off);
          H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, &start, nullptr, &count, nullptr);
        } else {
          H5Sselect_none(fspace.get());
          H5Sselect_none(mspace.get());
        }
        Handle dxpl = checked(H5Pcreate(H5P_DATASET_XFER), H5Pclose, "H5Pcreate failed");
        H5Pset_dxpl_mpio(dxpl.get(), H5FD_MPIO_COLLECTIVE);
        std::int64_t dummy = 0;
        check(
            H5Dwrite(d.get(), type, mspace.get(), fspace.get(), dxpl.get(), n > 0 ? data : &dummy),
            std::string("cannot write ") + name + " to '" + path + "'");
      };
      write("indptr", H5T_NATIVE_INT64, n_docs + 1, doc_off, static_cast<std::int64_t>(ptr.size()),
            ptr.data());
      write("indices", H5T_NATIVE_INT32, nnz, nnz_off, local.nnz(), local.words.data());
      write("data", H5T_NATIVE_INT32, nnz, nnz_off, local.nnz(), cnt.data());
      check(H5Fclose(file.release()), "cannot finish writing '" + path + "'");
    });
  } catch (const Error&) {
    if (comm.is_root()) std::remove(tmp.c_str());
    throw;
  }
  // Variable-length strings cannot be written through MPI-IO: rank 0 adds them serially.
  std::string err;
  if (comm.is_root()) {
    try {
      Handle file = checked(H5Fopen(tmp.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose,
                            "cannot reopen '" + tmp + "'");
      const hsize_t two = 2;
      Handle space = checked(H5Screate_simple(1, &two, nullptr), H5Sclose, "H5Screate failed");
      Handle a = checked(
          H5Acreate2(file.get(), "shape", H5T_NATIVE_INT64, space.get(), H5P_DEFAULT, H5P_DEFAULT),
          H5Aclose, "cannot create attribute 'shape'");
      const std::int64_t shape[2] = {n_docs, n_words};
      check(H5Awrite(a.get(), H5T_NATIVE_INT64, shape), "cannot write attribute 'shape'");
      a.reset();
      if (!vocab.empty()) {
        Handle type = checked(H5Tcopy(H5T_C_S1), H5Tclose, "H5Tcopy failed");
        H5Tset_size(type.get(), H5T_VARIABLE);
        H5Tset_cset(type.get(), H5T_CSET_UTF8);
        const hsize_t v = vocab.size();
        Handle vs = checked(H5Screate_simple(1, &v, nullptr), H5Sclose, "H5Screate failed");
        Handle d = checked(H5Dcreate2(file.get(), "vocab", type.get(), vs.get(), H5P_DEFAULT,
                                      H5P_DEFAULT, H5P_DEFAULT),
                           H5Dclose, "cannot create vocab in '" + path + "'");
        std::vector<const char*> p(vocab.size());
        for (std::size_t i = 0; i < vocab.size(); ++i) p[i] = vocab[i].c_str();
        check(H5Dwrite(d.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, p.data()),
              "cannot write vocab to '" + path + "'");
      }
      check(H5Fclose(file.release()), "cannot finish writing '" + path + "'");
      if (std::rename(tmp.c_str(), path.c_str()) != 0)
        throw Error("cannot move output into place at '" + path + "': " + std::strerror(errno));
    } catch (const Error& e) {
      err = e.what();
      std::remove(tmp.c_str());
    }
  }
  comm.broadcast(err, 0);
  if (!err.empty()) throw Error(err);
}

}  // namespace caviar::io
