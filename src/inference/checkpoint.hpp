#pragma once
// What every driver's checkpoints share: the --checkpoint-every schedule, the run fingerprint a
// resume must match, the identity of the data file, and the agreement on stop signals at an
// iteration boundary. The model-specific state is saved by each model (engine/checkpoint.hpp);
// files are written with io::FileWriter (temp file, then rename), so a checkpoint on disk is
// always either the previous complete one or the new complete one.
//
// What a model must do to keep the guarantees of checkpoint/resume (README.md, "Checkpoint,
// resume, preemption"):
//  1. Save, at an iteration boundary, everything the next iteration reads: the global parameters
//     (or the statistics they are rebuilt from by a deterministic, history-free update), the
//     position (iteration, epoch, step inside the epoch), every piece of schedule state (step
//     counters, adaptive-rate memories, optimiser moments, running sums of the epoch), and the
//     traces. Doubles are stored as doubles (bit-exact); nothing is re-derived from a rounded
//     value. Randomness must stay keyed by (seed, stream, global index/step), never by a
//     generator's hidden position, so that the resumed run draws the same numbers.
//  2. Write a Fingerprint with the model type, the algorithm, the shapes (K, D, ...), every option
//     that changes the result, and data_identity() of each input, and check() it on --resume, so
//     that a checkpoint of another model, dimension or data file fails with one clear line.
//  3. Poll a StopPoller at every iteration boundary (one allreduce), on every rank, at the same
//     place in the loop; when it says stop, write the checkpoint (rank 0) and throw Preempted on
//     every rank: main() prints the message and exits with kExitPreempted (75).
//  4. Test it: interrupt a run with a real signal at many points, resume, and compare the outputs
//     byte for byte with an uninterrupted run (tests/cli/test_checkpoint.py).
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "comm/comm.hpp"
#include "io/csr.hpp"
#include "io/h5.hpp"

namespace caviar::ckpt {

// --checkpoint-every N (iterations or steps) or Ts (seconds of rank 0's clock, e.g. "30s").
struct Every {
  std::int64_t iterations = 0;  // 0: not by count
  double seconds = 0;           // 0: not by time
  bool enabled() const { return iterations > 0 || seconds > 0; }
};
Every parse_every(const std::string& s);  // "" gives {} (only on signals)

// The settings a resumed run must share with the run that wrote the checkpoint. Entries are
// (key, value as text, how to name it to the user, e.g. "--seed"); the first mismatch is the error.
class Fingerprint {
 public:
  explicit Fingerprint(std::string model) : model_(std::move(model)) {}
  // `why`, if given, replaces the generic "it was written with FLAG X, this run has FLAG Y".
  void add(const std::string& key, const std::string& value, const std::string& flag,
           const std::string& why = "");
  void add(const std::string& key, std::int64_t value, const std::string& flag);
  void add(const std::string& key, double value, const std::string& flag);  // exact (%.17g)
  void write(io::FileWriter& w) const;  // attributes "model", "checkpoint", "fingerprint" (JSON)
  void write(io::ParallelRowWriter& w) const;  // the same, collectively
  // Throws caviar::Error ("--resume FILE: ...") unless r is a checkpoint of the same model with
  // the same entries.
  void check(const io::FileReader& r, const std::string& file) const;

