/**
 * @file attention.cu
 * @brief Causal grouped-query self-attention on the GPU, fp32: the CUDA twin of reference
 *        attention_forward / attention_backward (reference/layers.cpp), step for step
 *        (functions and layouts in cuda/attention.h).
 *
 * For sequence b and query head h, reading key/value head g = h / G (G = n_head / n_kv_head),
 * query position t, key position s, scale = 1 / √hd; q[t], k[s], v[s], dout[t] are the hd-wide
 * head slices of their rows:
 *
 * Forward (reference attention_forward):
 *   (1) scores[t,s] = (q[t] · k[s]) · scale                                        s ≤ t only
 *   (2) m_t = max_{s≤t} scores[t,s]
 *       probs[t,s] = exp(scores[t,s] − m_t) / Σ_{s'≤t} exp(scores[t,s'] − m_t);   0 for s > t
 *   (3) out[t] = Σ_{s≤t} probs[t,s] · v[s]
 *
 * Backward (reference attention_backward), the forward steps in reverse; Σ_{h→g} runs over the
 * G query heads that read key/value head g:
 *   from (3)  dprobs[t,s] = dout[t] · v[s];      dv[s] = Σ_{h→g} Σ_{t≥s} probs[t,s] · dout[t]
 *   from (2)  rowdot_t = Σ_{s≤t} dprobs[t,s] · probs[t,s]
 *             ds[t,s]  = probs[t,s] · (dprobs[t,s] − rowdot_t) · scale
 *             (the softmax Jacobian diag(p) − p pᵀ; the · scale is from (1))
 *   from (1)  dq[t] = Σ_{s≤t} ds[t,s] · k[s];    dk[s] = Σ_{h→g} Σ_{t≥s} ds[t,s] · q[t]
 *
 * Versions (docs/style.md §6):
 * 1 Rows — the reference's loops, a warp per row, no tiling:
 *   attention_forward_rows    one warp per query row (b, h, t), 8 rows a block. Lanes over the
 *                             keys s ≤ t for (1)–(2), the scores parked in the row of probs
 *                             and overwritten there by the probabilities; then lanes over the
 *                             hd columns for (3).
 *   attention_backward_rows   one warp per query row (b, h, t): lanes over s for dprobs, rowdot
 *                             and ds (ds kept in scratch memory, B·n_head matrices T × T, same
 *                             layout as probs); lanes over columns for dq.
 *   attention_backward_keys   one warp per key row (b, g, s), lanes over columns: dk[s] and
 *                             dv[s], heads h of the group in increasing order, then t = s … T−1.
 * The backward is split in two so that every output element is written by one thread, which
 * sums its terms in a fixed order: no atomics, the same bits on every run. Each arithmetic line
 * keeps the reference's order of operations, so the results differ from the float reference
 * only by summation order (and the last bit of expf).
 *
 * 2 Gemm — the reference's own matrix products, per query head h (key/value head g = h/G),
 *   as cuBLAS SGEMMs batched over the B sequences (cuda/linear.h gemm_strided_batched; fp32,
 *   no TF32); the causal softmax and its backward one warp per row:
 *     (1)       probs_h  = (q_h · k_gᵀ) · scale           full T × T, upper triangle masked in (2)
 *     (2)       softmax_causal_rows: max, exp, sum, divide over s ≤ t; zero for s > t
 *     (3)       out_h    = probs_h · v_g                    (probs is 0 above the diagonal)
 *     from (3)  ds_h     = dout_h · v_gᵀ                    dprobs, into the ds scratch
 *     from (2)  softmax_causal_backward_rows: ds = probs ⊙ (dprobs − rowdot) · scale, 0 for s > t
 *     from (1)  dq_h     = ds_h · k_g
 *               dk_g    (+)= ds_hᵀ · q_h,  dv_g (+)= probs_hᵀ · dout_h, heads of the group in
 *               increasing order (the first writes, the others add): a fixed order, so the
 *               same bits on every run.
 *   The products cover the masked upper triangle too (twice the causal flops) in exchange for
 *   cuBLAS's speed.
 *
 * Deliberately left out: an online softmax (flash attention; the model saves probs anyway),
 * half precision, tensor cores.
 */
