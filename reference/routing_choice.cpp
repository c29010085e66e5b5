/**
 * @file routing_choice.cpp
 * @brief routing_choice.h's reference: routing.cpp's forward and backward at every site.
 */
#include "routing_choice.h"

namespace mhar {

namespace {

template <typename T>
class ReferenceRouting final : public Routing<T> {
 public:
  void forward(Mat<T>& out, RoutingSaved<T>& saved, std::span<const Mat<T>> sources,
               const Eigen::Ref<const RowVec<T>>& q, const Eigen::Ref<const RowVec<T>>& g,
               int H) const override {
    routing_forward<T>(out, saved, sources, q, g, H);
  }
  void backward(std::span<Mat<T>> dsources, Eigen::Ref<RowVec<T>> dq, Eigen::Ref<RowVec<T>> dg,
                const Mat<T>& dout, const Mat<T>& out, const RoutingSaved<T>& saved,
                std::span<const Mat<T>> sources, const Eigen::Ref<const RowVec<T>>& q,
                const Eigen::Ref<const RowVec<T>>& g, int H) const override {
    routing_backward<T>(dsources, dq, dg, dout, out, saved, sources, q, g, H);
  }
};

}  // namespace

template <typename T>
const Routing<T>& reference_routing() {
  static const ReferenceRouting<T> routing;
  return routing;
}

template const Routing<float>& reference_routing<float>();
template const Routing<double>& reference_routing<double>();

}  // namespace mhar