 private:
  struct Entry {
    std::string key, value, flag, why;
  };
  std::string model_;
  std::vector<Entry> entries_;
};

// Collective: a cheap identity of a dataset's contents, the same on every rank: FNV-1a (64 bit)
// over the shape and the bytes (as double) of 8 windows of 8 rows spread evenly over the file,
// first and last rows included. It catches another file, another dataset, another shape, and any
// edit of the sampled rows (a shuffled or regenerated file), whatever the file's name or mtime;
// it does not see an edit confined to rows it does not sample.
std::string data_identity(const Comm& comm, const io::DataRef& ref, const io::MatrixShape& shape);

// The hash and the sampling of data_identity, for inputs that are not a dense matrix (an LDA
// corpus: lda_checkpoint.cpp), so that every identity is computed the same way.
class IdentityHash {
 public:
  void word(std::uint64_t w);  // FNV-1a (64 bit) over w's 8 bytes, little-endian
  void value(double v);        // its bits
  std::string hex() const;     // 16 hex digits
 private:
  std::uint64_t h_ = 0xcbf29ce484222325ull;
};
// The row ranges data_identity samples from `rows` rows: 8 windows of 8 rows spread evenly, first
// and last rows included, clipped so that they do not overlap.
std::vector<std::pair<std::int64_t, std::int64_t>> identity_windows(std::int64_t rows);

// Adds the data's shape and identity to a fingerprint; the path is stored but not compared (a
// job may copy its input to scratch between runs).
void add_data(Fingerprint& fp, const Comm& comm, const std::string& flag, const io::DataRef& ref,
              const io::MatrixShape& shape);

// Adds a CSR corpus's shape (documents x vocabulary x entries) and identity (the hash and sampling
// of data_identity over the sampled documents' word ids and counts) to a fingerprint. indptr is
// the corpus's whole /indptr if the caller holds it, else nullptr (it is read). Collective.
void add_corpus(Fingerprint& fp, const Comm& comm, const std::string& flag, const io::DataRef& ref,
                const io::CorpusInfo& info, const std::vector<std::int64_t>* indptr);

// Rank 0 checks that --checkpoint can be written and is none of `inputs` (a --resume file may be
// the same file: it is read before the first write).
void check_paths(const Comm& comm, const std::string& checkpoint, const std::string& every,
                 const std::vector<std::string>& inputs);

// Rank 0 checks that the --resume file exists (agreed), so that a typo fails before data load.
void check_resume(const Comm& comm, const std::string& resume);

// Thrown on every rank at once, after the agreement, when a stop signal ended the run. Not a
// caviar::Error (Comm::agree must not turn it into one); main() prints what() on rank 0 and
// exits with kExitPreempted.
class Preempted : public std::exception {
 public:
  explicit Preempted(std::string what) : what_(std::move(what)) {}
  const char* what() const noexcept override { return what_.c_str(); }

 private:
  std::string what_;
};

// At each iteration boundary: one allreduce (max) of (signal received on any rank, timed
// checkpoint due on rank 0's clock), so that every rank takes the same decision at the same
// iteration. Install StopSignals before constructing it.
class StopPoller {
 public:
  StopPoller(const Comm& comm, Every every);
  struct Decision {
    int signal = 0;             // SIGTERM / SIGUSR1 received on some rank: checkpoint and stop
    bool save = false;          // write a checkpoint (always true when signal != 0)
    std::int64_t proposed = 0;  // rank 0's `propose`, the same on every rank
  };
  // done: iterations (or steps) completed so far; the boundary given to skip_count_at (the one a
  // run resumed at) never saves by count. propose: a value of rank 0's (the others' is ignored),
  // clamped to [0, kMaxProposal], that the poll carries to every rank, such as the steps until
  // the next poll.
  static constexpr std::int64_t kMaxProposal = std::int64_t{1} << 40;
  Decision poll(std::int64_t done, std::int64_t propose = 0);
  void saved();  // restart the clock of --checkpoint-every Ts
  void skip_count_at(std::int64_t done) { skip_ = done; }

 private:
  const Comm& comm_;
  Every every_;
  double last_save_ = 0;  // rank 0's monotonic clock, seconds
  std::int64_t skip_ = -1;
};

std::string signal_name(int sig);  // "SIGTERM", "SIGUSR1", or "signal N"

// A trace in a checkpoint: empty ones are simply absent, and read back as empty.
void write_vec(io::FileWriter& w, const std::string& name, std::span<const double> v);
std::vector<double> read_vec(const io::FileReader& r, const std::string& name);

// A counter or position stored as the attribute `name` of a checkpoint (checked_int,
// core/error.hpp); `bad` is the prefix "--resume FILE: ".
std::int64_t read_int(const io::FileReader& r, const std::string& name, std::int64_t lo,
                      std::int64_t hi, const std::string& bad);

// Throws the Preempted of a stop at `where` ("before iteration 12"): one line naming the signal
// and the checkpoint written (or that none was, without --checkpoint).
[[noreturn]] void stop(int sig, const std::string& where, const std::string& checkpoint);

}  // namespace caviar::ckpt
