/**
 * @file check_layers.h
 * @ingroup cuda
 * @brief Every layer and optimiser twin (cuda/layers.h, cuda/linear.h, cuda/optim.h) against the
 * CPU reference, on fresh random inputs and awkward shapes: what tests/cuda asserts.
 *
 * Tolerance (docs/style.md §7), as in check_routing.h: truth is the reference
 * (reference/layers.cpp, reference/optim.cpp) in double on the same float inputs; ref_f_err is the
 * largest absolute error of the same reference run in float. A GPU result passes when max |gpu −
 * truth|  <=  8 · ref_f_err + 1e-6 · max |truth| (compare.h says how the 8 and the 1e-6 were
 * chosen). Saved forward values a backward reads (rinv, probs) are the double forward's, rounded to
 * float, for all three runs.
 *
 * The SwiGLU middle has no function of its own in the reference: it is checked through
 * reference mlp_forward / mlp_backward with 0/1 weights that make its matmuls exact copies
 * (x = [gate | up], W_gate = [I; 0], W_up = [0; I], W_down = [I | 0]).
 *
 * Plain C++ (compiled by g++): links mhar_reference (Eigen) and mhar_cuda.
 */
#pragma once

#include <string>
#include <vector>

#include "cuda/check/check_routing.h"
#include "cuda/device.h"

namespace mhar::cuda {

/// The dimensions every layer check draws from (docs/design.md letters).
struct LayerShape {
  int P = 1;        ///< positions, a multiple of T
  int T = 1;        ///< tokens per sequence (RoPE's t = p mod T)
  int d = 1;        ///< width of RMSNorm and the embedding; AdamW and clipping use P·d elements
  int n_heads = 1;  ///< RoPE heads
  int hd = 2;       ///< RoPE head width (even)
  int f = 1;        ///< SwiGLU hidden width
  int vocab = 1;    ///< embedding rows, cross-entropy classes
};

/// "P=7 T=7 d=40 heads=5 hd=8 f=72 vocab=19"
std::string describe(const LayerShape& s);

/// The awkward shapes: P = 1 and T = 1, P odd, d = 1 and d not a multiple of 32, hd = 2,
/// vocab = 1, vocab > 256, many positions (several dgain chunks, repeated tokens), a wide row.
std::vector<LayerShape> layer_check_shapes();

// Each check poisons the outputs written with `=` with NaN before the launch (an element the
// kernel does not write fails), and starts the `+=` outputs from random values. Each needs a
// CUDA device. CheckRow::version is "v1" (the only version of these kernels).

/// "rmsnorm_forward y", "rmsnorm_forward rinv", "rmsnorm_backward dx", "rmsnorm_backward dgain".
std::vector<CheckRow> check_rmsnorm(const LayerShape& s, unsigned seed);
/// "rope_forward y", "rope_backward dx".
std::vector<CheckRow> check_rope(const LayerShape& s, unsigned seed);
/// "swiglu_forward h", "swiglu_backward dgate", "swiglu_backward dup".
std::vector<CheckRow> check_swiglu(const LayerShape& s, unsigned seed);
/// "linear_forward y", "linear_backward dx", "linear_backward dW" (cuBLAS; in = d, out = f).
std::vector<CheckRow> check_linear(const LayerShape& s, unsigned seed);
/// "mlp_forward y|gate|up", "mlp_backward dx|dw_gate|dw_up|dw_down" (cuBLAS + SwiGLU middle).
std::vector<CheckRow> check_mlp(const LayerShape& s, unsigned seed);
/// "embedding_forward x", "embedding_backward dE".
std::vector<CheckRow> check_embedding(const LayerShape& s, unsigned seed);
/// "cross_entropy_forward loss", "cross_entropy_forward probs", "cross_entropy_backward dlogits".
std::vector<CheckRow> check_cross_entropy(const LayerShape& s, unsigned seed);
/// adamw_step on P·d elements, with decay at step 1 and without at step 7: param, m, v each.
std::vector<CheckRow> check_adamw(const LayerShape& s, unsigned seed);
/// grad_sq_norm over two tensors into one accumulator, and scale.
std::vector<CheckRow> check_clip(const LayerShape& s, unsigned seed);

/// Every check above on every shape of layer_check_shapes(). Throws std::runtime_error when
/// there is no CUDA device.
std::vector<CheckRow> check_layers(unsigned seed);

}  // namespace mhar::cuda
