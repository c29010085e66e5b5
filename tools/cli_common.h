/**
 * @file cli_common.h
 * @ingroup tools
 * @brief Shared pieces of mhar-toy's command line: the model-shape flags every subcommand that
 *        builds a model accepts, and the registration function of each subcommand.
 */
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

#include "figures.h"
#include "model.h"

namespace mhar::toy {

/// @name Validators for flags, so that --help shows what each accepts and a wrong value is
/// refused before anything runs (exit 2): "--steps: must be positive, got 0". They replace
/// CLI11 2.1's PositiveNumber, NonNegativeNumber, Range and IsMember, whose messages are
/// CLI11's ("Value 2 not in range 0.000000 to 1.000000", "--mode: mha not in {…}").
/// @{
/// A number > 0.
const CLI::Validator& positive();
/// A number ≥ 0 (0 usually means "off", "all" or "the default": each flag's help says which).
const CLI::Validator& non_negative();
/// A --threads (or --busy) value: 0 (each flag's help says what 0 means) to kMaxThreads
/// (thread_governor.h).
const CLI::Validator& thread_count();
/// A number in [lo, hi], shown in --help as CLI11's Range shows it ("FLOAT in [0 - 1]", type
/// "FLOAT" or "INT"): "--val-fraction: must be from 0 to 1, got 2".
CLI::Validator in_range(double lo, double hi, const std::string& type);
/// One of `names`, shown in --help as CLI11's IsMember shows it ("TEXT:{residual,attnres,…}"):
/// "--mode: must be residual, attnres, mhar, block or delta, got 'mha'".
CLI::Validator one_of(const std::vector<std::string>& names);
/// @}

/// What a CLI::ExtrasError leaves in `app` (its subcommands included), in the order of `typed`,
/// the arguments as the user gave them: "unexpected arguments --modes residual". CLI11's own
/// message lists them back to front ("residual --modes").
std::string unexpected_arguments(const CLI::App& app, const std::vector<std::string>& typed);

/// Any other parse error of `cmd` (the subcommand whose flags were being read) in our words, for
/// the message "mhar-toy: error: <command>: <words> (…)": a flag given without its value is
/// "--heads needs a value" (CLI11: "--heads: 1 required INT:NONNEGATIVE missing"), a missing
/// positional argument "missing the ckpt argument: <its help>", a missing required flag
/// "missing --cases, which this command needs: <its help>" (CLI11: "--cases is required"), a
/// value that its type cannot hold "--steps: '2.5' is not a whole number in range" (CLI11:
/// "Could not convert: --steps = 2.5");
/// a refused value keeps the validator's words ("--steps: must be positive, got 0").
std::string parse_error_words(const CLI::App& cmd, const CLI::ParseError& e);

/// Adds --mode, --heads, --d, --layers, --n-head, --n-kv-head, --ffn, --seq-len, --blocks.
void add_model_flags(CLI::App& cmd, Config& cfg, std::string& mode);
/// The config those flags describe, validated; throws UsageError (exit 2) naming what is wrong.
Config model_config(Config cfg, const std::string& mode);
/// The value of a --format flag ("png,svg,pdf"); throws UsageError (exit 2) naming what is allowed.
std::vector<io::Format> parse_format_flag(const std::string& list);

/// Adds --cuda-sync to `cmd` (train, check, bench): every CUDA launch is synchronised and
/// checked, so that a fault inside a kernel is reported under that kernel's name (as with
/// MHAR_CUDA_SYNC=1 in the environment; cuda/device.h, sync_launches).
void add_cuda_sync_flag(CLI::App& cmd, bool& on);
/// Turns the switch on when `on` (no effect in a build without CUDA).
void apply_cuda_sync(bool on);

/// Each subcommand registers itself on `app` and returns the function that executes it once the
/// command line is parsed (returning an exit code; errors.h).
using Runner = std::function<int()>;
struct Subcommand {
  CLI::App* cmd;
  Runner run;
};
Subcommand register_train(CLI::App& app);
Subcommand register_sample(CLI::App& app);
Subcommand register_eval(CLI::App& app);
Subcommand register_grad(CLI::App& app);
Subcommand register_heatmap(CLI::App& app);
Subcommand register_convert(CLI::App& app);
Subcommand register_plot(CLI::App& app);
Subcommand register_check(CLI::App& app);
Subcommand register_bench(CLI::App& app);
Subcommand register_stream(CLI::App& app);
Subcommand register_probe(CLI::App& app);
Subcommand register_sweep(CLI::App& app);
Subcommand register_cases(CLI::App& app);
Subcommand register_verify(CLI::App& app);

}  // namespace mhar::toy
