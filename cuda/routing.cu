/**
 * @file routing.cu
 * @brief Depth routing at one site on the GPU, fp32: the CUDA twin of reference/routing.cpp
 *        (routing_forward, routing_backward), step for step.
 *
 * Forward, per position p (docs/design.md §1):
 *   (1) r_i      = 1 / sqrt( (1/d) Σ_c S_i[p,c]² + eps )      RMS over the FULL width d
 *   (2) z_i[h]   = Σ_{c∈h} q_c · g_c · r_i · S_i[p,c]          no 1/√d, no temperature
 *   (3) α_i[h]   = exp(z_i[h]) / Σ_j exp(z_j[h])               softmax over depth, per head
 *   (4) out[p,c] = Σ_i α_i[h(c)] · S_i[p,c]                    values are the RAW sources
 *
 * Backward, given dout; D[h] = Σ_{c∈h} dout[p,c]·out[p,c]  (= Σ_j α_j[h]·a_j[h]):
 *   from (4)  a_i[h]  = Σ_{c∈h} dout[p,c] · S_i[p,c]            ∂loss/∂α_i[h]
 *   from (3)  dz_i[h] = α_i[h] · (a_i[h] − D[h])                 softmax Jacobian diag(α) − ααᵀ
 *   from (2)  u_i[c]  = dz_i[h(c)] · q_c · g_c                   ∂loss/∂(r_i·S_i)
 *   (4),(1)   dS_i[p,c] += α_i[h(c)]·dout[p,c]                                  value path
 *                        + r_i·u_i[c] − (r_i³/d)·(Σ_c' u_i[c']·S_i[p,c'])·S_i[p,c]  key path
 *   from (2)  dq_c += Σ_{p,i} dz_i[h(c)] · g_c · r_i · S_i[p,c]
 *             dg_c += Σ_{p,i} dz_i[h(c)] · q_c · r_i · S_i[p,c]
 *   with Σ_c u_i[c]·S_i[c] = Σ_h dz_i[h] · b_i[h],  b_i[h] = Σ_{c∈h} q_c g_c S_i[c].
 *
 * Versions (docs/style.md §6; docs/kernels.md gives each one's byte count):
 *   1 Naive  the reference's loops, one kernel per step and one thread per output element
 *            ((i,p) for r, (i,p,h) for z, (p,h) for the softmax, (p,c) for out); scratch r_i.
 *   2 Fused  same math, one team of threads per position: reads each source row once, fuses
 *            the RMS into the logit pass and keeps an online softmax (running max, running
 *            denominator, running weighted sum of the raw rows in registers). The backward
 *            reads each row once more, keeps it in registers for dS and dq, dg, and reduces
 *            dq, dg per thread block into a scratch buffer summed in a fixed order.
 *   3 Warp   same math as Fused, one warp per position: float4 loads (a warp reads 512
 *            contiguous bytes at a time), head sums as butterflies within the warp, no shared
 *            memory and no block barrier, the next source's row loaded while the current one
 *            is used. Needs d ≤ 1024 and K = d/H a multiple of 128 or one of 4, 8, 16, 32, 64
 *            (a float4 never straddles two heads); the paper's d = 512, H = 4 and the tiny
 *            d = 128, H = 4 qualify.
 *
 * Deliberately left out: half precision, streams.
 * Every reduction runs in a fixed order (warp butterflies, fixed loops): same bits every run.
 */
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>

#include "cuda_check.cuh"
#include "launch.cuh"
#include "routing.h"

// The __launch_bounds__(512, 1) variant of the VPT = 4 fused kernels (routing.h, FusedBounds):
// compiled unless the build says MHAR_FUSED4_ONE_BLOCK=0.
#ifndef MHAR_FUSED4_ONE_BLOCK
#define MHAR_FUSED4_ONE_BLOCK 1
#endif

