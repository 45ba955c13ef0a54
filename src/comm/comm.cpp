#include "comm/comm.hpp"

#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <limits>

namespace caviar {

static_assert(sizeof(MPI_Comm) <= sizeof(std::uint64_t), "MPI_Comm does not fit the opaque handle");

namespace {
MPI_Comm unpack(std::uint64_t h) {
  MPI_Comm c;
  std::memcpy(&c, &h, sizeof(MPI_Comm));
  return c;
}
std::uint64_t pack(MPI_Comm c) {
  std::uint64_t h = 0;
  std::memcpy(&h, &c, sizeof(MPI_Comm));
  return h;
}
// MPI counts are int: split large buffers so payloads over 2^31 elements still work.
constexpr std::size_t kMaxChunk = static_cast<std::size_t>(std::numeric_limits<int>::max());
}  // namespace

Environment::Environment(int& argc, char**& argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  // Errors come back as codes we check, rather than aborting inside MPI.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
}

Environment::~Environment() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

Comm::Comm(std::uint64_t handle, bool owned) : handle_(handle), owned_(owned) {
  MPI_Comm_rank(unpack(handle_), &rank_);
  MPI_Comm_size(unpack(handle_), &size_);
}

Comm Comm::world() {
  return Comm(pack(MPI_COMM_WORLD), false);
}
Comm Comm::self() {
  return Comm(pack(MPI_COMM_SELF), false);
}

Comm::Comm(Comm&& o) noexcept
    : handle_(o.handle_), owned_(o.owned_), rank_(o.rank_), size_(o.size_) {
  o.handle_ = pack(MPI_COMM_NULL);
  o.owned_ = false;
}

Comm& Comm::operator=(Comm&& o) noexcept {
  if (this != &o) {
    this->~Comm();
    handle_ = o.handle_;
    owned_ = o.owned_;
    rank_ = o.rank_;
    size_ = o.size_;
    o.handle_ = pack(MPI_COMM_NULL);
    o.owned_ = false;
  }
  return *this;
}

Comm::~Comm() {
  if (owned_) {
    MPI_Comm c = unpack(handle_);
    if (c != MPI_COMM_NULL) MPI_Comm_free(&c);
  }
}

namespace {
void check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    throw Error(std::string("MPI ") + what + " failed: " + std::string(msg, len));
  }
}
// Wall time inside MPI_Allreduce, summed over the process (Comm::allreduce_seconds).
double allreduce_wall = 0;
template <class T>
void allreduce_chunks(std::span<T> buf, MPI_Datatype type, MPI_Op op, MPI_Comm comm) {
  const double t0 = MPI_Wtime();
  for (std::size_t off = 0; off < buf.size(); off += kMaxChunk) {
    const int n = static_cast<int>(std::min(kMaxChunk, buf.size() - off));
    check(MPI_Allreduce(MPI_IN_PLACE, buf.data() + off, n, type, op, comm), "allreduce");
  }
  allreduce_wall += MPI_Wtime() - t0;
}
template <class T>
void bcast_chunks(std::span<T> buf, MPI_Datatype type, int root, MPI_Comm comm) {
  for (std::size_t off = 0; off < buf.size(); off += kMaxChunk) {
    const int n = static_cast<int>(std::min(kMaxChunk, buf.size() - off));
    check(MPI_Bcast(buf.data() + off, n, type, root, comm), "broadcast");
  }
}
}  // namespace

double Comm::allreduce_seconds() {
  return allreduce_wall;
}

void Comm::allreduce_sum(std::span<double> buf) const {
  if (size_ == 1 || buf.empty()) return;
  allreduce_chunks(buf, MPI_DOUBLE, MPI_SUM, unpack(handle_));
}

void Comm::allreduce_sum(std::span<std::int64_t> buf) const {
  if (size_ == 1 || buf.empty()) return;
  allreduce_chunks(buf, MPI_INT64_T, MPI_SUM, unpack(handle_));
}

namespace {
// MPI has no 128-bit integer type: a contiguous pair of 64-bit words, and a commutative user op.
void sum_int128(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const Int128*>(in);
  auto* b = static_cast<Int128*>(inout);
  for (int i = 0; i < *len; ++i) b[i] += a[i];
}
struct Int128Op {
  MPI_Datatype type = MPI_DATATYPE_NULL;
  MPI_Op op = MPI_OP_NULL;
  Int128Op() {
    check(MPI_Type_contiguous(2, MPI_UINT64_T, &type), "type creation");
    check(MPI_Type_commit(&type), "type commit");
    check(MPI_Op_create(&sum_int128, 1, &op), "op creation");
  }
};
}  // namespace

void Comm::allreduce_sum(std::span<Int128> buf) const {
  if (size_ == 1 || buf.empty()) return;
  static const Int128Op int128;  // created on first use, after MPI_Init; freed by MPI_Finalize
  allreduce_chunks(buf, int128.type, int128.op, unpack(handle_));
}

double Comm::allreduce_max(double v) const {
  if (size_ == 1) return v;
  allreduce_chunks(std::span<double>(&v, 1), MPI_DOUBLE, MPI_MAX, unpack(handle_));
  return v;
}

void Comm::allreduce_max(std::span<double> buf) const {
  if (size_ == 1 || buf.empty()) return;
  allreduce_chunks(buf, MPI_DOUBLE, MPI_MAX, unpack(handle_));
}

