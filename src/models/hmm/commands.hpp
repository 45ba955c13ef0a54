#pragma once
// caviar hmm fit | score | decode | sample, and caviar generate hmm.
#include <CLI/CLI.hpp>

#include "engine/command.hpp"

namespace caviar::hmm {
// Registers `hmm` and `generate hmm` (the `generate` command must already be registered).
void add_commands(CLI::App& cli, engine::Context& ctx);
}  // namespace caviar::hmm