namespace mhar::cuda {

std::string version_name(RoutingVersion v) {
  switch (v) {
    case RoutingVersion::Naive:
      return "naive";
    case RoutingVersion::Fused:
      return "fused";
    case RoutingVersion::Warp:
      return "warp";
  }
  return "unknown";
}

static bool warp_supports(int d, int H) {
  if (d < 1 || H < 1 || d % H != 0 || d > kWarpMaxWidth) return false;
  const int K = d / H;
  if (K % 4 != 0) return false;
  if (K % 128 == 0) return true;
  const int lanes = K / 4;  // lanes per head in a chunk: a power of two below 32
  return lanes < 32 && (lanes & (lanes - 1)) == 0;
}

bool version_supports(RoutingVersion v, int d, int H) {
  switch (v) {
    case RoutingVersion::Naive:
      return true;
    case RoutingVersion::Fused:
      return d <= kFusedMaxWidth;
    case RoutingVersion::Warp:
      return warp_supports(d, H);
  }
  return false;
}

namespace {
/// The process-wide choice of set_fused4_bounds.
std::atomic<FusedBounds> fused4_choice{FusedBounds::Default};
}  // namespace

bool fused4_one_block_built() {
  return MHAR_FUSED4_ONE_BLOCK != 0;
}

void set_fused4_bounds(FusedBounds b) {
  if (b == FusedBounds::OneBlockPerSM && !fused4_one_block_built())
    throw std::invalid_argument(
        "set_fused4_bounds: this build has no __launch_bounds__(512, 1) variant of the fused "
        "kernels (configure with -DMHAR_FUSED4_ONE_BLOCK=ON)");
  fused4_choice = b;
}

FusedBounds fused4_bounds() {
  return fused4_choice.load();
}

namespace {

using detail::ceil_div;
using detail::check;
using detail::check_launch;
using detail::Scratch;
using detail::thread_index;
using detail::thread_stride;
using detail::warp_sum;

/// eps inside the RMS: mhar::kRoutingEps of reference/routing.h.
constexpr float kEps = 1e-6f;
/// Threads per block of the naive kernels.
constexpr int kNaiveThreads = 256;
/// Positions per partial sum of the naive dq, dg reduction.
constexpr int kNaiveChunk = 256;
/// Largest block of the fused kernels (also their __launch_bounds__: ≤ 128 registers a thread).
constexpr int kFusedMaxBlock = 512;
/// Rows summed in parallel per column by reduce_columns.
constexpr int kReduceRows = 8;
/// Shared memory a block may use without opting in.
constexpr std::size_t kDefaultSmem = 48 * 1024;

/// Blocks for a grid-stride loop over n items (capped; the loops cover the rest).
unsigned naive_blocks(std::size_t n) {
  return static_cast<unsigned>(std::clamp<std::size_t>(ceil_div(n, kNaiveThreads), 1, 1u << 20));
}

// ============================================================================================
// Shared by both versions: dq, dg from per-row partial sums, in a fixed order.
// ============================================================================================

/// dq_c += g_c · Σ_rows partial[row, c];  dg_c += q_c · Σ_rows partial[row, c].
/// Block (32, kReduceRows): thread (x, y) sums rows y, y + 8, … of column c; thread y = 0 then
/// adds the 8 sums in order. partial: rows × d.
__global__ void reduce_columns(float* __restrict__ dq, float* __restrict__ dg,
                               const float* __restrict__ partial, int rows,
                               const float* __restrict__ q, const float* __restrict__ g, int d) {
  __shared__ float sums[kReduceRows][32];
  const int c = blockIdx.x * 32 + threadIdx.x;
  float s = 0.f;
  if (c < d)
    for (int row = threadIdx.y; row < rows; row += kReduceRows)
      s += partial[static_cast<std::size_t>(row) * d + c];
  sums[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < d) {
    float total = 0.f;
    for (int y = 0; y < kReduceRows; ++y) total += sums[y][threadIdx.x];
    dq[c] += g[c] * total;
    dg[c] += q[c] * total;
  }
}

void launch_reduce_columns(float* dq, float* dg, const float* partial, int rows, const float* q,
                           const float* g, int d) {
  const dim3 block(32, kReduceRows);
  reduce_columns<<<static_cast<unsigned>(ceil_div(d, 32)), block>>>(dq, dg, partial, rows, q, g, d);
  check_launch("routing: reduce_columns launch");
}

// ============================================================================================
// Version 1 (Naive): the reference loops, one thread per output element.
// Rows are (i, p) pairs, row = i·P + p: source row S_i[p,:] starts at row·d, α_i[p,:] at row·H.
// ============================================================================================

/// (1) r_i = 1 / sqrt( (1/d) Σ_c S_i[p,c]² + eps ); one thread per row (i, p).
__global__ void rms_naive(float* __restrict__ rinv, const float* __restrict__ sources,
                          std::size_t rows, int d) {
  for (std::size_t row = thread_index(); row < rows; row += thread_stride()) {
    const float* S = sources + row * d;
    float sum_sq = 0.f;
    for (int c = 0; c < d; ++c) sum_sq += S[c] * S[c];
    rinv[row] = 1.0f / sqrtf(sum_sq / d + kEps);
  }
}

/// (2) z_i[h] = r_i · Σ_{c∈h} q_c g_c S_i[p,c]; one thread per (i, p, h). z goes into alpha.
__global__ void logits_naive(float* __restrict__ alpha, const float* __restrict__ rinv,
                             const float* __restrict__ sources, const float* __restrict__ q,
                             const float* __restrict__ g, std::size_t rows, int d, int H) {
  const int K = d / H;
  for (std::size_t idx = thread_index(); idx < rows * H; idx += thread_stride()) {
    const std::size_t row = idx / H;
    const int h = static_cast<int>(idx % H);
    const float* S = sources + row * d;
    float z = 0.f;
    for (int c = h * K; c < (h + 1) * K; ++c) z += q[c] * g[c] * S[c];
    alpha[idx] = rinv[row] * z;
  }
}

/// (3) α_i[h] = exp(z_i[h] − m) / Σ_j exp(z_j[h] − m), m = max_j z_j[h]; one thread per (p, h).
/// alpha holds z on entry; element (i, p, h) is at i·PH + (p·H + h).
__global__ void softmax_naive(float* __restrict__ alpha, int N, std::size_t PH) {
  for (std::size_t idx = thread_index(); idx < PH; idx += thread_stride()) {
    float m = alpha[idx];
    for (int i = 1; i < N; ++i) m = fmaxf(m, alpha[i * PH + idx]);
    float denom = 0.f;
    for (int i = 0; i < N; ++i) {
      const float e = expf(alpha[i * PH + idx] - m);
      alpha[i * PH + idx] = e;
      denom += e;
    }
    for (int i = 0; i < N; ++i) alpha[i * PH + idx] /= denom;
  }
}

/// (4) out[p,c] = Σ_i α_i[h(c)] · S_i[p,c]; one thread per (p, c).
__global__ void out_naive(float* __restrict__ out, const float* __restrict__ alpha,
                          const float* __restrict__ sources, int N, int P, int d, int H) {
  const int K = d / H;
  const std::size_t Pd = static_cast<std::size_t>(P) * d;
  for (std::size_t idx = thread_index(); idx < Pd; idx += thread_stride()) {
    const std::size_t p = idx / d;
    const int h = static_cast<int>(idx % d) / K;
    float o = 0.f;
    for (int i = 0; i < N; ++i)
      o += alpha[(static_cast<std::size_t>(i) * P + p) * H + h] * sources[i * Pd + idx];
    out[idx] = o;
  }
}

/// D[p,h] = Σ_{c∈h} dout[p,c] · out[p,c]; one thread per (p, h).
__global__ void head_dot_naive(float* __restrict__ D, const float* __restrict__ dout,
                               const float* __restrict__ out, int P, int d, int H) {
  const int K = d / H;
  for (std::size_t idx = thread_index(); idx < static_cast<std::size_t>(P) * H;
       idx += thread_stride()) {
    const std::size_t p = idx / H;
    const int h = static_cast<int>(idx % H);
    float s = 0.f;
    for (int c = h * K; c < (h + 1) * K; ++c) s += dout[p * d + c] * out[p * d + c];
    D[idx] = s;
  }
}

/// from (4): a_i[h] = Σ_{c∈h} dout ⊙ S_i;  from (3): dz_i[h] = α_i[h] · (a_i[h] − D[h]).
/// One thread per (i, p, h).
__global__ void dz_naive(float* __restrict__ dz, const float* __restrict__ alpha,
                         const float* __restrict__ D, const float* __restrict__ dout,
                         const float* __restrict__ sources, int P, std::size_t rows, int d, int H) {
  const int K = d / H;
  for (std::size_t idx = thread_index(); idx < rows * H; idx += thread_stride()) {
    const std::size_t row = idx / H;
    const std::size_t p = row % P;
    const int h = static_cast<int>(idx % H);
    float a = 0.f;
    for (int c = h * K; c < (h + 1) * K; ++c) a += dout[p * d + c] * sources[row * d + c];
    dz[idx] = alpha[idx] * (a - D[p * H + h]);
  }
}

/// from (1): uS_i = Σ_c u_i[c] · S_i[p,c], u_i[c] = dz_i[h(c)] · q_c · g_c; one thread per (i, p).
__global__ void us_naive(float* __restrict__ uS, const float* __restrict__ dz,
                         const float* __restrict__ sources, const float* __restrict__ q,
                         const float* __restrict__ g, std::size_t rows, int d, int H) {
  const int K = d / H;
  for (std::size_t row = thread_index(); row < rows; row += thread_stride()) {
    float s = 0.f;
    for (int c = 0; c < d; ++c) s += dz[row * H + c / K] * q[c] * g[c] * sources[row * d + c];
    uS[row] = s;
  }
}

/// from (4), value path, and (1)-(2), key path; one thread per (i, p, c):
/// dS_i[p,c] += α_i[h(c)]·dout[p,c] + r_i·u_i[c] − (r_i³/d)·uS_i·S_i[p,c].
__global__ void dsources_naive(float* __restrict__ dsources, const float* __restrict__ alpha,
                               const float* __restrict__ dz, const float* __restrict__ rinv,
                               const float* __restrict__ uS, const float* __restrict__ dout,
                               const float* __restrict__ sources, const float* __restrict__ q,
                               const float* __restrict__ g, int P, std::size_t rows, int d, int H) {
  const int K = d / H;
  for (std::size_t idx = thread_index(); idx < rows * d; idx += thread_stride()) {
    const std::size_t row = idx / d;
    const std::size_t p = row % P;
    const int c = static_cast<int>(idx % d);
    const std::size_t rh = row * H + c / K;
    const float r = rinv[row];
    const float u = dz[rh] * q[c] * g[c];
    dsources[idx] += alpha[rh] * dout[p * d + c] + r * u - (r * r * r / d) * uS[row] * sources[idx];
  }
}

/// dq, dg first half: partial[k, c] = Σ_i Σ_{p in chunk k} dz_i[h(c)] · r_i · S_i[p,c];
/// one thread per (chunk k, c). reduce_columns then sums the chunks in order.
__global__ void dzn_naive(float* __restrict__ partial, const float* __restrict__ dz,
                          const float* __restrict__ rinv, const float* __restrict__ sources, int N,
                          int P, int d, int H) {
  const int K = d / H;
  const std::size_t chunks = ceil_div(P, kNaiveChunk);
  for (std::size_t idx = thread_index(); idx < chunks * d; idx += thread_stride()) {
    const std::size_t k = idx / d;
    const int c = static_cast<int>(idx % d);
    const std::size_t p_end =
        (k + 1) * kNaiveChunk < static_cast<std::size_t>(P) ? (k + 1) * kNaiveChunk : P;
    float s = 0.f;
    for (int i = 0; i < N; ++i)
      for (std::size_t p = k * kNaiveChunk; p < p_end; ++p) {
        const std::size_t row = static_cast<std::size_t>(i) * P + p;
        s += dz[row * H + c / K] * rinv[row] * sources[row * d + c];
      }
    partial[idx] = s;
  }
}

// ============================================================================================
// Version 2 (Fused): one team of TT threads per position.
// Thread t of a team owns columns c = t + TT·k, k < VPT: for each k the team reads TT
// consecutive floats (coalesced). A block holds R teams, one position each. All teams of a
// block walk the same N sources, so block-wide __syncthreads() are reached by every thread;
// teams past the last position (p ≥ P) run along with zeros and write nothing.
// Per-head sums: each thread stages its products in shared memory, then warp w of the team
// sums heads w, w + W, … (lanes stride over the head's K columns, then a warp butterfly).
// ============================================================================================

/// Team and block shape of the fused kernels for a given d, H.
struct FusedLayout {
  int TT = 0;                   ///< threads per team (one position), a multiple of 32
  int W = 0;                    ///< warps per team, TT / 32
  int VPT = 0;                  ///< columns per thread, a power of two with VPT · TT ≥ d
  int R = 0;                    ///< teams (positions) per block
  std::size_t team_floats = 0;  ///< shared floats per team
  std::size_t smem_bytes() const {
    return static_cast<std::size_t>(R) * team_floats * sizeof(float);
  }
};

/// About 4 columns per thread, teams of 32 … 512 threads, blocks of ~256 threads.
/// Shared floats per team: forward d + 4H + W, backward 2d + 3H + 2W.
FusedLayout fused_layout(int d, int H, bool backward) {
  FusedLayout L;
  L.TT = static_cast<int>(std::min<std::size_t>(kFusedMaxBlock, ceil_div(ceil_div(d, 4), 32) * 32));
  L.W = L.TT / 32;
  const int needed = static_cast<int>(ceil_div(d, L.TT));
  L.VPT = 1;
  while (L.VPT < needed) L.VPT *= 2;
  L.team_floats = backward
                      ? 2 * static_cast<std::size_t>(d) + 3 * static_cast<std::size_t>(H) + 2 * L.W
                      : static_cast<std::size_t>(d) + 4 * static_cast<std::size_t>(H) + L.W;
  L.R = std::max(1, 256 / L.TT);
  while (L.R > 1 && L.smem_bytes() > kDefaultSmem) L.R /= 2;
  return L;
}

/// Forward, one team per position p = blockIdx.x · R + team.
/// Team shared memory: tmp[d] | m[H] | l[H] | scale[H] | weight[H] | wsum[W].
/// MinBlocks: the second argument of __launch_bounds__ (FusedBounds in routing.h); 0, the
/// default, asks for no minimum (nvcc 13 then emits the PTX of `__launch_bounds__(512)`).
template <int VPT, int MinBlocks = 0>
__global__ void __launch_bounds__(kFusedMaxBlock, MinBlocks)
    routing_forward_fused(float* __restrict__ out, float* __restrict__ alpha,
                          const float* __restrict__ sources, const float* __restrict__ q,
                          const float* __restrict__ g, int N, int P, int d, int H, int TT) {
  extern __shared__ float smem[];
  const int W = TT / 32, K = d / H, R = blockDim.x / TT;
  const int team = threadIdx.x / TT, t = threadIdx.x % TT, warp = t / 32, lane = t % 32;
  const std::size_t p = static_cast<std::size_t>(blockIdx.x) * R + team;
  const bool active = p < static_cast<std::size_t>(P);

  float* tmp = smem + static_cast<std::size_t>(team) * (d + 4 * H + W);  // q_c g_c S_i[p,c]
  float* m = tmp + d;         // running max of z over the sources seen, per head
  float* l = m + H;           // running Σ exp(z − m), per head
  float* scale = l + H;       // exp(m_old − m_new) for this source, per head
  float* weight = scale + H;  // exp(z_i − m_new) for this source, per head
  float* wsum = weight + H;   // per-warp Σ S², per team

  float qg[VPT], s[VPT], acc[VPT];
  int hk[VPT];
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    const int c = t + TT * k;
    qg[k] = c < d ? q[c] * g[c] : 0.f;
    hk[k] = c < d ? c / K : 0;
    acc[k] = 0.f;
  }
  for (int h = t; h < H; h += TT) {
    m[h] = -INFINITY;
    l[h] = 0.f;
  }
  __syncthreads();

