/**
 * @file check_model.h
 * @ingroup cuda
 * @brief The whole training step on the GPU (cuda/model.h) against the CPU reference
 *        (reference/model.h), in every residual mode: the loss and every parameter gradient,
 *        over a few steps of a training trajectory. What `mhar-toy check` prints and tests/cuda
 *        asserts.
 *
 * Each step, the three runs see the same float parameters and the same batch:
 *   truth      reference model_forward / model_backward in double (on the float values, so
 *              that input rounding is not counted as error);
 *   ref_float  the same reference in float: its error against truth is the error budget;
 *   gpu        cuda::model_forward / cuda::model_backward.
 * A row passes when max |gpu − truth| ≤ 8 · max |ref_float − truth| + 1e-6 · max |truth|
 * (compare.h says why). Between steps the double run takes a clipped AdamW step, so
 * later steps compare gradients at trained, non-uniform parameters; the optimiser itself is
 * compared element by element in check_layers.h (check_adamw, check_clip).
 *
 * The starting parameters are drawn away from the DESIGN initialisation on purpose: routing
 * queries, key gains, norm gains, delta gates and the null source all random, so that every
 * routing softmax is far from uniform and every gradient is non-zero.
 */
#pragma once

#include <string>
#include <vector>

#include "cuda/check/check_routing.h"
#include "reference/model.h"

namespace mhar::cuda {

/// One model to check: a name for the table, its config and batch.
struct ModelCheckCase {
  std::string name;  ///< "mhar H=4 B=2 T=7 d=24 L=2"
  Config cfg;
  int B = 1;
  RoutingVersion routing = RoutingVersion::Fused;  ///< the routing kernels every site uses
};

/// Every residual mode on small awkward shapes: T odd and T = 1, d not a multiple of 32,
/// grouped-query attention, K = d/H not a power of two, H = d, several blocks.
std::vector<ModelCheckCase> model_check_cases();

/// `steps` steps of one case: per step t the loss (step "step <t>", tensor "loss"), then every
/// gradient (step "step <t> grad", tensor the parameter's name). Needs a CUDA device.
std::vector<CheckRow> check_model_step(const ModelCheckCase& c, int steps, unsigned seed);

/// Every case of model_check_cases(), three steps each. Throws std::runtime_error when there
/// is no CUDA device.
std::vector<CheckRow> check_model(unsigned seed);

}  // namespace mhar::cuda
