/**
 * @file gradcheck.h
 * @brief Central finite differences in double, the error measure every gradient check uses, and
 *        the float tolerance of the CPU versions' tests (F2, B2, F3, B3, the fast model step).
 *
 * Each check prints one line "gradcheck <name>: worst relative error <e> (element <k>)" so the
 * test log (and scripts/test.sh's summary) shows how close every analytic gradient is.
 */
#pragma once

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "tensor.h"
#include "tolerance.h"

namespace mhar::test {

/// max |a − truth| / max |truth| (the scale floored at `floor`, and at 1e-30): one output's error
/// on its own scale, for comparing a float or another loop order against a double truth. An
/// output that is zero in exact arithmetic because two terms cancel (dq of a site with one
/// source: α = 1, so dz = a − D = 0) has no scale of its own; give it the size of those terms as
/// `floor`, since a float sum in another order leaves a rounding residue of their size · ε.
template <typename A, typename B>
double scaled_error(const Eigen::MatrixBase<A>& a, const Eigen::MatrixBase<B>& truth,
                    double floor = 0) {
  const double scale = std::max({truth.cwiseAbs().maxCoeff(), floor, 1e-30});
  return (a.template cast<double>() - truth).cwiseAbs().maxCoeff() / scale;
}

/// The worst scaled_error over several outputs, each on its own scale: add(a, truth) per output.
struct WorstError {
  double value = 0;
  template <typename A, typename B>
  void add(const Eigen::MatrixBase<A>& a, const Eigen::MatrixBase<B>& truth, double floor = 0) {
    value = std::max(value, scaled_error(a, truth, floor));
  }
};

/// The error a float CPU version may have against the double truth, given `err_ref`, the error of
/// the reference (F1, B1) in float on the same inputs, both measured as WorstError does:
/// 8 · max(err_ref, 1e-7) (reference/tolerance.h). The 8 allows another summation order; 1e-7
/// (≈ one float ulp of 1) stands in for a reference error that happens to be ~0.
inline double version_tolerance(double err_ref) {
  return earned_tolerance(err_ref, 8.0, 0.0, 1e-7);
}

/// Step of the central difference: truncation error ~ h² ~ 1e-10, rounding ~ 1e-16/h ~ 1e-11.
inline constexpr double kFdStep = 1e-5;
/// A gradient passes when its worst relative error is below this: ~1000× the expected FD error,
/// and ~1e4× below what any real bug (a missing term, a wrong sign) produces.
inline constexpr double kGradTol = 1e-6;

struct GradReport {
  bool pass = true;    ///< every element within kGradTol (relative) + the FD rounding noise
  double worst = 0.0;  ///< worst relative error over the checked elements
  long worst_index = -1;
  double analytic = 0.0, numeric = 0.0;  ///< at the worst element
};

/**
 * Compares `analytic` (∂f/∂x for the elements of x listed in `indices`) with central differences
 * of f. Relative error per element: |a − n| / max(|a|, |n|, 1e-3 · max_k |n_k|, 1e-12), so
 * elements whose gradient is tiny next to the tensor's largest are measured on that scale.
 * An element passes when |a − n| ≤ kGradTol · that denominator + noise, where
 * noise = 16 · ε · |f| / h is the rounding error of the difference quotient itself (f is computed
 * to a few ulps of |f|; dividing by 2h amplifies that): it matters only for gradients much
 * smaller than |f|, as in a whole model whose loss is ~5.5 = log 256.
 */
inline GradReport check_gradient(const std::string& name, Mat<double>& x,
                                 const Mat<double>& analytic, const std::function<double()>& f,
                                 const std::vector<long>& indices) {
  std::vector<double> numeric(indices.size());
  double scale = 0.0;
  for (std::size_t k = 0; k < indices.size(); ++k) {
    double& v = x.data()[indices[k]];
    const double saved = v;
    v = saved + kFdStep;
    const double fp = f();
    v = saved - kFdStep;
    const double fm = f();
    v = saved;
    numeric[k] = (fp - fm) / (2 * kFdStep);
    scale = std::max(scale, std::abs(numeric[k]));
  }
  GradReport rep;
  const double noise = 16 * std::numeric_limits<double>::epsilon() * std::abs(f()) / kFdStep;
  for (std::size_t k = 0; k < indices.size(); ++k) {
    const double a = analytic.data()[indices[k]], n = numeric[k];
    const double denom = std::max({std::abs(a), std::abs(n), 1e-3 * scale, 1e-12});
    const double rel = std::abs(a - n) / denom;
    if (std::abs(a - n) > kGradTol * denom + noise) rep.pass = false;
    if (rel > rep.worst || rep.worst_index < 0) {
      rep.worst = rel;
      rep.worst_index = indices[k];
      rep.analytic = a;
      rep.numeric = n;
    }
  }
  std::printf(
      "gradcheck %s: worst relative error %.3e (element %ld: analytic %.6e, numeric %.6e) %s\n",
      name.c_str(), rep.worst, rep.worst_index, rep.analytic, rep.numeric,
      rep.pass ? "ok" : "FAIL");
  return rep;
}

/// All elements of x, or `count` of them spread evenly (first and last always included).
inline std::vector<long> sample_indices(const Mat<double>& x, long count = -1) {
  const long n = static_cast<long>(x.size());
  std::vector<long> idx;
  if (count < 0 || count >= n) {
    for (long i = 0; i < n; ++i) idx.push_back(i);
  } else {
    for (long k = 0; k < count; ++k) idx.push_back(count == 1 ? 0 : k * (n - 1) / (count - 1));
  }
  return idx;
}

}  // namespace mhar::test
