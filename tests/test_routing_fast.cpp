/**
 * @file test_routing_fast.cpp
 * @brief CPU routing F2 and B2 (cpu/routing_fast.h) against the reference (F1, B1) in
 *        float and double, and its promise of the same bits for any number of threads. Its
 *        finite-difference gradient checks are test_routing.cpp's, run over both versions.
 */
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>

#include "gradcheck.h"
#include "routing.h"
#include "routing_fast.h"

#ifdef _OPENMP
#include <omp.h>
#endif

using namespace mhar;

namespace {

struct Case {
  int P, d, N, H;
};

/// Forward then backward (dout given) of one version, from zeroed gradients.
template <typename T>
struct Run {
  Mat<T> out;
  RoutingSaved<T> saved;
  std::vector<Mat<T>> dS;
  RowVec<T> dq, dg;
};

template <typename T>
Run<T> run(bool fast, const std::vector<Mat<T>>& S, const RowVec<T>& q, const RowVec<T>& g,
           const Mat<T>& dout, int H) {
  Run<T> r;
  const auto P = S[0].rows(), d = S[0].cols();
  r.dS.assign(S.size(), Mat<T>::Zero(P, d));
  r.dq = RowVec<T>::Zero(d);
  r.dg = RowVec<T>::Zero(d);
  if (fast) {
    routing_forward_fast<T>(r.out, r.saved, S, q, g, H);
    routing_backward_fast<T>(r.dS, r.dq, r.dg, dout, r.out, r.saved, S, q, g, H);
  } else {
    routing_forward<T>(r.out, r.saved, S, q, g, H);
    routing_backward<T>(r.dS, r.dq, r.dg, dout, r.out, r.saved, S, q, g, H);
  }
  return r;
}

/// Every output of a run, one after another, in double (to compare runs element by element).
template <typename T>
std::vector<double> flatten(const Run<T>& r) {
  std::vector<double> v;
  auto put = [&](const auto& m) {
    for (Eigen::Index k = 0; k < m.size(); ++k) v.push_back(static_cast<double>(m.data()[k]));
  };
  put(r.out);
  for (const auto& a : r.saved.alpha) put(a);
  for (const auto& x : r.saved.rinv) put(x);
  for (const auto& x : r.dS) put(x);
  put(r.dq);
  put(r.dg);
  return v;
}

/// Worst error of `x` against `truth`, relative to the largest |truth| of the same output group.
/// Groups: out, α, r, dS, dq, dg (their scales differ); returns the worst over the groups.
template <typename T>
double worst_rel(const Run<T>& x, const Run<double>& truth) {
  mhar::test::WorstError worst;
  worst.add(x.out, truth.out);
  for (std::size_t i = 0; i < truth.dS.size(); ++i) {
    worst.add(x.saved.alpha[i], truth.saved.alpha[i]);
    worst.add(x.saved.rinv[i], truth.saved.rinv[i]);
    worst.add(x.dS[i], truth.dS[i]);
  }
  worst.add(x.dq, truth.dq);
  worst.add(x.dg, truth.dg);
  return worst.value;
}

template <typename T>
std::vector<Mat<T>> cast_all(const std::vector<Mat<double>>& v) {
  std::vector<Mat<T>> out;
  for (const auto& m : v) out.push_back(m.cast<T>());
  return out;
}

}  // namespace

