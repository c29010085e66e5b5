/**
 * @file test_routing_stack.cpp
 * @brief CPU routing B3 and F3 (cpu/routing_stack.h), the backward and the forward
 *        of a stack of sites one source at a time: against the reference (F1, B1) site by
 *        site in double and float, the backward against central differences in double, the same
 *        bits for 1 and 2 threads, and their refusals (shapes, order) that leave them usable.
 */
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>

#include "gradcheck.h"
#include "routing.h"
#include "routing_fast.h"
#include "routing_stack.h"

#ifdef _OPENMP
#include <omp.h>
#endif

using namespace mhar;
using mhar::test::check_gradient;
using mhar::test::sample_indices;

namespace {

/// n sources P × d and n sites (site s reads sources 0 … s), with their parameters and the
/// ∂loss/∂out_s each site's backward gets.
template <typename T>
struct Stack {
  std::vector<Mat<T>> S;     // n × (P × d)
  Mat<T> q, g;               // n × d: row s is site s's q, g
  std::vector<Mat<T>> dout;  // n × (P × d)
  int H = 1;
};

Stack<double> draw(int n, int P, int d, int H, std::uint64_t seed) {
  Rng rng(seed);
  Stack<double> st;
  st.H = H;
  for (int i = 0; i < n; ++i) st.S.push_back(rng.normal_matrix<double>(P, d));
  st.q = rng.normal_matrix<double>(n, d);
  st.g = rng.normal_matrix<double>(n, d, 1.0, 0.3);
  for (int s = 0; s < n; ++s) st.dout.push_back(rng.normal_matrix<double>(P, d));
  return st;
}

template <typename T>
Stack<T> cast(const Stack<double>& st) {
  Stack<T> out;
  out.H = st.H;
  for (const auto& m : st.S) out.S.push_back(m.cast<T>());
  for (const auto& m : st.dout) out.dout.push_back(m.cast<T>());
  out.q = st.q.cast<T>();
  out.g = st.g.cast<T>();
  return out;
}

/// What a stack's backward gives: every dS_i, and dq, dg (n × d). On a truth, dq_terms and
/// dg_terms are the size of the terms their sums cancel (term_scales), else 0.
template <typename T>
struct Grads {
  std::vector<Mat<T>> dS;
  Mat<T> dq, dg;
  double dq_terms = 0, dg_terms = 0;
};

/// Which CPU forward runs a stack's sites.
enum class Fwd { V1, V2, V4 };

/// The forward of every site (F1, F2 or F3), into outs and saved. F3 in the
/// model's order: source 0, site 0, source 1, site 1, …
template <typename T>
void forward_all(const Stack<T>& st, Fwd v, std::vector<Mat<T>>& outs,
                 std::vector<RoutingSaved<T>>& saved) {
  const int n = static_cast<int>(st.S.size());
  outs.resize(n);
  saved.resize(n);
  if (v == Fwd::V4) {
    RoutingStackForward<T> stack(st.q, st.g, st.H, saved);
    for (int s = 0; s < n; ++s) {
      stack.add_source(s, st.S[s]);
      stack.site(s, outs[s]);
    }
    return;
  }
  for (int s = 0; s < n; ++s) {
    const std::span<const Mat<T>> src(st.S.data(), s + 1);
    if (v == Fwd::V2)
      routing_forward_fast<T>(outs[s], saved[s], src, st.q.row(s), st.g.row(s), st.H);
    else
      routing_forward<T>(outs[s], saved[s], src, st.q.row(s), st.g.row(s), st.H);
  }
}

/// What a stack's forward gives: every site's output, weights, logits and 1 / RMS.
template <typename T>
struct Forward {
  std::vector<Mat<T>> out;
  std::vector<RoutingSaved<T>> saved;
};

template <typename T>
Forward<T> forward_of(const Stack<T>& st, Fwd v) {
  Forward<T> f;
  forward_all(st, v, f.out, f.saved);
  return f;
}

/// Worst error of a forward against truth, relative to the largest |truth| of each output.
template <typename T>
double worst_rel(const Forward<T>& x, const Forward<double>& truth) {
  mhar::test::WorstError worst;
  for (std::size_t s = 0; s < truth.out.size(); ++s) {
    worst.add(x.out[s], truth.out[s]);
    for (std::size_t i = 0; i <= s; ++i) {
      worst.add(x.saved[s].alpha[i], truth.saved[s].alpha[i]);
      worst.add(x.saved[s].logits[i], truth.saved[s].logits[i]);
      worst.add(x.saved[s].rinv[i], truth.saved[s].rinv[i]);
    }
  }
  return worst.value;
}

template <typename T>
std::vector<T> flatten(const Forward<T>& f) {
  std::vector<T> v;
  auto put = [&](const auto& m) { v.insert(v.end(), m.data(), m.data() + m.size()); };
  for (std::size_t s = 0; s < f.out.size(); ++s) {
    put(f.out[s]);
    for (std::size_t i = 0; i <= s; ++i) {
      put(f.saved[s].alpha[i]);
      put(f.saved[s].logits[i]);
      put(f.saved[s].rinv[i]);
    }
  }
  return v;
}

/// F1/B1 or F2/B2: each site's backward in turn, s = n − 1 … 0 (as the model runs them), into
/// zeroed gradients.
template <typename T>
Grads<T> site_by_site(const Stack<T>& st, bool fast) {
  const int n = static_cast<int>(st.S.size());
  const auto P = st.S[0].rows(), d = st.S[0].cols();
  std::vector<Mat<T>> outs;
  std::vector<RoutingSaved<T>> saved;
  forward_all(st, fast ? Fwd::V2 : Fwd::V1, outs, saved);
  Grads<T> gr{std::vector<Mat<T>>(n, Mat<T>::Zero(P, d)), Mat<T>::Zero(n, d), Mat<T>::Zero(n, d)};
  for (int s = n - 1; s >= 0; --s) {
    const std::span<const Mat<T>> src(st.S.data(), s + 1);
    const std::span<Mat<T>> dsrc(gr.dS.data(), s + 1);
    if (fast)
      routing_backward_fast<T>(dsrc, gr.dq.row(s), gr.dg.row(s), st.dout[s], outs[s], saved[s], src,
                               st.q.row(s), st.g.row(s), st.H);
    else
      routing_backward<T>(dsrc, gr.dq.row(s), gr.dg.row(s), st.dout[s], outs[s], saved[s], src,
                          st.q.row(s), st.g.row(s), st.H);
  }
  return gr;
}

/// B3, in the model's order: site n − 1 added, then for s = n − 1 … 1 source s's gradient
/// and site s − 1 added, then source 0's; after the forward of F3 (as the model) or F2.
template <typename T>
Grads<T> by_source(const Stack<T>& st, Fwd v = Fwd::V4) {
  const int n = static_cast<int>(st.S.size());
  const auto d = st.S[0].cols();
  std::vector<Mat<T>> outs;
  std::vector<RoutingSaved<T>> saved;
  forward_all(st, v, outs, saved);
  Grads<T> gr{std::vector<Mat<T>>(n), Mat<T>::Zero(n, d), Mat<T>::Zero(n, d)};
  RoutingStackBackward<T> stack(st.S, st.H);
  stack.add_site(n - 1, st.dout[n - 1], outs[n - 1], saved[n - 1], st.q.row(n - 1),
                 st.g.row(n - 1));
  for (int s = n - 1; s >= 1; --s) {
    stack.source_gradient(s, gr.dS[s]);
    stack.add_site(s - 1, st.dout[s - 1], outs[s - 1], saved[s - 1], st.q.row(s - 1),
                   st.g.row(s - 1));
  }
  stack.source_gradient(0, gr.dS[0]);
  stack.parameter_gradients(gr.dq, gr.dg);
  return gr;
}

/// Worst error of x against truth, relative to the largest |truth| of each output (dS_i, dq,
/// dg), over the outputs; dq's and dg's scale floored at the size of their terms.
template <typename T>
double worst_rel(const Grads<T>& x, const Grads<double>& truth) {
  mhar::test::WorstError worst;
  for (std::size_t i = 0; i < truth.dS.size(); ++i) worst.add(x.dS[i], truth.dS[i]);
  worst.add(x.dq, truth.dq, truth.dq_terms);
  worst.add(x.dg, truth.dg, truth.dg_terms);
  return worst.value;
}

/**
 * dq_c = Σ_{i≤s} Σ_p dzr_i[p][h(c)] · g_c · S_i[p, c] with dz_i = α_i · (a_i − D), a difference
 * of two sums. At a site with one source (α = 1) the two are equal, so dq and dg are 0 in exact
 * arithmetic, and a float version whose sums for a and D run in another order than B1's leaves
 * a residue of about ε · |a| (B1 itself may leave 0: it sums both in the same order). So their
 * scale is the size of the terms before they cancel: max over sites and c of
 *   Σ_i Σ_p r_i · α_i · (|a_i| + |D|) · |g_c| · |S_i[p, c]|   (|q_c| for dg).
 * Sets truth.dq_terms and truth.dg_terms, from the stack's double forward (F1).
 */
void term_scales(const Stack<double>& st, Grads<double>& truth) {
  const int n = static_cast<int>(st.S.size());
  const auto P = st.S[0].rows(), d = st.S[0].cols(), K = d / st.H;
  std::vector<Mat<double>> outs;
  std::vector<RoutingSaved<double>> saved;
  forward_all(st, Fwd::V1, outs, saved);
  for (int s = 0; s < n; ++s) {
    RowVec<double> terms = RowVec<double>::Zero(d);  // Σ_i Σ_p r · α · (|a| + |D|) · |S[p, c]|
    for (int i = 0; i <= s; ++i)
      for (Eigen::Index p = 0; p < P; ++p)
        for (int h = 0; h < st.H; ++h) {
          const auto cols = Eigen::seqN(h * K, K);
          const double a = st.dout[s].row(p)(cols).dot(st.S[i].row(p)(cols));
          const double D = st.dout[s].row(p)(cols).dot(outs[s].row(p)(cols));
          const double w = saved[s].rinv[i](p) * saved[s].alpha[i](p, h) * (std::abs(a) + std::abs(D));
          terms(cols) += w * st.S[i].row(p)(cols).cwiseAbs();
        }
    truth.dq_terms = std::max(truth.dq_terms, terms.cwiseProduct(st.g.row(s).cwiseAbs()).maxCoeff());
    truth.dg_terms = std::max(truth.dg_terms, terms.cwiseProduct(st.q.row(s).cwiseAbs()).maxCoeff());
  }
}

template <typename T>
std::vector<T> flatten(const Grads<T>& g) {
  std::vector<T> v;
  auto put = [&](const Mat<T>& m) { v.insert(v.end(), m.data(), m.data() + m.size()); };
  for (const auto& m : g.dS) put(m);
  put(g.dq);
  put(g.dg);
  return v;
}

struct Case {
  int n, P, d, H;
};

/// run() twice on 1 thread and twice on 2: every value the same bits all four times.
template <typename F>
void check_same_bits(F&& run) {
#ifdef _OPENMP
  const int before = omp_get_max_threads();
  omp_set_num_threads(1);
  const auto one_a = run();
  const auto one_b = run();
  omp_set_num_threads(2);
  REQUIRE(omp_get_max_threads() == 2);
  const auto two_a = run();
  const auto two_b = run();
  omp_set_num_threads(before);
  CHECK(one_a == one_b);  // exact equality of every float: the same bits
  CHECK(two_a == two_b);
  CHECK(one_a == two_a);
#else
  CHECK(run() == run());
  WARN("built without OpenMP: only one thread to compare");
#endif
}

}  // namespace

