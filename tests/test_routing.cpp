/**
 * @file test_routing.cpp
 * @brief Depth routing reference: finite-difference gradients (of CPU versions F1/B1 and F2/B2),
 * docs/design.md §1 properties, bad input.
 */
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>

#include "gradcheck.h"
#include "routing.h"
#include "routing_fast.h"

using namespace mhar;
using mhar::test::check_gradient;
using mhar::test::sample_indices;

namespace {

struct Case {
  int P, d, N, H;
};

std::vector<Mat<double>> random_sources(Rng& rng, int N, int P, int d) {
  std::vector<Mat<double>> s;
  for (int i = 0; i < N; ++i) s.push_back(rng.normal_matrix<double>(P, d));
  return s;
}

/// An independent single-head oracle written straight from the formulas, one position at a time.
Mat<double> single_head_loops(const std::vector<Mat<double>>& S, const RowVec<double>& q,
                              const RowVec<double>& g) {
  const int N = static_cast<int>(S.size());
  const int P = static_cast<int>(S[0].rows()), d = static_cast<int>(S[0].cols());
  Mat<double> out = Mat<double>::Zero(P, d);
  for (int p = 0; p < P; ++p) {
    std::vector<double> z(N);
    for (int i = 0; i < N; ++i) {
      double ms = 0;
      for (int c = 0; c < d; ++c) ms += S[i](p, c) * S[i](p, c);
      const double r = 1.0 / std::sqrt(ms / d + kRoutingEps);
      z[i] = 0;
      for (int c = 0; c < d; ++c) z[i] += q(c) * g(c) * r * S[i](p, c);
    }
    const double zmax = *std::max_element(z.begin(), z.end());
    double den = 0;
    for (int i = 0; i < N; ++i) den += std::exp(z[i] - zmax);
    for (int i = 0; i < N; ++i)
      for (int c = 0; c < d; ++c) out(p, c) += std::exp(z[i] - zmax) / den * S[i](p, c);
  }
  return out;
}

}  // namespace

namespace {

/// A CPU routing version: the reference (F1/B1, reference/routing.h) or the fast one (F2/B2,
/// cpu/routing_fast.h); both take the same arguments.
struct Version {
  const char* tag;
  decltype(&routing_forward<double>) forward;
  decltype(&routing_backward<double>) backward;
};
const Version kReference{"routing", &routing_forward<double>, &routing_backward<double>};
const Version kFast{"routing F2/B2", &routing_forward_fast<double>, &routing_backward_fast<double>};

}  // namespace

TEST_CASE(
    "op gradient, routing F1/B1 and F2/B2 (N = 1, H = 1, H = d, odd P, d not a multiple "
    "of 8, several blocks of positions)",
    "[routing][fast][grad]") {
  const Version v = GENERATE(kReference, kFast);
  // Case{37, 8, 3, 2}: more positions than one block of F2/B2 (32). Case{11, 1024, 4, 4}:
  // wide enough that F2/B2 cuts the block into sub-blocks (8 rows in double, so 8 + 3);
  // its 45 K source values are checked at 256 entries per tensor, spread evenly.
  const Case cs =
      GENERATE(Case{5, 12, 3, 4}, Case{1, 8, 1, 1}, Case{3, 6, 4, 6}, Case{7, 10, 5, 2},
               Case{4, 16, 2, 1}, Case{2, 9, 3, 3}, Case{37, 8, 3, 2}, Case{11, 1024, 4, 4});
  const long count = cs.d >= 512 ? 256 : -1;  // -1: every entry
  CAPTURE(v.tag, cs.P, cs.d, cs.N, cs.H);
  Rng rng(1000 + cs.P * 31 + cs.d * 7 + cs.N * 3 + cs.H);
  auto S = random_sources(rng, cs.N, cs.P, cs.d);
  Mat<double> q = rng.normal_matrix<double>(1, cs.d);
  Mat<double> g = rng.normal_matrix<double>(1, cs.d, 1.0, 0.3);
  const Mat<double> W = rng.normal_matrix<double>(cs.P, cs.d);  // loss = Σ out ⊙ W

  auto loss = [&] {
    Mat<double> out;
    RoutingSaved<double> saved;
    v.forward(out, saved, S, q, g, cs.H);
    return out.cwiseProduct(W).sum();
  };
  Mat<double> out;
  RoutingSaved<double> saved;
  v.forward(out, saved, S, q, g, cs.H);
  std::vector<Mat<double>> dS(cs.N, Mat<double>::Zero(cs.P, cs.d));
  RowVec<double> dq = RowVec<double>::Zero(cs.d), dg = RowVec<double>::Zero(cs.d);
  v.backward(dS, dq, dg, W, out, saved, S, q, g, cs.H);

  const std::string tag = std::string(v.tag) + "(P=" + std::to_string(cs.P) +
                          ",d=" + std::to_string(cs.d) + ",N=" + std::to_string(cs.N) +
                          ",H=" + std::to_string(cs.H) + ")";
  for (int i = 0; i < cs.N; ++i) {
    const auto rep = check_gradient(tag + " dS" + std::to_string(i), S[i], dS[i], loss,
                                    sample_indices(S[i], count));
    CHECK(rep.pass);
  }
  const Mat<double> dqm = dq, dgm = dg;
  CHECK(check_gradient(tag + " dq", q, dqm, loss, sample_indices(q, count)).pass);
  CHECK(check_gradient(tag + " dg", g, dgm, loss, sample_indices(g, count)).pass);
}

