/**
 * @file routing.cpp
 * @brief Depth routing, CPU reference: docs/design.md §1 line by line.
 *
 * Open docs/design.md#routing-steps beside this file: the forward below is its steps (1)–(4),
 * each comment carrying the step's number, vectorised over all P positions at once; the
 * backward is the same page's derivation, from (4) back to (1).
 *
 * Head h owns the K = d / H columns [h·K, (h+1)·K). Because a row-major P × d matrix stores
 * those K columns contiguously, it is also a (P·H) × K matrix whose row p·H + h is head h of
 * position p: `heads(X)` below is that view, and `flat(A)` reads a P × H matrix as the matching
 * column of P·H values. A per-head sum is then one `rowwise().sum()` over heads(X), and scaling
 * each head by its weight one `flat(α).asDiagonal() * heads(X)`, for all heads at once.
 * The CUDA twin is cuda/routing.cu, one file per version behind it (routing_naive.cu is these
 * loops, one thread per output element).
 */
#include "routing.h"

#include <cmath>

namespace mhar {

template <typename T>
void check_routing_args(std::span<const Mat<T>> sources, const Eigen::Ref<const RowVec<T>>& q,
                        const Eigen::Ref<const RowVec<T>>& g, int H) {
  require(!sources.empty(), "routing", "needs at least one source (N >= 1)");
  const auto P = sources[0].rows(), d = sources[0].cols();
  require(P >= 1 && d >= 1, "routing", "sources must be non-empty, got ", P, "×", d);
  for (std::size_t i = 1; i < sources.size(); ++i)
    require(sources[i].rows() == P && sources[i].cols() == d, "routing", "source ", i, " is ",
            sources[i].rows(), "×", sources[i].cols(), " but source 0 is ", P, "×", d);
  require(q.cols() == d, "routing", "q must have d = ", d, " entries, got ", q.cols());
  require(g.cols() == d, "routing", "g must have d = ", d, " entries, got ", g.cols());
  require(H >= 1 && d % H == 0, "routing", "H = ", H, " must divide d = ", d,
          " (allowed: a divisor of d)");
}

template <typename T>
void check_routing_backward_args(std::span<Mat<T>> dsources, const Mat<T>& dout, const Mat<T>& out,
                                 const RoutingSaved<T>& saved, std::span<const Mat<T>> sources,
                                 const Eigen::Ref<const RowVec<T>>& q,
                                 const Eigen::Ref<const RowVec<T>>& g, int H) {
  check_routing_args(sources, q, g, H);
  const auto N = sources.size();
  const auto P = sources[0].rows(), d = sources[0].cols();
  require(dsources.size() == N, "routing_backward", "dsources has ", dsources.size(),
          " entries, sources has ", N);
  require_shape(dout, P, d, "routing_backward", "dout");
  require_shape(out, P, d, "routing_backward", "out");
  require(saved.alpha.size() == N && saved.rinv.size() == N, "routing_backward",
          "saved state is from a forward over ", saved.alpha.size(), " sources, not ", N);
  for (std::size_t i = 0; i < N; ++i) {
    require_shape(dsources[i], P, d, "routing_backward", "dsources[i]");
    require_shape(saved.alpha[i], P, H, "routing_backward", "saved.alpha[i]");
    require(saved.rinv[i].size() == P, "routing_backward", "saved.rinv[i] has ",
            saved.rinv[i].size(), " entries, not P = ", P);
  }
}

namespace {

/// The P × d matrix X as (P·H) × K: row p·H + h is head h of position p.
template <typename T>
Eigen::Map<const Mat<T>> heads(const Mat<T>& X, int H) {
  return {X.data(), X.rows() * H, X.cols() / H};
}
template <typename T>
Eigen::Map<Mat<T>> heads(Mat<T>& X, int H) {
  return {X.data(), X.rows() * H, X.cols() / H};
}
/// The P × H matrix A as a column of P·H values (entry p·H + h), matching the rows of heads().
template <typename T>
Eigen::Map<const Vec<T>> flat(const Mat<T>& A) {
  return {A.data(), A.size()};
}
template <typename T>
Eigen::Map<Vec<T>> flat(Mat<T>& A) {
  return {A.data(), A.size()};
}

}  // namespace

template <typename T>
void routing_forward(Mat<T>& out, RoutingSaved<T>& saved, std::span<const Mat<T>> sources,
                     const Eigen::Ref<const RowVec<T>>& q, const Eigen::Ref<const RowVec<T>>& g,
                     int H) {
  check_routing_args(sources, q, g, H);
  // sources: N × (P × d); q, g: 1 × d; out: P × d; α_i: P × H; r_i: P
  const auto N = sources.size();
  const auto P = sources[0].rows();
  const int d = static_cast<int>(sources[0].cols());
  const RowVec<T> qg = q.cwiseProduct(g);  // the key projection q ⊙ g

  saved.alpha.assign(N, Mat<T>(P, H));
  saved.logits.assign(N, Mat<T>(P, H));
  saved.rinv.assign(N, Vec<T>());
  const std::vector<Mat<T>>& z = saved.logits;
  for (std::size_t i = 0; i < N; ++i) {
    const Mat<T>& S = sources[i];
    // (1) r_i = 1 / sqrt( mean_c S_i² + eps )
    saved.rinv[i] = ((S.array().square().rowwise().sum() / T(d)) + T(kRoutingEps)).rsqrt();
    // (2) z_i[h] = r_i · Σ_{c∈h} S_i[c] · (q ⊙ g)_c
    const Mat<T> Sqg = S * qg.asDiagonal();
    flat(saved.logits[i]) = heads(Sqg, H).rowwise().sum();
    saved.logits[i] = saved.rinv[i].asDiagonal() * saved.logits[i];
  }

  // (3) α_i = exp(z_i − m) / Σ_j exp(z_j − m), with m = max_j z_j per (p, h) for stability
  Mat<T> m = z[0];
  for (std::size_t i = 1; i < N; ++i) m = m.cwiseMax(z[i]);
  Mat<T> denom = Mat<T>::Zero(P, H);
  for (std::size_t i = 0; i < N; ++i) {
    saved.alpha[i] = (z[i] - m).array().exp().matrix();
    denom += saved.alpha[i];
  }
  for (std::size_t i = 0; i < N; ++i) saved.alpha[i] = saved.alpha[i].cwiseQuotient(denom);

  // (4) out[p, c] = Σ_i α_i[p, h(c)] · S_i[p, c]   (values: the raw sources)
  out = Mat<T>::Zero(P, d);
  for (std::size_t i = 0; i < N; ++i)
    heads(out, H) += flat(saved.alpha[i]).asDiagonal() * heads(sources[i], H);
}

template <typename T>
void routing_backward(std::span<Mat<T>> dsources, Eigen::Ref<RowVec<T>> dq,
                      Eigen::Ref<RowVec<T>> dg, const Mat<T>& dout, const Mat<T>& out,
                      const RoutingSaved<T>& saved, std::span<const Mat<T>> sources,
                      const Eigen::Ref<const RowVec<T>>& q, const Eigen::Ref<const RowVec<T>>& g,
                      int H) {
  check_routing_backward_args(dsources, dout, out, saved, sources, q, g, H);
  const auto N = sources.size();
  const auto P = sources[0].rows();
  const int d = static_cast<int>(sources[0].cols());
  const RowVec<T> qg = q.cwiseProduct(g);
  const Mat<T> QG = qg.replicate(P, 1);  // q ⊙ g on every row, P × d

  // D[h] = Σ_{c∈h} dout ⊙ out   (= Σ_j α_j[h] · a_j[h]): P × H
  Mat<T> D(P, H);
  flat(D) = heads(dout, H).cwiseProduct(heads(out, H)).rowwise().sum();

  Mat<T> a(P, H), kp(P, H), dzrS(P, d);
  for (std::size_t i = 0; i < N; ++i) {
    const Mat<T>& S = sources[i];
    const Mat<T>& alpha = saved.alpha[i];
    const Vec<T>& r = saved.rinv[i];
    // from (4), weight path: a_i[h] = Σ_{c∈h} dout ⊙ S_i   (∂loss/∂α_i[h])
    flat(a) = heads(dout, H).cwiseProduct(heads(S, H)).rowwise().sum();
    // from (3): dz_i = α_i ⊙ (a_i − D)   (softmax Jacobian diag(α) − ααᵀ)
    const Mat<T> dz = alpha.cwiseProduct(a - D);
    // from (2): z_i[h] = r_i · Σ_{c∈h} q_c g_c S_i[c], so with dzr = r_i · dz_i:
    //   dq_c += Σ_p dzr[h(c)] · g_c · S_i[c];   dg_c += Σ_p dzr[h(c)] · q_c · S_i[c]
    const Mat<T> dzr = r.asDiagonal() * dz;
    heads(dzrS, H) = flat(dzr).asDiagonal() * heads(S, H);
    const RowVec<T> dzrS_sum = dzrS.colwise().sum();
    dq += dzrS_sum.cwiseProduct(g);
    dg += dzrS_sum.cwiseProduct(q);
    //   u_i[c] = dz_i[h(c)] · q_c · g_c is ∂loss/∂(r_i S_i[c]); for (1) we need
    //   Σ_c u_i[c] S_i[c] = Σ_h dz_i[h] · kp_i[h],  kp_i[h] = Σ_{c∈h} q_c g_c S_i[c]
    flat(kp) = heads(QG, H).cwiseProduct(heads(S, H)).rowwise().sum();
    const Vec<T> uS = dz.cwiseProduct(kp).rowwise().sum();
    // from (1), r_i = (mean S_i² + eps)^(−1/2): the RMS path's coefficient (r_i³ / d) · Σ_c u_i S_i
    const Vec<T> coef = (r.array().cube() * uS.array() / T(d)).matrix();
    // dS_i += α_i[h(c)] · dout          value path, from (4)
    //       + r_i · u_i                  key path, from (2)
    //       − coef · S_i                 key path through the RMS, from (1)
    heads(dsources[i], H) +=
        flat(alpha).asDiagonal() * heads(dout, H) + flat(dzr).asDiagonal() * heads(QG, H);
    dsources[i] -= coef.asDiagonal() * S;
  }
}

#define MHAR_INSTANTIATE(T)                                                                        \
  template void check_routing_args<T>(std::span<const Mat<T>>, const Eigen::Ref<const RowVec<T>>&, \
                                      const Eigen::Ref<const RowVec<T>>&, int);                    \
  template void check_routing_backward_args<T>(std::span<Mat<T>>, const Mat<T>&, const Mat<T>&,    \
                                               const RoutingSaved<T>&, std::span<const Mat<T>>,    \
                                               const Eigen::Ref<const RowVec<T>>&,                 \
                                               const Eigen::Ref<const RowVec<T>>&, int);           \
  template void routing_forward<T>(Mat<T>&, RoutingSaved<T>&, std::span<const Mat<T>>,             \
                                   const Eigen::Ref<const RowVec<T>>&,                             \
                                   const Eigen::Ref<const RowVec<T>>&, int);                       \
  template void routing_backward<T>(                                                               \
      std::span<Mat<T>>, Eigen::Ref<RowVec<T>>, Eigen::Ref<RowVec<T>>, const Mat<T>&,              \
      const Mat<T>&, const RoutingSaved<T>&, std::span<const Mat<T>>,                              \
      const Eigen::Ref<const RowVec<T>>&, const Eigen::Ref<const RowVec<T>>&, int);
MHAR_INSTANTIATE(float)
MHAR_INSTANTIATE(double)
#undef MHAR_INSTANTIATE

}  // namespace mhar
