/**
 * @file cli_train.h
 * @ingroup tools
 * @brief train's own flags, for the commands that pass them on to child runs (sweep): each binds
 *        one TrainOptions field, and TrainOptions::to_args writes them back.
 */
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "train.h"

namespace mhar::toy {

/// Adds the model flags (add_model_flags, bound to o.cfg and `mode`) and every training flag
/// (bound to the other fields of `o`) to `cmd`. register_train adds --resume, --cuda-sync and
/// the GPU self-check flags after them.
void add_train_options(CLI::App& cmd, TrainOptions& o, std::string& mode);

}  // namespace mhar::toy