TEST_CASE("routing backward accumulates into dsources, dq, dg", "[routing]") {
  Rng rng(7);
  auto S = random_sources(rng, 3, 4, 8);
  const RowVec<double> q = rng.normal_matrix<double>(1, 8), g = rng.normal_matrix<double>(1, 8);
  const Mat<double> dout = rng.normal_matrix<double>(4, 8);
  Mat<double> out;
  RoutingSaved<double> saved;
  routing_forward<double>(out, saved, S, q, g, 2);
  std::vector<Mat<double>> dS1(3, Mat<double>::Zero(4, 8));
  RowVec<double> dq1 = RowVec<double>::Zero(8), dg1 = RowVec<double>::Zero(8);
  routing_backward<double>(dS1, dq1, dg1, dout, out, saved, S, q, g, 2);
  std::vector<Mat<double>> dS2(3, Mat<double>::Ones(4, 8));
  RowVec<double> dq2 = RowVec<double>::Ones(8), dg2 = RowVec<double>::Ones(8);
  routing_backward<double>(dS2, dq2, dg2, dout, out, saved, S, q, g, 2);
  for (int i = 0; i < 3; ++i)
    CHECK((dS2[i].array() - 1.0 - dS1[i].array()).abs().maxCoeff() < 1e-12);
  CHECK((dq2.array() - 1.0 - dq1.array()).abs().maxCoeff() < 1e-12);
  CHECK((dg2.array() - 1.0 - dg1.array()).abs().maxCoeff() < 1e-12);
}

TEST_CASE("routing with q = 0 is the plain mean of the sources", "[routing][property]") {
  const int H = GENERATE(1, 2, 4);
  Rng rng(11 + H);
  auto S = random_sources(rng, 5, 6, 8);
  const RowVec<double> q = RowVec<double>::Zero(8), g = rng.normal_matrix<double>(1, 8);
  Mat<double> out;
  RoutingSaved<double> saved;
  routing_forward<double>(out, saved, S, q, g, H);
  Mat<double> mean = Mat<double>::Zero(6, 8);
  for (auto& s : S) mean += s / 5.0;
  CHECK((out - mean).cwiseAbs().maxCoeff() < 1e-14);
}

TEST_CASE("routing over one source returns it", "[routing][property]") {
  Rng rng(12);
  auto S = random_sources(rng, 1, 3, 10);
  const RowVec<double> q = rng.normal_matrix<double>(1, 10), g = rng.normal_matrix<double>(1, 10);
  Mat<double> out;
  RoutingSaved<double> saved;
  routing_forward<double>(out, saved, S, q, g, 5);
  CHECK((out - S[0]).cwiseAbs().maxCoeff() < 1e-14);
}

