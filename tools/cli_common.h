/**
 * @file cli_common.h
 * @brief Shared pieces of mhar-toy's command line: the model-shape flags every subcommand that
 *        builds a model accepts, and the registration function of each subcommand.
 */
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

#include "model.h"

namespace mhar::toy {

/// Adds --mode, --heads, --d, --layers, --n-head, --n-kv-head, --ffn, --seq-len, --blocks.
void add_model_flags(CLI::App& cmd, Config& cfg, std::string& mode);

/// Each subcommand registers itself and sets `run` to the function that executes it
/// (returning an exit code; errors.h).
using Runner = std::function<int()>;
void register_train(CLI::App& app, Runner& run);

}  // namespace mhar::toy
