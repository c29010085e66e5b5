/**
 * @file test_general_routing.cpp
 * @brief The verify kit's truth (tools/verify/general_routing.h) is only as good as these checks:
 *        it equals the project's reference (reference/routing.h) where the conventions coincide,
 *        its backward matches central differences in double under every convention, and its
 *        float twin (the yardstick) stays within float error of it.
 */
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "../gradcheck.h"
#include "general_routing.h"
#include "routing.h"

using namespace mhar;
using namespace mhar::verify;

namespace {

RoutingInputs<double> random_inputs(Rng& rng, int N, int P, int d, const Conventions& c) {
  RoutingInputs<double> in;
  in.N = N;
  in.P = P;
  in.d = d;
  const auto fill = [&](std::vector<double>& v, std::size_t n, double mean, double sd) {
    v.resize(n);
    for (auto& x : v) x = rng.normal(mean, sd);
  };
  fill(in.sources, static_cast<std::size_t>(N) * P * d, 0, 1);
  for (int i = 0; i < N; ++i)  // sources of different sizes
    for (int k = 0; k < P * d; ++k) in.sources[static_cast<std::size_t>(i) * P * d + k] *= 0.3 + i;
  fill(in.q, d, 0, 0.7);
  if (c.gain) fill(in.g, d, 1, 0.3);
  fill(in.dout, static_cast<std::size_t>(P) * d, 0, 1);
  if (c.delta) {
    fill(in.partial, static_cast<std::size_t>(P) * d, 0, 1);
    in.gate = 0.6;
  }
  return in;
}

double max_abs_diff(const std::vector<double>& a, const Mat<double>& b) {
  REQUIRE(a.size() == static_cast<std::size_t>(b.size()));
  double w = 0;
  for (std::size_t k = 0; k < a.size(); ++k) w = std::max(w, std::abs(a[k] - b.data()[k]));
  return w;
}

}  // namespace

TEST_CASE("general routing equals reference/routing.cpp where the conventions coincide",
          "[verify][routing]") {
  struct Shape {
    int N, P, d, H;
  };
  const Shape s =
      GENERATE(Shape{1, 3, 8, 2}, Shape{4, 5, 12, 1}, Shape{3, 2, 6, 6}, Shape{6, 7, 20, 4});
  CAPTURE(s.N, s.P, s.d, s.H);
  Rng rng(11 + s.N);
  Conventions c;
  c.H = s.H;
  c.eps = kRoutingEps;
  const RoutingInputs<double> in = random_inputs(rng, s.N, s.P, s.d, c);
  const RoutingOutputs<double> o = general_routing(in, c);

  std::vector<Mat<double>> S(s.N, Mat<double>(s.P, s.d));
  for (int i = 0; i < s.N; ++i)
    for (int k = 0; k < s.P * s.d; ++k) S[i].data()[k] = in.sources[i * s.P * s.d + k];
  RowVec<double> q(s.d), g(s.d);
  for (int k = 0; k < s.d; ++k) q[k] = in.q[k], g[k] = in.g[k];
  Mat<double> out, dout(s.P, s.d);
  for (int k = 0; k < s.P * s.d; ++k) dout.data()[k] = in.dout[k];
  RoutingSaved<double> saved;
  routing_forward<double>(out, saved, S, q, g, s.H);
  std::vector<Mat<double>> dS(s.N, Mat<double>::Zero(s.P, s.d));
  RowVec<double> dq = RowVec<double>::Zero(s.d), dg = RowVec<double>::Zero(s.d);
  routing_backward<double>(dS, dq, dg, dout, out, saved, S, q, g, s.H);

  CHECK(max_abs_diff(o.out, out) < 1e-12);
  for (int i = 0; i < s.N; ++i)
    for (int p = 0; p < s.P; ++p)
      for (int h = 0; h < s.H; ++h)
        CHECK(std::abs(o.alpha[(i * s.P + p) * s.H + h] - saved.alpha[i](p, h)) < 1e-12);
  for (int i = 0; i < s.N; ++i) {
    std::vector<double> part(o.dsources.begin() + i * s.P * s.d,
                             o.dsources.begin() + (i + 1) * s.P * s.d);
    CHECK(max_abs_diff(part, dS[i]) < 1e-10);
  }
  CHECK(max_abs_diff(o.dq, dq) < 1e-10);
  CHECK(max_abs_diff(o.dg, dg) < 1e-10);
}

