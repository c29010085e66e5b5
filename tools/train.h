/**
 * @file train.h
 * @ingroup tools
 * @brief `mhar-toy train`: the training loop on the CPU reference, with a run directory
 *        (config.json, metrics.jsonl, metrics.csv, checkpoint.safetensors, optimizer.safetensors,
 *        heatmaps/), warmup + cosine learning rate, AdamW, clipping, validation, exact resume.
 */
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data.h"
#include "model.h"

namespace mhar::toy {

struct TrainOptions {
  Config cfg;
  std::string data = kDefaultCorpus;
  std::string out = "runs/mhar";
  std::string device = "auto";
  int steps = 600;
  int batch = 16;
  double lr = 3e-3;
  double min_lr_ratio = 0.1;  ///< cosine decays to lr · min_lr_ratio at the last step
  int warmup = 30;
  double weight_decay = 0.1;
  double clip = 1.0;
  std::uint64_t seed = 1;
  double val_fraction = 0.1;
  int eval_every = 100;
  int eval_batches = 8;
  int ckpt_every = 100;
  int heatmap_every = 100;                 ///< 0: only at the end
  std::string figure_formats = "png,svg";  ///< of the heatmaps: io::parse_formats
  int log_every = 10;
  int threads = 0;               ///< 0: all cores
  std::string routing = "fast";  ///< the CPU's routing: cpu_routing_names (cpu/routing_versions.h)
  bool quiet = false;

  /// The arguments of `mhar-toy train` that run these options: every model and training flag
  /// (cli_train.h; the vocabulary is not a flag), --out, and -q when quiet. Parsing them with
  /// add_train_options gives these options back. Defined in cli_train.cpp, beside the flags.
  std::vector<std::string> to_args() const;
};

nlohmann::json train_options_to_json(const TrainOptions& o);
TrainOptions train_options_from_json(const nlohmann::json& j, const std::string& where);

/// Throws UsageError with a message naming the flag and what is allowed.
void validate(const TrainOptions& o);

/// Learning rate at step s (1-based): linear warmup, then cosine down to lr · min_lr_ratio.
double learning_rate(const TrainOptions& o, long step);

/// Trains from scratch into o.out (which must not already hold a run). Returns an exit code.
/// "1h05m", "3m07s" or "42s"; "?" for a negative or non-finite number of seconds.
std::string fmt_duration(double seconds);

int train(const TrainOptions& o);
/// Continues the run in `dir` with its saved options; `steps` > 0 overrides the total.
int resume(const std::string& dir, int steps, bool quiet);

}  // namespace mhar::toy
