/**
 * @file routing_versions.cpp
 * @brief routing_versions.h: the fast CPU routing as a Routing<T>, and the choice by name.
 */
#include "routing_versions.h"

#include "routing_fast.h"
#include "routing_stack.h"

namespace mhar {

namespace {

template <typename T>
class FastRouting final : public Routing<T> {
 public:
  void forward(Mat<T>& out, RoutingSaved<T>& saved, std::span<const Mat<T>> sources,
               const Eigen::Ref<const RowVec<T>>& q, const Eigen::Ref<const RowVec<T>>& g,
               int H) const override {
    routing_forward_fast<T>(out, saved, sources, q, g, H);  // F2
  }
  void backward(std::span<Mat<T>> dsources, Eigen::Ref<RowVec<T>> dq, Eigen::Ref<RowVec<T>> dg,
                const Mat<T>& dout, const Mat<T>& out, const RoutingSaved<T>& saved,
                std::span<const Mat<T>> sources, const Eigen::Ref<const RowVec<T>>& q,
                const Eigen::Ref<const RowVec<T>>& g, int H) const override {
    routing_backward_fast<T>(dsources, dq, dg, dout, out, saved, sources, q, g, H);  // B2
  }
  std::unique_ptr<StackForward<T>> stack_forward(const Mat<T>& q, const Mat<T>& g, int H,
                                                 std::span<RoutingSaved<T>> saved) const override {
    return std::make_unique<RoutingStackForward<T>>(q, g, H, saved);  // F3
  }
  std::unique_ptr<StackBackward<T>> stack_backward(std::span<const Mat<T>> sources,
                                                   int H) const override {
    return std::make_unique<RoutingStackBackward<T>>(sources, H);  // B3
  }
};

}  // namespace

std::string cpu_routing_name(CpuRouting r) {
  return r == CpuRouting::Reference ? "reference" : "fast";
}

std::vector<std::string> cpu_routing_names() {
  return {cpu_routing_name(CpuRouting::Reference), cpu_routing_name(CpuRouting::Fast)};
}

CpuRouting parse_cpu_routing(const std::string& name) {
  std::string allowed;
  for (CpuRouting r : {CpuRouting::Reference, CpuRouting::Fast}) {
    if (cpu_routing_name(r) == name) return r;
    allowed += (allowed.empty() ? "" : ", ") + cpu_routing_name(r);
  }
  throw ShapeError("unknown CPU routing '" + name + "' (allowed: " + allowed + ")");
}

template <typename T>
const Routing<T>& fast_routing() {
  static const FastRouting<T> routing;
  return routing;
}

template <typename T>
const Routing<T>& cpu_routing(CpuRouting r) {
  return r == CpuRouting::Reference ? reference_routing<T>() : fast_routing<T>();
}

template const Routing<float>& fast_routing<float>();
template const Routing<double>& fast_routing<double>();
template const Routing<float>& cpu_routing<float>(CpuRouting);
template const Routing<double>& cpu_routing<double>(CpuRouting);

}  // namespace mhar
