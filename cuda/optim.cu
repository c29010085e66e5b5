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
 * Versions (STYLE.md §6): 1 only — one thread per element (grid-stride loops); grad_sq_norm
 * sums per block in a fixed tree, then one block sums the block partials in a fixed order.
 * Deliberately left out: fusing all parameters into one launch (multi-tensor apply), half
 * precision, vectorised loads. No atomics: the same bits on every run.
 */
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>

#include "cuda/launch.cuh"
#include "cuda/optim.h"

namespace mhar::cuda {

namespace {

using detail::block_sum;
using detail::ceil_div;
using detail::check_launch;
using detail::grid_for;
using detail::kThreads;
using detail::require;
using detail::require_pointers;
using detail::Scratch;
using detail::thread_index;
using detail::thread_stride;

/// Most blocks of grad_sq_partial, so that one block of grad_sq_total sums their partials.
constexpr std::size_t kMaxPartials = 1024;

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

/// Clipping (1), first half: partial[b] = Σ γ² over the elements block b visits (thread j of
/// block b takes elements b·kThreads + j, then every gridDim · kThreads after), in double.
__global__ void grad_sq_partial(double* __restrict__ partial, const float* __restrict__ grads,
                                std::size_t n) {
  double s = 0.0;
  for (std::size_t k = thread_index(); k < n; k += thread_stride()) {
    const double g = grads[k];
    s += g * g;
  }
  s = block_sum(s);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

/// Clipping (1), second half: out[0] += Σ_b partial[b], one block, a fixed tree.
__global__ void grad_sq_total(float* __restrict__ out, const double* __restrict__ partial,
                              int blocks) {
  double s = 0.0;
  for (int b = static_cast<int>(threadIdx.x); b < blocks; b += kThreads) s += partial[b];
  s = block_sum(s);
  // sq += ‖γ‖² — reference clip_grad_norm "sq +=" (rounded to float once, here)
  if (threadIdx.x == 0) out[0] = static_cast<float>(static_cast<double>(out[0]) + s);
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
  // A function of n only: the same split, so the same sum order, on every run.
  const std::size_t blocks = std::min(ceil_div(n, kThreads), kMaxPartials);
  Scratch<double> partial(blocks, where);
  grad_sq_partial<<<static_cast<unsigned>(blocks), kThreads>>>(partial.get(), grads, n);
  check_launch("grad_sq_norm: grad_sq_partial launch");
  grad_sq_total<<<1, kThreads>>>(out, partial.get(), static_cast<int>(blocks));
  check_launch("grad_sq_norm: grad_sq_total launch");
}

void scale(float* x, float s, std::size_t n) {
  const char* where = "cuda::scale";
  require_count(where, n);
  require_pointers(where, {{"x", x}});
  scale_elements<<<grid_for(n), kThreads>>>(x, s, n);
  check_launch("scale: scale_elements launch");
}

}  // namespace mhar::cuda