TEST_CASE("general routing: the backward matches central differences under every convention",
          "[verify][routing][gradcheck]") {
  struct Conv {
    const char* what;
    int N, P, d, H;
    double eps, scale;
    bool gain, delta;
  };
  const Conv v =
      GENERATE(Conv{"plain", 4, 3, 12, 3, 1e-6, 1.0, true, false},
               Conv{"scale, no gain", 3, 2, 8, 2, 1e-6, 0.37, false, false},
               Conv{"delta, big eps", 5, 2, 8, 4, 0.5, 1.0, true, true},
               Conv{"delta, no gain, H = d, scale 2", 3, 2, 6, 6, 1e-3, 2.0, false, true},
               Conv{"N = 1", 1, 3, 8, 2, 1e-6, 1.0, true, true});
  CAPTURE(v.what);
  Conventions c;
  c.H = v.H;
  c.eps = v.eps;
  c.scale = v.scale;
  c.gain = v.gain;
  c.delta = v.delta;
  Rng rng(7);
  RoutingInputs<double> in = random_inputs(rng, v.N, v.P, v.d, c);
  const RoutingOutputs<double> o = general_routing(in, c);
  // loss = Σ dout ⊙ out, as a function of one input vector at a time (viewed as a 1 × n matrix)
  const auto check = [&](const char* name, std::vector<double>& x, const std::vector<double>& g) {
    Mat<double> X(1, static_cast<Eigen::Index>(x.size())), G(1, X.cols());
    for (std::size_t k = 0; k < x.size(); ++k) X(0, k) = x[k], G(0, k) = g[k];
    const auto loss = [&]() {
      for (std::size_t k = 0; k < x.size(); ++k) x[k] = X(0, k);
      const RoutingOutputs<double> f = general_routing(in, c, false);
      double l = 0;
      for (std::size_t k = 0; k < f.out.size(); ++k) l += in.dout[k] * f.out[k];
      return l;
    };
    const test::GradReport r =
        test::check_gradient(std::string(v.what) + " " + name, X, G, loss, test::sample_indices(X));
    for (std::size_t k = 0; k < x.size(); ++k) x[k] = X(0, k);
    CHECK(r.pass);
  };
  check("dsources", in.sources, o.dsources);
  check("dq", in.q, o.dq);
  if (c.gain) check("dg", in.g, o.dg);
  if (c.delta) {
    check("dpartial", in.partial, o.dpartial);
    std::vector<double> gate{in.gate};
    Mat<double> X(1, 1), G(1, 1);
    X(0, 0) = in.gate;
    G(0, 0) = o.dgate;
    const auto loss = [&]() {
      in.gate = X(0, 0);
      const RoutingOutputs<double> f = general_routing(in, c, false);
      double l = 0;
      for (std::size_t k = 0; k < f.out.size(); ++k) l += in.dout[k] * f.out[k];
      return l;
    };
    CHECK(test::check_gradient(std::string(v.what) + " dgate", X, G, loss, {0}).pass);
  }
}

TEST_CASE("general routing: the float twin is within float error of the double truth",
          "[verify][routing]") {
  Conventions c;
  c.H = 4;
  c.scale = 0.5;
  c.delta = true;
  Rng rng(3);
  const RoutingInputs<double> in = random_inputs(rng, 6, 5, 32, c);
  const RoutingInputs<float> f = to_float(in);
  const RoutingOutputs<double> t = general_routing(in, c);
  const RoutingOutputs<float> r = general_routing(f, c);
  double worst = 0, big = 0;
  for (std::size_t k = 0; k < t.dsources.size(); ++k) {
    worst = std::max(worst, std::abs(double(r.dsources[k]) - t.dsources[k]));
    big = std::max(big, std::abs(t.dsources[k]));
  }
  CHECK(worst / big < 1e-5);
  CHECK(worst / big > 0);  // float really did round: the yardstick measures something
}

TEST_CASE("general routing refuses inputs that do not make a routing site", "[verify][routing]") {
  Conventions c;
  c.H = 3;
  Rng rng(1);
  RoutingInputs<double> in = random_inputs(rng, 2, 2, 6, c);
  c.H = 4;
  CHECK_THROWS_WITH(general_routing(in, c), Catch::Contains("H = 4 must divide d = 6"));
  c.H = 3;
  c.gain = false;
  CHECK_THROWS_WITH(general_routing(in, c), Catch::Contains("a gain-free site takes no g"));
  c.gain = true;
  c.delta = true;
  CHECK_THROWS_WITH(general_routing(in, c), Catch::Contains("needs partial"));
}