std::int64_t Comm::allreduce_min(std::int64_t v) const {
  if (size_ == 1) return v;
  allreduce_chunks(std::span<std::int64_t>(&v, 1), MPI_INT64_T, MPI_MIN, unpack(handle_));
  return v;
}

void Comm::allreduce_or(std::span<std::uint64_t> buf) const {
  if (size_ == 1 || buf.empty()) return;
  allreduce_chunks(buf, MPI_UINT64_T, MPI_BOR, unpack(handle_));
}

std::int64_t Comm::allreduce_max(std::int64_t v) const {
  if (size_ == 1) return v;
  allreduce_chunks(std::span<std::int64_t>(&v, 1), MPI_INT64_T, MPI_MAX, unpack(handle_));
  return v;
}

void Comm::broadcast(std::span<double> buf, int root) const {
  if (size_ == 1 || buf.empty()) return;
  bcast_chunks(buf, MPI_DOUBLE, root, unpack(handle_));
}

void Comm::broadcast(std::span<std::int64_t> buf, int root) const {
  if (size_ == 1 || buf.empty()) return;
  bcast_chunks(buf, MPI_INT64_T, root, unpack(handle_));
}

void Comm::broadcast(std::string& s, int root) const {
  if (size_ == 1) return;
  std::int64_t n = static_cast<std::int64_t>(s.size());
  broadcast(std::span<std::int64_t>(&n, 1), root);
  s.resize(static_cast<std::size_t>(n));
  if (n > 0) bcast_chunks(std::span<char>(s.data(), s.size()), MPI_CHAR, root, unpack(handle_));
}

std::vector<double> Comm::allgather(double v) const {
  std::vector<double> out(static_cast<std::size_t>(size_), v);
  if (size_ > 1) {
    check(MPI_Allgather(&v, 1, MPI_DOUBLE, out.data(), 1, MPI_DOUBLE, unpack(handle_)),
          "allgather");
  }
  return out;
}

std::vector<std::int64_t> Comm::allgather(std::int64_t v) const {
  std::vector<std::int64_t> out(static_cast<std::size_t>(size_), v);
  if (size_ > 1) {
    check(MPI_Allgather(&v, 1, MPI_INT64_T, out.data(), 1, MPI_INT64_T, unpack(handle_)),
          "allgather");
  }
  return out;
}

namespace {
// The int counts and displacements of a v-collective from every rank's count (MPI counts are int).
struct Layout {
  std::vector<int> counts, displs;
  std::int64_t total = 0;
};
Layout layout(std::span<const std::int64_t> counts, const char* what) {
  Layout l{std::vector<int>(counts.size()), std::vector<int>(counts.size()), 0};
  for (std::size_t p = 0; p < counts.size(); ++p) {
    if (l.total + counts[p] > std::numeric_limits<int>::max())
      throw Error(std::string(what) + ": more than 2^31 values in one call");
    l.counts[p] = static_cast<int>(counts[p]);
    l.displs[p] = static_cast<int>(l.total);
    l.total += counts[p];
  }
  return l;
}
}  // namespace

std::vector<double> Comm::allgatherv(std::span<const double> mine) const {
  if (size_ == 1) return std::vector<double>(mine.begin(), mine.end());
  const std::vector<std::int64_t> counts = allgather(static_cast<std::int64_t>(mine.size()));
  return allgatherv(mine, counts);
}

std::vector<double> Comm::allgatherv(std::span<const double> mine,
                                     std::span<const std::int64_t> counts) const {
  if (size_ == 1) return std::vector<double>(mine.begin(), mine.end());
  if (counts.size() != static_cast<std::size_t>(size_) ||
      counts[static_cast<std::size_t>(rank_)] != static_cast<std::int64_t>(mine.size())) {
    // A bug, found on this rank alone, while the others may be inside the collective already:
    // end the job rather than leave them waiting.
    std::fprintf(stderr, "caviar: internal error: allgatherv's counts do not match the sizes\n");
    MPI_Abort(unpack(handle_), 70);
  }
  const Layout l = layout(counts, "allgatherv");
  std::vector<double> out(static_cast<std::size_t>(l.total));
  check(MPI_Allgatherv(mine.data(), static_cast<int>(mine.size()), MPI_DOUBLE, out.data(),
                       l.counts.data(), l.displs.data(), MPI_DOUBLE, unpack(handle_)),
        "allgatherv");
  return out;
}

std::vector<double> Comm::gatherv(std::span<const double> mine, int root) const {
  if (size_ == 1) return std::vector<double>(mine.begin(), mine.end());
  const Layout l = layout(allgather(static_cast<std::int64_t>(mine.size())), "gatherv");
  std::vector<double> out(rank_ == root ? static_cast<std::size_t>(l.total) : 0);
  check(MPI_Gatherv(mine.data(), static_cast<int>(mine.size()), MPI_DOUBLE, out.data(),
                    l.counts.data(), l.displs.data(), MPI_DOUBLE, root, unpack(handle_)),
        "gatherv");
  return out;
}

void Comm::barrier() const {
  if (size_ > 1) check(MPI_Barrier(unpack(handle_)), "barrier");
}

void Comm::raise_if_any(const std::string& local_error) const {
  if (size_ == 1) {
    if (!local_error.empty()) throw Error(local_error);
    return;
  }
  const std::int64_t mine = local_error.empty() ? size_ : rank_;
  const std::int64_t first = allreduce_min(mine);
  if (first == size_) return;
  std::string message = local_error;
  broadcast(message, static_cast<int>(first));
  throw Error(message);
}

}  // namespace caviar
