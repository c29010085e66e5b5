/**
 * @file routing_fast.h
 * @ingroup cpu
 * @brief Depth routing at one site, F2 (forward) and B2 (backward): the reference's math in a
 *        loop order that reads each source row from memory once, split over positions across
 *        OpenMP threads. routing_versions.h lists the versions; routing_fast_forward.cpp and
 *        routing_fast_backward.cpp say what each changes.
 *
 * Same arguments, same saved state (so either backward takes either forward's RoutingSaved),
 * same `=` / `+=` contract as F1 and B1 (reference/routing.h). The fast routing
 * (routing_versions.h) runs them at the block and delta sites and in the decoder's step; the
 * tests check them against F1 and B1 in float and double and through the finite-difference
 * gradient checks.
 *
 * Determinism: positions are cut into blocks of kRoutingBlock, fixed by P alone, and blocks
 * into sub-blocks of R rows, fixed by N, d and the scalar type alone. A block is done by one
 * thread in a fixed order (sub-block, then source, then position), and its dq, dg partial sums
 * are added in block order after the parallel loop. So every bit of every output is the same on
 * every run AND for any number of threads (tests/test_routing_fast.cpp checks 1 thread against 2,
 * twice each).
 */
#pragma once

#include "routing.h"

namespace mhar {

/// Positions per block of F2 and B2. Fixed, never derived from the thread count: the block
/// partials of dq and dg, and so the result's bits, depend on P only. 32 positions keep the
/// per-block partial sums small (2 · d values a block) and give 2 threads 16+ blocks at P ≥ 512.
inline constexpr Eigen::Index kRoutingBlock = 32;

/**
 * @brief Routing forward, F2 (same contract as routing_forward).
 *
 * Per sub-block of positions: one pass over each source's rows computes r_i and z_i[h] (steps
 * (1), (2)); then per position the softmax over i per head (3) runs on N × H numbers, and (4)
 * sums the rows again while they are still in cache. Writes out and saved; throws ShapeError
 * on bad shapes.
 */
template <typename T>
void routing_forward_fast(Mat<T>& out, RoutingSaved<T>& saved, std::span<const Mat<T>> sources,
                          const Eigen::Ref<const RowVec<T>>& q,
                          const Eigen::Ref<const RowVec<T>>& g, int H);

/**
 * @brief Routing backward, B2 (same contract as routing_backward).
 *
 * Per sub-block of positions: D[h] = ⟨dout_h, out_h⟩ once a position, then source by source,
 * one read of each row for a_i[h] and kp_i[h] and one more (from cache) for dS_i and the dq, dg
 * partials. Accumulates (+=) into dsources, dq, dg; reductions in a fixed order (see the file
 * comment).
 */
template <typename T>
void routing_backward_fast(std::span<Mat<T>> dsources, Eigen::Ref<RowVec<T>> dq,
                           Eigen::Ref<RowVec<T>> dg, const Mat<T>& dout, const Mat<T>& out,
                           const RoutingSaved<T>& saved, std::span<const Mat<T>> sources,
                           const Eigen::Ref<const RowVec<T>>& q,
                           const Eigen::Ref<const RowVec<T>>& g, int H);

}  // namespace mhar
