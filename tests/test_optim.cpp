/**
 * @file test_optim.cpp
 * @brief AdamW against a hand-written scalar loop; global-norm clipping.
 */
#include <catch2/catch.hpp>
#include <cmath>

#include "optim.h"

using namespace mhar;

TEST_CASE("adamw matches the scalar formulas over several steps", "[adamw]") {
  const bool decay = GENERATE(true, false);
  Rng rng(200);
  Mat<double> p = rng.normal_matrix<double>(3, 4), m = Mat<double>::Zero(3, 4),
              v = Mat<double>::Zero(3, 4);
  Mat<double> p_ref = p, m_ref = m, v_ref = v;
  const AdamWHyper hy{0.9, 0.95, 1e-8, 0.1};
  const double lr = 0.01;
  for (long t = 1; t <= 5; ++t) {
    const Mat<double> g = rng.normal_matrix<double>(3, 4);
    adamw_step(p, m, v, g, t, lr, hy, decay);
    for (int i = 0; i < 12; ++i) {
      double& th = p_ref.data()[i];
      double& mm = m_ref.data()[i];
      double& vv = v_ref.data()[i];
      if (decay) th -= lr * hy.weight_decay * th;
      mm = hy.beta1 * mm + (1 - hy.beta1) * g.data()[i];
      vv = hy.beta2 * vv + (1 - hy.beta2) * g.data()[i] * g.data()[i];
      const double mh = mm / (1 - std::pow(hy.beta1, t)), vh = vv / (1 - std::pow(hy.beta2, t));
      th -= lr * mh / (std::sqrt(vh) + hy.eps);
    }
  }
  CHECK((p - p_ref).cwiseAbs().maxCoeff() < 1e-14);
  CHECK((m - m_ref).cwiseAbs().maxCoeff() < 1e-14);
}

TEST_CASE("clip_grad_norm scales to the maximum norm only when it is exceeded", "[clip]") {
  Mat<double> a = Mat<double>::Constant(2, 2, 3.0), b = Mat<double>::Constant(1, 2, 4.0);
  std::vector<Mat<double>*> gs = {&a, &b};
  const double n = std::sqrt(4 * 9.0 + 2 * 16.0);
  CHECK(std::abs(clip_grad_norm<double>(gs, 100.0) - n) < 1e-12);
  CHECK(a(0, 0) == 3.0);
  CHECK(std::abs(clip_grad_norm<double>(gs, 1.0) - n) < 1e-12);
  CHECK(std::abs(std::sqrt(a.squaredNorm() + b.squaredNorm()) - 1.0) < 1e-12);
}

TEST_CASE("adamw rejects mismatched shapes", "[adamw][bad-input]") {
  Mat<double> p(2, 2), m(2, 2), v(2, 3), g(2, 2);
  CHECK_THROWS_WITH(adamw_step(p, m, v, g, 1, 0.1, AdamWHyper{}, true),
                    Catch::Matchers::Contains("v must be 2×2, got 2×3"));
  CHECK_THROWS_WITH(adamw_step(p, m, m, g, 0, 0.1, AdamWHyper{}, true),
                    Catch::Matchers::Contains("step counts from 1"));
}