TEST_CASE("routing B3 matches the reference site by site in double and float",
          "[routing][stack]") {
  // One site; H = 1 and H = d; odd P; d not a multiple of 8; P over several blocks with a
  // partial last one (kRoutingBlock = 32); the default model's 9 sites at d 128, H 4; and 25
  // sites at d 520 (K 65, a scalar tail per head), where R = 256 KB / (3 · d · sizeof) rows
  // makes sub-blocks of fewer than 32 rows in double (21 rows, P 45 = 21 + 21 + 3). Heads of
  // K = 8, 16 and 32 take the row-by-row pass (source_row), the others the site-by-site one.
  const Case cs =
      GENERATE(Case{1, 5, 8, 2}, Case{3, 7, 10, 1}, Case{4, 6, 6, 6}, Case{5, 77, 16, 4},
               Case{9, 101, 128, 4}, Case{2, 64, 64, 64}, Case{25, 45, 520, 8},
               Case{6, 70, 16, 2}, Case{7, 45, 48, 3}, Case{25, 9, 256, 8});
  CAPTURE(cs.n, cs.P, cs.d, cs.H);
  const Stack<double> st = draw(cs.n, cs.P, cs.d, cs.H, 5000 + cs.n * 13 + cs.P * 7 + cs.d);
  Grads<double> truth = site_by_site(st, false);
  term_scales(st, truth);  // at n = 1, dq and dg are 0 in exact arithmetic: see term_scales
  // Double: other loop orders round differently by a few ulps of each output's scale; 1e-12 is
  // ~5000 ulps, far above that and far below any wrong term. After either fast forward.
  const double err_double = worst_rel(by_source(st), truth);
  const double err_double_v2 = worst_rel(by_source(st, Fwd::V2), truth);
  CAPTURE(err_double, err_double_v2);
  CHECK(err_double < 1e-12);
  CHECK(err_double_v2 < 1e-12);
  // Float: within a small multiple of the reference's own float error (docs/style.md §7), floor 1e-7.
  const Stack<float> sf = cast<float>(st);
  const double err_ref = worst_rel(site_by_site(sf, false), truth);
  const double err_v3 = worst_rel(by_source(sf), truth);
  CAPTURE(err_ref, err_v3);
  CHECK(err_v3 <= mhar::test::version_tolerance(err_ref));
}

