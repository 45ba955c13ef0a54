#pragma once
// What every caviar fuzz target shares: a one-rank MPI world (a singleton, no mpirun), a private
// scratch directory on tmpfs, and the seed-writing mode.
//
// Seeds: run a target with CAVIAR_FUZZ_WRITE_SEEDS=DIR and it writes its seed inputs into DIR
// and exits instead of fuzzing (scripts/check_fuzz.sh does this before each run). The HDF5 targets
// make their seeds from files that caviar itself writes (a real checkpoint, a real corpus),
// encoded with h5_spec.hpp, so that the seeds follow the current file formats.
//
// Inspecting and crafting inputs of the HDF5 targets: CAVIAR_FUZZ_DECODE_TO=FILE.h5 while running
// an input writes the file it decodes to; CAVIAR_FUZZ_ENCODE=FILE.h5 CAVIAR_FUZZ_ENCODE_TO=INPUT
// [CAVIAR_FUZZ_CONFIG=BYTE] encodes an HDF5 file (e.g. edited with h5py) into an input and exits
// (a fingerprint equal to the configuration's current one becomes kFingerprint).
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "comm/comm.hpp"
#include "h5_spec.hpp"

namespace caviar::fuzz {

// The checkpoint targets' fingerprint placeholder. A checkpoint's "fingerprint" attribute holds the
// run's settings and the hash of the target's data, which any change of that data or of the
// fingerprint's keys changes. Seeds and regression inputs hold kFingerprint instead, and the
// target puts the current fingerprint of the input's configuration in its place before writing
// the file (the fuzzer still mutates the placeholder into anything else). So committed inputs
// keep reaching past the fingerprint check when the data or the keys change.
inline constexpr const char* kFingerprint = "$FINGERPRINT";

struct Target {
  std::function<void(const std::string& dir)> write_seeds;
  // The current fingerprint of configuration `config` (checkpoint targets; "" for the others).
  std::function<std::string(int config)> fingerprint = [](int) { return std::string(); };
};

// Call from LLVMFuzzerInitialize: MPI_Init (once), one OpenMP thread, the scratch directory.
// CAVIAR_FUZZ_WRITE_SEEDS=DIR: writes the seeds and exits. CAVIAR_FUZZ_ENCODE: encodes and exits.
void init(const Target& target);

const Comm& comm();
// A path in this process's scratch directory (/dev/shm/caviar-fuzz-<pid>, removed at exit).
std::string scratch(const std::string& name);

// Writes `bytes` to dir/name (a seed input).
void save(const std::string& dir, const std::string& name, const std::vector<std::uint8_t>& bytes);

// An input for an HDF5 target: `prefix` (e.g. the configuration byte) and the encoding of the file,
// with the value `fingerprint` (if not empty) replaced by kFingerprint.
std::vector<std::uint8_t> input_of_file(const std::string& h5, std::vector<std::uint8_t> prefix,
                                        const std::string& fingerprint = "");
// The value of the root attribute "fingerprint" of a file ("" if it has none).
std::string fingerprint_of_file(const std::string& h5);

// A caviar::Error is the expected outcome of a bad input; with CAVIAR_FUZZ_VERBOSE set, it is
// printed (to see what a seed or a regression input reaches).
void refused(const std::exception& e);

// Decodes data into an HDF5 file at `path`, kFingerprint replaced by `fingerprint`; false if the
// file could not be created. With CAVIAR_FUZZ_DECODE_TO=FILE set, the file is also written there
// (to inspect an input).
bool write_input(const std::string& path, const std::uint8_t* data, std::size_t size,
                 const std::string& fingerprint = "");

// The shape every checkpoint target shares. Input: one configuration byte (configuration
// data[0] % configs), then the encoding of a checkpoint, which the target resumes from.
// write_checkpoint(c, path) writes configuration c's real checkpoint (once, on first use): the
// seeds are those files, and their "fingerprint" attribute is the configuration's current one.
// resume(c, path) runs the fit of configuration c resuming from `path`; a caviar::Error it throws
// is a refusal, the expected outcome of a bad input.
class CheckpointTarget {
 public:
  using Run = std::function<void(int config, const std::string& path)>;
  CheckpointTarget(int configs, Run write_checkpoint, Run resume);

  Target target();  // for init()
  // The body of LLVMFuzzerTestOneInput.
  int run(const std::uint8_t* data, std::size_t size);

 private:
  const std::string& checkpoint(int c);
  const std::string& fingerprint(int c);

  int configs_;
  Run write_checkpoint_, resume_;
  std::vector<std::string> checkpoint_, fingerprint_;
};

}  // namespace caviar::fuzz
