/**
 * @file json_types.h
 * @brief The JSON of a run directory, declared once: the model config (config.json "model" and
 *        checkpoint metadata), the training settings (config.json "train") and one row of
 *        metrics.jsonl. nlohmann's NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE writes and reads each
 *        field under its own name, so a new field is one word in one list.
 *
 * Mode is converted with mode_name / parse_mode rather than NLOHMANN_JSON_SERIALIZE_ENUM: that
 * macro reads an unknown string as the first enumerator, so a hand-edited "mode": "mhra" would
 * load as a residual model; parse_mode refuses it and lists the modes.
 */
#pragma once

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "model.h"
#include "train.h"

namespace mhar {

inline void to_json(nlohmann::json& j, Mode m) {
  j = mode_name(m);
}
inline void from_json(const nlohmann::json& j, Mode& m) {
  m = parse_mode(j.get<std::string>());
}

// Every key is required on reading (a missing one is an error that names it).
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(Config, vocab, d, L, n_head, n_kv_head, ffn, T, mode, H,
                                   n_blocks)

namespace toy {

// config.json "train": every TrainOptions field but cfg (the "model" section), out (where the
// run is) and quiet (how it was started).
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(TrainOptions, data, steps, batch, lr, min_lr_ratio, warmup,
                                   weight_decay, clip, seed, val_fraction, eval_every, eval_batches,
                                   ckpt_every, heatmap_every, figure_formats, log_every, device,
                                   threads, routing)

/// The fields every metrics.jsonl row has.
struct MetricsFields {
  long step = 0;
  double train_loss = 0, lr = 0, grad_norm = 0, tokens_per_s = 0, elapsed_s = 0;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(MetricsFields, step, train_loss, lr, grad_norm, tokens_per_s,
                                   elapsed_s)

/// One row of metrics.jsonl: the fields above, and val_loss on the steps that evaluated.
struct MetricsRow : MetricsFields {
  std::optional<double> val_loss;
};

inline void to_json(nlohmann::json& j, const MetricsRow& r) {
  j = static_cast<const MetricsFields&>(r);
  if (r.val_loss) j["val_loss"] = *r.val_loss;
}
inline void from_json(const nlohmann::json& j, MetricsRow& r) {
  from_json(j, static_cast<MetricsFields&>(r));
  if (j.contains("val_loss")) r.val_loss = j.at("val_loss").get<double>();
}

/// The rows of a metrics.jsonl, in order, up to the first line that does not parse (a torn
/// last line of a run that was stopped), which *torn says when it is given. An absent file has
/// no rows.
std::vector<MetricsRow> read_metrics(const std::filesystem::path& path, bool* torn = nullptr);

}  // namespace toy
}  // namespace mhar