  for (int i = 0; i < N; ++i) {
    const std::size_t row = static_cast<std::size_t>(i) * P + p;  // used only when active
    // Read the row once: Σ S² for (1) and the products q_c g_c S_i[p,c] for (2).
    float sum_sq = 0.f;
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const int c = t + TT * k;
      s[k] = active && c < d ? sources[row * d + c] : 0.f;
      sum_sq += s[k] * s[k];
      if (c < d) tmp[c] = qg[k] * s[k];
    }
    sum_sq = warp_sum(sum_sq);
    if (lane == 0) wsum[warp] = sum_sq;
    __syncthreads();

    // (1) r_i = 1 / sqrt( (1/d) Σ_c S_i[p,c]² + eps )   (every thread, same order, same bits)
    float total_sq = 0.f;
    for (int w = 0; w < W; ++w) total_sq += wsum[w];
    const float r = 1.0f / sqrtf(total_sq / d + kEps);

    // (2) z_i[h] = r_i · Σ_{c∈h} q_c g_c S_i[p,c];  warp w takes heads w, w + W, …
    for (int h = warp; h < H; h += W) {
      float zsum = 0.f;
      for (int j = lane; j < K; j += 32) zsum += tmp[h * K + j];
      zsum = warp_sum(zsum);
      if (lane == 0) {
        const float z = r * zsum;
        // (3), online: m_new = max(m, z); l = l·exp(m − m_new) + exp(z − m_new)
        const float m_new = fmaxf(m[h], z);
        const float sc = expf(m[h] - m_new);  // exp(−inf) = 0 for the first source
        const float w = expf(z - m_new);
        l[h] = l[h] * sc + w;
        m[h] = m_new;
        scale[h] = sc;
        weight[h] = w;
        if (active) alpha[row * H + h] = z;  // the logit for now; normalised after the loop
      }
    }
    __syncthreads();

