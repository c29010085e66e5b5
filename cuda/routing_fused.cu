/**
 * @file routing_fused.cu
 * @brief Routing version 2 (Fused), the default: the steps of docs/design.md#routing-steps with
 *        one team of threads per position, so each source row is read once in the forward and
 *        once more in the backward (docs/kernels.md gives the byte counts).
 *
 * Forward: the RMS (1) is fused into the logit pass (2), and the softmax over depth (3) is
 * online: a running maximum, a running denominator and a running weighted sum of the raw rows
 * (4), kept in registers. Backward: each row is held in registers for dS and for the per-team
 * dq, dg sums, which launch_reduce_columns adds up in a fixed order.
 *
 * Thread t of a team owns columns c = t + TT·k, k < VPT: for each k the team reads TT
 * consecutive floats (coalesced). A block holds R teams, one position each. All teams of a
 * block walk the same N sources, so block-wide __syncthreads() are reached by every thread;
 * teams past the last position (p ≥ P) run along with zeros and write nothing.
 * Per-head sums: each thread stages its products in shared memory, then warp w of the team
 * sums heads w, w + W, … (lanes stride over the head's K columns, then a warp butterfly).
 */
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>

#include "launch.cuh"
#include "routing.h"
#include "routing_versions.h"

// The __launch_bounds__(512, 1) variant of the VPT = 4 kernels (routing.h, FusedBounds):
// compiled unless the build says MHAR_FUSED4_ONE_BLOCK=0.
#ifndef MHAR_FUSED4_ONE_BLOCK
#define MHAR_FUSED4_ONE_BLOCK 1
#endif

namespace mhar::cuda {

namespace {

using detail::ceil_div;
using detail::check;
using detail::check_launch;
using detail::require;
using detail::Scratch;
using detail::warp_sum;
using routing_detail::kEps;
using routing_detail::launch_reduce_columns;
using routing_detail::one_wave;

/// Largest block of the fused kernels (also their __launch_bounds__: ≤ 128 registers a thread).
constexpr int kFusedMaxBlock = 512;
/// Shared memory a block may use without opting in.
constexpr std::size_t kDefaultSmem = 48 * 1024;

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

/// Calls f with the columns per thread as a template argument: one of the compiled kernels,
/// among which fused_layout picks.
template <typename F>
void with_vpt(int vpt, const char* where, F&& f) {
  detail::with_constant<1, 2, 4, 8, 16>(vpt, where, f);
}

}  // namespace

namespace routing_detail {

void forward_fused(float* out, float* alpha, const float* sources, const float* q, const float* g,
                   int N, int P, int d, int H) {
  const FusedLayout L = fused_layout(d, H, false);
  with_vpt(L.VPT, "routing_forward (fused)", [&](auto V) {
    constexpr int vpt = decltype(V)::value;
#if MHAR_FUSED4_ONE_BLOCK
    if constexpr (vpt == 4)
      if (fused4_bounds() == FusedBounds::OneBlockPerSM)
        return forward_fused_vpt<4, 1>(L, out, alpha, sources, q, g, N, P, d, H);
#endif
    forward_fused_vpt<vpt>(L, out, alpha, sources, q, g, N, P, d, H);
  });
}

void backward_fused(float* dsources, float* dq, float* dg, const float* dout, const float* out,
                    const float* alpha, const float* sources, const float* q, const float* g, int N,
                    int P, int d, int H) {
  const FusedLayout L = fused_layout(d, H, true);
  with_vpt(L.VPT, "routing_backward (fused)", [&](auto V) {
    constexpr int vpt = decltype(V)::value;
#if MHAR_FUSED4_ONE_BLOCK
    if constexpr (vpt == 4)
      if (fused4_bounds() == FusedBounds::OneBlockPerSM)
        return backward_fused_vpt<4, 1>(L, dsources, dq, dg, dout, out, alpha, sources, q, g, N, P,
                                        d, H);
#endif
    backward_fused_vpt<vpt>(L, dsources, dq, dg, dout, out, alpha, sources, q, g, N, P, d, H);
  });
}

}  // namespace routing_detail

bool fused4_applies(int d) {
  return d >= 1 && d <= kFusedMaxWidth && fused_layout(d, 1, false).VPT == 4;
}

}  // namespace mhar::cuda
