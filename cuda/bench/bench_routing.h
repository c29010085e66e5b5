/**
 * @file bench_routing.h
 * @ingroup cuda
 * @brief Speed of the routing kernels (cuda/routing.cu) as bytes moved ÷ time, next to the
 *        copy bandwidth measured in the same run (docs/design.md §4).
 *
 * A plain C++ header (no CUDA types): `mhar-toy bench routing` calls it (target mhar_cuda_bench).
 * Bytes are what the operation must move at least, the same formula for every version, so GB/s
 * is an effective rate and a version that moves more than the minimum shows it as lower GB/s:
 *   forward   4 · (N·P·d + P·d + N·P·H)              read sources, write out and α
 *   backward  4 · (3·N·P·d + 2·P·d + N·P·H)          read sources once, read and write dsources,
 *                                                    read dout and out, read α (dq, dg: O(d))
 *   copy      4 · 2·N·P·d                            read and write a buffer the size of sources
 */
#pragma once

#include <string>
#include <vector>

namespace mhar::cuda {

/// The version column of the fused kernels under __launch_bounds__(512, 1) (routing.h,
/// FusedBounds::OneBlockPerSM).
inline constexpr const char* kFusedOneBlockName = "fused-lb1";

/// One measurement: op is "copy", "forward" or "backward"; version "naive", "fused", "warp",
/// kFusedOneBlockName or "kernel" (the copy).
struct BenchRow {
  std::string op, version;
  double ms = 0;        ///< mean time of one call
  double bytes = 0;     ///< bytes the op moves (formula above)
  double gbps = 0;      ///< bytes / time, 1e9 bytes per second
  double pct_copy = 0;  ///< gbps as a percentage of the copy kernel's
};

/// Bytes one routing forward moves (formula above).
double routing_forward_bytes(int N, int P, int d, int H);
/// Bytes one routing backward moves (formula above).
double routing_backward_bytes(int N, int P, int d, int H);

/**
 * @brief Times the copy kernel, then every version's forward and backward, on device-generated
 *        random inputs: one warm-up call, then the mean over `repeats` calls (cudaEvent timing).
 *
 * Needs about 2·N·P·d + 2·P·d + N·P·H floats of device memory. Versions that cannot handle the
 * shape (Fused with d > kFusedMaxWidth) are left out. Where the fused kernels take four columns
 * a thread (fused4_applies) and the build has the variant, the fused version is timed a second
 * time under __launch_bounds__(512, 1), as kFusedOneBlockName; the process's choice of
 * FusedBounds is restored afterwards. Throws std::runtime_error on CUDA errors
 * (including "no device") and std::invalid_argument on bad shapes or repeats < 1.
 */
std::vector<BenchRow> bench_routing(int N, int P, int d, int H, int repeats);

}  // namespace mhar::cuda