    // (4), online: acc = Σ_i exp(z_i − m)·S_i, rescaled whenever the running max m grows
#pragma unroll
    for (int k = 0; k < VPT; ++k) acc[k] = acc[k] * scale[hk[k]] + weight[hk[k]] * s[k];
  }
  // The last __syncthreads() above made the final m, l and every saved z visible to the team.
  if (!active) return;
    // (4) out[p,c] = acc / l   (= Σ_i α_i[h(c)] S_i[p,c])
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    const int c = t + TT * k;
    if (c < d) out[p * d + c] = acc[k] / l[hk[k]];
  }
  // (3) α_i[h] = exp(z_i[h] − m[h]) / l[h]
  for (long long idx = t; idx < static_cast<long long>(N) * H; idx += TT) {
    const long long i = idx / H;
    const int h = static_cast<int>(idx % H);
    const std::size_t a = (static_cast<std::size_t>(i) * P + p) * H + h;
    alpha[a] = expf(alpha[a] - m[h]) / l[h];
  }
}

/// Backward, one team per position; a grid-stride loop over groups of R positions (the grid is
/// sized to fill the GPU once). Each team accumulates Σ dz_i[h(c)] r_i S_i[p,c] in registers
/// and finally writes it as row (blockIdx.x · R + team) of `partial` (gridDim.x · R × d).
/// Team shared memory: ta[d] | tb[d] | D[H] | dz[H] | al[H] | wsum[W] | wpart[W].
template <int VPT, int MinBlocks = 0>
__global__ void __launch_bounds__(kFusedMaxBlock, MinBlocks)
    routing_backward_fused(float* __restrict__ dsources, float* __restrict__ partial,
                           const float* __restrict__ dout, const float* __restrict__ out,
                           const float* __restrict__ alpha, const float* __restrict__ sources,
                           const float* __restrict__ q, const float* __restrict__ g, int N, int P,
                           int d, int H, int TT) {
  extern __shared__ float smem[];
  const int W = TT / 32, K = d / H, R = blockDim.x / TT;
  const int team = threadIdx.x / TT, t = threadIdx.x % TT, warp = t / 32, lane = t % 32;

  float* ta =
      smem + static_cast<std::size_t>(team) * (2 * d + 3 * H + 2 * W);  // dout ⊙ (out or S_i)
  float* tb = ta + d;                                                   // q_c g_c S_i[p,c]
  float* Dh = tb + d;                                                   // D[h]
  float* dzh = Dh + H;                                                  // dz_i[h]
  float* alh = dzh + H;                                                 // α_i[h]
  float* wsum = alh + H;                                                // per-warp Σ S²
  float* wpart = wsum + W;  // per-warp Σ_h dz_i[h] b_i[h]

  float qg[VPT], s[VPT], go[VPT], nacc[VPT];
  int hk[VPT];
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    const int c = t + TT * k;
    qg[k] = c < d ? q[c] * g[c] : 0.f;
    hk[k] = c < d ? c / K : 0;
    nacc[k] = 0.f;
  }

  const std::size_t groups = (static_cast<std::size_t>(P) + R - 1) / R;
  for (std::size_t group = blockIdx.x; group < groups; group += gridDim.x) {  // block-uniform
    const std::size_t p = group * R + team;
    const bool active = p < static_cast<std::size_t>(P);

    // D[h] = Σ_{c∈h} dout[p,c] · out[p,c]   (replaces a pass over the sources)
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const int c = t + TT * k;
      go[k] = active && c < d ? dout[p * d + c] : 0.f;
      if (c < d) ta[c] = active ? go[k] * out[p * d + c] : 0.f;
    }
    __syncthreads();
    for (int h = warp; h < H; h += W) {
      float v = 0.f;
      for (int j = lane; j < K; j += 32) v += ta[h * K + j];
      v = warp_sum(v);
      if (lane == 0) Dh[h] = v;
    }
    __syncthreads();

    for (int i = 0; i < N; ++i) {
      const std::size_t row = static_cast<std::size_t>(i) * P + p;  // used only when active
      // Read the row once (kept in registers): Σ S², dout ⊙ S_i and q g ⊙ S_i.
      float sum_sq = 0.f;
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        const int c = t + TT * k;
        s[k] = active && c < d ? sources[row * d + c] : 0.f;
        sum_sq += s[k] * s[k];
        if (c < d) {
          ta[c] = go[k] * s[k];
          tb[c] = qg[k] * s[k];
        }
      }
      sum_sq = warp_sum(sum_sq);
      if (lane == 0) wsum[warp] = sum_sq;
      __syncthreads();

      // (1) recomputed: r_i = 1 / sqrt( (1/d) Σ_c S_i[p,c]² + eps )
      float total_sq = 0.f;
      for (int w = 0; w < W; ++w) total_sq += wsum[w];
      const float r = 1.0f / sqrtf(total_sq / d + kEps);

      // from (4): a_i[h] = Σ_{c∈h} dout ⊙ S_i;  from (3): dz_i[h] = α_i[h] · (a_i[h] − D[h]);
      // b_i[h] = Σ_{c∈h} q_c g_c S_i[c], so that Σ_c u_i[c] S_i[c] = Σ_h dz_i[h] b_i[h]
      float part = 0.f;
      for (int h = warp; h < H; h += W) {
        float a = 0.f, b = 0.f;
        for (int j = lane; j < K; j += 32) {
          a += ta[h * K + j];
          b += tb[h * K + j];
        }
        a = warp_sum(a);
        b = warp_sum(b);
        if (lane == 0) {
          const float al = active ? alpha[row * H + h] : 0.f;
          const float dz = al * (a - Dh[h]);
          alh[h] = al;
          dzh[h] = dz;
          part += dz * b;
        }
      }
      if (lane == 0) wpart[warp] = part;
      __syncthreads();

      // (1): the RMS term's coefficient (r_i³/d) · Σ_c u_i[c] S_i[p,c]
      float uS = 0.f;
      for (int w = 0; w < W; ++w) uS += wpart[w];
      const float coef = r * r * r / d * uS;
      if (active) {
#pragma unroll
        for (int k = 0; k < VPT; ++k) {
          const int c = t + TT * k;
          if (c < d) {
            const int h = hk[k];
            // from (4), value path: α_i[h(c)]·dout;  from (2),(1), key path: r_i·u_i − coef·S_i
            dsources[row * d + c] += alh[h] * go[k] + r * (dzh[h] * qg[k]) - coef * s[k];
            // from (2): dq_c, dg_c collect dz_i[h(c)] · r_i · S_i[p,c] (times g_c, q_c later)
            nacc[k] += dzh[h] * r * s[k];
          }
        }
      }
    }
  }
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    const int c = t + TT * k;
    if (c < d) partial[(static_cast<std::size_t>(blockIdx.x) * R + team) * d + c] = nacc[k];
  }
}

