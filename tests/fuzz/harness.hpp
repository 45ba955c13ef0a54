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
// [CAVIAR_FUZZ_CONFIG=BYTE] encodes an HDF5 file (e.g. edited with h5py) into an input and exits.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "comm/comm.hpp"
#include "h5_spec.hpp"

namespace caviar::fuzz {

// Call from LLVMFuzzerInitialize: MPI_Init (once), one OpenMP thread, the scratch directory.
// If CAVIAR_FUZZ_WRITE_SEEDS is set, runs write_seeds(dir) and exits.
void init(const std::function<void(const std::string& dir)>& write_seeds);

const Comm& comm();
// A path in this process's scratch directory (/dev/shm/caviar-fuzz-<pid>, removed at exit).
std::string scratch(const std::string& name);

// Writes `bytes` to dir/name (a seed input).
void save(const std::string& dir, const std::string& name, const std::vector<std::uint8_t>& bytes);

// A seed for an HDF5 target: `prefix` (e.g. the configuration byte) and the encoding of the file.
std::vector<std::uint8_t> seed_of_file(const std::string& h5, std::vector<std::uint8_t> prefix);

// A caviar::Error is the expected outcome of a bad input; with CAVIAR_FUZZ_VERBOSE set, it is
// printed (to see what a seed or a regression input reaches).
void refused(const std::exception& e);

// Decodes data into an HDF5 file at `path`; false if it could not be created. With
// CAVIAR_FUZZ_DECODE_TO=FILE set, the file is also written there (to inspect an input).
bool write_input(const std::string& path, const std::uint8_t* data, std::size_t size);

}  // namespace caviar::fuzz
