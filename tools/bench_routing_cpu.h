/**
 * @file bench_routing_cpu.h
 * @ingroup tools
 * @brief `mhar-toy bench routing --device cpu`: the CPU routing versions (reference/routing.h,
 *        cpu/routing_versions.h) as bytes moved ÷ time, next to a copy loop timed in the same
 *        run on the same number of threads (docs/design.md §4).
 *
 * Bytes are the minimum each operation moves, the formula of docs/kernels.md and
 * cuda/bench/bench_routing.h (4-byte floats), the same for every version, so GB/s is an
 * effective rate:
 *   forward   4 · (N·P·d + P·d + N·P·H)        read sources, write out and α
 *   backward  4 · (3·N·P·d + 2·P·d + N·P·H)    read sources, read and write dsources, read dout,
 *                                              out and α (dq, dg: O(d))
 *   copy      4 · 2·N·P·d                      read and write a buffer the size of the sources
 *
 * The stack tables time every routing site of a model at once, n sites where site s reads
 * sources 0 … s (the N = 2L + 1 sites of attnres and mhar):
 *   stack-fwd  Σ_s forward(N = s + 1)            each site's forward (F2); F3
 *                                              (each source's logits once, when it is added)
 *                                              is shown against the same bytes
 *   stack-bwd  4 · (Σ_s (s+1)·(P·d + P·H) + 4·n·P·d)
 *                                              what B3 moves: per (site, source) pair
 *                                              dout_s and α read; per site dout_s and out_s read
 *                                              for D; per source S_i read and dS_i written.
 *                                              B2, site by site, moves about 3·P·d a pair
 *                                              (S_i read, dS_i read and written) and is shown
 *                                              against the same bytes.
 */
#pragma once

#include <string>
#include <vector>

namespace mhar::toy {

/// One measurement: op "copy", "forward", "backward", "stack-fwd" or "stack-bwd"; version "-",
/// "F1 ref", "F2 fast", "F3 stack" (forward) or "B1 ref", "B2 fast", "B3 stack" (backward).
struct CpuRoutingRow {
  std::string op, version;
  int threads = 1;
  double ms = 0;        ///< fastest time of one call over the repeats
  double bytes = 0;     ///< bytes the op moves (formula above)
  double gbps = 0;      ///< bytes / time, 1e9 bytes per second
  double pct_copy = 0;  ///< gbps as a percentage of the copy loop's at the same thread count
};

/// Bytes one routing forward moves (formula above).
double cpu_routing_forward_bytes(int N, int P, int d, int H);
/// Bytes one routing backward moves (formula above).
double cpu_routing_backward_bytes(int N, int P, int d, int H);

/// Bytes the forwards of a stack of n sites move, site s reading s + 1 sources (formula above).
double cpu_stack_forward_bytes(int n, int P, int d, int H);
/// Bytes B3's backward of a stack of n sites moves (formula above).
double cpu_stack_backward_bytes(int n, int P, int d, int H);

/// Bytes the routing of one training step moves: the stack forward and backward (formulas
/// above) over the 2L + 1 sites of an attnres or mhar model, P = batch · T positions.
double cpu_step_routing_bytes(int L, int P, int d, int H);
/// Of cpu_step_routing_bytes, the bytes written: each site's output in the forward and each
/// source's gradient in the backward, 4 · 2 · (2L + 1) · P · d (α and the logits, about 1/K of
/// the sources, are counted as read). The rest is read.
double cpu_step_routing_written_bytes(int L, int P, int d);

/// GB/s (read and write bytes, as for "copy" above) of the copy loop over two buffers of `floats`
/// floats each on the current OpenMP threads: the fastest of `repeats` calls after a warm-up.
double cpu_copy_gbps(long floats, int repeats);
/// GB/s (bytes read) of a read-only loop over one buffer of `bytes` bytes on the current OpenMP
/// threads (every 64-bit word XORed into one, nothing written): the fastest of `repeats` calls
/// after a warm-up. The routing mostly reads, so this, not the copy's rate, is its limit.
double cpu_read_gbps(long bytes, int repeats);

/**
 * @brief For each thread count in `threads`: times the copy loop and both versions' forward
 *        and backward in float on random inputs, interleaved in rounds; one warm-up call each,
 *        then the fastest of `repeats` rounds (other processes only add time).
 *
 * Needs about 4·N·P·d floats of memory. Throws ShapeError on bad shapes (H not dividing d).
 */
std::vector<CpuRoutingRow> bench_routing_cpu(int N, int P, int d, int H, int repeats,
                                             const std::vector<int>& threads);

/**
 * @brief For each thread count: the copy loop (over n·P·d floats), the forwards of a stack of n
 *        sites (site s reads sources 0 … s) by F2 (site by site) and by F3
 *        (RoutingStackForward), and its backward by B2 (site by site, last first, on
 *        zeroed source gradients) and by B3 (RoutingStackBackward), as the model runs
 *        each; in rounds, fastest of `repeats` after a warm-up.
 *
 * Needs about 6·n·P·d floats (the sources, their gradients, the douts, the outputs and the copy
 * loop's two buffers). Throws ShapeError on bad shapes.
 */
std::vector<CpuRoutingRow> bench_routing_stack_cpu(int n, int P, int d, int H, int repeats,
                                                   const std::vector<int>& threads);

}  // namespace mhar::toy
