/**
 * @file optim.cu
 * @brief AdamW and the pieces of gradient clipping on the GPU, fp32: the CUDA twins of
 *        reference/optim.cpp (adamw_step, clip_grad_norm), step for step.
 *
 * AdamW, per element k (reference adamw_step; the scalars are computed on the host in double
 * and rounded to float, as the reference does):
 *   (1) θ ← θ · (1 − lr · wd)                                    only where `decay`
 *   (2) m ← β1 · m + (1 − β1) · γ;   v ← β2 · v + (1 − β2) · γ²
 *   (3) θ ← θ − lr · (m / c1) / ( sqrt(v / c2) + eps ),   c1 = 1 − β1ᵗ,  c2 = 1 − β2ᵗ
 *
 * Clipping (reference clip_grad_norm):
 *   (1) sq += Σ_k γ_k²          grad_sq_norm, summed in double (the reference sums in double too)
 *   (2) γ ← γ · s               scale, s = max_norm / sqrt(sq) chosen by the caller
 *
 * Versions (docs/style.md §6): 1 only — one thread per element (grid-stride loops); grad_sq_norm is
 * ⟨γ, γ⟩ through dot_add (cuda/tensor_ops.cu): per-block sums in a fixed tree, then one block
 * sums the block partials in a fixed order.
 * Deliberately left out: fusing all parameters into one launch (multi-tensor apply), half
 * precision, vectorised loads. No atomics: the same bits on every run.
 */
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>

#include "cuda/launch.cuh"
#include "cuda/optim.h"
#include "cuda/tensor_ops.h"

namespace mhar::cuda {

namespace {

using detail::check_launch;
using detail::grid_for;
using detail::kThreads;
using detail::require;
using detail::require_pointers;
using detail::thread_index;
using detail::thread_stride;

/// The float scalars of one AdamW step, computed on the host like the reference.
struct AdamScalars {
  float decay_factor;  ///< 1 − lr · wd (used only where decay)
  float b1, b2;        ///< β1, β2
  float c1, c2;        ///< 1 − β1ᵗ, 1 − β2ᵗ
  float lr, eps;
};

/// One thread per element.
__global__ void adamw_elements(float* __restrict__ param, float* __restrict__ m,
                               float* __restrict__ v, const float* __restrict__ grad, std::size_t n,
                               AdamScalars s, bool decay) {
  for (std::size_t k = thread_index(); k < n; k += thread_stride()) {
    float theta = param[k];
    // (1) θ ← θ − lr · wd · θ — reference adamw_step "param *= 1 − lr · wd"
    if (decay) theta *= s.decay_factor;
    // (2) m ← β1 m + (1 − β1) γ;  v ← β2 v + (1 − β2) γ² — reference adamw_step "m =", "v ="
    const float g = grad[k];
    const float mk = s.b1 * m[k] + (1.0f - s.b1) * g;
    const float vk = s.b2 * v[k] + (1.0f - s.b2) * (g * g);
    m[k] = mk;
    v[k] = vk;
    // (3) θ ← θ − lr · m̂ / (sqrt(v̂) + eps) — reference adamw_step "param.array() -="
    param[k] = theta - s.lr * (mk / s.c1) / (sqrtf(vk / s.c2) + s.eps);
  }
}

/// Clipping (2), one thread per element.
__global__ void scale_elements(float* __restrict__ x, float s, std::size_t n) {
  // γ ← γ · s — reference clip_grad_norm "*g *= s"
  for (std::size_t k = thread_index(); k < n; k += thread_stride()) x[k] *= s;
}

void require_count(const char* where, std::size_t n) {
  require(n >= 1, where, "n = 0: needs at least one element (n >= 1)");
}

}  // namespace

void adamw_step(float* param, float* m, float* v, const float* grad, std::size_t n, long step,
                double lr, double beta1, double beta2, double eps, double weight_decay,
                bool decay) {
  const char* where = "cuda::adamw_step";
  require_count(where, n);
  require(step >= 1, where, "step counts from 1, got " + std::to_string(step));
  require(beta1 >= 0 && beta1 < 1, where,
          "beta1 = " + std::to_string(beta1) + " must lie in [0, 1)");
  require(beta2 >= 0 && beta2 < 1, where,
          "beta2 = " + std::to_string(beta2) + " must lie in [0, 1)");
  require(eps >= 0, where, "eps = " + std::to_string(eps) + " must not be negative");
  require(weight_decay >= 0, where,
          "weight_decay = " + std::to_string(weight_decay) + " must not be negative");
  require(std::isfinite(lr), where, "lr must be a finite number");
  require_pointers(where, {{"param", param}, {"m", m}, {"v", v}, {"grad", grad}});
  AdamScalars s{};
  s.decay_factor = static_cast<float>(1.0 - lr * weight_decay);
  s.b1 = static_cast<float>(beta1);
  s.b2 = static_cast<float>(beta2);
  s.c1 = static_cast<float>(1.0 - std::pow(beta1, static_cast<double>(step)));
  s.c2 = static_cast<float>(1.0 - std::pow(beta2, static_cast<double>(step)));
  s.lr = static_cast<float>(lr);
  s.eps = static_cast<float>(eps);
  adamw_elements<<<grid_for(n), kThreads>>>(param, m, v, grad, n, s, decay);
  check_launch("adamw_step: adamw_elements launch");
}

void grad_sq_norm(float* out, const float* grads, std::size_t n) {
  const char* where = "cuda::grad_sq_norm";
  require_count(where, n);
  require_pointers(where, {{"out", out}, {"grads", grads}});
  // ‖γ‖² = ⟨γ, γ⟩: the fixed-order double dot product of cuda/tensor_ops.cu
  // (per-block partial sums, then one block sums those) — reference clip_grad_norm "sq +="
  dot_add(out, grads, grads, n);
}

void scale(float* x, float s, std::size_t n) {
  const char* where = "cuda::scale";
  require_count(where, n);
  require_pointers(where, {{"x", x}});
  scale_elements<<<grid_for(n), kThreads>>>(x, s, n);
  check_launch("scale: scale_elements launch");
}

}  // namespace mhar::cuda
