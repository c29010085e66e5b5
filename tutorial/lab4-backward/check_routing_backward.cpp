/**
 * @file check_routing_backward.cpp
 * @brief Lab 4's checker: runs lab4::routing_backward (your student_routing.cpp, or
 *        solution_routing.cpp) on several shapes and compares dsources, dq and dg with central
 *        finite differences in double AND with the project's reference mhar::routing_backward.
 *
 * Prints "pass" per shape, or, at the first failure, which gradient and element is wrong, the
 * expected and the received value, and a hint that names the step to look at. Exit code 0 when
 * every shape passes, 1 on a failure, 2 when the reference itself disagrees with the finite
 * differences (a bug of the project, not yours).
 *
 * The loss is ℓ = Σ_{p,c} dout[p,c] · out[p,c] for a fixed random dout, so ∂ℓ/∂out = dout.
 * Tolerances: double, so the reference and a correct per-position loop agree to about 1e-14
 * relative; 1e-9 leaves room for any summation order. Central differences with step 1e-6 are good
 * to about 1e-8 here; 1e-6 is the bar.
 */
#include <cmath>
#include <cstdio>
#include <exception>
#include <span>
#include <string>
#include <vector>

#include "routing.h"

using mhar::Mat;
using mhar::RowVec;

namespace lab4 {
/// Defined in student_routing.cpp (lab4_check_student) or solution_routing.cpp
/// (lab4_check_solution); same signature as mhar::routing_backward.
template <typename T>
void routing_backward(std::span<Mat<T>> dsources, Eigen::Ref<RowVec<T>> dq,
                      Eigen::Ref<RowVec<T>> dg, const Mat<T>& dout, const Mat<T>& out,
                      const mhar::RoutingSaved<T>& saved, std::span<const Mat<T>> sources,
                      const Eigen::Ref<const RowVec<T>>& q, const Eigen::Ref<const RowVec<T>>& g,
                      int H);
}  // namespace lab4