#include <math_constants.h>

#include <climits>
#include <cstddef>
#include <string>

#include "cuda/attention.h"
#include "cuda/launch.cuh"
#include "cuda/linear.h"

namespace mhar::cuda {

namespace {

using detail::ceil_div;
using detail::check_launch;
using detail::kThreads;
using detail::kWarp;
using detail::require;
using detail::require_pointers;
using detail::require_positive;
using detail::Scratch;
using detail::warp_max;
using detail::warp_sum;

/// Rows (query rows or key rows) per block: one warp each.
constexpr int kRowsPerBlock = kThreads / kWarp;

/// Blocks for `rows` warps.
unsigned row_blocks(std::size_t rows) {
  return static_cast<unsigned>(ceil_div(rows, kRowsPerBlock));
}

/// Row handled by this warp (warp-uniform, so a warp returns as a whole and its shuffles stay
/// complete).
__device__ std::size_t warp_row() {
  return static_cast<std::size_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
}

/// Offset of head `head`'s slice of row p = b·T + t in a P × (heads·hd) matrix.
__device__ std::size_t head_at(int b, int t, int head, int T, int heads, int hd) {
  return (static_cast<std::size_t>(b) * T + t) * heads * hd + static_cast<std::size_t>(head) * hd;
}

/// 1 / √hd, as the reference computes it in float.
__device__ float attention_scale(int hd) {
  return 1.0f / sqrtf(static_cast<float>(hd));
}

/// (2) on row t of a probs matrix, which holds the scores of s ≤ t: probs = softmax over s ≤ t,
/// max subtracted; zeros above the diagonal. One warp, lane owns s = lane, lane + 32, …
/// — reference "a.row(t).head(t + 1) = (row − row.maxCoeff()).exp()", "/= sum()", and
/// "a = Mat<T>::Zero(T_len, T_len)".
__device__ void softmax_causal_row(float* a, int t, int T, int lane) {
  float m = -CUDART_INF_F;
  for (int s = lane; s <= t; s += kWarp) m = fmaxf(m, a[s]);
  m = warp_max(m);
  float sum = 0.f;
  for (int s = lane; s <= t; s += kWarp) {
    a[s] = expf(a[s] - m);
    sum += a[s];
  }
  sum = warp_sum(sum);
  for (int s = lane; s <= t; s += kWarp) a[s] /= sum;
  for (int s = t + 1 + lane; s < T; s += kWarp) a[s] = 0.f;
}

/// From (2), on row t: dst holds dprobs[t, s ≤ t] on entry, ds = probs ⊙ (dprobs − rowdot) · scale
/// on return, zeros above the diagonal — reference "rowdot = rowsum(dprobs ⊙ probs)", "ds =".
__device__ void softmax_causal_backward_row(float* dst, const float* a, int t, int T, int lane,
                                            float scale) {
  float rowdot = 0.f;
  for (int s = lane; s <= t; s += kWarp) rowdot += dst[s] * a[s];
  rowdot = warp_sum(rowdot);
  for (int s = lane; s <= t; s += kWarp) dst[s] = a[s] * (dst[s] - rowdot) * scale;
  for (int s = t + 1 + lane; s < T; s += kWarp) dst[s] = 0.f;
}

// ============================================================================================
// Forward
// ============================================================================================

/// One warp per query row (b, h, t); row index (b·n_head + h)·T + t, which is also the row of
/// probs it writes.
__global__ void attention_forward_rows(float* __restrict__ out, float* __restrict__ probs,
                                       const float* __restrict__ q, const float* __restrict__ k,
                                       const float* __restrict__ v, int B, int T, int n_head,
                                       int n_kv_head, int hd) {
  const std::size_t row = warp_row();
  if (row >= static_cast<std::size_t>(B) * n_head * T) return;
  const int lane = static_cast<int>(threadIdx.x % kWarp);
  const int t = static_cast<int>(row % T);
  const int h = static_cast<int>(row / T % n_head);
  const int b = static_cast<int>(row / T / n_head);
  const int g = h / (n_head / n_kv_head);  // reference "kv = h / G"
  const float scale = attention_scale(hd);
  const float* qt = q + head_at(b, t, h, T, n_head, hd);
  float* a = probs + row * T;  // row t of probs matrix b·n_head + h

  // (1) scores = q_h · k_hᵀ / √hd, causal: only s ≤ t — reference "Mat<T> s = (qh * khᵀ) * scale"
  //     Lane owns s = lane, lane + 32, …; the score waits in a[s] until (2) overwrites it.
  for (int s = lane; s <= t; s += kWarp) {
    const float* ks = k + head_at(b, s, g, T, n_kv_head, hd);
    float dot = 0.f;
    for (int c = 0; c < hd; ++c) dot += qt[c] * ks[c];
    a[s] = dot * scale;
  }
  // (2) probs = softmax over s ≤ t, max subtracted; zeros above the diagonal
  softmax_causal_row(a, t, T, lane);
  __syncwarp();  // (3) reads the whole row, written by every lane

  // (3) out_h = probs · v_h — reference "out.block(…) = a * vh"; lane owns columns c, c + 32, …
  float* ot = out + head_at(b, t, h, T, n_head, hd);
  for (int c = lane; c < hd; c += kWarp) {
    float acc = 0.f;
    for (int s = 0; s <= t; ++s) acc += a[s] * v[head_at(b, s, g, T, n_kv_head, hd) + c];
    ot[c] = acc;
  }
}

// ============================================================================================
// Backward
// ============================================================================================

/// First half: one warp per query row (b, h, t), row index (b·n_head + h)·T + t as in the
/// forward. Writes row t of ds (zeros above the diagonal) and dq[t].
__global__ void attention_backward_rows(float* __restrict__ dq, float* __restrict__ ds,
                                        const float* __restrict__ dout,
                                        const float* __restrict__ probs,
                                        const float* __restrict__ k, const float* __restrict__ v,
                                        int B, int T, int n_head, int n_kv_head, int hd) {
  const std::size_t row = warp_row();
  if (row >= static_cast<std::size_t>(B) * n_head * T) return;
  const int lane = static_cast<int>(threadIdx.x % kWarp);
  const int t = static_cast<int>(row % T);
  const int h = static_cast<int>(row / T % n_head);
  const int b = static_cast<int>(row / T / n_head);
  const int g = h / (n_head / n_kv_head);  // reference "kv = h / G"
  const float scale = attention_scale(hd);
  const float* a = probs + row * T;  // row t of probs matrix b·n_head + h
  float* dst = ds + row * T;         // row t of ds, same layout
  const float* dout_t = dout + head_at(b, t, h, T, n_head, hd);

  // from out_h = probs · v_h:  dprobs = dout_h · v_hᵀ — reference "dprobs ="; lane owns
  // s = lane, lane + 32, …, and dprobs[t,s] waits in dst[s] until ds overwrites it.
  for (int s = lane; s <= t; s += kWarp) {
    const float* vs = v + head_at(b, s, g, T, n_kv_head, hd);
    float dprobs = 0.f;
    for (int c = 0; c < hd; ++c) dprobs += dout_t[c] * vs[c];
    dst[s] = dprobs;
  }
  // from the softmax: ds = probs ⊙ (dprobs − rowdot) · scale (the lane reads its own dst[s])
  softmax_causal_backward_row(dst, a, t, T, lane, scale);
  __syncwarp();  // dq reads the whole row of ds, written by every lane

  // from scores = q_h · k_hᵀ / √hd:  dq_h = ds · k_h — reference "dq.block(…) = ds * kh"; lane
  // owns columns c, c + 32, …
  float* dqt = dq + head_at(b, t, h, T, n_head, hd);
  for (int c = lane; c < hd; c += kWarp) {
    float acc = 0.f;
    for (int s = 0; s <= t; ++s) acc += dst[s] * k[head_at(b, s, g, T, n_kv_head, hd) + c];
    dqt[c] = acc;
  }
}

/// Second half: one warp per key row (b, g, s), row index (b·n_kv_head + g)·T + s; lane owns
/// columns c, c + 32, … of dk[s] and dv[s]. Query heads h = g·G … g·G + G − 1 in increasing
/// order, and within each t = s … T − 1 (the causal entries t ≥ s of column s).
__global__ void attention_backward_keys(float* __restrict__ dk, float* __restrict__ dv,
                                        const float* __restrict__ ds,
                                        const float* __restrict__ probs,
                                        const float* __restrict__ dout, const float* __restrict__ q,
                                        int B, int T, int n_head, int n_kv_head, int hd) {
  const std::size_t row = warp_row();
  if (row >= static_cast<std::size_t>(B) * n_kv_head * T) return;
  const int lane = static_cast<int>(threadIdx.x % kWarp);
  const int s = static_cast<int>(row % T);
  const int g = static_cast<int>(row / T % n_kv_head);
  const int b = static_cast<int>(row / T / n_kv_head);
  const int G = n_head / n_kv_head;
  const std::size_t TT = static_cast<std::size_t>(T) * T;
  for (int c = lane; c < hd; c += kWarp) {
    float dk_acc = 0.f, dv_acc = 0.f;
    for (int h = g * G; h < (g + 1) * G; ++h) {
      const std::size_t matrix = (static_cast<std::size_t>(b) * n_head + h) * TT;
      for (int t = s; t < T; ++t) {
        const std::size_t ts = matrix + static_cast<std::size_t>(t) * T + s;
        const std::size_t qc = head_at(b, t, h, T, n_head, hd) + c;
        // from scores = q_h · k_hᵀ / √hd:  dk_h += dsᵀ · q_h — reference "dk.block(…) +="
        dk_acc += ds[ts] * q[qc];
        // from out_h = probs · v_h:  dv_h += probsᵀ · dout_h — reference "dv.block(…) +="
        dv_acc += probs[ts] * dout[qc];
      }
    }
    const std::size_t kc = head_at(b, s, g, T, n_kv_head, hd) + c;
    dk[kc] = dk_acc;
    dv[kc] = dv_acc;
  }
}

// ============================================================================================
// Version 2 (Gemm): the row kernels between the matrix products
// ============================================================================================

/// (2) on one row of probs, which holds the scores (1): one warp per query row (b, h, t).
__global__ void softmax_causal_rows(float* __restrict__ probs, int T, std::size_t rows) {
  const std::size_t row = warp_row();
  if (row >= rows) return;
  softmax_causal_row(probs + row * T, static_cast<int>(row % T), T,
                     static_cast<int>(threadIdx.x % kWarp));
}

/// From (2): ds = probs ⊙ (dprobs − rowdot) · scale on one row; ds holds dprobs on entry.
__global__ void softmax_causal_backward_rows(float* __restrict__ ds,
                                             const float* __restrict__ probs, int T,
                                             std::size_t rows, float scale) {
  const std::size_t row = warp_row();
  if (row >= rows) return;
  softmax_causal_backward_row(ds + row * T, probs + row * T, static_cast<int>(row % T), T,
                              static_cast<int>(threadIdx.x % kWarp), scale);
}

/// Head slices for the batched products: head `head` of a P × (heads·hd) matrix is, per
/// sequence, a T × hd block with rows heads·hd apart; sequences T·heads·hd apart.
struct HeadSlices {
  int ld;
  long long stride;
};
HeadSlices head_slices(int T, int heads, int hd) {
  return {heads * hd, static_cast<long long>(T) * heads * hd};
}

void forward_gemm(float* out, float* probs, const float* q, const float* k, const float* v, int B,
                  int T, int n_head, int n_kv_head, int hd) {
  const int G = n_head / n_kv_head;
  const HeadSlices qs = head_slices(T, n_head, hd), ks = head_slices(T, n_kv_head, hd);
  const long long TT = static_cast<long long>(T) * T, ps = n_head * TT;  // probs: per sequence
  const float scale = 1.0f / sqrtf(static_cast<float>(hd));
  for (int h = 0; h < n_head; ++h) {
    const int g = h / G;  // reference "kv = h / G"
    // (1) scores = (q_h · k_gᵀ) · scale — reference "Mat<T> s = (qh * khᵀ) * scale"
    gemm_strided_batched(false, true, T, T, hd, scale, q + h * hd, qs.ld, qs.stride, k + g * hd,
                         ks.ld, ks.stride, 0.f, probs + h * TT, T, ps, B);
  }
  const std::size_t rows = static_cast<std::size_t>(B) * n_head * T;
  // (2) the causal softmax of every row
  softmax_causal_rows<<<row_blocks(rows), kThreads>>>(probs, T, rows);
  check_launch("attention_forward (gemm): softmax_causal_rows launch");
  for (int h = 0; h < n_head; ++h) {
    const int g = h / G;
    // (3) out_h = probs · v_g — reference "out.block(…) = a * vh"
    gemm_strided_batched(false, false, T, hd, T, 1.f, probs + h * TT, T, ps, v + g * hd, ks.ld,
                         ks.stride, 0.f, out + h * hd, qs.ld, qs.stride, B);
  }
}

void backward_gemm(float* dq, float* dk, float* dv, const float* dout, const float* probs,
                   const float* q, const float* k, const float* v, int B, int T, int n_head,
                   int n_kv_head, int hd, float* ds) {
  const int G = n_head / n_kv_head;
  const HeadSlices qs = head_slices(T, n_head, hd), ks = head_slices(T, n_kv_head, hd);
  const long long TT = static_cast<long long>(T) * T, ps = n_head * TT;
  const float scale = 1.0f / sqrtf(static_cast<float>(hd));
  for (int h = 0; h < n_head; ++h) {
    const int g = h / G;
    // from out_h = probs · v_h:  dprobs = dout_h · v_gᵀ — reference "dprobs ="
    gemm_strided_batched(false, true, T, T, hd, 1.f, dout + h * hd, qs.ld, qs.stride, v + g * hd,
                         ks.ld, ks.stride, 0.f, ds + h * TT, T, ps, B);
  }
  const std::size_t rows = static_cast<std::size_t>(B) * n_head * T;
  // from the softmax: ds = probs ⊙ (dprobs − rowdot) · scale — reference "rowdot =", "ds ="
  softmax_causal_backward_rows<<<row_blocks(rows), kThreads>>>(ds, probs, T, rows, scale);
  check_launch("attention_backward (gemm): softmax_causal_backward_rows launch");
  for (int h = 0; h < n_head; ++h) {
    const int g = h / G;
    const float beta = h % G == 0 ? 0.f : 1.f;  // the group's first head writes, the rest add
    // from scores = q_h · k_gᵀ / √hd:  dq_h = ds · k_g — reference "dq.block(…) = ds * kh"
    gemm_strided_batched(false, false, T, hd, T, 1.f, ds + h * TT, T, ps, k + g * hd, ks.ld,
                         ks.stride, 0.f, dq + h * hd, qs.ld, qs.stride, B);
    // dk_g += dsᵀ · q_h — reference "dk.block(…) +="
    gemm_strided_batched(true, false, T, hd, T, 1.f, ds + h * TT, T, ps, q + h * hd, qs.ld,
                         qs.stride, beta, dk + g * hd, ks.ld, ks.stride, B);
    // from out_h = probs · v_h:  dv_g += probsᵀ · dout_h — reference "dv.block(…) +="
    gemm_strided_batched(true, false, T, hd, T, 1.f, probs + h * TT, T, ps, dout + h * hd, qs.ld,
                         qs.stride, beta, dv + g * hd, ks.ld, ks.stride, B);
  }
}

// ============================================================================================
// Host side: argument checks, scratch memory, launches.
// ============================================================================================

/// The reference's check_attention, for sizes instead of matrices; plus the grid limit.
void require_attention_shape(const char* where, int B, int T, int n_head, int n_kv_head, int hd) {
  require_positive(where, "B", B, "needs at least one sequence");
  require_positive(where, "T", T, "needs at least one token per sequence");
  require_positive(where, "n_head", n_head, "needs at least one query head");
  require_positive(where, "n_kv_head", n_kv_head, "needs at least one key/value head");
  require_positive(where, "hd", hd, "head width must be positive");
  require(n_head % n_kv_head == 0, where,
          "n_head = " + std::to_string(n_head) +
              " must be a multiple of n_kv_head = " + std::to_string(n_kv_head));
  const std::size_t rows = static_cast<std::size_t>(B) * n_head * T;
  require(ceil_div(rows, kRowsPerBlock) <= static_cast<std::size_t>(INT_MAX), where,
          "B·n_head·T = " + std::to_string(rows) + " query rows need more than 2³¹ − 1 blocks");
}

void require_version(const char* where, AttentionVersion v) {
  require(v == AttentionVersion::Rows || v == AttentionVersion::Gemm, where,
          "unknown AttentionVersion " + std::to_string(static_cast<int>(v)) +
              " (allowed: 1 = rows, 2 = gemm)");
}

}  // namespace

const char* attention_version_name(AttentionVersion v) {
  switch (v) {
    case AttentionVersion::Rows:
      return "rows";
    case AttentionVersion::Gemm:
      return "gemm";
  }
  return "unknown";
}

void attention_forward(float* out, float* probs, const float* q, const float* k, const float* v,
                       int B, int T, int n_head, int n_kv_head, int hd, AttentionVersion version) {
  const char* where = "cuda::attention_forward";
  require_attention_shape(where, B, T, n_head, n_kv_head, hd);
  require_pointers(where, {{"out", out}, {"probs", probs}, {"q", q}, {"k", k}, {"v", v}});
  require_version(where, version);
  if (version == AttentionVersion::Gemm)
    return forward_gemm(out, probs, q, k, v, B, T, n_head, n_kv_head, hd);
  const std::size_t rows = static_cast<std::size_t>(B) * n_head * T;
  attention_forward_rows<<<row_blocks(rows), kThreads>>>(out, probs, q, k, v, B, T, n_head,
                                                         n_kv_head, hd);
  check_launch("attention_forward: attention_forward_rows launch");
}

void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* probs,
                        const float* q, const float* k, const float* v, int B, int T, int n_head,
                        int n_kv_head, int hd, AttentionVersion version) {
  const char* where = "cuda::attention_backward";
  require_attention_shape(where, B, T, n_head, n_kv_head, hd);
  require_pointers(where, {{"dq", dq},
                           {"dk", dk},
                           {"dv", dv},
                           {"dout", dout},
                           {"probs", probs},
                           {"q", q},
                           {"k", k},
                           {"v", v}});
  const std::size_t query_rows = static_cast<std::size_t>(B) * n_head * T;
  const std::size_t key_rows = static_cast<std::size_t>(B) * n_kv_head * T;
  require_version(where, version);
  Scratch<float> ds(query_rows * T, where);  // B·n_head matrices T × T, like probs
  if (version == AttentionVersion::Gemm)
    return backward_gemm(dq, dk, dv, dout, probs, q, k, v, B, T, n_head, n_kv_head, hd, ds.get());
  attention_backward_rows<<<row_blocks(query_rows), kThreads>>>(dq, ds.get(), dout, probs, k, v, B,
                                                                T, n_head, n_kv_head, hd);
  check_launch("attention_backward: attention_backward_rows launch");
  attention_backward_keys<<<row_blocks(key_rows), kThreads>>>(dk, dv, ds.get(), probs, dout, q, B,
                                                              T, n_head, n_kv_head, hd);
  check_launch("attention_backward: attention_backward_keys launch");
}

}  // namespace mhar::cuda
