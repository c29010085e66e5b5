/**
 * @file routing.h
 * @ingroup reference
 * @brief Depth routing at one site (docs/design.md §1): forward and backward, CPU reference.
 *
 * A routing site mixes N earlier sub-layer outputs ("sources", each P × d) into one P × d input.
 * The pseudo-query q (d) is read as H slices of width K = d / H; head h owns the columns
 * [h·K, (h+1)·K) and runs its own softmax over depth. H = 1 is Attention Residuals exactly;
 * H > 1 is Multi-Head Attention Residuals (MHAR). The split adds no parameters.
 *
 * Plain Eigen, vectorised over positions: a loop over sources i and heads h, and for each an
 * Eigen line over all P positions and the head's K columns, under the formula it computes.
 * The CUDA twin is cuda/routing.cu (same names, same argument order). This is version 1 of
 * each op, F1 and B1; the fast CPU versions (cpu/routing_versions.h) compute the same math in
 * other loop orders, and the tests hold them to this one. The model runs whichever its cache
 * names (routing_choice.h): `train --routing reference` runs this file at every site.
 */
#pragma once

#include <span>
#include <vector>

#include "tensor.h"

namespace mhar {

/// eps inside the RMS of a routing key (docs/design.md §1).
inline constexpr double kRoutingEps = 1e-6;

/// What the routing forward saves for its backward.
template <typename T>
struct RoutingSaved {
  std::vector<Mat<T>> alpha;   ///< N × (P × H): routing weights α_i[h], softmax over i
  std::vector<Mat<T>> logits;  ///< N × (P × H): logits z_i[h] before the softmax
  std::vector<Vec<T>> rinv;    ///< N × (P): r_i = 1 / RMS(S_i) over the full width d
};

/// Throws ShapeError unless sources, q, g and H make a routing site (what the forward checks).
template <typename T>
void check_routing_args(std::span<const Mat<T>> sources, const Eigen::Ref<const RowVec<T>>& q,
                        const Eigen::Ref<const RowVec<T>>& g, int H);

/// Throws ShapeError unless the backward's arguments match the sources and the saved forward.
template <typename T>
void check_routing_backward_args(std::span<Mat<T>> dsources, const Mat<T>& dout, const Mat<T>& out,
                                 const RoutingSaved<T>& saved, std::span<const Mat<T>> sources,
                                 const Eigen::Ref<const RowVec<T>>& q,
                                 const Eigen::Ref<const RowVec<T>>& g, int H);

/**
 * @brief Routing forward at one site.
 *
 * Writes (=) out and saved. Throws ShapeError on bad shapes (H not dividing d, N = 0, sources
 * of different shapes, q or g not 1 × d).
 *
 * @param out      P × d: out[p,c] = Σ_i α_i[p,h(c)] · S_i[p,c]
 * @param saved    α (N × P × H) and r (N × P) for the backward
 * @param sources  N × (P × d): the raw sources S_0 … S_{N-1}
 * @param q        1 × d pseudo-query (read as H slices)
 * @param g        1 × d key gain
 * @param H        routing heads; must divide d
 */
template <typename T>
void routing_forward(Mat<T>& out, RoutingSaved<T>& saved, std::span<const Mat<T>> sources,
                     const Eigen::Ref<const RowVec<T>>& q, const Eigen::Ref<const RowVec<T>>& g,
                     int H);

/**
 * @brief Routing backward at one site.
 *
 * Accumulates (+=) into dsources, dq and dg: a source's gradient sums over every site that reads
 * it, and q, g over positions. Reductions run in a fixed order (deterministic).
 *
 * @param dsources N × (P × d), += ∂loss/∂S_i
 * @param dq       1 × d, += ∂loss/∂q
 * @param dg       1 × d, += ∂loss/∂g
 * @param dout     P × d, ∂loss/∂out
 * @param out      P × d, the forward's output
 * @param saved    what the forward saved
 * @param sources, q, g, H  as in the forward
 */
template <typename T>
void routing_backward(std::span<Mat<T>> dsources, Eigen::Ref<RowVec<T>> dq,
                      Eigen::Ref<RowVec<T>> dg, const Mat<T>& dout, const Mat<T>& out,
                      const RoutingSaved<T>& saved, std::span<const Mat<T>> sources,
                      const Eigen::Ref<const RowVec<T>>& q, const Eigen::Ref<const RowVec<T>>& g,
                      int H);

}  // namespace mhar
