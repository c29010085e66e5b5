/**
 * @file attention.h
 * @ingroup cuda
 * @brief Causal grouped-query self-attention on the GPU, fp32: the CUDA twin of reference
 *        attention_forward / attention_backward (reference/layers.h), same names and argument
 *        order.
 *
 * Dimension letters (docs/design.md §1–2): B sequences, T tokens per sequence, P = B·T positions,
 * hd head width; n_head query heads share n_kv_head key/value heads, G = n_head / n_kv_head
 * query heads per key/value head: query head h reads key/value head h / G.
 *
 * A plain C++ header (no CUDA types, no Eigen): g++-compiled code calls these functions with
 * DEVICE pointers (see device.h for DeviceBuffer). All tensors are contiguous fp32, row-major,
 * one row per position p = b·T + t; head h occupies columns [h·hd, (h+1)·hd) of its row.
 *   q, out, dq, dout:  P × (n_head·hd)
 *   k, v, dk, dv:      P × (n_kv_head·hd)
 *   probs:             B·n_head matrices of T × T, matrix (b·n_head + h) at offset
 *                      (b·n_head + h)·T·T; row t is the query, column s the key.
 * Outputs must not alias inputs. The kernels and their equations are in cuda/attention.cu.
 *
 * This is the attention core only, after the q/k/v projections and RoPE and before the output
 * projection (those are linear_forward and rope_forward). hd may be any positive width (the
 * reference asks no more; the model's is even because of RoPE).
 *
 * Errors: bad arguments throw std::invalid_argument before any CUDA call; a failed CUDA call
 * throws std::runtime_error with CUDA's message. Launches go to the default stream and are
 * asynchronous: a fault inside a kernel surfaces at the next synchronising call. Every sum runs
 * in a fixed order (no atomics): two runs give the same bits.
 */
#pragma once

namespace mhar::cuda {

/**
 * Kernel versions (docs/style.md §6):
 *   Rows = 1: the reference's loops, one warp per query row (and per key row in the backward);
 *             the teaching version and a second oracle.
 *   Gemm = 2: the reference's matrix products as cuBLAS strided-batched SGEMMs (fp32, per head,
 *             batched over the sequences) and one warp per row for the causal softmax and its
 *             backward. The default.
 */
enum class AttentionVersion { Rows = 1, Gemm = 2 };

/// "rows" or "gemm".
const char* attention_version_name(AttentionVersion v);

// ---- out[b,t,h] = Σ_{s≤t} softmax_s( q[b,t,h] · k[b,s,h/G] / √hd ) · v[b,s,h/G] ------------

/**
 * @brief Attention forward (reference attention_forward).
 * @param out        P × (n_head·hd) (=)
 * @param probs      B·n_head matrices T × T (=), saved for the backward: the causal softmax,
 *                   written in full, zero above the diagonal (s > t)
 * @param q          P × (n_head·hd), queries (after RoPE)
 * @param k          P × (n_kv_head·hd), keys (after RoPE)
 * @param v          P × (n_kv_head·hd), values
 * @param B          sequences
 * @param T          tokens per sequence
 * @param n_head     query heads, a multiple of n_kv_head
 * @param n_kv_head  key/value heads
 * @param hd         head width
 * @param version    kernel version (Gemm by default)
 */
void attention_forward(float* out, float* probs, const float* q, const float* k, const float* v,
                       int B, int T, int n_head, int n_kv_head, int hd,
                       AttentionVersion version = AttentionVersion::Gemm);

/**
 * @brief Attention backward (reference attention_backward).
 * @param dq         P × (n_head·hd) (=)
 * @param dk         P × (n_kv_head·hd) (=), summed over the G query heads of each key/value
 *                   head in a fixed order
 * @param dv         P × (n_kv_head·hd) (=), likewise
 * @param dout       P × (n_head·hd), ∂loss/∂out
 * @param probs      B·n_head matrices T × T, as saved by the forward (only s ≤ t is read)
 * @param q          P × (n_head·hd), as in the forward
 * @param k          P × (n_kv_head·hd), as in the forward
 * @param v          P × (n_kv_head·hd), as in the forward
 * @param B          sequences
 * @param T          tokens per sequence
 * @param n_head     query heads, a multiple of n_kv_head
 * @param n_kv_head  key/value heads
 * @param hd         head width
 * @param version    kernel version (Gemm by default)
 */
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* probs,
                        const float* q, const float* k, const float* v, int B, int T, int n_head,
                        int n_kv_head, int hd, AttentionVersion version = AttentionVersion::Gemm);

}  // namespace mhar::cuda
