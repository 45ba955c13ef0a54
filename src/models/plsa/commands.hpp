#pragma once
// caviar plsa fit | score.
#include <CLI/CLI.hpp>

#include "engine/command.hpp"

namespace caviar::plsa {
void add_commands(CLI::App& cli, engine::Context& ctx);
}
