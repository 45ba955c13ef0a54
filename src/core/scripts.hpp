#pragma once
// Where the binary finds the Python scripts it runs (scripts/plot_vae.py, ...). An installed binary
// looks beside itself, <bin>/../share/caviar/scripts, so that a prefix can be moved or copied to
// another cluster as a whole; a binary in the build tree uses the scripts of its source tree, so
// that edits to them take effect without an install.
#include <string>
#include <vector>

namespace caviar {

// The full path of scripts/<name>; throws Error naming where it looked if the file is not there.
std::string script_path(const std::string& name);

// s quoted for /bin/sh (single quotes; an embedded ' becomes '\''), for the commands that run
// those scripts through std::system.
std::string shell_quote(const std::string& s);

// Runs `PYTHON path ARGS...` (PYTHON: $CAVIAR_PYTHON, else /usr/bin/python3; every argument
// shell-quoted) to draw the PNG `png`; throws Error naming the command if it failed.
void run_plot_script(const std::string& path, const std::vector<std::string>& args,
                     const std::string& png);

// Draws a PNG with scripts/<script>: writes `table_json` (what the script reads) beside `png`,
// runs `PYTHON script TABLE --png PNG` (PYTHON: $CAVIAR_PYTHON, else /usr/bin/python3; the script
// writes the PNG atomically), removes the table, and throws Error naming the command if it failed.
void render_png(const std::string& script, const std::string& table_json, const std::string& png);

}  // namespace caviar