TEST_CASE("routing F3 matches the reference site by site in double and float",
          "[routing][stack]") {
  // The cases of B3's test, and P over several blocks of F3's logits (256 rows)
  // with a partial last one.
  const Case cs = GENERATE(Case{1, 5, 8, 2}, Case{3, 7, 10, 1}, Case{4, 6, 6, 6},
                           Case{5, 77, 16, 4}, Case{9, 101, 128, 4}, Case{2, 64, 64, 64},
                           Case{25, 45, 520, 8}, Case{3, 600, 24, 3});
  CAPTURE(cs.n, cs.P, cs.d, cs.H);
  const Stack<double> st = draw(cs.n, cs.P, cs.d, cs.H, 7000 + cs.n * 13 + cs.P * 7 + cs.d);
  const Forward<double> truth = forward_of(st, Fwd::V1);
  // Double: as B3's test, 1e-12 of each output's scale.
  const double err_double = worst_rel(forward_of(st, Fwd::V4), truth);
  CAPTURE(err_double);
  CHECK(err_double < 1e-12);
  // Float: within a small multiple of the reference's own float error, floor 1e-7.
  const Stack<float> sf = cast<float>(st);
  const double err_ref = worst_rel(forward_of(sf, Fwd::V1), truth);
  const double err_v4 = worst_rel(forward_of(sf, Fwd::V4), truth);
  CAPTURE(err_ref, err_v4);
  CHECK(err_v4 <= mhar::test::version_tolerance(err_ref));
}

