/**
 * @file tolerance.h
 * @ingroup reference
 * @brief The one tolerance rule of the project (docs/style.md §7): how much error a result earns
 *        from the error the reference itself makes in float. `mhar-toy check` (cuda/check/
 *        compare.h), the verify kit (tools/verify/cases.h) and the CPU version tests
 *        (tests/test_routing_fast.cpp and its neighbours) all call earned_tolerance().
 *
 * Header-only and free of Eigen on purpose: the verify kit links nothing else of the reference
 * (tools/verify/CMakeLists.txt), and still shares this rule through the mhar_tolerance target.
 */
#pragma once

#include <algorithm>

namespace mhar {

/**
 * The error a result may have against the double truth:
 *
 *     tolerance = factor · max(ref_err, ref_floor) + floor
 *
 * ref_err is the error of the same reference computed in float from the same inputs (the honest
 * baseline), on the scale the caller measures its errors on (absolute or relative).
 *
 * Why this shape. Float rounding in a sum of n terms costs about n·u·Σ|terms| in the worst case
 * and √n·u·(…) typically, where u is the unit roundoff; the constant depends on the order of the
 * additions. A legitimate kernel adds in another order (tree sums, an online softmax, fused
 * multiply-adds), so its error is the reference's error times a small constant: `factor` (8 or
 * 10, a few bits) covers that, while a real bug (a wrong index, a missing term) is off by the
 * size of the values themselves, orders of magnitude above. ref_err is one sample of the
 * rounding, and it can come out ~0 where the float reference happens to be exact (N = 1 gives
 * out = S_0); another order is not exact there, so a floor keeps such a case from demanding
 * bit-exactness. Callers state the floor one of two equivalent ways: `floor`, a few ulps of the
 * largest value added on (check, verify), or `ref_floor`, the reference's error counted as at
 * least about an ulp (the CPU version tests). The two differ by at most 2× and only near the
 * floor; each caller's comment says how its numbers were chosen.
 */
constexpr double earned_tolerance(double ref_err, double factor, double floor,
                                  double ref_floor = 0.0) {
  return factor * std::max(ref_err, ref_floor) + floor;
}

}  // namespace mhar