// ============================================================================================
// Version 3 (Warp): one warp per position, four columns per load (float4), no shared memory.
// ============================================================================================
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

// ============================================================================================
// Host side: argument checks, scratch memory, launches.
// ============================================================================================

void require(bool ok, const std::string& where, const std::string& message) {
  if (!ok) throw std::invalid_argument(where + ": " + message);
}

/// Every check that needs no device; throws std::invalid_argument.
void check_args(const char* where, int N, int P, int d, int H, RoutingVersion v,
                std::initializer_list<std::pair<const char*, const void*>> pointers) {
  require(v == RoutingVersion::Naive || v == RoutingVersion::Fused || v == RoutingVersion::Warp,
          where,
          "unknown RoutingVersion " + std::to_string(static_cast<int>(v)) +
              " (allowed: 1 = naive, 2 = fused, 3 = warp)");
  require(N >= 1, where, "N = " + std::to_string(N) + ": needs at least one source (N >= 1)");
  require(P >= 1, where, "P = " + std::to_string(P) + ": needs at least one position (P >= 1)");
  require(d >= 1, where, "d = " + std::to_string(d) + ": width must be >= 1");
  require(H >= 1 && d % H == 0, where,
          "H = " + std::to_string(H) + " must divide d = " + std::to_string(d) +
              " (allowed: a divisor of d)");
  for (const auto& [name, ptr] : pointers)
    require(ptr != nullptr, where, std::string(name) + " is a null pointer");
  if (v == RoutingVersion::Fused)
    require(d <= kFusedMaxWidth, where,
            "d = " + std::to_string(d) + " is wider than the fused kernels handle (d <= " +
                std::to_string(kFusedMaxWidth) + "); use RoutingVersion::Naive");
  if (v == RoutingVersion::Warp) {
    require(warp_supports(d, H), where,
            "d = " + std::to_string(d) + ", H = " + std::to_string(H) +
                ": the warp kernels need d <= " + std::to_string(kWarpMaxWidth) +
                " and K = d/H a multiple of 128 or one of 4, 8, 16, 32, 64; use "
                "RoutingVersion::Fused");
    for (const auto& [name, ptr] : pointers)
      require(reinterpret_cast<std::uintptr_t>(ptr) % 16 == 0, where,
              std::string(name) +
                  " is not 16-byte aligned (the warp kernels load float4); use "
                  "RoutingVersion::Fused");
  }
}

