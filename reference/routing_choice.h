/**
 * @file routing_choice.h
 * @ingroup reference
 * @brief How the model runs its routing sites: the interface a routing version fills, and the
 *        reference's, routing.h at every site.
 *
 * The model (model.cpp, decode.cpp) never names a routing version. It asks the Routing<T> it was
 * given (Cache::routing, DecodeState::routing; null means reference_routing()) for one site's
 * forward and backward, and, in attnres and mhar, where site s reads sources 0 … s, for an object
 * that routes the whole stack at once. The reference has no stack form: it routes every site on
 * its own, with routing_forward and routing_backward, as docs/design.md §1 writes them. The fast
 * CPU versions live in cpu/ (cpu/routing_versions.h lists them); the GPU picks its versions the
 * same way, through DeviceCache::routing (cuda/model.h).
 *
 * Every version computes the same functions; they differ in the order of their sums, so the
 * results differ by float rounding (tests/test_model_routing.cpp holds a whole training step of
 * each mode under the fast versions to the same step under the reference).
 */
#pragma once

#include <memory>
#include <span>

#include "routing.h"

namespace mhar {

/// The routing forward of a stack where site s reads sources 0 … s, source by source (a version
/// that has one: cpu/routing_stack.h). Call add_source(0), site(0), add_source(1), site(1), …
template <typename T>
class StackForward {
 public:
  virtual ~StackForward() = default;
  /// Source i (0, 1, … in order) is written; it is kept by reference until the last site.
  virtual void add_source(int i, const Mat<T>& S) = 0;
  /// Site s's output (=) over sources 0 … s, and its saved state (given at construction).
  virtual void site(int s, Mat<T>& out) = 0;
};

/// The routing backward of the same stack: add_site(s, …) once ∂loss/∂out_s is known,
/// source_gradient(i) once every site s ≥ i is added, parameter_gradients at the end.
template <typename T>
class StackBackward {
 public:
  virtual ~StackBackward() = default;
  virtual void add_site(int s, const Mat<T>& dout, const Mat<T>& out, const RoutingSaved<T>& saved,
                        const Eigen::Ref<const RowVec<T>>& q,
                        const Eigen::Ref<const RowVec<T>>& g) = 0;
  /// dsource (=) ∂loss/∂S_i through every site that reads it.
  virtual void source_gradient(int i, Mat<T>& dsource) = 0;
  /// dq.row(s), dg.row(s) += each site's parameter gradients (n × d each).
  virtual void parameter_gradients(Eigen::Ref<Mat<T>> dq, Eigen::Ref<Mat<T>> dg) const = 0;
};

/**
 * @brief One way of running the routing sites. forward and backward have routing.h's contract
 * (routing_forward, routing_backward); the stack factories return null when the version routes
 * a stack site by site, as the reference does.
 */
template <typename T>
class Routing {
 public:
  virtual ~Routing() = default;
  virtual void forward(Mat<T>& out, RoutingSaved<T>& saved, std::span<const Mat<T>> sources,
                       const Eigen::Ref<const RowVec<T>>& q, const Eigen::Ref<const RowVec<T>>& g,
                       int H) const = 0;
  virtual void backward(std::span<Mat<T>> dsources, Eigen::Ref<RowVec<T>> dq,
                        Eigen::Ref<RowVec<T>> dg, const Mat<T>& dout, const Mat<T>& out,
                        const RoutingSaved<T>& saved, std::span<const Mat<T>> sources,
                        const Eigen::Ref<const RowVec<T>>& q, const Eigen::Ref<const RowVec<T>>& g,
                        int H) const = 0;
  /// q, g: n × d (row s is site s's); saved: the n sites' state, filled by the object.
  virtual std::unique_ptr<StackForward<T>> stack_forward(const Mat<T>& q, const Mat<T>& g, int H,
                                                         std::span<RoutingSaved<T>> saved) const {
    (void)q, (void)g, (void)H, (void)saved;
    return nullptr;
  }
  /// sources: S_0 … S_{n−1}, one site per source.
  virtual std::unique_ptr<StackBackward<T>> stack_backward(std::span<const Mat<T>> sources,
                                                           int H) const {
    (void)sources, (void)H;
    return nullptr;
  }
};

/// The reference: routing_forward and routing_backward (routing.h) at every site, no stack form.
template <typename T>
const Routing<T>& reference_routing();

}  // namespace mhar
