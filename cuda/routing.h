/**
 * @file routing.h
 * @ingroup cuda
 * @brief Depth routing at one site (docs/design.md §1) on the GPU, fp32: the CUDA twin of
 *        reference/routing.h, same names and argument order.
 *
 * Dimension letters (docs/design.md §1): P positions, d model width, N sources, H routing heads,
 * K = d / H head width. Head h owns the columns [h·K, (h+1)·K).
 *
 * A plain C++ header (no CUDA types, no Eigen): g++-compiled code calls these functions with
 * DEVICE pointers (see device.h for DeviceBuffer). The kernels, their equations and their
 * versions are in cuda/routing_{naive,fused,warp}.cu behind cuda/routing.cu; docs/kernels.md
 * describes each version and its cost.
 *
 * Device layouts, all contiguous fp32:
 *   sources, dsources  N × P × d   source i at offset i·P·d, row-major P × d (element [i][p][c])
 *   alpha              N × P × H   α_i[p,h] at (i·P + p)·H + h
 *   out, dout          P × d
 *   q, g, dq, dg       d
 *
 * Errors: bad arguments throw std::invalid_argument before any CUDA call; a failed CUDA call
 * throws std::runtime_error with CUDA's message. Launches go to the default stream and are
 * asynchronous: a fault inside a kernel surfaces at the next synchronising call.
 */
#pragma once

#include <string>

namespace mhar::cuda {

/**
 * Kernel versions (docs/style.md §6); a version keeps its number when it becomes the default.
 *   Naive = 1: a direct port of the reference loops, one thread per output element; a second
 *              oracle and the teaching version.
 *   Fused = 2: one team of threads per position reads each source row once (RMS fused, online
 *              softmax over depth); the backward reads each row once more and reduces dq, dg
 *              per thread block in a fixed order. The default.
 *   Warp  = 3: the Fused steps with one warp per position, float4 loads, head sums as warp
 *              butterflies, no shared memory or barriers, the next row prefetched. Only for
 *              the shapes version_supports() accepts (d ≤ 1024, K = d/H a multiple of 128 or
 *              one of 4, 8, 16, 32, 64) and 16-byte aligned pointers.
 */
enum class RoutingVersion { Naive = 1, Fused = 2, Warp = 3 };

/// Every version, in order.
inline constexpr RoutingVersion kRoutingVersions[] = {RoutingVersion::Naive, RoutingVersion::Fused,
                                                      RoutingVersion::Warp};

/// "naive", "fused" or "warp".
std::string version_name(RoutingVersion v);

/// Widest d the Fused version handles (registers per thread); Naive has no limit.
inline constexpr int kFusedMaxWidth = 8192;
/// Widest d the Warp version handles (8 float4 chunks a lane).
inline constexpr int kWarpMaxWidth = 1024;

/// True when version v handles width d with H heads (H dividing d); the Warp version also needs
/// its pointers 16-byte aligned, which cudaMalloc'd buffers are.
bool version_supports(RoutingVersion v, int d, int H);

/**
 * Launch bounds of the Fused kernels at four columns a thread (VPT = 4: 97 ≤ d ≤ 2048, the tiny
 * and the paper's widths), a choice only a GPU can settle (docs/kernels.md):
 *   Default      `__launch_bounds__(512)`: ptxas holds them to 64 registers, with a 32-byte spill;
 *   OneBlockPerSM `__launch_bounds__(512, 1)`: 80–96 registers, no spill, fewer warps per SM.
 * OneBlockPerSM exists only in a build with the CMake option MHAR_FUSED4_ONE_BLOCK (on by
 * default); `mhar-toy bench routing` times both, so one GPU run decides.
 */
enum class FusedBounds { Default, OneBlockPerSM };
/// True when this build has the OneBlockPerSM variant (MHAR_FUSED4_ONE_BLOCK).
bool fused4_one_block_built();
/// True when the Fused kernels take four columns a thread at width d (where FusedBounds applies).
bool fused4_applies(int d);
/// Selects the launch bounds the Fused version uses from now on, process-wide (Default until
/// changed). Throws std::invalid_argument for OneBlockPerSM in a build without it.
void set_fused4_bounds(FusedBounds b);
/// The launch bounds the Fused version uses at four columns a thread.
FusedBounds fused4_bounds();

/**
 * @brief Routing forward at one site.
 *
 * Writes (=) out and alpha. Throws std::invalid_argument when N, P, d < 1, H does not divide d,
 * a pointer is null, (Fused) d > kFusedMaxWidth, or (Warp) !version_supports or a pointer is
 * not 16-byte aligned.
 *
 * @param out      P × d: out[p,c] = Σ_i α_i[p,h(c)] · S_i[p,c]
 * @param alpha    N × P × H: routing weights α_i[p,h], saved for the backward (and heatmaps)
 * @param sources  N × P × d: the raw sources S_0 … S_{N-1}
 * @param q        d: pseudo-query (read as H slices)
 * @param g        d: key gain
 * @param N        sources
 * @param P        positions
 * @param d        model width
 * @param H        routing heads; must divide d
 * @param v        kernel version (Fused by default)
 */
void routing_forward(float* out, float* alpha, const float* sources, const float* q, const float* g,
                     int N, int P, int d, int H, RoutingVersion v = RoutingVersion::Fused);

/**
 * @brief Routing backward at one site.
 *
 * Accumulates (+=) into dsources, dq and dg, like the reference: a source's gradient sums over
 * every site that reads it. dq and dg are reduced over positions in a fixed order, so two runs
 * give the same bits. 1/RMS is recomputed from the sources (nothing but α is saved).
 *
 * @param dsources N × P × d, += ∂loss/∂S_i
 * @param dq       d, += ∂loss/∂q
 * @param dg       d, += ∂loss/∂g
 * @param dout     P × d, ∂loss/∂out
 * @param out      P × d, the forward's output
 * @param alpha    N × P × H, the forward's routing weights
 * @param sources  N × P × d, as in the forward
 * @param q        d, as in the forward
 * @param g        d, as in the forward
 * @param N, P, d, H, v  as in the forward
 */
void routing_backward(float* dsources, float* dq, float* dg, const float* dout, const float* out,
                      const float* alpha, const float* sources, const float* q, const float* g,
                      int N, int P, int d, int H, RoutingVersion v = RoutingVersion::Fused);

}  // namespace mhar::cuda