/// Lets `kernel` use layout L's shared memory (opting in above 48 KB); throws if the device
/// cannot give that much.
template <typename Kernel>
void prepare_shared_memory(Kernel kernel, const FusedLayout& L, int d, int H, const char* where) {
  const std::size_t bytes = L.smem_bytes();
  if (bytes <= kDefaultSmem) return;
  int device = 0, optin = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
        "cudaDeviceGetAttribute(MaxSharedMemoryPerBlockOptin)");
  require(bytes <= static_cast<std::size_t>(optin), where,
          "d = " + std::to_string(d) + ", H = " + std::to_string(H) + " needs " +
              std::to_string(bytes) + " bytes of shared memory per block, this device allows " +
              std::to_string(optin) + "; use RoutingVersion::Naive");
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(bytes)),
        "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
}

/// Blocks of `kernel` (with `threads` threads and `smem` bytes of shared memory) that fit on
/// the current device at once: the SM count × the occupancy calculator's blocks per SM, asked
/// once per (device, kernel, threads, smem) and kept, since a backward call would otherwise
/// repeat both queries every time. Throws when not even one block fits.
int blocks_per_wave(const void* kernel, int threads, std::size_t smem, const char* where) {
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  using Key = std::tuple<int, const void*, int, std::size_t>;
  static std::mutex mutex;
  static std::map<Key, int> known;
  const Key key{device, kernel, threads, smem};
  {
    std::lock_guard<std::mutex> lock(mutex);
    const auto it = known.find(key);
    if (it != known.end()) return it->second;
  }
  int sms = 0, per_sm = 0;
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
        "cudaDeviceGetAttribute(MultiProcessorCount)");
  check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem),
        "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  if (per_sm < 1)
    throw std::runtime_error(std::string(where) + ": a block of " + std::to_string(threads) +
                             " threads and " + std::to_string(smem) +
                             " bytes of shared memory does not fit on this device");
  std::lock_guard<std::mutex> lock(mutex);
  known[key] = per_sm * sms;
  return per_sm * sms;
}

