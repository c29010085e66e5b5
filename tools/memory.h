/**
 * @file memory.h
 * @ingroup tools
 * @brief How much memory a model and one step of it need, estimated from the config alone, so
 *        that a size that cannot fit is refused before anything is allocated.
 *
 * The estimate counts the parameters (and, when training, their gradients and AdamW's two
 * moments) and what the forward keeps for the backward: per position, the 2L + 1 primitives, the
 * 2L sub-layer inputs and normed inputs, q, k, v and the attention output of every layer, the
 * attention probabilities (n_head · T per position and layer), the MLP's saved hidden values
 * (3 · ffn), the routing outputs and the logits, plus the backward's own buffers. It errs high
 * (a 25 % margin); its purpose is to turn "std::bad_alloc" into a sentence, not to plan memory.
 */
#pragma once

#include <string>

#include "model.h"

namespace mhar::toy {

/// What the memory is for: a forward only (eval, sample, heatmap) or forward + backward.
enum class Workload { Forward, Training, Gradient };

/// Number of parameter scalars of `cfg`, computed in double from the config (nothing allocated).
double param_count(const Config& cfg);

/// Estimated bytes for the parameters and one step on B sequences, scalars of `scalar_bytes`.
double memory_needed(const Config& cfg, int B, int scalar_bytes, Workload w);

/// Bytes this machine can still give (MemAvailable from /proc/meminfo, else physical memory).
double memory_available();

/**
 * @brief Throws UsageError ("<what> needs X GiB …, this machine has Y GiB available") when the
 * estimate exceeds what the machine has. `what` names the command, e.g. "train"; `models`
 * counts the models of this size held at once (bench step builds one per mode before timing).
 */
void require_memory(const Config& cfg, int B, int scalar_bytes, Workload w, const std::string& what,
                    int models = 1);

}  // namespace mhar::toy
