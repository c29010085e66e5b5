/**
 * @file check_routing.cpp
 * @brief check_routing.h: run a kernel version and the reference (double and float) on the
 *        same float inputs and measure the GPU's error against the reference's own.
 */
#include "cuda/check/check_routing.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <stdexcept>

#include "cuda/check/compare.h"
#include "cuda/device.h"
#include "reference/routing.h"

namespace mhar::cuda {

namespace {

using check_detail::flatten;
using check_detail::require_device;

/// One shape's inputs, drawn in double, rounded to float; the double copies hold exactly the
/// float values, so input rounding is not counted as error.
struct Inputs {
  std::vector<Mat<float>> S_f;
  std::vector<Mat<double>> S_d;
  RowVec<float> q_f, g_f;
  RowVec<double> q_d, g_d;
};

template <typename Derived>
Mat<float> to_float(const Eigen::MatrixBase<Derived>& m) {
  return m.template cast<float>();
}

Inputs make_inputs(const RoutingShape& s, Rng& rng) {
  Inputs in;
  const int K = s.d / s.H;
  for (int i = 0; i < s.N; ++i) {
    // Sources of different scales (like sub-layer outputs); never zero.
    const double scale = rng.uniform(0.5, 2.0);
    in.S_f.push_back(to_float(rng.normal_matrix<double>(s.P, s.d, 0.0, scale)));
    in.S_d.push_back(in.S_f.back().cast<double>());
  }
  // q ~ N(0, 1.5²/K): logits z of order one, so the softmax is neither uniform nor one-hot.
  in.q_f = to_float(rng.normal_matrix<double>(1, s.d, 0.0, 1.5 / std::sqrt(double(K))));
  in.g_f = to_float(rng.normal_matrix<double>(1, s.d, 1.0, 0.3));
  in.q_d = in.q_f.cast<double>();
  in.g_d = in.g_f.cast<double>();
  return in;
}

CheckRow compare(const std::string& step, const std::string& tensor, RoutingVersion v,
                 const RoutingShape& s, const std::vector<double>& truth,
                 const std::vector<float>& ref_float, const std::vector<float>& gpu) {
  return compare_with_truth(step, tensor, version_name(v), describe(s), truth, ref_float, gpu);
}

unsigned mix_seed(unsigned seed, const RoutingShape& s) {
  return seed * 1000003u + static_cast<unsigned>(s.N * 7919 + s.P * 104729 + s.d * 31 + s.H);
}

}  // namespace

std::string describe(const RoutingShape& s) {
  return "N=" + std::to_string(s.N) + " P=" + std::to_string(s.P) + " d=" + std::to_string(s.d) +
         " H=" + std::to_string(s.H);
}

std::vector<RoutingShape> routing_check_shapes() {
  return {
      {1, 5, 32, 4},       // N = 1: out = S_0, α = 1
      {4, 3, 8, 1},        // H = 1 (single-head Attention Residuals)
      {3, 4, 16, 16},      // H = d: K = 1
      {5, 6, 96, 4},       // K = 24, not a power of two
      {3, 7, 36, 3},       // K = 12, P odd, d not a multiple of 32
      {4, 1, 40, 2},       // a single position
      {6, 7, 40, 5},       // d = 40, K = 8, P odd
      {2, 9, 1, 1},        // d = 1
      {9, 1000, 256, 4},   // larger
      {3, 5, 3000, 6},     // wide d: several columns per thread, K = 500
      {2, 3, 6144, 2},     // 16 columns per thread; the fused backward opts in to > 48 KB shared
      {3, 37, 512, 4},     // the paper's d and H: K = 128, one float4 chunk per head (warp)
      {2, 11, 512, 2},     // K = 256: a head spans two chunks (warp)
      {3, 5, 1024, 1},     // K = d = 1024: eight chunks, one head (warp)
      {2, 100000, 32, 2},  // many positions: the fused backward's grid-stride loop turns
  };
}

std::vector<CheckRow> check_routing_forward(const RoutingShape& s, RoutingVersion v,
                                            unsigned seed) {
  require_device("check_routing_forward");
  Rng rng(mix_seed(seed, s));
  const Inputs in = make_inputs(s, rng);

  // Truth (double) and the honest baseline (the same reference in float).
  Mat<double> out_d;
  RoutingSaved<double> saved_d;
  mhar::routing_forward<double>(out_d, saved_d, in.S_d, in.q_d, in.g_d, s.H);
  Mat<float> out_f;
  RoutingSaved<float> saved_f;
  mhar::routing_forward<float>(out_f, saved_f, in.S_f, in.q_f, in.g_f, s.H);

  DeviceBuffer sources(flatten(in.S_f)), q(flatten(in.q_f)), g(flatten(in.g_f));
  DeviceBuffer out(static_cast<std::size_t>(s.P) * s.d),
      alpha(static_cast<std::size_t>(s.N) * s.P * s.H);
  out.fill_bytes(0xFF);  // NaN: an element the kernel does not write fails the check
  alpha.fill_bytes(0xFF);
  routing_forward(out.data(), alpha.data(), sources.data(), q.data(), g.data(), s.N, s.P, s.d, s.H,
                  v);

  return {compare("forward", "out", v, s, flatten(out_d), flatten(out_f), out.download()),
          compare("forward", "alpha", v, s, flatten(saved_d.alpha), flatten(saved_f.alpha),
                  alpha.download())};
}

std::vector<CheckRow> check_routing_backward(const RoutingShape& s, RoutingVersion v,
                                             unsigned seed) {
  require_device("check_routing_backward");
  Rng rng(mix_seed(seed, s) + 1);
  const Inputs in = make_inputs(s, rng);
  const Mat<float> dout_f = to_float(rng.normal_matrix<double>(s.P, s.d));
  const Mat<double> dout_d = dout_f.cast<double>();

  // The forward's out and α, rounded to float: the same backward inputs for all three runs.
  Mat<double> out_d;
  RoutingSaved<double> saved_d;
  mhar::routing_forward<double>(out_d, saved_d, in.S_d, in.q_d, in.g_d, s.H);
  Mat<float> out_f;
  RoutingSaved<float> saved_f;
  mhar::routing_forward<float>(out_f, saved_f, in.S_f, in.q_f, in.g_f, s.H);
  out_f = to_float(out_d);
  out_d = out_f.cast<double>();
  for (int i = 0; i < s.N; ++i) {
    saved_f.alpha[i] = to_float(saved_d.alpha[i]);
    saved_d.alpha[i] = saved_f.alpha[i].cast<double>();
  }

  // Gradients start from random values: the backward must add to them (+=).
  std::vector<Mat<float>> dS_f;
  std::vector<Mat<double>> dS_d;
  for (int i = 0; i < s.N; ++i) {
    dS_f.push_back(to_float(rng.normal_matrix<double>(s.P, s.d)));
    dS_d.push_back(dS_f.back().cast<double>());
  }
  RowVec<float> dq_f = to_float(rng.normal_matrix<double>(1, s.d));
  RowVec<float> dg_f = to_float(rng.normal_matrix<double>(1, s.d));
  RowVec<double> dq_d = dq_f.cast<double>(), dg_d = dg_f.cast<double>();
  DeviceBuffer dsources(flatten(dS_f)), dq(flatten(dq_f)), dg(flatten(dg_f));

  mhar::routing_backward<double>(dS_d, dq_d, dg_d, dout_d, out_d, saved_d, in.S_d, in.q_d, in.g_d,
                                 s.H);
  mhar::routing_backward<float>(dS_f, dq_f, dg_f, dout_f, out_f, saved_f, in.S_f, in.q_f, in.g_f,
                                s.H);

  DeviceBuffer sources(flatten(in.S_f)), q(flatten(in.q_f)), g(flatten(in.g_f));
  DeviceBuffer d_dout(flatten(dout_f)), d_out(flatten(out_f)), alpha(flatten(saved_f.alpha));
  routing_backward(dsources.data(), dq.data(), dg.data(), d_dout.data(), d_out.data(), alpha.data(),
                   sources.data(), q.data(), g.data(), s.N, s.P, s.d, s.H, v);

  return {compare("backward", "dsources", v, s, flatten(dS_d), flatten(dS_f), dsources.download()),
          compare("backward", "dq", v, s, flatten(dq_d), flatten(dq_f), dq.download()),
          compare("backward", "dg", v, s, flatten(dg_d), flatten(dg_f), dg.download())};
}

std::vector<CheckRow> check_routing(unsigned seed) {
  require_device("check_routing");
  std::vector<CheckRow> rows;
  for (const RoutingShape& s : routing_check_shapes())
    for (RoutingVersion v : kRoutingVersions) {
      if (!version_supports(v, s.d, s.H)) continue;
      for (auto& r : check_routing_forward(s, v, seed)) rows.push_back(std::move(r));
      for (auto& r : check_routing_backward(s, v, seed)) rows.push_back(std::move(r));
    }
  return rows;
}

}  // namespace mhar::cuda