/// Blocks for one wave of `kernel` over `groups` work items: as many as fit on the GPU at once
/// (a function of the device and the shape only, so the order of the dq, dg sums, and their
/// bits, never change between runs), at most one per item.
template <typename Kernel>
unsigned one_wave(Kernel kernel, int threads, std::size_t smem, std::size_t groups,
                  const char* where) {
  const int wave = blocks_per_wave(reinterpret_cast<const void*>(kernel), threads, smem, where);
  return static_cast<unsigned>(std::min<std::size_t>(groups, static_cast<std::size_t>(wave)));
}

void forward_naive(float* out, float* alpha, const float* sources, const float* q, const float* g,
                   int N, int P, int d, int H) {
  const std::size_t rows = static_cast<std::size_t>(N) * P;
  const std::size_t PH = static_cast<std::size_t>(P) * H;
  Scratch<float> rinv(rows, "routing_forward (naive)");
  rms_naive<<<naive_blocks(rows), kNaiveThreads>>>(rinv.get(), sources, rows, d);
  check_launch("routing_forward (naive): rms_naive launch");
  logits_naive<<<naive_blocks(rows * H), kNaiveThreads>>>(alpha, rinv.get(), sources, q, g, rows, d,
                                                          H);
  check_launch("routing_forward (naive): logits_naive launch");
  softmax_naive<<<naive_blocks(PH), kNaiveThreads>>>(alpha, N, PH);
  check_launch("routing_forward (naive): softmax_naive launch");
  out_naive<<<naive_blocks(static_cast<std::size_t>(P) * d), kNaiveThreads>>>(out, alpha, sources,
                                                                              N, P, d, H);
  check_launch("routing_forward (naive): out_naive launch");
}

void backward_naive(float* dsources, float* dq, float* dg, const float* dout, const float* out,
                    const float* alpha, const float* sources, const float* q, const float* g, int N,
                    int P, int d, int H) {
  const std::size_t rows = static_cast<std::size_t>(N) * P;
  const std::size_t chunks = ceil_div(P, kNaiveChunk);
  const char* where = "routing_backward (naive)";
  Scratch<float> rinv(rows, where), D(static_cast<std::size_t>(P) * H, where), dz(rows * H, where),
      uS(rows, where), partial(chunks * d, where);
  rms_naive<<<naive_blocks(rows), kNaiveThreads>>>(rinv.get(), sources, rows, d);
  check_launch("routing_backward (naive): rms_naive launch");
  head_dot_naive<<<naive_blocks(static_cast<std::size_t>(P) * H), kNaiveThreads>>>(D.get(), dout,
                                                                                   out, P, d, H);
  check_launch("routing_backward (naive): head_dot_naive launch");
  dz_naive<<<naive_blocks(rows * H), kNaiveThreads>>>(dz.get(), alpha, D.get(), dout, sources, P,
                                                      rows, d, H);
  check_launch("routing_backward (naive): dz_naive launch");
  us_naive<<<naive_blocks(rows), kNaiveThreads>>>(uS.get(), dz.get(), sources, q, g, rows, d, H);
  check_launch("routing_backward (naive): us_naive launch");
  dsources_naive<<<naive_blocks(rows * d), kNaiveThreads>>>(
      dsources, alpha, dz.get(), rinv.get(), uS.get(), dout, sources, q, g, P, rows, d, H);
  check_launch("routing_backward (naive): dsources_naive launch");
  dzn_naive<<<naive_blocks(chunks * d), kNaiveThreads>>>(partial.get(), dz.get(), rinv.get(),
                                                         sources, N, P, d, H);
  check_launch("routing_backward (naive): dzn_naive launch");
  launch_reduce_columns(dq, dg, partial.get(), static_cast<int>(chunks), q, g, d);
}

/// "<what>: routing_forward_fused launch", naming the launch bounds of a OneBlockPerSM kernel.
template <int MinBlocks>
const char* fused_launch_name(bool backward) {
  if constexpr (MinBlocks == 0)
    return backward ? "routing_backward (fused): routing_backward_fused launch"
                    : "routing_forward (fused): routing_forward_fused launch";
  else
    return backward ? "routing_backward (fused): routing_backward_fused "
                      "__launch_bounds__(512, 1) launch"
                    : "routing_forward (fused): routing_forward_fused __launch_bounds__(512, 1) "
                      "launch";
}

template <int VPT, int MinBlocks = 0>
void forward_fused_vpt(const FusedLayout& L, float* out, float* alpha, const float* sources,
                       const float* q, const float* g, int N, int P, int d, int H) {
  const auto kernel = routing_forward_fused<VPT, MinBlocks>;
  prepare_shared_memory(kernel, L, d, H, "routing_forward (fused)");
  const auto blocks = static_cast<unsigned>(ceil_div(P, L.R));
  kernel<<<blocks, L.R * L.TT, L.smem_bytes()>>>(out, alpha, sources, q, g, N, P, d, H, L.TT);
  check_launch(fused_launch_name<MinBlocks>(false));
}

