/**
 * @file routing.cu
 * @brief Depth routing at one site on the GPU, fp32: the CUDA twin of reference/routing.cpp
 *        (routing_forward, routing_backward). This file is the public API of routing.h: it
 *        checks the arguments, then hands the call to one kernel version.
 *
 * Every version computes the steps (1)–(4) of docs/design.md#routing-steps and their backward
 * (the same page), and its comments carry the steps' numbers.
 *
 * The versions, one file each (docs/style.md §6; docs/kernels.md gives each one's byte count):
 *   1 Naive  routing_naive.cu: the reference's loops, one kernel per step and one thread per
 *            output element; a second oracle and the teaching version.
 *   2 Fused  routing_fused.cu: one team of threads per position reads each source row once,
 *            fuses the RMS into the logit pass and keeps an online softmax; the backward reads
 *            each row once more. The default.
 *   3 Warp   routing_warp.cu: the Fused steps with one warp per position, float4 loads, head
 *            sums as warp butterflies, no shared memory and no block barrier.
 * routing_shared.cu holds what they share (the fixed-order dq, dg reduction, one-wave grids);
 * routing_versions.h declares each version's entry points.
 *
 * Deliberately left out: half precision, streams.
 * Every reduction runs in a fixed order (warp butterflies, fixed loops): same bits every run.
 */
#include <atomic>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <utility>

#include "launch.cuh"
#include "routing.h"
#include "routing_versions.h"

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

bool version_supports(RoutingVersion v, int d, int H) {
  switch (v) {
    case RoutingVersion::Naive:
      return true;
    case RoutingVersion::Fused:
      return d <= kFusedMaxWidth;
    case RoutingVersion::Warp:
      return routing_detail::warp_supports(d, H);
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

using Pointers = std::initializer_list<std::pair<const char*, const void*>>;

/// Every check that needs no device; throws std::invalid_argument.
void check_args(const char* where, int N, int P, int d, int H, RoutingVersion v,
                Pointers pointers) {
  using detail::require;
  require(v == RoutingVersion::Naive || v == RoutingVersion::Fused || v == RoutingVersion::Warp,
          where,
          "unknown RoutingVersion " + std::to_string(static_cast<int>(v)) +
              " (allowed: 1 = naive, 2 = fused, 3 = warp)");
  detail::require_positive(where, "N", N, "needs at least one source");
  detail::require_positive(where, "P", P, "needs at least one position");
  detail::require_positive(where, "d", d, "the width must be at least 1");
  require(H >= 1 && d % H == 0, where,
          "H = " + std::to_string(H) + " must divide d = " + std::to_string(d) +
              " (allowed: a divisor of d)");
  detail::require_pointers(where, pointers);
  if (v == RoutingVersion::Fused)
    require(d <= kFusedMaxWidth, where,
            "d = " + std::to_string(d) + " is wider than the fused kernels handle (d <= " +
                std::to_string(kFusedMaxWidth) + "); use RoutingVersion::Naive");
  if (v == RoutingVersion::Warp) {
    require(routing_detail::warp_supports(d, H), where,
            "d = " + std::to_string(d) + ", H = " + std::to_string(H) +
                ": the warp kernels need d <= " + std::to_string(kWarpMaxWidth) +
                " and K = d/H a multiple of 128 or one of 4, 8, 16, 32, 64; use "
                "RoutingVersion::Fused");
    detail::require_aligned(where, 16, "the warp kernels load float4; use RoutingVersion::Fused",
                            pointers);
  }
}

}  // namespace

void routing_forward(float* out, float* alpha, const float* sources, const float* q, const float* g,
                     int N, int P, int d, int H, RoutingVersion v) {
  check_args("cuda::routing_forward", N, P, d, H, v,
             {{"out", out}, {"alpha", alpha}, {"sources", sources}, {"q", q}, {"g", g}});
  switch (v) {
    case RoutingVersion::Naive:
      return routing_detail::forward_naive(out, alpha, sources, q, g, N, P, d, H);
    case RoutingVersion::Fused:
      return routing_detail::forward_fused(out, alpha, sources, q, g, N, P, d, H);
    case RoutingVersion::Warp:
      return routing_detail::forward_warp(out, alpha, sources, q, g, N, P, d, H);
  }
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
  switch (v) {
    case RoutingVersion::Naive:
      return routing_detail::backward_naive(dsources, dq, dg, dout, out, alpha, sources, q, g, N, P,
                                            d, H);
    case RoutingVersion::Fused:
      return routing_detail::backward_fused(dsources, dq, dg, dout, out, alpha, sources, q, g, N, P,
                                            d, H);
    case RoutingVersion::Warp:
      return routing_detail::backward_warp(dsources, dq, dg, dout, out, alpha, sources, q, g, N, P,
                                           d, H);
  }
}

}  // namespace mhar::cuda