TEST_CASE("routing weights sum to one per position and head", "[routing][property]") {
  const int H = GENERATE(1, 3, 12);
  Rng rng(13 + H);
  auto S = random_sources(rng, 4, 5, 12);
  const RowVec<double> q = rng.normal_matrix<double>(1, 12, 0, 3),
                       g = rng.normal_matrix<double>(1, 12);
  Mat<double> out;
  RoutingSaved<double> saved;
  routing_forward<double>(out, saved, S, q, g, H);
  Mat<double> total = Mat<double>::Zero(5, H);
  for (auto& a : saved.alpha) {
    CHECK(a.minCoeff() >= 0.0);
    total += a;
  }
  CHECK((total.array() - 1.0).abs().maxCoeff() < 1e-14);
}

TEST_CASE("routing with H = 1 equals an independent single-head implementation",
          "[routing][property]") {
  Rng rng(14);
  auto S = random_sources(rng, 4, 7, 9);
  const RowVec<double> q = rng.normal_matrix<double>(1, 9), g = rng.normal_matrix<double>(1, 9);
  Mat<double> out;
  RoutingSaved<double> saved;
  routing_forward<double>(out, saved, S, q, g, 1);
  CHECK((out - single_head_loops(S, q, g)).cwiseAbs().maxCoeff() < 1e-13);
}

TEST_CASE("routing is invariant to the order of its sources", "[routing][property]") {
  Rng rng(15);
  auto S = random_sources(rng, 5, 4, 8);
  const RowVec<double> q = rng.normal_matrix<double>(1, 8), g = rng.normal_matrix<double>(1, 8);
  Mat<double> out, out_perm;
  RoutingSaved<double> saved;
  routing_forward<double>(out, saved, S, q, g, 4);
  std::vector<Mat<double>> Sp = {S[3], S[0], S[4], S[2], S[1]};
  routing_forward<double>(out_perm, saved, Sp, q, g, 4);
  CHECK((out - out_perm).cwiseAbs().maxCoeff() < 1e-13);
}

TEST_CASE("scaling a source leaves its key unchanged", "[routing][property]") {
  Rng rng(16);
  auto S = random_sources(rng, 3, 4, 8);
  const RowVec<double> q = rng.normal_matrix<double>(1, 8), g = rng.normal_matrix<double>(1, 8);
  Mat<double> out;
  RoutingSaved<double> a, b;
  routing_forward<double>(out, a, S, q, g, 2);
  S[1] *= 7.5;
  routing_forward<double>(out, b, S, q, g, 2);
  // Up to eps inside the RMS: the relative change of r is ~ eps / mean(S²) ~ 1e-6.
  for (int i = 0; i < 3; ++i) CHECK((a.alpha[i] - b.alpha[i]).cwiseAbs().maxCoeff() < 1e-5);
}

TEST_CASE("routing rejects bad shapes with a clear message", "[routing][bad-input]") {
  Rng rng(17);
  auto S = random_sources(rng, 2, 3, 8);
  const RowVec<double> q = RowVec<double>::Zero(8), g = RowVec<double>::Ones(8);
  Mat<double> out;
  RoutingSaved<double> saved;
  using Catch::Matchers::Contains;
  CHECK_THROWS_WITH(routing_forward<double>(out, saved, S, q, g, 3),
                    Contains("H = 3 must divide d = 8"));
  CHECK_THROWS_WITH(routing_forward<double>(out, saved, S, q, g, 0), Contains("must divide"));
  CHECK_THROWS_WITH(routing_forward<double>(out, saved, std::span<const Mat<double>>(), q, g, 1),
                    Contains("at least one source"));
  auto bad = S;
  bad[1] = rng.normal_matrix<double>(3, 7);
  CHECK_THROWS_WITH(routing_forward<double>(out, saved, bad, q, g, 1),
                    Contains("source 1 is 3×7 but source 0 is 3×8"));
  const RowVec<double> q7 = RowVec<double>::Zero(7);
  CHECK_THROWS_WITH(routing_forward<double>(out, saved, S, q7, g, 1),
                    Contains("q must have d = 8"));
  bad[1] = Mat<double>(0, 8);
  bad[0] = Mat<double>(0, 8);
  CHECK_THROWS_WITH(routing_forward<double>(out, saved, bad, q, g, 1), Contains("non-empty"));
}
