#include "harness.hpp"

#include <omp.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <utility>

#include "core/error.hpp"

namespace caviar::fuzz {

namespace {
std::string& scratch_dir() {
  static std::string dir;
  return dir;
}
std::unique_ptr<Environment>& environment() {
  static std::unique_ptr<Environment> env;
  return env;
}
std::unique_ptr<Comm>& world() {
  static std::unique_ptr<Comm> c;
  return c;
}
void remove_scratch() {
  std::error_code ec;
  if (!scratch_dir().empty()) std::filesystem::remove_all(scratch_dir(), ec);
}
}  // namespace

void init(const Target& target) {
  // OMPIO's shared-file-pointer component creates and removes three files at every MPI-IO open;
  // caviar never uses a shared file pointer, and the fuzzers open files thousands of times.
  setenv("OMPI_MCA_sharedfp", "individual", 0);
  // libFuzzer's own arguments are none of MPI's business: a bare argv.
  static char name[] = "caviar-fuzz";
  static char* args[] = {name, nullptr};
  int argc = 1;
  char** argv = args;
  environment() = std::make_unique<Environment>(argc, argv);
  world() = std::make_unique<Comm>(Comm::world());
  // One thread: the machine's cores are shared, and the readers are what is fuzzed.
  omp_set_num_threads(1);
  const bool shm = std::filesystem::is_directory("/dev/shm");
  scratch_dir() = std::string(shm ? "/dev/shm" : "/tmp") + "/caviar-fuzz-" +
                  std::to_string(static_cast<long>(::getpid()));
  std::filesystem::create_directories(scratch_dir());
  std::atexit(remove_scratch);
  if (const char* h5 = std::getenv("CAVIAR_FUZZ_ENCODE")) {
    const char* to = std::getenv("CAVIAR_FUZZ_ENCODE_TO");
    const char* config = std::getenv("CAVIAR_FUZZ_CONFIG");
    std::vector<std::uint8_t> prefix;
    std::string fp;
    if (config) {
      prefix.push_back(static_cast<std::uint8_t>(std::atoi(config)));
      fp = target.fingerprint(prefix[0]);
    }
    const std::filesystem::path out = to ? to : "input";
    save(out.parent_path().empty() ? "." : out.parent_path().string(), out.filename().string(),
         input_of_file(h5, prefix, fp));
    remove_scratch();
    std::_Exit(0);  // MPI is not finalised: exit as libFuzzer does after a run
  }
  if (const char* dir = std::getenv("CAVIAR_FUZZ_WRITE_SEEDS")) {
    std::filesystem::create_directories(dir);
    target.write_seeds(dir);
    remove_scratch();
    std::_Exit(0);
  }
}

const Comm& comm() {
  return *world();
}

std::string scratch(const std::string& name) {
  return scratch_dir() + "/" + name;
}

void save(const std::string& dir, const std::string& name, const std::vector<std::uint8_t>& bytes) {
  std::ofstream f(dir + "/" + name, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!f) {
    std::fprintf(stderr, "cannot write seed %s/%s\n", dir.c_str(), name.c_str());
    std::exit(1);
  }
  std::fprintf(stderr, "seed %s/%s: %zu bytes\n", dir.c_str(), name.c_str(), bytes.size());
}

namespace {
std::size_t replace_strings(std::vector<Entry>& entries, const std::string& from,
                            const std::string& to) {
  std::size_t n = 0;
  for (Entry& e : entries)
    for (std::string& s : e.strings)
      if (s == from) {
        s = to;
        ++n;
      }
  return n;
}
}  // namespace

std::vector<std::uint8_t> input_of_file(const std::string& h5, std::vector<std::uint8_t> prefix,
                                        const std::string& fingerprint) {
  std::vector<Entry> entries = read_file(h5);
  if (!fingerprint.empty()) replace_strings(entries, fingerprint, kFingerprint);
  const std::vector<std::uint8_t> body = encode(entries);
  prefix.insert(prefix.end(), body.begin(), body.end());
  return prefix;
}

std::string fingerprint_of_file(const std::string& h5) {
  for (const Entry& e : read_file(h5))
    if (e.kind == Entry::kAttribute && e.object.empty() && e.name == "fingerprint" &&
        e.strings.size() == 1)
      return e.strings[0];
  return "";
}

void refused(const std::exception& e) {
  static const bool verbose = std::getenv("CAVIAR_FUZZ_VERBOSE") != nullptr;
  if (verbose) std::fprintf(stderr, "refused: %s\n", e.what());
}

bool write_input(const std::string& path, const std::uint8_t* data, std::size_t size,
                 const std::string& fingerprint) {
  std::vector<Entry> entries = decode(data, size);
  if (!fingerprint.empty()) replace_strings(entries, kFingerprint, fingerprint);
  // To look at what an input decodes to (h5dump): CAVIAR_FUZZ_DECODE_TO=FILE.h5.
  if (const char* to = std::getenv("CAVIAR_FUZZ_DECODE_TO")) write_file(to, entries);
  return write_file(path, entries);
}

CheckpointTarget::CheckpointTarget(int configs, Run write_checkpoint, Run resume)
    : configs_(configs),
      write_checkpoint_(std::move(write_checkpoint)),
      resume_(std::move(resume)),
      checkpoint_(static_cast<std::size_t>(configs)),
      fingerprint_(static_cast<std::size_t>(configs)) {}

const std::string& CheckpointTarget::checkpoint(int c) {
  std::string& path = checkpoint_[static_cast<std::size_t>(c)];
  if (path.empty()) {
    const std::string p = scratch("ck" + std::to_string(c) + ".h5");
    write_checkpoint_(c, p);
    path = p;
  }
  return path;
}

const std::string& CheckpointTarget::fingerprint(int c) {
  std::string& fp = fingerprint_[static_cast<std::size_t>(c)];
  if (fp.empty()) fp = fingerprint_of_file(checkpoint(c));
  return fp;
}

Target CheckpointTarget::target() {
  Target t;
  t.write_seeds = [this](const std::string& dir) {
    for (int c = 0; c < configs_; ++c)
      save(dir, "config" + std::to_string(c),
           input_of_file(checkpoint(c), {static_cast<std::uint8_t>(c)}, fingerprint(c)));
  };
  t.fingerprint = [this](int c) { return fingerprint(c); };
  return t;
}

int CheckpointTarget::run(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const int c = data[0] % configs_;
  const std::string ck = scratch("resume.h5");
  if (!write_input(ck, data + 1, size - 1, fingerprint(c))) return 0;
  try {
    resume_(c, ck);
  } catch (const caviar::Error& e) {
    refused(e);
  }
  return 0;
}

}  // namespace caviar::fuzz
