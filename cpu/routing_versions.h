/**
 * @file routing_versions.h
 * @ingroup cpu
 * @brief The fast CPU routing versions: their lineage, one file each, and the choice the model
 *        and the tools make between them and the reference.
 *
 * **Numbering.** Each op has its own lineage, and a CPU version is always written with its op's
 * letter and number, F for the forward and B for the backward: F2, B3. Version 1 of each op is
 * the reference (reference/routing.cpp). The GPU numbers its kernels differently: one number
 * names a forward and backward pair (cuda/routing_versions.h: 1 naive, 2 fused, 3 warp), and is
 * written bare or by its name, so "F3" never means the GPU's warp version 3.
 *
 *   op        version  file                         what it changes from the one before
 *   forward   F1       reference/routing.cpp        docs/design.md §1, one Eigen line a step
 *             F2       routing_fast_forward.cpp     a few positions at a time, all sources read
 *                                                   while their rows stay in cache, blocks of
 *                                                   positions across threads
 *             F3       routing_stack_forward.cpp    a whole attnres or mhar stack: each source's
 *                                                   logits at every later site once, when the
 *                                                   source is written; sites in pairs
 *   backward  B1       reference/routing.cpp        the same page's derivation, step by step
 *             B2       routing_fast_backward.cpp    as F2, and D = ⟨dout, out⟩ instead of a pass
 *                                                   over the weights
 *             B3       routing_stack_backward.cpp   a whole stack, source by source: each
 *                                                   source's gradient written once, not at every
 *                                                   site that reads it
 *
 * routing_fast.h declares F2 and B2 (one site, routing.h's contract); routing_stack.h declares
 * F3 and B3 (a stack where site s reads sources 0 … s). routing_blocks.h holds what they share:
 * blocks of positions across OpenMP threads, and vector loops with intrinsics and prefetches,
 * which is why none of this is in reference/. Each file's first lines say what it changes.
 *
 * **The choice.** `fast_routing()` is the Routing<T> (reference/routing_choice.h) the model
 * runs by default: F2 and B2 at a block or delta site and in the decoder, F3 and B3 for the
 * stack of attnres and mhar. `train --routing reference|fast` picks it or the reference.
 */
#pragma once

#include <string>
#include <vector>

#include "routing_choice.h"

namespace mhar {

/// The CPU routing the model runs: the reference (routing.h at every site) or the fast versions.
enum class CpuRouting { Reference, Fast };

/// "reference" or "fast".
std::string cpu_routing_name(CpuRouting r);
/// cpu_routing_name of each choice, in the order --help lists them.
std::vector<std::string> cpu_routing_names();
/// Parses a name of cpu_routing_names; throws ShapeError listing the allowed names.
CpuRouting parse_cpu_routing(const std::string& name);

/// F2 and B2 at each site, F3 and B3 for an attnres or mhar stack.
template <typename T>
const Routing<T>& fast_routing();

/// reference_routing() or fast_routing().
template <typename T>
const Routing<T>& cpu_routing(CpuRouting r);

}  // namespace mhar
