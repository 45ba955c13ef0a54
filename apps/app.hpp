#pragma once
// Shared plumbing of the caviar command-line program: how commands register, report progress
// and print their one-line JSON summary. Validation and I/O live in the drivers; apps stay thin.
#include <CLI/CLI.hpp>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "comm/comm.hpp"
#include "engine/command.hpp"

namespace caviar::app {

// The command layer shared with the models' own commands (engine/command.hpp).
using engine::Context;
using engine::print_progress;
using engine::print_summary;

void add_gmm_commands(CLI::App& app, Context& ctx);
void add_generate_commands(CLI::App& app, Context& ctx);
void add_prep_commands(CLI::App& app, Context& ctx);
// lda fit|topics|score|export|import, plus `generate lda` and `prep text` into those groups (so
// it must be called after add_generate_commands and add_prep_commands).
void add_lda_commands(CLI::App& app, Context& ctx);
void add_vae_commands(CLI::App& app, Context& ctx);

}  // namespace caviar::app
