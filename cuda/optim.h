/**
 * @file optim.h
 * @ingroup cuda
 * @brief AdamW and the pieces of global-norm gradient clipping on the GPU, fp32: the CUDA twins
 *        of reference/optim.h, same names and argument order (the hyper-parameters spelled out
 *        instead of an AdamWHyper, so that this header needs nothing from reference/).
 *
 * AdamW (Loshchilov & Hutter), one step t ≥ 1 for a parameter θ with gradient γ:
 *   θ ← θ − lr · wd · θ                          (decoupled decay; only where `decay` is true)
 *   m ← β1 · m + (1 − β1) · γ,   v ← β2 · v + (1 − β2) · γ²
 *   θ ← θ − lr · (m / (1 − β1ᵗ)) / ( sqrt(v / (1 − β2ᵗ)) + eps )
 *
 * Clipping (reference clip_grad_norm) is split in two so that it spans any number of device
 * tensors: zero one device float `sq`, call grad_sq_norm(sq, g, n) for every gradient (sq
 * accumulates in a fixed order), download it, norm = sqrt(sq); when norm > max_norm > 0, call
 * scale(g, max_norm / norm, n) on every gradient.
 *
 * A plain C++ header (no CUDA types, no Eigen): all pointers are DEVICE pointers to contiguous
 * fp32 arrays of n elements (the shape does not matter to an elementwise step). The kernels are
 * in cuda/optim.cu. Errors: bad arguments throw std::invalid_argument before any CUDA call; a
 * failed CUDA call throws std::runtime_error with CUDA's message.
 */
#pragma once

#include <cstddef>

namespace mhar::cuda {

/**
 * @brief One AdamW step on `param` and its moments (reference adamw_step).
 * @param param         n (updated in place)
 * @param m             n (updated in place), the first moment
 * @param v             n (updated in place), the second moment
 * @param grad          n
 * @param n             elements
 * @param step          counts from 1 (bias corrections 1 − β1ᵗ, 1 − β2ᵗ, on the host in double)
 * @param lr            learning rate
 * @param beta1         β1 in [0, 1)
 * @param beta2         β2 in [0, 1)
 * @param eps           added to sqrt(v̂), ≥ 0
 * @param weight_decay  decoupled decay wd, ≥ 0
 * @param decay         whether this parameter decays (the model says which, per tensor)
 */
void adamw_step(float* param, float* m, float* v, const float* grad, std::size_t n, long step,
                double lr, double beta1, double beta2, double eps, double weight_decay, bool decay);

/**
 * @brief out[0] += Σ_k grads[k]² (the squared-norm part of reference clip_grad_norm).
 *
 * Accumulated in double in a fixed order (per-block partial sums, then one block sums those),
 * then added to the float in out[0]: two runs give the same bits.
 * @param out    1 float (+=)
 * @param grads  n
 * @param n      elements
 */
void grad_sq_norm(float* out, const float* grads, std::size_t n);

/**
 * @brief x[k] *= s for k < n (the scaling part of reference clip_grad_norm).
 * @param x  n (updated in place)
 * @param s  the factor, max_norm / norm
 * @param n  elements
 */
void scale(float* x, float s, std::size_t n);

}  // namespace mhar::cuda