TEST_CASE("op gradient, routing B3 over a stack of sites", "[routing][stack][grad]") {
  // loss = Σ_s Σ out_s ⊙ W_s, so ∂loss/∂out_s = W_s; every source, q_s and g_s is checked.
  // Heads of K = 3, 4, 1 (site by site) and 8, 16, 32 (row by row).
  const Case cs = GENERATE(Case{4, 5, 12, 4}, Case{3, 37, 8, 2}, Case{5, 3, 6, 6},
                           Case{3, 6, 16, 2}, Case{4, 5, 32, 2}, Case{3, 4, 64, 2});
  CAPTURE(cs.n, cs.P, cs.d, cs.H);
  Stack<double> st = draw(cs.n, cs.P, cs.d, cs.H, 900 + cs.n + cs.P);
  auto loss = [&] {
    std::vector<Mat<double>> outs;
    std::vector<RoutingSaved<double>> saved;
    forward_all(st, Fwd::V1, outs, saved);
    double l = 0;
    for (int s = 0; s < cs.n; ++s) l += outs[s].cwiseProduct(st.dout[s]).sum();
    return l;
  };
  const Grads<double> gr = by_source(st);
  const std::string tag = "routing v3 stack(n=" + std::to_string(cs.n) +
                          ",P=" + std::to_string(cs.P) + ",d=" + std::to_string(cs.d) +
                          ",H=" + std::to_string(cs.H) + ")";
  for (int i = 0; i < cs.n; ++i)
    CHECK(check_gradient(tag + " dS" + std::to_string(i), st.S[i], gr.dS[i], loss,
                         sample_indices(st.S[i]))
              .pass);
  CHECK(check_gradient(tag + " dq", st.q, gr.dq, loss, sample_indices(st.q)).pass);
  CHECK(check_gradient(tag + " dg", st.g, gr.dg, loss, sample_indices(st.g)).pass);
}

