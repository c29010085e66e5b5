/**
 * @file layers.cu
 * @brief The decoder's row-wise and elementwise building blocks on the GPU, fp32: the CUDA
 *        twins of reference/layers.cpp, step for step (functions and shapes in cuda/layers.h).
 *
 * RMSNorm (reference rmsnorm_forward / rmsnorm_backward), per row p:
 *   (1) r_p    = 1 / sqrt( (1/d) Σ_c x[p,c]² + eps )
 *   (2) y[p,c] = r_p · x[p,c] · gain_c
 *   from (2)   dgain_c += Σ_p dy[p,c] · r_p · x[p,c];   dxhat = dy ⊙ gain
 *   from (1)   dx[p,c]  = r_p · dxhat[p,c] − (r_p³ / d) · (Σ_c' dxhat[p,c'] · x[p,c']) · x[p,c]
 *
 * RoPE (reference rope_forward / rope_backward, both through rope_rotate), for head h, pair i:
 *   a = h·hd + i,  b = a + hd/2,  angle = sign · t · θ^(−2i/hd),  t = p mod T
 *   [y_a, y_b] = [x_a cos − x_b sin,  x_a sin + x_b cos];  sign = +1 forward, −1 backward
 *
 * SwiGLU middle (reference mlp_forward (2) / mlp_backward "from (2)"), elementwise:
 *   (2) h = silu(gate) ⊙ up,  silu(a) = a · σ(a)
 *   dup = dh ⊙ silu(gate);  dgate = dh ⊙ up ⊙ σ(gate) · (1 + gate · (1 − σ(gate)))
 *
 * Embedding (reference embedding_forward / embedding_backward):
 *   x[p] = E[token_p];   dE[token_p] += dx[p]
 *
 * Cross-entropy (reference cross_entropy_forward / cross_entropy_backward):
 *   m_p = max_v logits[p,v],  z_p = Σ_v exp(logits[p,v] − m_p),  probs = exp(logits − m_p) / z_p
 *   loss = (1/P) Σ_p ( m_p + log z_p − logits[p, target_p] )
 *   dlogits = (probs − onehot(target)) / P
 *
 * Versions (docs/style.md §6): 1 only — the reference's loops, one warp per row where a row needs a
 * sum (RMSNorm, the softmax), one thread per element otherwise; the rest of the design is in
 * docs/kernels.md ("Layer twins"). Each arithmetic line keeps the reference's order of
 * operations, so the results differ from the float reference only by summation order.
 *
 * Deliberately left out: fusion with the matmuls, half precision, vectorised loads, streams.
 * Every reduction runs in a fixed order (warp butterflies, fixed loops, no atomics).
 */
#include <math_constants.h>

#include <cstddef>
#include <string>

#include "cuda/launch.cuh"
#include "cuda/layers.h"