TEST_CASE("routing F2/B2 matches the reference in double and float", "[routing][fast]") {
  // N = 1, H = 1, H = d, odd P, d not a multiple of 8, P over several blocks with a partial last
  // one (kRoutingBlock = 32), and the default model's shape (d 128, H 4). The last two are wide
  // enough (N · d · sizeof > 8 KB) that a block is cut into sub-blocks of fewer than 32 rows,
  // with a partial last sub-block: N 9, d 512 gives 7 rows in double, 14 in float (P 45 = 32 +
  // 13); N 25, d 520 (K 65) gives 2 and 5 rows.
  const Case cs = GENERATE(Case{5, 12, 3, 4}, Case{1, 8, 1, 1}, Case{3, 6, 4, 6}, Case{7, 10, 5, 2},
                           Case{77, 16, 2, 1}, Case{33, 9, 3, 3}, Case{101, 128, 9, 4},
                           Case{64, 64, 1, 64}, Case{45, 512, 9, 4}, Case{37, 520, 25, 8});
  CAPTURE(cs.P, cs.d, cs.N, cs.H);
  Rng rng(2000 + cs.P * 31 + cs.d * 7 + cs.N * 3 + cs.H);
  std::vector<Mat<double>> S;
  for (int i = 0; i < cs.N; ++i) S.push_back(rng.normal_matrix<double>(cs.P, cs.d));
  const RowVec<double> q = rng.normal_matrix<double>(1, cs.d);
  const RowVec<double> g = rng.normal_matrix<double>(1, cs.d, 1.0, 0.3);
  const Mat<double> dout = rng.normal_matrix<double>(cs.P, cs.d);

  const Run<double> truth = run<double>(false, S, q, g, dout, cs.H);
  // Double: the two loop orders round differently, by a few ulps of each output's scale.
  // 1e-12 is ~5000 ulps (2.2e-16), far above that and far below any wrong term.
  const double err_double = worst_rel(run<double>(true, S, q, g, dout, cs.H), truth);
  CAPTURE(err_double);
  CHECK(err_double < 1e-12);

  // Float: F2/B2's error against the double truth may be a small multiple of the reference's
  // own float error (docs/style.md §7); the floor of 1e-7 (≈ one float ulp of 1) covers cases where
  // the reference's float error happens to be ~0.
  const auto Sf = cast_all<float>(S);
  const RowVec<float> qf = q.cast<float>(), gf = g.cast<float>();
  const Mat<float> doutf = dout.cast<float>();
  const double err_ref = worst_rel(run<float>(false, Sf, qf, gf, doutf, cs.H), truth);
  const double err_fast = worst_rel(run<float>(true, Sf, qf, gf, doutf, cs.H), truth);
  CAPTURE(err_ref, err_fast);
  CHECK(err_fast <= mhar::test::version_tolerance(err_ref));
}

TEST_CASE("routing F2/B2 gives the same bits on every run and for 1 and 2 threads",
          "[routing][fast][determinism]") {
  // Large enough that the block loop runs on threads (≥ 64 K source values): 10 blocks of 32
  // rows; and d 512, N 9, 6 blocks cut into sub-blocks of 14 rows.
  const Case cs = GENERATE(Case{300, 64, 5, 4}, Case{180, 512, 9, 4});
  const int N = cs.N, P = cs.P, d = cs.d, H = cs.H;
  CAPTURE(P, d, N, H);
  Rng rng(4242 + P);
  std::vector<Mat<float>> S;
  for (int i = 0; i < N; ++i) S.push_back(rng.normal_matrix<float>(P, d));
  const RowVec<float> q = rng.normal_matrix<float>(1, d),
                      g = rng.normal_matrix<float>(1, d, 1, 0.3);
  const Mat<float> dout = rng.normal_matrix<float>(P, d);
#ifdef _OPENMP
  const int before = omp_get_max_threads();
  omp_set_num_threads(1);
  const auto one_a = flatten(run<float>(true, S, q, g, dout, H));
  const auto one_b = flatten(run<float>(true, S, q, g, dout, H));
  omp_set_num_threads(2);
  REQUIRE(omp_get_max_threads() == 2);
  const auto two_a = flatten(run<float>(true, S, q, g, dout, H));
  const auto two_b = flatten(run<float>(true, S, q, g, dout, H));
  omp_set_num_threads(before);
  CHECK(one_a == one_b);  // exact equality of every float: the same bits
  CHECK(two_a == two_b);
  CHECK(one_a == two_a);
#else
  const auto a = flatten(run<float>(true, S, q, g, dout, H));
  const auto b = flatten(run<float>(true, S, q, g, dout, H));
  CHECK(a == b);
  WARN("built without OpenMP: only one thread to compare");
#endif
}

TEST_CASE("routing F2/B2 rejects bad shapes like the reference", "[routing][fast][bad-input]") {
  Rng rng(17);
  std::vector<Mat<double>> S = {rng.normal_matrix<double>(3, 8), rng.normal_matrix<double>(3, 8)};
  const RowVec<double> q = RowVec<double>::Zero(8), g = RowVec<double>::Ones(8);
  Mat<double> out;
  RoutingSaved<double> saved;
  using Catch::Matchers::Contains;
  CHECK_THROWS_WITH(routing_forward_fast<double>(out, saved, S, q, g, 3),
                    Contains("H = 3 must divide d = 8"));
  routing_forward_fast<double>(out, saved, S, q, g, 2);
  std::vector<Mat<double>> dS(2, Mat<double>::Zero(3, 8));
  RowVec<double> dq = RowVec<double>::Zero(8), dg = RowVec<double>::Zero(8);
  CHECK_THROWS_WITH(
      routing_backward_fast<double>(dS, dq, dg, Mat<double>::Zero(3, 7), out, saved, S, q, g, 2),
      Contains("dout must be 3×8"));
  CHECK_THROWS_WITH(
      routing_backward_fast<double>(dS, dq, dg, Mat<double>::Zero(3, 8), out, saved, S, q, g, 4),
      Contains("saved.alpha[i] must be 3×4"));
}
