/**
 * @file optim.h
 * @ingroup reference
 * @brief AdamW with decoupled weight decay, and global-norm gradient clipping, CPU reference.
 *
 * AdamW (Loshchilov & Hutter), one step t ≥ 1 for a parameter θ with gradient γ:
 *   θ ← θ − lr · wd · θ                          (decoupled decay; only where `decay` is true)
 *   m ← β1 · m + (1 − β1) · γ,   v ← β2 · v + (1 − β2) · γ²
 *   θ ← θ − lr · (m / (1 − β1ᵗ)) / ( sqrt(v / (1 − β2ᵗ)) + eps )
 */
#pragma once

#include <span>

#include "tensor.h"

namespace mhar {

struct AdamWHyper {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
};

/// One AdamW step on `param` (+ its moments m, v, all the same shape). step counts from 1.
template <typename T>
void adamw_step(Mat<T>& param, Mat<T>& m, Mat<T>& v, const Mat<T>& grad, long step, double lr,
                const AdamWHyper& hyper, bool decay);

/// Global L2 norm of all gradients; when it exceeds max_norm > 0, every gradient is scaled by
/// max_norm / norm. Returns the norm before clipping.
template <typename T>
double clip_grad_norm(std::span<Mat<T>* const> grads, double max_norm);

}  // namespace mhar
