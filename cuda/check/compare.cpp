/**
 * @file compare.cpp
 * @brief compare.h: one GPU output against the double truth, held to a multiple of the float
 *        reference's own error.
 */
#include "cuda/check/compare.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "reference/tolerance.h"

namespace mhar::cuda {

double max_abs_diff(const std::vector<double>& truth, const std::vector<float>& x) {
  if (truth.size() != x.size()) return std::numeric_limits<double>::infinity();
  double worst = 0;
  for (std::size_t k = 0; k < truth.size(); ++k) {
    const double e = std::abs(double(x[k]) - truth[k]);
    if (!(e <= worst)) worst = std::isnan(e) ? std::numeric_limits<double>::infinity() : e;
  }
  return worst;
}

CheckRow compare_with_truth(const std::string& step, const std::string& tensor,
                            const std::string& version, const std::string& shape,
                            const std::vector<double>& truth, const std::vector<float>& ref_float,
                            const std::vector<float>& gpu) {
  double scale = 0;
  for (double t : truth) scale = std::max(scale, std::abs(t));
  const double unit = scale > 0 ? scale : 1.0;
  const double ref_err = max_abs_diff(truth, ref_float);
  const double gpu_err = max_abs_diff(truth, gpu);
  // docs/style.md §7: a small multiple of the float reference's own error (compare.h says why
  // 8 and 1e-6; reference/tolerance.h derives the rule's shape).
  const double tol = earned_tolerance(ref_err, 8.0, 1e-6 * scale);
  CheckRow r;
  r.step = step;
  r.tensor = tensor;
  r.version = version;
  r.worst_rel_err = gpu_err / unit;
  r.tolerance = tol / unit;
  r.pass = gpu_err <= tol;
  r.shape = shape;
  return r;
}

std::string format_check_row(const CheckRow& r) {
  char buf[96];
  std::snprintf(buf, sizeof buf, ": worst relative error %.3e (tolerance %.3e) %s", r.worst_rel_err,
                r.tolerance, r.pass ? "ok" : "FAIL");
  return r.version + " " + r.op() + " " + r.shape + buf;
}

}  // namespace mhar::cuda
