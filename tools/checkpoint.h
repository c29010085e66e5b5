/**
 * @file checkpoint.h
 * @ingroup tools
 * @brief Model checkpoints and optimiser state as safetensors files (docs/checkpoint-format.md).
 *
 * checkpoint.safetensors holds every parameter tensor under the names of Params::for_each, in
 * float32, with the model config as JSON in the metadata. optimizer.safetensors holds AdamW's
 * moments ("m.<name>", "v.<name>"). Both are written to a temporary file and renamed.
 */
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "model.h"

namespace mhar::toy {

/// Format tag and version written into every checkpoint's metadata.
inline constexpr const char* kCheckpointFormat = "mhar.checkpoint";
inline constexpr int kCheckpointVersion = 1;

nlohmann::json config_to_json(const Config& cfg);
/// Reads and validates a config; throws UsageError naming `where` on a missing field, a value that
/// is not an exact integer in range (32.5, true, 1e3, 2^63 are refused, not coerced), or a shape
/// the model cannot have.
Config config_from_json(const nlohmann::json& j, const std::string& where);
/// A checkpoint's step: digits only (no sign, space or exponent), at most 18 of them; UsageError
/// naming `where` otherwise.
long parse_step(const std::string& text, const std::string& where);

struct Checkpoint {
  Config cfg;
  Params<float> params;
  long step = 0;
  std::map<std::string, std::string> metadata;
};

/// `path` may be a checkpoint file or a run directory (its checkpoint.safetensors).
std::string resolve_checkpoint_path(const std::string& path);

void save_checkpoint(const std::string& path, const Config& cfg, const Params<float>& params,
                     long step, const std::map<std::string, std::string>& extra = {});
/// Throws UsageError naming the file when it is missing, truncated, corrupt (any rule of
/// docs/checkpoint-format.md), or holds tensors whose names or shapes do not match its own config;
/// the config is checked against the header before any tensor is read or allocated.
Checkpoint load_checkpoint(const std::string& path);

void save_optimizer(const std::string& path, const Params<float>& m, const Params<float>& v,
                    long step);
/// Loads the moments into m and v (already shaped for the model); returns the step. Refuses
/// another format or format version, a tensor more or less than m. and v. of each parameter, a
/// non-finite value, and a negative second moment.
long load_optimizer(const std::string& path, Params<float>& m, Params<float>& v);

}  // namespace mhar::toy
