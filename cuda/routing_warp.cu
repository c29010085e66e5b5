/**
 * @file routing_warp.cu
 * @brief Routing version 3 (Warp): the Fused steps of docs/design.md#routing-steps with one
 *        warp per position: float4 loads (a warp reads 512 contiguous bytes at a time), head
 *        sums as butterflies within the warp, no shared memory and no block barrier, the next
 *        source's row loaded while the current one is used.
 *
 * Needs d ≤ 1024 and K = d/H a multiple of 128 or one of 4, 8, 16, 32, 64 (a float4 never
 * straddles two heads; routing_detail::warp_supports); the paper's d = 512, H = 4 and the tiny
 * d = 128, H = 4 qualify.
 */
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>

#include "launch.cuh"
#include "routing_versions.h"

namespace mhar::cuda {

namespace {

using detail::ceil_div;
using detail::check_launch;
using detail::Scratch;
using detail::warp_sum;
using routing_detail::kEps;
using routing_detail::launch_reduce_columns;
using routing_detail::one_wave;

//
// Lane l holds the columns of its float4 chunks j = 0 … C−1: c = 4·(l + 32·j) + e, e = 0 … 3,
// so a warp reads 512 contiguous bytes per chunk. Every float4 lies in one head (K % 4 == 0).
// A head's sums are butterflies: when K < 128 a chunk holds 128/K heads, each on an aligned
// group of K/4 lanes (K/4 a power of two), summed over that group only; when K ≥ 128 (K a
// multiple of 128) a head is K/128 whole chunks, summed over the warp and then over its chunks
// in order. Either way every lane of a head ends with the same bits, so the online softmax is
// kept, identically, by every lane of the head, and no barrier is needed.

/// Threads per block of the Warp kernels: 8 positions a block.
constexpr int kWarpBlock = 256;

/// Which heads and columns a lane holds; the same for every position.
struct WarpLanes {
  int d, K, seg, per;  ///< seg: lanes summed per head in a chunk; per: chunks per head
};

__device__ WarpLanes warp_lanes(int d, int H) {
  const int K = d / H;
  return {d, K, K < 128 ? K / 4 : 32, K < 128 ? 1 : K / 128};
}

/// Sum over each aligned group of `seg` lanes (a power of two ≤ 32): a butterfly in which
/// every lane of the group gets the same bits.
__device__ float segment_sum(float v, int seg) {
  for (int offset = seg / 2; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

/// part[j]: this lane's share of a sum over the columns of chunk j's head. On return part[j] is
/// the head's whole sum, the same bits on every lane of the head.
template <int C>
__device__ void head_sums(float (&part)[C], const WarpLanes& W) {
#pragma unroll
  for (int j = 0; j < C; ++j) part[j] = segment_sum(part[j], W.seg);
  if (W.per == 1) return;
  float total[C];
#pragma unroll
  for (int j = 0; j < C; ++j) {  // chunks first − first + per − 1 make one head, in order
    const int first = j - j % W.per;
    total[j] = 0.f;
#pragma unroll
    for (int jj = 0; jj < C; ++jj)
      if (jj >= first && jj < first + W.per) total[j] += part[jj];
  }
#pragma unroll
  for (int j = 0; j < C; ++j) part[j] = total[j];
}

/// x[4j … 4j+3] = row[4·(lane + 32j) …] (zeros past d), j < C = X / 4. `row` must be 16-byte
/// aligned.
template <int X>
__device__ void load_chunks(float (&x)[X], const float* __restrict__ row, int d, int lane) {
  constexpr int C = X / 4;
  const float4* row4 = reinterpret_cast<const float4*>(row);
#pragma unroll
  for (int j = 0; j < C; ++j) {
    const int f = lane + 32 * j;
    const float4 v = 4 * f < d ? row4[f] : float4{0.f, 0.f, 0.f, 0.f};
    x[4 * j] = v.x;
    x[4 * j + 1] = v.y;
    x[4 * j + 2] = v.z;
    x[4 * j + 3] = v.w;
  }
}

template <int X>
__device__ void store_chunks(float* __restrict__ row, const float (&x)[X], int d, int lane) {
  constexpr int C = X / 4;
  float4* row4 = reinterpret_cast<float4*>(row);
#pragma unroll
  for (int j = 0; j < C; ++j) {
    const int f = lane + 32 * j;
    if (4 * f < d) row4[f] = float4{x[4 * j], x[4 * j + 1], x[4 * j + 2], x[4 * j + 3]};
  }
}

/// qg = q ⊙ g on this lane's columns (zeros past d): the products q_c · g_c of (2).
template <int X>
__device__ void load_qg(float (&qg)[X], const float* __restrict__ q, const float* __restrict__ g,
                        int d, int lane) {
  float gg[X];
  load_chunks(qg, q, d, lane);
  load_chunks(gg, g, d, lane);
#pragma unroll
  for (int k = 0; k < X; ++k) qg[k] *= gg[k];
}

/// Σ_e a[4j+e]·b[4j+e] for each chunk j.
template <int C>
__device__ void chunk_dots(float (&out)[C], const float (&a)[4 * C], const float (&b)[4 * C]) {
#pragma unroll
  for (int j = 0; j < C; ++j)
    out[j] = a[4 * j] * b[4 * j] + a[4 * j + 1] * b[4 * j + 1] + a[4 * j + 2] * b[4 * j + 2] +
             a[4 * j + 3] * b[4 * j + 3];
}

/// The head of each chunk of this lane, and whether the lane "owns" it (holds the head's first
/// column: it writes the head's α).
template <int C>
__device__ void chunk_heads(int (&head)[C], bool (&owner)[C], const WarpLanes& W, int lane) {
#pragma unroll
  for (int j = 0; j < C; ++j) {
    const int c = 4 * (lane + 32 * j);
    head[j] = c < W.d ? c / W.K : 0;
    owner[j] = c < W.d && c % W.K == 0;
  }
}

/// Forward, one warp per position p = blockIdx.x · 8 + warp. Same steps as Fused, with the
/// next source's row loaded while this one is used.
template <int C>
__global__ void __launch_bounds__(kWarpBlock, C < 8 ? 2 : 1)
    routing_forward_warp(float* __restrict__ out, float* __restrict__ alpha,
                         const float* __restrict__ sources, const float* __restrict__ q,
                         const float* __restrict__ g, int N, int P, int d, int H) {
  const int lane = threadIdx.x % 32;
  const std::size_t p = static_cast<std::size_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (p >= static_cast<std::size_t>(P)) return;  // the whole warp: no butterfly loses a lane
  const WarpLanes W = warp_lanes(d, H);
  int head[C];
  bool owner[C];
  chunk_heads(head, owner, W, lane);
  float qg[4 * C], s[4 * C], next[4 * C], acc[4 * C], m[C], l[C];
  load_qg(qg, q, g, d, lane);
#pragma unroll
  for (int k = 0; k < 4 * C; ++k) acc[k] = 0.f;
#pragma unroll
  for (int j = 0; j < C; ++j) {
    m[j] = -INFINITY;
    l[j] = 0.f;
  }
  load_chunks(next, sources + p * d, d, lane);

  for (int i = 0; i < N; ++i) {
    const std::size_t row = static_cast<std::size_t>(i) * P + p;
#pragma unroll
    for (int k = 0; k < 4 * C; ++k) s[k] = next[k];
    if (i + 1 < N) load_chunks(next, sources + (row + P) * d, d, lane);  // in flight meanwhile

    // (1) r_i = 1 / sqrt( (1/d) Σ_c S_i[p,c]² + eps )
    float sum_sq = 0.f;
#pragma unroll
    for (int k = 0; k < 4 * C; ++k) sum_sq += s[k] * s[k];
    const float r = 1.0f / sqrtf(warp_sum(sum_sq) / d + kEps);

    // (2) z_i[h] = r_i · Σ_{c∈h} q_c g_c S_i[p,c]
    float z[C];
    chunk_dots(z, qg, s);
    head_sums(z, W);
#pragma unroll
    for (int j = 0; j < C; ++j) {
      z[j] *= r;
      // (3), online: m_new = max(m, z); l = l·exp(m − m_new) + exp(z − m_new)
      const float m_new = fmaxf(m[j], z[j]);
      const float sc = expf(m[j] - m_new);  // exp(−inf) = 0 for the first source
      const float w = expf(z[j] - m_new);
      l[j] = l[j] * sc + w;
      m[j] = m_new;
      // (4), online: acc = Σ_i exp(z_i − m)·S_i, rescaled whenever the running max m grows
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[4 * j + e] = acc[4 * j + e] * sc + w * s[4 * j + e];
      if (owner[j]) alpha[row * H + head[j]] = z[j];  // the logit for now; normalised below
    }
  }
  // (4) out[p,c] = acc / l   (= Σ_i α_i[h(c)] S_i[p,c])
#pragma unroll
  for (int j = 0; j < C; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[4 * j + e] /= l[j];
  store_chunks(out + p * d, acc, d, lane);
  // (3) α_i[h] = exp(z_i[h] − m[h]) / l[h], by the lane that wrote z_i[h]
#pragma unroll
  for (int j = 0; j < C; ++j)
    if (owner[j])
      for (int i = 0; i < N; ++i) {
        const std::size_t a = (static_cast<std::size_t>(i) * P + p) * H + head[j];
        alpha[a] = expf(alpha[a] - m[j]) / l[j];
      }
}

/// Backward, one warp per position, a grid-stride loop over positions (the grid fills the GPU
/// once; two blocks of 8 warps per multiprocessor at 128 registers a thread); each warp accumulates
/// Σ dz_i[h(c)] r_i S_i[p,c] in registers and finally writes it as row (global warp index) of
/// `partial` (warps × d), summed in order by reduce_columns.
template <int C>
__global__ void __launch_bounds__(kWarpBlock, C < 8 ? 2 : 1)
    routing_backward_warp(float* __restrict__ dsources, float* __restrict__ partial,
                          const float* __restrict__ dout, const float* __restrict__ out,
                          const float* __restrict__ alpha, const float* __restrict__ sources,
                          const float* __restrict__ q, const float* __restrict__ g, int N, int P,
                          int d, int H) {
  const int lane = threadIdx.x % 32;
  const std::size_t warp =
      static_cast<std::size_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const std::size_t warps = static_cast<std::size_t>(gridDim.x) * (blockDim.x / 32);
  const WarpLanes W = warp_lanes(d, H);
  int head[C];
  bool owner[C];
  chunk_heads(head, owner, W, lane);
  float qg[4 * C], go[4 * C], s[4 * C], ds[4 * C], nacc[4 * C];
  load_qg(qg, q, g, d, lane);
#pragma unroll
  for (int k = 0; k < 4 * C; ++k) nacc[k] = 0.f;

  for (std::size_t p = warp; p < static_cast<std::size_t>(P); p += warps) {  // warp-uniform
    // D[h] = Σ_{c∈h} dout[p,c] · out[p,c]   (replaces a pass over the sources)
    float D[C];
    load_chunks(go, dout + p * d, d, lane);
    load_chunks(s, out + p * d, d, lane);
    chunk_dots(D, go, s);
    head_sums(D, W);

    for (int i = 0; i < N; ++i) {
      const std::size_t row = static_cast<std::size_t>(i) * P + p;
      // The row and its gradient, loaded together (no prefetch: registers go to occupancy).
      load_chunks(s, sources + row * d, d, lane);
      load_chunks(ds, dsources + row * d, d, lane);
      float al[C];
#pragma unroll
      for (int j = 0; j < C; ++j) al[j] = alpha[row * H + head[j]];

      // (1) recomputed: r_i = 1 / sqrt( (1/d) Σ_c S_i[p,c]² + eps )
      float sum_sq = 0.f;
#pragma unroll
      for (int k = 0; k < 4 * C; ++k) sum_sq += s[k] * s[k];
      const float r = 1.0f / sqrtf(warp_sum(sum_sq) / d + kEps);

      // from (4): a_i[h] = Σ_{c∈h} dout ⊙ S_i;  from (3): dz_i[h] = α_i[h] · (a_i[h] − D[h]);
      // b_i[h] = Σ_{c∈h} q_c g_c S_i[c], so that Σ_c u_i[c] S_i[c] = Σ_h dz_i[h] b_i[h]
      float a[C], b[C], dz[C];
      chunk_dots(a, go, s);
      chunk_dots(b, qg, s);
      head_sums(a, W);
      head_sums(b, W);
      float part = 0.f;
#pragma unroll
      for (int j = 0; j < C; ++j) {
        dz[j] = al[j] * (a[j] - D[j]);
        if (owner[j]) part += dz[j] * b[j];  // each head once, by its owner
      }
      // (1): the RMS term's coefficient (r_i³/d) · Σ_c u_i[c] S_i[p,c]
      const float coef = r * r * r / d * warp_sum(part);
#pragma unroll
      for (int j = 0; j < C; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int k = 4 * j + e;
          // from (4), value path: α_i[h(c)]·dout;  from (2),(1), key path: r_i·u_i − coef·S_i
          ds[k] += al[j] * go[k] + r * (dz[j] * qg[k]) - coef * s[k];
          // from (2): dq_c, dg_c collect dz_i[h(c)] · r_i · S_i[p,c] (times g_c, q_c later)
          nacc[k] += dz[j] * r * s[k];
        }
      store_chunks(dsources + row * d, ds, d, lane);
    }
  }
  store_chunks(partial + warp * d, nacc, d, lane);
}

/// Chunks of 128 columns per lane for width d: 1, 2, 4 or 8.
int warp_chunks(int d) {
  int C = 1;
  while (128 * C < d) C *= 2;
  return C;
}

template <int C>
void forward_warp_c(float* out, float* alpha, const float* sources, const float* q, const float* g,
                    int N, int P, int d, int H) {
  const auto blocks = static_cast<unsigned>(ceil_div(P, kWarpBlock / 32));
  const auto kernel = routing_forward_warp<C>;
  kernel<<<blocks, kWarpBlock>>>(out, alpha, sources, q, g, N, P, d, H);
  check_launch("routing_forward (warp): routing_forward_warp launch");
}

template <int C>
void backward_warp_c(float* dsources, float* dq, float* dg, const float* dout, const float* out,
                     const float* alpha, const float* sources, const float* q, const float* g,
                     int N, int P, int d, int H) {
  const auto kernel = routing_backward_warp<C>;
  const unsigned blocks =
      one_wave(kernel, kWarpBlock, 0, ceil_div(P, kWarpBlock / 32), "routing_backward (warp)");
  const int rows = static_cast<int>(blocks) * (kWarpBlock / 32);
  Scratch<float> partial(static_cast<std::size_t>(rows) * d, "routing_backward (warp)");
  // The kernel stores its column sums into `partial` as float4.
  detail::require_scratch_aligned("routing_backward (warp)", "partial", partial.get(), 16,
                                  "the warp kernel stores float4 into it");
  kernel<<<blocks, kWarpBlock>>>(dsources, partial.get(), dout, out, alpha, sources, q, g, N, P, d,
                                 H);
  check_launch("routing_backward (warp): routing_backward_warp launch");
  launch_reduce_columns(dq, dg, partial.get(), rows, q, g, d);
}

/// Calls f with the float4 chunks per lane for width d as a template argument: one of the
/// compiled kernels.
template <typename F>
void with_chunks(int d, const char* where, F&& f) {
  detail::with_constant<1, 2, 4, 8>(warp_chunks(d), where, f);
}

}  // namespace

namespace routing_detail {

void forward_warp(float* out, float* alpha, const float* sources, const float* q, const float* g,
                  int N, int P, int d, int H) {
  with_chunks(d, "routing_forward (warp)", [&](auto C) {
    forward_warp_c<decltype(C)::value>(out, alpha, sources, q, g, N, P, d, H);
  });
}

void backward_warp(float* dsources, float* dq, float* dg, const float* dout, const float* out,
                   const float* alpha, const float* sources, const float* q, const float* g, int N,
                   int P, int d, int H) {
  with_chunks(d, "routing_backward (warp)", [&](auto C) {
    backward_warp_c<decltype(C)::value>(dsources, dq, dg, dout, out, alpha, sources, q, g, N, P, d,
                                        H);
  });
}

}  // namespace routing_detail

}  // namespace mhar::cuda
