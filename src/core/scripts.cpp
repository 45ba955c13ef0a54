#include "core/scripts.hpp"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <system_error>

#include "core/error.hpp"

// Set by CMakeLists.txt: the scripts directory relative to the installed binary's directory, the
// build tree's binary directory, and the source tree's scripts directory.
#ifndef CAVIAR_SCRIPTS_REL
#error "CAVIAR_SCRIPTS_REL must be defined"
#endif

namespace caviar {

namespace fs = std::filesystem;

std::string script_path(const std::string& name) {
  std::error_code ec;
  // /proc/self/exe, not argv[0]: under mpirun or a module, argv[0] is often a bare name from PATH.
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) throw Error("cannot find the caviar binary's own path (/proc/self/exe): " + ec.message());
  const fs::path dir = exe.parent_path();
  // The build tree first: an install into a prefix that happens to contain the build tree must
  // not make the build-tree binary run stale installed copies.
  if (fs::equivalent(dir, fs::path(CAVIAR_BUILD_BINARY_DIR), ec))
    return (fs::path(CAVIAR_SOURCE_SCRIPTS_DIR) / name).string();
  const fs::path installed = (dir / CAVIAR_SCRIPTS_REL / name).lexically_normal();
  if (fs::is_regular_file(installed, ec)) return installed.string();
  throw Error(name + " not found: looked for " + installed.string() + " (next to the binary " +
              exe.string() + "); reinstall caviar (cmake --install)");
}

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

void render_png(const std::string& script, const std::string& table_json, const std::string& png) {
  const std::string path = script_path(script);
  const std::string table = png + ".tmp-caviar-table.json";
  {
    std::ofstream f(table);
    f << table_json << '\n';
    if (!f) throw Error("cannot write '" + table + "'");
  }
  struct RemoveTable {
    const std::string& f;
    ~RemoveTable() {
      std::error_code ec;
      fs::remove(f, ec);
    }
  } remove_table{table};
  run_plot_script(path, {table, "--png", png}, png);
}

void run_plot_script(const std::string& path, const std::vector<std::string>& args,
                     const std::string& png) {
  const char* py = std::getenv("CAVIAR_PYTHON");
  std::string cmd = shell_quote(py ? py : "/usr/bin/python3") + " " + shell_quote(path);
  for (const std::string& a : args) cmd.append(" ").append(shell_quote(a));
  if (std::system(cmd.c_str()) != 0)
    throw Error("rendering " + png + " failed (" + cmd +
                "); it needs Debian's python3-matplotlib and python3-h5py");
}

}  // namespace caviar