namespace {

constexpr double kTolReference = 1e-9;   // against mhar::routing_backward, both in double
constexpr double kTolFiniteDiff = 1e-6;  // against central differences, step kStep
constexpr double kStep = 1e-6;

struct Shape {
  int N, P, d, H;
  const char* what;
};

/// One routing site's inputs and the forward's results.
struct Problem {
  Shape s;
  std::vector<Mat<double>> sources;  // N × (P × d)
  RowVec<double> q, g;               // 1 × d
  Mat<double> dout, out;             // P × d
  mhar::RoutingSaved<double> saved;
};

/// Gradients of one site: dsources N × (P × d), dq and dg 1 × d.
struct Grads {
  std::vector<Mat<double>> dS;
  RowVec<double> dq, dg;
};

Grads zeros(const Shape& s) {
  return {std::vector<Mat<double>>(s.N, Mat<double>::Zero(s.P, s.d)), RowVec<double>::Zero(s.d),
          RowVec<double>::Zero(s.d)};
}

Problem make_problem(const Shape& s, std::uint64_t seed) {
  mhar::Rng rng(seed);
  Problem pr{s, {}, {}, {}, {}, {}, {}};
  for (int i = 0; i < s.N; ++i) pr.sources.push_back(rng.normal_matrix<double>(s.P, s.d));
  pr.q = rng.normal_matrix<double>(1, s.d, 0.0, 0.7);  // not zero: a uniform α hides mistakes
  pr.g = rng.normal_matrix<double>(1, s.d, 1.0, 0.3);
  pr.dout = rng.normal_matrix<double>(s.P, s.d);
  mhar::routing_forward<double>(pr.out, pr.saved, pr.sources, pr.q, pr.g, s.H);
  return pr;
}

/// ℓ = Σ dout ⊙ out(sources, q, g).
double loss(const Problem& pr, const std::vector<Mat<double>>& sources, const RowVec<double>& q,
            const RowVec<double>& g) {
  Mat<double> out;
  mhar::RoutingSaved<double> saved;
  mhar::routing_forward<double>(out, saved, sources, q, g, pr.s.H);
  return pr.dout.cwiseProduct(out).sum();
}

/// Central differences of ℓ for every element of every input.
Grads finite_differences(const Problem& pr) {
  Grads fd = zeros(pr.s);
  std::vector<Mat<double>> S = pr.sources;
  RowVec<double> q = pr.q, g = pr.g;
  auto central = [&](double& x) {
    const double x0 = x;
    x = x0 + kStep;
    const double up = loss(pr, S, q, g);
    x = x0 - kStep;
    const double down = loss(pr, S, q, g);
    x = x0;
    return (up - down) / (2 * kStep);
  };
  for (int i = 0; i < pr.s.N; ++i)
    for (Eigen::Index k = 0; k < S[i].size(); ++k) fd.dS[i].data()[k] = central(S[i].data()[k]);
  for (int c = 0; c < pr.s.d; ++c) {
    fd.dq(c) = central(q(c));
    fd.dg(c) = central(g(c));
  }
  return fd;
}

Grads reference(const Problem& pr) {
  Grads r = zeros(pr.s);
  mhar::routing_backward<double>(r.dS, r.dq, r.dg, pr.dout, pr.out, pr.saved, pr.sources, pr.q,
                                 pr.g, pr.s.H);
  return r;
}

/// The usual mistakes, for the hints: the backward with one piece left out or changed.
struct Mistake {
  bool no_key = false;        // dS without STEP 4 and 5 (dz never reaches the sources)
  bool no_rms = false;        // dS without STEP 5
  bool no_D = false;          // dz = α·a instead of α·(a − D)
  bool dq_without_g = false;  // dq_c += dz · r · S
  bool dg_without_q = false;  // dg_c += dz · r · S
  bool no_r = false;          // dq, dg without the factor r
};

Grads with_mistake(const Problem& pr, const Mistake& m) {
  const Shape& s = pr.s;
  const int K = s.d / s.H;
  Grads w = zeros(s);
  for (int p = 0; p < s.P; ++p) {
    std::vector<double> D(s.H, 0.0), dz(s.H);
    for (int c = 0; c < s.d; ++c) D[c / K] += pr.dout(p, c) * pr.out(p, c);
    for (int i = 0; i < s.N; ++i) {
      const Mat<double>& S = pr.sources[i];
      const double r = pr.saved.rinv[i](p);
      for (int h = 0; h < s.H; ++h) {
        double a = 0;
        for (int c = h * K; c < (h + 1) * K; ++c) a += pr.dout(p, c) * S(p, c);
        dz[h] = pr.saved.alpha[i](p, h) * (a - (m.no_D ? 0.0 : D[h]));
      }
      double uS = 0;
      for (int c = 0; c < s.d; ++c) {
        const double u = dz[c / K] * pr.q(c) * pr.g(c);
        w.dS[i](p, c) += pr.saved.alpha[i](p, c / K) * pr.dout(p, c) + (m.no_key ? 0 : r * u);
        uS += u * S(p, c);
        const double dzrS = dz[c / K] * (m.no_r ? 1.0 : r) * S(p, c);
        w.dq(c) += dzrS * (m.dq_without_g ? 1.0 : pr.g(c));
        w.dg(c) += dzrS * (m.dg_without_q ? 1.0 : pr.q(c));
      }
      if (!m.no_key && !m.no_rms)
        for (int c = 0; c < s.d; ++c) w.dS[i](p, c) -= r * r * r / s.d * uS * S(p, c);
    }
  }
  return w;
}

/// Worst error of `got` against `want`, relative to the largest |want| of the tensor (at least
/// 1e-3: the inputs are O(1), and an exactly-zero gradient, as dq at N = 1, is compared
/// absolutely).
struct Worst {
  double err = 0;
  Eigen::Index at = 0;
};
Worst worst(const Mat<double>& got, const Mat<double>& want) {
  const double scale = std::max(want.cwiseAbs().maxCoeff(), 1e-3);
  Worst w;
  for (Eigen::Index k = 0; k < want.size(); ++k) {
    const double e = std::abs(got.data()[k] - want.data()[k]) / scale;
    if (e > w.err) w = {e, k};
  }
  return w;
}
bool same(const Mat<double>& a, const Mat<double>& b) {
  return worst(a, b).err <= kTolReference;
}
bool same_dS(const Grads& a, const Grads& b) {
  for (std::size_t i = 0; i < a.dS.size(); ++i)
    if (!same(a.dS[i], b.dS[i])) return false;
  return true;
}

/// A sentence naming the step to look at, from which known mistake the answer matches.
std::string hint(const Problem& pr, const Grads& got, const Grads& want, const Grads& raw,
                 const Grads& prior) {
  const bool dS_ok = same_dS(got, want), dq_ok = same(got.dq, want.dq),
             dg_ok = same(got.dg, want.dg);
  if (same_dS(raw, want) && !dS_ok)
    return "your dS equals the gradient itself, without what dsources held before: accumulate "
           "(dS(p, c) += ...), never assign";
  if ((same(raw.dq, want.dq) && !dq_ok) || (same(raw.dg, want.dg) && !dg_ok))
    return "dq or dg equals the gradient itself, without what it held before: accumulate "
           "(dq(c) += ...), never assign";
  if (!dS_ok && same_dS(got, with_mistake(pr, {.no_key = true})))
    return "dS has only the value path (α·dout): the logits z depend on S too. Add STEP 4 "
           "(r·u) and STEP 5 (the RMS path), which need dz from STEP 1–3";
  if (!dS_ok && same_dS(got, with_mistake(pr, {.no_rms = true})))
    return "dS misses the RMS path (STEP 5): r_i depends on S_i, so subtract (r³/d)·uS·S_i[p,c] "
           "with uS = Σ_c u_c·S_i[p,c] summed over the FULL width d";
  if (!dS_ok && same_dS(got, with_mistake(pr, {.no_D = true})))
    return "dz looks like α·a: the softmax Jacobian is diag(α) − ααᵀ, so dz = α·(a − D) with "
           "D[h] = Σ_{c∈h} dout·out (STEP 1 and STEP 3)";
  if (dS_ok && !dq_ok && same(got.dq, with_mistake(pr, {.dq_without_g = true}).dq))
    return "dq wrong but dS right: dz is fine, check the g factor (dq_c += dz·g_c·r·S_i[p,c])";
  if (dS_ok && !dg_ok && same(got.dg, with_mistake(pr, {.dg_without_q = true}).dg))
    return "dg wrong but dS right: dz is fine, check the q factor (dg_c += dz·q_c·r·S_i[p,c])";
  if (dS_ok && (!dq_ok || !dg_ok) && same(got.dq, with_mistake(pr, {.no_r = true}).dq))
    return "dq, dg wrong but dS right: the logit uses the normalised source r·S, so dq and dg "
           "need the factor r";
  if (dS_ok && !dq_ok && !dg_ok && same(got.dq, want.dg) && same(got.dg, want.dq))
    return "dq and dg are swapped: dq carries g_c, dg carries q_c";
  if (dS_ok && !dq_ok && same(got.dq - prior.dq, RowVec<double>::Zero(pr.s.d)))
    return "dS is right but dq, dg are untouched: write STEP 6";
  if (dS_ok) return "dS is right, so dz is right: the mistake is in STEP 6 (dq, dg)";
  return "dS is wrong: check STEP 1-3 (dz) first, then STEP 4-5 (a head's dz reaches all its K "
         "columns through u_c = dz[c / K]·q_c·g_c, and uS sums over all d columns)";
}

/// Compares one tensor; prints the first failure and returns false.
bool compare(const char* name, int i, const Mat<double>& got, const Mat<double>& want,
             const Mat<double>& fd, const Shape& s) {
  const Worst w_ref = worst(got, want), w_fd = worst(got, fd);
  if (w_ref.err <= kTolReference && w_fd.err <= kTolFiniteDiff) return true;
  const Eigen::Index k = w_ref.err > kTolReference ? w_ref.at : w_fd.at;
  const Eigen::Index row = k / got.cols(), col = k % got.cols();
  std::printf("  FAIL  %s", name);
  if (i >= 0) std::printf("[%d]", i);
  std::printf(
      " at [p=%ld, c=%ld] (head h=%ld): expected %.12g (reference), %.12g (finite "
      "differences), got %.12g\n",
      static_cast<long>(row), static_cast<long>(col), static_cast<long>(col / (s.d / s.H)),
      want.data()[k], fd.data()[k], got.data()[k]);
  std::printf(
      "        worst error relative to max|expected|: %.3g against the reference (bar "
      "%.0e), %.3g against finite differences (bar %.0e)\n",
      w_ref.err, kTolReference, w_fd.err, kTolFiniteDiff);
  return false;
}

}  // namespace