TEST_CASE("routing B3 gives the same bits on every run and for 1 and 2 threads",
          "[routing][stack][determinism]") {
  // Enough values that the block loops run on threads (≥ 64 K): 10 blocks of 32 rows; and d 512
  // with 9 sites, 6 blocks.
  const Case cs = GENERATE(Case{5, 300, 64, 4}, Case{9, 180, 512, 4});
  CAPTURE(cs.n, cs.P, cs.d, cs.H);
  const Stack<float> st = cast<float>(draw(cs.n, cs.P, cs.d, cs.H, 4343 + cs.P));
  check_same_bits([&] { return flatten(by_source(st)); });
}

TEST_CASE("routing F3 gives the same bits on every run and for 1 and 2 threads",
          "[routing][stack][determinism]") {
  // Enough values that the block loops run on threads (≥ 64 K): P over several logit blocks
  // (256 rows) with a partial last one; and d 512 with 9 sites.
  const Case cs = GENERATE(Case{5, 600, 64, 4}, Case{9, 180, 512, 4});
  CAPTURE(cs.n, cs.P, cs.d, cs.H);
  const Stack<float> st = cast<float>(draw(cs.n, cs.P, cs.d, cs.H, 4545 + cs.P));
  check_same_bits([&] { return flatten(forward_of(st, Fwd::V4)); });
}

TEST_CASE("routing F3 refuses bad shapes and a wrong order, and stays usable",
          "[routing][stack][bad-input]") {
  using Catch::Matchers::Contains;
  const Stack<double> st = draw(3, 4, 8, 2, 37);
  std::vector<RoutingSaved<double>> saved(3);
  using Fwd4 = RoutingStackForward<double>;
  CHECK_THROWS_WITH(Fwd4(st.q, st.g, 3, saved), Contains("H = 3 must divide d = 8"));
  CHECK_THROWS_WITH(Fwd4(st.q.topRows(2), st.g, 2, saved),
                    Contains("q and g must both be 3 × d (one row a site), got 2×8 and 3×8"));
  CHECK_THROWS_WITH(Fwd4(st.q, st.g, 2, std::span<RoutingSaved<double>>()),
                    Contains("needs at least one site"));

  Fwd4 stack(st.q, st.g, 2, saved);
  Mat<double> out;
  CHECK_THROWS_WITH(stack.site(0, out), Contains("site 0 reads sources 0 … 0 but 0 are added"));
  CHECK_THROWS_WITH(stack.add_source(1, st.S[1]), Contains("the next is source 0"));
  CHECK_THROWS_WITH(stack.add_source(0, Mat<double>::Zero(4, 6)),
                    Contains("source 0 is 4×6, must be P × d with d = 8"));
  stack.add_source(0, st.S[0]);
  CHECK_THROWS_WITH(stack.add_source(1, Mat<double>::Zero(5, 8)),
                    Contains("source 1 has 5 positions, source 0 has 4"));
  CHECK_THROWS_WITH(stack.site(3, out), Contains("site 3 outside [0, 3)"));
  CHECK_THROWS_WITH(stack.site(1, out), Contains("site 1 reads sources 0 … 1 but 1 are added"));

  // After every refusal, the right calls give what a fresh stack gives.
  std::vector<Mat<double>> outs(3);
  stack.site(0, outs[0]);
  CHECK_THROWS_WITH(stack.site(0, out),
                    Contains("sites run in order: site 0 asked, the next is site 1"));
  for (int s = 1; s < 3; ++s) {
    stack.add_source(s, st.S[s]);
    stack.site(s, outs[s]);
  }
  CHECK_THROWS_WITH(stack.add_source(3, st.S[2]), Contains("all 3 sources are added already"));
  const Forward<double> fresh = forward_of(st, Fwd::V4);
  for (int s = 0; s < 3; ++s) {
    CHECK(outs[s] == fresh.out[s]);
    for (int i = 0; i <= s; ++i) {
      CHECK(saved[s].alpha[i] == fresh.saved[s].alpha[i]);
      CHECK(saved[s].logits[i] == fresh.saved[s].logits[i]);
    }
  }
}

