/**
 * @file perturbed.h
 * @brief Test fixture shared by the model and decode tests: parameters moved away from their
 *        initial values, so that every path carries signal and gradient (q = 0 and gates = 0 at
 *        init would hide bugs in the routing and the delta paths).
 */
#pragma once

#include <string>

#include "model.h"

namespace mhar::test {

/// Matrices N(0, 0.3²); routing queries N(0, 1); gains, key gains, ν and gates a_j N(1, 0.3²).
inline Params<double> perturbed(const Config& c, Rng& rng) {
  Params<double> p = init_params<double>(c, rng);
  p.for_each([&](const std::string& name, Mat<double>& m, bool decay) {
    if (decay)
      m = rng.normal_matrix<double>(m.rows(), m.cols(), 0.0, 0.3);
    else if (name == "route.q")
      m = rng.normal_matrix<double>(m.rows(), m.cols(), 0.0, 1.0);
    else
      m = rng.normal_matrix<double>(m.rows(), m.cols(), 1.0, 0.3);
  });
  return p;
}

}  // namespace mhar::test