int main() {
  const std::vector<Shape> shapes = {
      {1, 3, 4, 1, "N = 1: a single source, α = 1, the gradient is dout itself"},
      {3, 2, 6, 1, "H = 1: single-head Attention Residuals"},
      {4, 3, 8, 2, "H = 2"},
      {3, 2, 4, 4, "H = d: one column per head"},
      {5, 3, 12, 3, "N = 5, H = 3, K = 4"},
  };
  std::uint64_t seed = 1;
  for (const Shape& s : shapes) {
    std::printf("shape N=%d P=%d d=%d H=%d (%s)\n", s.N, s.P, s.d, s.H, s.what);
    const Problem pr = make_problem(s, seed++);
    const Grads want = reference(pr), fd = finite_differences(pr);

    for (int i = 0; i < s.N; ++i)
      if (worst(want.dS[i], fd.dS[i]).err > kTolFiniteDiff) {
        std::printf(
            "  the reference disagrees with finite differences: a bug of the project, "
            "please report it\n");
        return 2;
      }

    // What the buffers held before (other sites' gradients): your code must add to it.
    mhar::Rng rng(100 + seed);
    Grads prior{{}, rng.normal_matrix<double>(1, s.d), rng.normal_matrix<double>(1, s.d)};
    for (int i = 0; i < s.N; ++i) prior.dS.push_back(rng.normal_matrix<double>(s.P, s.d));
    Grads raw = prior;
    try {
      lab4::routing_backward<double>(raw.dS, raw.dq, raw.dg, pr.dout, pr.out, pr.saved, pr.sources,
                                     pr.q, pr.g, s.H);
    } catch (const std::exception& e) {
      std::printf("  FAIL  your routing_backward threw: %s\n", e.what());
      return 1;
    }
    Grads got = raw;
    for (int i = 0; i < s.N; ++i) got.dS[i] -= prior.dS[i];
    got.dq -= prior.dq;
    got.dg -= prior.dg;

    bool ok = true;
    for (int i = 0; i < s.N && ok; ++i)
      ok = compare("dsources", i, got.dS[i], want.dS[i], fd.dS[i], s);
    ok = ok && compare("dq", -1, got.dq, want.dq, fd.dq, s);
    ok = ok && compare("dg", -1, got.dg, want.dg, fd.dg, s);
    if (!ok) {
      std::printf("  hint: %s\n", hint(pr, got, want, raw, prior).c_str());
      std::printf("FAIL\n");
      return 1;
    }
    std::printf("  pass  dsources, dq, dg match the reference and finite differences\n");
  }
  std::printf("PASS: all %zu shapes\n", shapes.size());
  return 0;
}