TEST_CASE("routing B3 refuses bad shapes and a wrong order, and stays usable",
          "[routing][stack][bad-input]") {
  using Catch::Matchers::Contains;
  const Stack<double> st = draw(3, 4, 8, 2, 31);
  std::vector<Mat<double>> outs;
  std::vector<RoutingSaved<double>> saved;
  forward_all(st, Fwd::V4, outs, saved);

  CHECK_THROWS_WITH(RoutingStackBackward<double>(st.S, 3), Contains("H = 3 must divide d = 8"));
  CHECK_THROWS_WITH(RoutingStackBackward<double>(std::span<const Mat<double>>(), 2),
                    Contains("needs at least one source"));
  std::vector<Mat<double>> uneven = st.S;
  uneven[1] = Mat<double>::Zero(4, 6);
  CHECK_THROWS_WITH(RoutingStackBackward<double>(uneven, 2), Contains("source 1 is 4×6"));

  RoutingStackBackward<double> stack(st.S, 2);
  Mat<double> dS;
  Mat<double> dq = Mat<double>::Zero(3, 8), dg = Mat<double>::Zero(3, 8);
  // source 2 is read by site 2 only, which has not been added
  CHECK_THROWS_WITH(stack.source_gradient(2, dS), Contains("site 2 reads source 2"));
  CHECK_THROWS_WITH(stack.add_site(3, st.dout[2], outs[2], saved[2], st.q.row(2), st.g.row(2)),
                    Contains("site 3 outside [0, 3)"));
  CHECK_THROWS_WITH(
      stack.add_site(2, Mat<double>::Zero(4, 7), outs[2], saved[2], st.q.row(2), st.g.row(2)),
      Contains("dout must be 4×8"));
  // site 1's saved state (2 sources) offered as site 2's (3 sources)
  CHECK_THROWS_WITH(stack.add_site(2, st.dout[2], outs[2], saved[1], st.q.row(2), st.g.row(2)),
                    Contains("saved holds 2 sources, site 2 reads 3"));
  CHECK_THROWS_WITH(stack.parameter_gradients(dq, dg), Contains("was not taken yet"));

  // After every refusal, the right calls give what a fresh stack gives.
  stack.add_site(2, st.dout[2], outs[2], saved[2], st.q.row(2), st.g.row(2));
  CHECK_THROWS_WITH(stack.add_site(2, st.dout[2], outs[2], saved[2], st.q.row(2), st.g.row(2)),
                    Contains("site 2 was already added"));
  stack.source_gradient(2, dS);
  CHECK_THROWS_WITH(stack.source_gradient(2, dS), Contains("already taken"));
  CHECK_THROWS_WITH(stack.source_gradient(1, dS), Contains("site 1 reads source 1"));
  std::vector<Mat<double>> dSs(3);
  dSs[2] = dS;
  stack.add_site(1, st.dout[1], outs[1], saved[1], st.q.row(1), st.g.row(1));
  stack.source_gradient(1, dSs[1]);
  stack.add_site(0, st.dout[0], outs[0], saved[0], st.q.row(0), st.g.row(0));
  stack.source_gradient(0, dSs[0]);
  CHECK_THROWS_WITH(stack.parameter_gradients(dq.leftCols(7), dg), Contains("dq must be 3×8"));
  stack.parameter_gradients(dq, dg);
  const Grads<double> fresh = by_source(st);
  for (int i = 0; i < 3; ++i) CHECK(dSs[i] == fresh.dS[i]);
  CHECK(dq == fresh.dq);
  CHECK(dg == fresh.dg);
}