namespace mhar::cuda {

namespace {

using detail::block_sum;
using detail::ceil_div;
using detail::check_launch;
using detail::grid_for;
using detail::kThreads;
using detail::kWarp;
using detail::require;
using detail::require_pointers;
using detail::require_positive;
using detail::Scratch;
using detail::thread_index;
using detail::thread_stride;
using detail::warp_max;
using detail::warp_sum;

/// eps inside every RMSNorm: mhar::kNormEps of reference/layers.h.
constexpr float kNormEps = 1e-6f;
/// RoPE base θ: mhar::kRopeTheta of reference/layers.h.
constexpr double kRopeTheta = 10000.0;
/// Rows per block of the one-warp-per-row kernels.
constexpr int kRowsPerBlock = kThreads / kWarp;
/// Positions per partial sum of dgain (rmsnorm_dgain_partial).
constexpr int kChunk = 256;

/// Blocks for the one-warp-per-row kernels: one warp per row, no grid-stride loop.
unsigned row_blocks(int P) {
  return static_cast<unsigned>(ceil_div(static_cast<std::size_t>(P), kRowsPerBlock));
}

/// Row handled by this warp (warp-uniform, so a warp returns as a whole and its shuffles stay
/// complete).
__device__ std::size_t warp_row() {
  return static_cast<std::size_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
}

// ============================================================================================
// RMSNorm
// ============================================================================================

/// Forward, one warp per row p.
__global__ void rmsnorm_forward_rows(float* __restrict__ y, float* __restrict__ rinv,
                                     const float* __restrict__ x, const float* __restrict__ gain,
                                     int P, int d) {
  const std::size_t p = warp_row();
  if (p >= static_cast<std::size_t>(P)) return;
  const int lane = static_cast<int>(threadIdx.x % kWarp);
  const float* xp = x + p * d;
  float sum_sq = 0.f;
  for (int c = lane; c < d; c += kWarp) sum_sq += xp[c] * xp[c];
  sum_sq = warp_sum(sum_sq);
  // (1) r = 1 / sqrt( mean_c x² + eps ) — reference/layers.cpp rmsnorm_forward (1)
  const float r = 1.0f / sqrtf(sum_sq / static_cast<float>(d) + kNormEps);
  if (lane == 0) rinv[p] = r;
  // (2) y = diag(r) · x · diag(gain) — reference/layers.cpp rmsnorm_forward (2)
  for (int c = lane; c < d; c += kWarp) y[p * d + c] = r * xp[c] * gain[c];
}

/// Backward dx, one warp per row p.
__global__ void rmsnorm_backward_rows(float* __restrict__ dx, const float* __restrict__ dy,
                                      const float* __restrict__ rinv, const float* __restrict__ x,
                                      const float* __restrict__ gain, int P, int d) {
  const std::size_t p = warp_row();
  if (p >= static_cast<std::size_t>(P)) return;
  const int lane = static_cast<int>(threadIdx.x % kWarp);
  const float* dyp = dy + p * d;
  const float* xp = x + p * d;
  // from (2): dxhat = dy ⊙ gain;  from (1): Σ_c dxhat ⊙ x — reference rmsnorm_backward "coef"
  float dot = 0.f;
  for (int c = lane; c < d; c += kWarp) dot += (dyp[c] * gain[c]) * xp[c];
  dot = warp_sum(dot);
  const float r = rinv[p];
  const float coef = r * r * r * dot / static_cast<float>(d);
  // from (1): dx = r · dxhat − (r³ / d) · (Σ_c dxhat ⊙ x) · x — reference rmsnorm_backward "dx ="
  for (int c = lane; c < d; c += kWarp) dx[p * d + c] = r * (dyp[c] * gain[c]) - coef * xp[c];
}

/// Backward dgain, first half: partial[k, c] = Σ_{p in chunk k} dy[p,c] · (r_p · x[p,c]), one
/// thread per (chunk k, column c), positions in increasing order.
__global__ void rmsnorm_dgain_partial(float* __restrict__ partial, const float* __restrict__ dy,
                                      const float* __restrict__ rinv, const float* __restrict__ x,
                                      int P, int d) {
  const std::size_t chunks = ceil_div(static_cast<std::size_t>(P), kChunk);
  for (std::size_t idx = thread_index(); idx < chunks * d; idx += thread_stride()) {
    const std::size_t k = idx / d;
    const std::size_t c = idx % d;
    const std::size_t end = (k + 1) * kChunk, rows = static_cast<std::size_t>(P);
    const std::size_t p_end = end < rows ? end : rows;
    float s = 0.f;
    // from (2): Σ_p dy ⊙ (r · x) — reference rmsnorm_backward "dgain +=", over this chunk
    for (std::size_t p = k * kChunk; p < p_end; ++p) s += dy[p * d + c] * (rinv[p] * x[p * d + c]);
    partial[idx] = s;
  }
}

/// Backward dgain, second half: dgain_c += Σ_k partial[k, c], chunks in increasing order; one
/// thread per column.
__global__ void rmsnorm_dgain_reduce(float* __restrict__ dgain, const float* __restrict__ partial,
                                     int chunks, int d) {
  for (std::size_t c = thread_index(); c < static_cast<std::size_t>(d); c += thread_stride()) {
    float total = 0.f;
    for (int k = 0; k < chunks; ++k) total += partial[static_cast<std::size_t>(k) * d + c];
    // from (2): dgain += Σ_p dy ⊙ (r · x) — reference rmsnorm_backward "dgain +="
    dgain[c] += total;
  }
}

// ============================================================================================
// RoPE
// ============================================================================================

/// The rotation of pair i at position t, tabulated once per call in double (like the reference)
/// and rounded to float: cos_t, sin_t are T × half. One thread per (t, i).
__global__ void rope_table(float* __restrict__ cos_t, float* __restrict__ sin_t, int T, int hd,
                           double sign) {
  const int half = hd / 2;
  for (std::size_t idx = thread_index(); idx < static_cast<std::size_t>(T) * half;
       idx += thread_stride()) {
    const int t = static_cast<int>(idx / half);
    const int i = static_cast<int>(idx % half);
    // angle = sign · t · θ^(−2i/hd) — reference rope_rotate, the cos_t / sin_t table
    const double angle = sign * t * pow(kRopeTheta, -2.0 * i / hd);
    cos_t[idx] = static_cast<float>(cos(angle));
    sin_t[idx] = static_cast<float>(sin(angle));
  }
}

/// Rotates every pair; one thread per (p, h, i), i the fastest index (coalesced).
__global__ void rope_rotate_pairs(float* __restrict__ y, const float* __restrict__ x,
                                  const float* __restrict__ cos_t, const float* __restrict__ sin_t,
                                  int P, int T, int n_heads, int hd) {
  const int half = hd / 2;
  const std::size_t width = static_cast<std::size_t>(n_heads) * hd;
  const std::size_t pairs = static_cast<std::size_t>(P) * n_heads * half;
  for (std::size_t idx = thread_index(); idx < pairs; idx += thread_stride()) {
    const std::size_t i = idx % half;
    const std::size_t h = (idx / half) % n_heads;
    const std::size_t p = idx / half / n_heads;
    const std::size_t t = p % T;
    // a = h·hd + i,  b = a + hd/2 — reference rope_rotate, segments (h·hd, half), (h·hd + half,
    // half)
    const std::size_t a = p * width + h * hd + i;
    const std::size_t b = a + half;
    const float c = cos_t[t * half + i], s = sin_t[t * half + i];
    const float xa = x[a], xb = x[b];
    // [y_a, y_b] = [x_a cos − x_b sin,  x_a sin + x_b cos] — reference rope_rotate
    y[a] = xa * c - xb * s;
    y[b] = xa * s + xb * c;
  }
}

// ============================================================================================
// SwiGLU middle
// ============================================================================================

/// σ(a) = 1 / (1 + exp(−a)), as the reference writes it.
__device__ float sigmoid(float a) {
  return 1.0f / (1.0f + expf(-a));
}

/// One thread per element.
__global__ void swiglu_forward_elements(float* __restrict__ h, const float* __restrict__ gate,
                                        const float* __restrict__ up, std::size_t n) {
  for (std::size_t idx = thread_index(); idx < n; idx += thread_stride()) {
    const float a = gate[idx];
    // (2) h = silu(gate) ⊙ up,  silu(a) = a · σ(a) — reference mlp_forward (2)
    h[idx] = a * sigmoid(a) * up[idx];
  }
}

/// One thread per element.
__global__ void swiglu_backward_elements(float* __restrict__ dgate, float* __restrict__ dup,
                                         const float* __restrict__ dh,
                                         const float* __restrict__ gate,
                                         const float* __restrict__ up, std::size_t n) {
  for (std::size_t idx = thread_index(); idx < n; idx += thread_stride()) {
    const float a = gate[idx];
    const float sig = sigmoid(a);
    // from (2): dup = dh ⊙ silu(gate) — reference mlp_backward "dup ="
    dup[idx] = dh[idx] * (a * sig);
    // from (2): dgate = dh ⊙ up ⊙ σ · (1 + a · (1 − σ)) — reference mlp_backward "dgate ="
    dgate[idx] = dh[idx] * up[idx] * sig * (1.0f + a * (1.0f - sig));
  }
}

// ============================================================================================
// Embedding
// ============================================================================================

/// Forward, one thread per element (p, c).
__global__ void embedding_forward_elements(float* __restrict__ x, const int* __restrict__ tokens,
                                           const float* __restrict__ E, int P, int d, int vocab) {
  const std::size_t n = static_cast<std::size_t>(P) * d;
  for (std::size_t idx = thread_index(); idx < n; idx += thread_stride()) {
    const std::size_t p = idx / d;
    const std::size_t c = idx % d;
    const int token = tokens[p];
    // x[p] = E[token_p] — reference embedding_forward (which throws where this writes NaN)
    x[idx] =
        token >= 0 && token < vocab ? E[static_cast<std::size_t>(token) * d + c] : CUDART_NAN_F;
  }
}

/// Backward, one block per vocabulary row v: thread j owns columns j, j + blockDim, …, and
/// scans the positions in increasing order, adding dx[p] wherever token_p = v. Every element of
/// dE is written by exactly one thread, in the reference's order: no atomics.
__global__ void embedding_backward_rows(float* __restrict__ dE, const float* __restrict__ dx,
                                        const int* __restrict__ tokens, int P, int d) {
  const int v = static_cast<int>(blockIdx.x);
  for (int c = static_cast<int>(threadIdx.x); c < d; c += static_cast<int>(blockDim.x)) {
    float acc = dE[static_cast<std::size_t>(v) * d + c];
    // dE[token_p] += dx[p], p = 0, 1, … — reference embedding_backward
    for (int p = 0; p < P; ++p)
      if (tokens[p] == v) acc += dx[static_cast<std::size_t>(p) * d + c];
    dE[static_cast<std::size_t>(v) * d + c] = acc;
  }
}

// ============================================================================================
// Cross-entropy
// ============================================================================================

/// Forward, one warp per row p: probs and the row's loss term m + log z − logits[target].
__global__ void cross_entropy_rows(float* __restrict__ row_loss, float* __restrict__ probs,
                                   const float* __restrict__ logits,
                                   const int* __restrict__ targets, int P, int vocab) {
  const std::size_t p = warp_row();
  if (p >= static_cast<std::size_t>(P)) return;
  const int lane = static_cast<int>(threadIdx.x % kWarp);
  const float* lp = logits + p * vocab;
  // m = max_v logits[p, v] — reference cross_entropy_forward "m ="
  float m = -CUDART_INF_F;
  for (int v = lane; v < vocab; v += kWarp) m = fmaxf(m, lp[v]);
  m = warp_max(m);
  // z = Σ_v exp(logits − m) — reference cross_entropy_forward "z ="
  float z = 0.f;
  for (int v = lane; v < vocab; v += kWarp) z += expf(lp[v] - m);
  z = warp_sum(z);
  // probs = exp(logits − m) · (1 / z) — reference cross_entropy_forward "probs ="
  const float inv_z = 1.0f / z;
  for (int v = lane; v < vocab; v += kWarp) probs[p * vocab + v] = inv_z * expf(lp[v] - m);
  if (lane == 0) {
    // m + log z − logits[p, target] — reference cross_entropy_forward, the loop's term
    const int target = targets[p];
    row_loss[p] = target >= 0 && target < vocab ? m + logf(z) - lp[target] : CUDART_NAN_F;
  }
}

/// loss = (1/P) Σ_p row_loss[p]: one block of kThreads; thread j sums rows j, j + kThreads, …
/// in double, then block_sum's fixed tree.
__global__ void cross_entropy_mean(float* __restrict__ loss, const float* __restrict__ row_loss,
                                   int P) {
  double s = 0.0;
  for (int p = static_cast<int>(threadIdx.x); p < P; p += kThreads) s += row_loss[p];
  s = block_sum(s);
  // loss = mean_p (…) — reference cross_entropy_forward "return loss / P"
  if (threadIdx.x == 0) loss[0] = static_cast<float>(s / P);
}

/// Backward, one thread per element (p, v).
__global__ void cross_entropy_backward_elements(float* __restrict__ dlogits,
                                                const float* __restrict__ probs,
                                                const int* __restrict__ targets, int P, int vocab) {
  const std::size_t n = static_cast<std::size_t>(P) * vocab;
  for (std::size_t idx = thread_index(); idx < n; idx += thread_stride()) {
    const std::size_t p = idx / vocab;
    const int v = static_cast<int>(idx % vocab);
    const int target = targets[p];
    // dlogits = (probs − onehot(target)) / P — reference cross_entropy_backward
    const float onehot_removed = v == target ? probs[idx] - 1.0f : probs[idx];
    dlogits[idx] =
        target >= 0 && target < vocab ? onehot_removed / static_cast<float>(P) : CUDART_NAN_F;
  }
}

// ============================================================================================
// Host side: argument checks, scratch memory, launches.
// ============================================================================================

void require_rows(const char* where, int P, int width, const char* width_name) {
  require_positive(where, "P", P, "needs at least one position");
  require_positive(where, width_name, width, "width must be positive");
}

void rope(const char* where, float* y, const float* x, int P, int T, int n_heads, int hd,
          double sign) {
  require_rows(where, P, hd, "hd");
  require_positive(where, "T", T, "needs at least one token per sequence");
  require_positive(where, "n_heads", n_heads, "needs at least one head");
  require(hd % 2 == 0, where,
          "hd = " + std::to_string(hd) + " must be even (rotate-half pairs i, i + hd/2)");
  require(P % T == 0, where,
          "P = " + std::to_string(P) +
              " rows are not a whole number of sequences of T = " + std::to_string(T));
  require_pointers(where, {{sign > 0 ? "y" : "dx", y}, {sign > 0 ? "x" : "dy", x}});
  const std::size_t half = static_cast<std::size_t>(hd) / 2;
  const std::size_t table = static_cast<std::size_t>(T) * half;
  Scratch<float> cos_t(table, where), sin_t(table, where);
  rope_table<<<grid_for(table), kThreads>>>(cos_t.get(), sin_t.get(), T, hd, sign);
  check_launch("rope: rope_table launch");
  const std::size_t pairs = static_cast<std::size_t>(P) * n_heads * half;
  rope_rotate_pairs<<<grid_for(pairs), kThreads>>>(y, x, cos_t.get(), sin_t.get(), P, T, n_heads,
                                                   hd);
  check_launch("rope: rope_rotate_pairs launch");
}

}  // namespace

void rmsnorm_forward(float* y, float* rinv, const float* x, const float* gain, int P, int d) {
  const char* where = "cuda::rmsnorm_forward";
  require_rows(where, P, d, "d");
  require_pointers(where, {{"y", y}, {"rinv", rinv}, {"x", x}, {"gain", gain}});
  rmsnorm_forward_rows<<<row_blocks(P), kThreads>>>(y, rinv, x, gain, P, d);
  check_launch("rmsnorm_forward: rmsnorm_forward_rows launch");
}

void rmsnorm_backward(float* dx, float* dgain, const float* dy, const float* rinv, const float* x,
                      const float* gain, int P, int d) {
  const char* where = "cuda::rmsnorm_backward";
  require_rows(where, P, d, "d");
  require_pointers(
      where, {{"dx", dx}, {"dgain", dgain}, {"dy", dy}, {"rinv", rinv}, {"x", x}, {"gain", gain}});
  rmsnorm_backward_rows<<<row_blocks(P), kThreads>>>(dx, dy, rinv, x, gain, P, d);
  check_launch("rmsnorm_backward: rmsnorm_backward_rows launch");
  const std::size_t chunks = ceil_div(static_cast<std::size_t>(P), kChunk);
  Scratch<float> partial(chunks * d, where);
  rmsnorm_dgain_partial<<<grid_for(chunks * d), kThreads>>>(partial.get(), dy, rinv, x, P, d);
  check_launch("rmsnorm_backward: rmsnorm_dgain_partial launch");
  rmsnorm_dgain_reduce<<<grid_for(static_cast<std::size_t>(d)), kThreads>>>(
      dgain, partial.get(), static_cast<int>(chunks), d);
  check_launch("rmsnorm_backward: rmsnorm_dgain_reduce launch");
}

void rope_forward(float* y, const float* x, int P, int T, int n_heads, int hd) {
  rope("cuda::rope_forward", y, x, P, T, n_heads, hd, +1.0);
}

void rope_backward(float* dx, const float* dy, int P, int T, int n_heads, int hd) {
  // The rotation is orthogonal: its transpose is the rotation by −angle (reference rope_backward).
  rope("cuda::rope_backward", dx, dy, P, T, n_heads, hd, -1.0);
}

void swiglu_forward(float* h, const float* gate, const float* up, int P, int f) {
  const char* where = "cuda::swiglu_forward";
  require_rows(where, P, f, "f");
  require_pointers(where, {{"h", h}, {"gate", gate}, {"up", up}});
  const std::size_t n = static_cast<std::size_t>(P) * f;
  swiglu_forward_elements<<<grid_for(n), kThreads>>>(h, gate, up, n);
  check_launch("swiglu_forward: swiglu_forward_elements launch");
}

void swiglu_backward(float* dgate, float* dup, const float* dh, const float* gate, const float* up,
                     int P, int f) {
  const char* where = "cuda::swiglu_backward";
  require_rows(where, P, f, "f");
  require_pointers(where, {{"dgate", dgate}, {"dup", dup}, {"dh", dh}, {"gate", gate}, {"up", up}});
  const std::size_t n = static_cast<std::size_t>(P) * f;
  swiglu_backward_elements<<<grid_for(n), kThreads>>>(dgate, dup, dh, gate, up, n);
  check_launch("swiglu_backward: swiglu_backward_elements launch");
}

void embedding_forward(float* x, const int* tokens, const float* E, int P, int d, int vocab) {
  const char* where = "cuda::embedding_forward";
  require_rows(where, P, d, "d");
  require_positive(where, "vocab", vocab, "needs at least one token in the vocabulary");
  require_pointers(where, {{"x", x}, {"tokens", tokens}, {"E", E}});
  const std::size_t n = static_cast<std::size_t>(P) * d;
  embedding_forward_elements<<<grid_for(n), kThreads>>>(x, tokens, E, P, d, vocab);
  check_launch("embedding_forward: embedding_forward_elements launch");
}

void embedding_backward(float* dE, const float* dx, const int* tokens, int P, int d, int vocab) {
  const char* where = "cuda::embedding_backward";
  require_rows(where, P, d, "d");
  require_positive(where, "vocab", vocab, "needs at least one token in the vocabulary");
  require_pointers(where, {{"dE", dE}, {"dx", dx}, {"tokens", tokens}});
  embedding_backward_rows<<<static_cast<unsigned>(vocab), kThreads>>>(dE, dx, tokens, P, d);
  check_launch("embedding_backward: embedding_backward_rows launch");
}

void cross_entropy_forward(float* loss, float* probs, const float* logits, const int* targets,
                           int P, int vocab) {
  const char* where = "cuda::cross_entropy_forward";
  require_rows(where, P, vocab, "vocab");
  require_pointers(where,
                   {{"loss", loss}, {"probs", probs}, {"logits", logits}, {"targets", targets}});
  Scratch<float> row_loss(static_cast<std::size_t>(P), where);
  cross_entropy_rows<<<row_blocks(P), kThreads>>>(row_loss.get(), probs, logits, targets, P, vocab);
  check_launch("cross_entropy_forward: cross_entropy_rows launch");
  cross_entropy_mean<<<1, kThreads>>>(loss, row_loss.get(), P);
  check_launch("cross_entropy_forward: cross_entropy_mean launch");
}

void cross_entropy_backward(float* dlogits, const float* probs, const int* targets, int P,
                            int vocab) {
  const char* where = "cuda::cross_entropy_backward";
  require_rows(where, P, vocab, "vocab");
  require_pointers(where, {{"dlogits", dlogits}, {"probs", probs}, {"targets", targets}});
  const std::size_t n = static_cast<std::size_t>(P) * vocab;
  cross_entropy_backward_elements<<<grid_for(n), kThreads>>>(dlogits, probs, targets, P, vocab);
  check_launch("cross_entropy_backward: cross_entropy_backward_elements launch");
}

}  // namespace mhar::cuda
