/**
 * @file routing_versions.h
 * @ingroup cuda
 * @brief Internal to cuda/routing*.cu: each kernel version's entry points, and what the
 *        versions share. Users call routing.h; this header is how its dispatch reaches a version.
 *
 * One file per version, each the same four steps (docs/design.md, anchor routing-steps) in a
 * different thread layout:
 *   routing_naive.cu   version 1, the reference loops, one thread per output element
 *   routing_fused.cu   version 2, one team of threads per position, each source row read once
 *   routing_warp.cu    version 3, one warp per position, float4 loads, no shared memory
 *   routing_shared.cu  the fixed-order dq, dg reduction and the one-wave grid size they share
 *   routing.cu         the public API: argument checks, then one call into a version
 *
 * Every entry point takes arguments routing.cu has already checked (check_args there) and
 * launches on the default stream; the layouts are those of routing.h.
 */
#pragma once

#include <algorithm>
#include <cstddef>

namespace mhar::cuda::routing_detail {

/// eps inside the RMS: mhar::kRoutingEps of reference/routing.h.
inline constexpr float kEps = 1e-6f;

/// True when the Warp version handles width d with H heads (routing.h, RoutingVersion::Warp):
/// d ≤ kWarpMaxWidth and K = d/H a multiple of 128 or one of 4, 8, 16, 32, 64.
bool warp_supports(int d, int H);

/// dq_c += g_c · Σ_rows partial[row, c] and dg_c += q_c · Σ_rows partial[row, c], summed in a
/// fixed order (the same bits every run). partial: rows × d, one row per team or warp.
void launch_reduce_columns(float* dq, float* dg, const float* partial, int rows, const float* q,
                           const float* g, int d);

/// Blocks of `kernel` (with `threads` threads and `smem` bytes of shared memory) that fit on
/// the current device at once; asked once per (device, kernel, threads, smem) and kept.
int blocks_per_wave(const void* kernel, int threads, std::size_t smem, const char* where);

/// Blocks for one wave of `kernel` over `groups` work items: as many as fit on the GPU at once
/// (a function of the device and the shape only, so the order of the dq, dg sums, and their
/// bits, never change between runs), at most one per item.
template <typename Kernel>
unsigned one_wave(Kernel kernel, int threads, std::size_t smem, std::size_t groups,
                  const char* where) {
  const int wave = blocks_per_wave(reinterpret_cast<const void*>(kernel), threads, smem, where);
  return static_cast<unsigned>(std::min<std::size_t>(groups, static_cast<std::size_t>(wave)));
}

/// @name One version's forward and backward (routing.h's routing_forward, routing_backward).
/// @{
void forward_naive(float* out, float* alpha, const float* sources, const float* q, const float* g,
                   int N, int P, int d, int H);
void backward_naive(float* dsources, float* dq, float* dg, const float* dout, const float* out,
                    const float* alpha, const float* sources, const float* q, const float* g, int N,
                    int P, int d, int H);
void forward_fused(float* out, float* alpha, const float* sources, const float* q, const float* g,
                   int N, int P, int d, int H);
void backward_fused(float* dsources, float* dq, float* dg, const float* dout, const float* out,
                    const float* alpha, const float* sources, const float* q, const float* g, int N,
                    int P, int d, int H);
void forward_warp(float* out, float* alpha, const float* sources, const float* q, const float* g,
                  int N, int P, int d, int H);
void backward_warp(float* dsources, float* dq, float* dg, const float* dout, const float* out,
                   const float* alpha, const float* sources, const float* q, const float* g, int N,
                   int P, int d, int H);
/// @}

}  // namespace mhar::cuda::routing_detail