template <int VPT, int MinBlocks = 0>
void backward_fused_vpt(const FusedLayout& L, float* dsources, float* dq, float* dg,
                        const float* dout, const float* out, const float* alpha,
                        const float* sources, const float* q, const float* g, int N, int P, int d,
                        int H) {
  const auto kernel = routing_backward_fused<VPT, MinBlocks>;
  prepare_shared_memory(kernel, L, d, H, "routing_backward (fused)");
  const unsigned blocks =
      one_wave(kernel, L.R * L.TT, L.smem_bytes(), ceil_div(P, L.R), "routing_backward (fused)");
  const int rows = static_cast<int>(blocks) * L.R;
  Scratch<float> partial(static_cast<std::size_t>(rows) * d, "routing_backward (fused)");
  kernel<<<blocks, L.R * L.TT, L.smem_bytes()>>>(dsources, partial.get(), dout, out, alpha, sources,
                                                 q, g, N, P, d, H, L.TT);
  check_launch(fused_launch_name<MinBlocks>(true));
  launch_reduce_columns(dq, dg, partial.get(), rows, q, g, d);
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

}  // namespace

void routing_forward(float* out, float* alpha, const float* sources, const float* q, const float* g,
                     int N, int P, int d, int H, RoutingVersion v) {
  check_args("cuda::routing_forward", N, P, d, H, v,
             {{"out", out}, {"alpha", alpha}, {"sources", sources}, {"q", q}, {"g", g}});
  if (v == RoutingVersion::Naive) return forward_naive(out, alpha, sources, q, g, N, P, d, H);
  if (v == RoutingVersion::Warp) {
    switch (warp_chunks(d)) {
      case 1:
        return forward_warp_c<1>(out, alpha, sources, q, g, N, P, d, H);
      case 2:
        return forward_warp_c<2>(out, alpha, sources, q, g, N, P, d, H);
      case 4:
        return forward_warp_c<4>(out, alpha, sources, q, g, N, P, d, H);
      case 8:
        return forward_warp_c<8>(out, alpha, sources, q, g, N, P, d, H);
    }
    throw std::logic_error("routing_forward (warp): no kernel for d = " + std::to_string(d));
  }
  const FusedLayout L = fused_layout(d, H, false);
  switch (L.VPT) {
    case 1:
      return forward_fused_vpt<1>(L, out, alpha, sources, q, g, N, P, d, H);
    case 2:
      return forward_fused_vpt<2>(L, out, alpha, sources, q, g, N, P, d, H);
    case 4:
#if MHAR_FUSED4_ONE_BLOCK
      if (fused4_bounds() == FusedBounds::OneBlockPerSM)
        return forward_fused_vpt<4, 1>(L, out, alpha, sources, q, g, N, P, d, H);
#endif
      return forward_fused_vpt<4>(L, out, alpha, sources, q, g, N, P, d, H);
    case 8:
      return forward_fused_vpt<8>(L, out, alpha, sources, q, g, N, P, d, H);
    case 16:
      return forward_fused_vpt<16>(L, out, alpha, sources, q, g, N, P, d, H);
  }
  throw std::logic_error("routing_forward (fused): no kernel for " + std::to_string(L.VPT) +
                         " columns per thread");
}

void routing_backward(float* dsources, float* dq, float* dg, const float* dout, const float* out,
                      const float* alpha, const float* sources, const float* q, const float* g,
                      int N, int P, int d, int H, RoutingVersion v) {
  check_args("cuda::routing_backward", N, P, d, H, v,
             {{"dsources", dsources},
              {"dq", dq},
              {"dg", dg},
              {"dout", dout},
              {"out", out},
              {"alpha", alpha},
              {"sources", sources},
              {"q", q},
              {"g", g}});
  if (v == RoutingVersion::Naive)
    return backward_naive(dsources, dq, dg, dout, out, alpha, sources, q, g, N, P, d, H);
  if (v == RoutingVersion::Warp) {
    switch (warp_chunks(d)) {
      case 1:
        return backward_warp_c<1>(dsources, dq, dg, dout, out, alpha, sources, q, g, N, P, d, H);
      case 2:
        return backward_warp_c<2>(dsources, dq, dg, dout, out, alpha, sources, q, g, N, P, d, H);
      case 4:
        return backward_warp_c<4>(dsources, dq, dg, dout, out, alpha, sources, q, g, N, P, d, H);
      case 8:
        return backward_warp_c<8>(dsources, dq, dg, dout, out, alpha, sources, q, g, N, P, d, H);
    }
    throw std::logic_error("routing_backward (warp): no kernel for d = " + std::to_string(d));
  }
  const FusedLayout L = fused_layout(d, H, true);
  switch (L.VPT) {
    case 1:
      return backward_fused_vpt<1>(L, dsources, dq, dg, dout, out, alpha, sources, q, g, N, P, d,
                                   H);
    case 2:
      return backward_fused_vpt<2>(L, dsources, dq, dg, dout, out, alpha, sources, q, g, N, P, d,
                                   H);
    case 4:
#if MHAR_FUSED4_ONE_BLOCK
      if (fused4_bounds() == FusedBounds::OneBlockPerSM)
        return backward_fused_vpt<4, 1>(L, dsources, dq, dg, dout, out, alpha, sources, q, g, N,
                                        P, d, H);
#endif
      return backward_fused_vpt<4>(L, dsources, dq, dg, dout, out, alpha, sources, q, g, N, P, d,
                                   H);
    case 8:
      return backward_fused_vpt<8>(L, dsources, dq, dg, dout, out, alpha, sources, q, g, N, P, d,
                                   H);
    case 16:
      return backward_fused_vpt<16>(L, dsources, dq, dg, dout, out, alpha, sources, q, g, N, P, d,
                                    H);
  }
  throw std::logic_error("routing_backward (fused): no kernel for " + std::to_string(L.VPT) +
                         " columns per thread");
}

bool fused4_applies(int d) {
  return d >= 1 && d <= kFusedMaxWidth && fused_layout(d, 1, false).VPT == 4;
}

}  // namespace mhar::cuda
