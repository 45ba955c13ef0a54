#pragma once
// caviar bbvi fit: black-box VI of a Bayesian GLM on the engine's draws driver (engine/draws.hpp).
#include <CLI/CLI.hpp>

#include "engine/command.hpp"

namespace caviar::bbvi {
// Registers `bbvi`.
void add_commands(CLI::App& cli, engine::Context& ctx);
}  // namespace caviar::bbvi
