/**
 * @file routing.cpp
 * @brief Depth routing, CPU reference: DESIGN.md §1 line by line.
 *
 * Forward, per position p (vectorised below over all P positions at once):
 *   (1) r_i      = 1 / sqrt( (1/d) Σ_c S_i[p,c]² + eps )      RMS over the FULL width d
 *   (2) z_i[h]   = Σ_{c∈h} q_c · g_c · r_i · S_i[p,c]          no 1/√d, no temperature
 *   (3) α_i[h]   = exp(z_i[h]) / Σ_j exp(z_j[h])               softmax over depth, per head
 *   (4) out[p,c] = Σ_i α_i[h(c)] · S_i[p,c]                    values are the RAW sources
 *
 * Head h owns the K = d / H columns [h·K, (h+1)·K): `cols(X, h)` below is that slice of X.
 * The backward walks (4) → (1). The CUDA twin is cuda/routing.cu.
 */
#include "routing.h"

#include <cmath>

namespace mhar {

namespace {

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

/// Head h's K columns of a P × d matrix.
template <typename M>
auto cols(M& X, int h, int K) {
  return X.middleCols(static_cast<Eigen::Index>(h) * K, K);
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
  const int d = static_cast<int>(sources[0].cols()), K = d / H;
  const RowVec<T> qg = q.cwiseProduct(g);  // the key projection q ⊙ g

  saved.alpha.assign(N, Mat<T>(P, H));
  saved.rinv.assign(N, Vec<T>());
  std::vector<Mat<T>>& z = saved.alpha;  // logits, turned into weights in place at (3)
  for (std::size_t i = 0; i < N; ++i) {
    const Mat<T>& S = sources[i];
    // (1) r_i = 1 / sqrt( mean_c S_i² + eps )
    saved.rinv[i] = ((S.array().square().rowwise().sum() / T(d)) + T(kRoutingEps)).rsqrt();
    // (2) z_i[h] = r_i · Σ_{c∈h} S_i[c] · (q ⊙ g)_c
    for (int h = 0; h < H; ++h)
      z[i].col(h) = saved.rinv[i].cwiseProduct(cols(S, h, K) * cols(qg, h, K).transpose());
  }

  // (3) α_i = exp(z_i − m) / Σ_j exp(z_j − m), with m = max_j z_j per (p, h) for stability
  Mat<T> m = z[0];
  for (std::size_t i = 1; i < N; ++i) m = m.cwiseMax(z[i]);
  Mat<T> denom = Mat<T>::Zero(P, H);
  for (std::size_t i = 0; i < N; ++i) {
    z[i] = (z[i] - m).array().exp().matrix();
    denom += z[i];
  }
  for (std::size_t i = 0; i < N; ++i) saved.alpha[i] = z[i].cwiseQuotient(denom);

  // (4) out[:, h] = Σ_i α_i[h] · S_i[:, h]   (values: the raw sources)
  out = Mat<T>::Zero(P, d);
  for (std::size_t i = 0; i < N; ++i)
    for (int h = 0; h < H; ++h)
      cols(out, h, K) += saved.alpha[i].col(h).asDiagonal() * cols(sources[i], h, K);
}

template <typename T>
void routing_backward(std::span<Mat<T>> dsources, Eigen::Ref<RowVec<T>> dq,
                      Eigen::Ref<RowVec<T>> dg, const Mat<T>& dout, const Mat<T>& out,
                      const RoutingSaved<T>& saved, std::span<const Mat<T>> sources,
                      const Eigen::Ref<const RowVec<T>>& q, const Eigen::Ref<const RowVec<T>>& g,
                      int H) {
  check_routing_args(sources, q, g, H);
  const auto N = sources.size();
  const auto P = sources[0].rows();
  const int d = static_cast<int>(sources[0].cols()), K = d / H;
  require(dsources.size() == N, "routing_backward", "dsources has ", dsources.size(),
          " entries, sources has ", N);
  require_shape(dout, P, d, "routing_backward", "dout");
  require_shape(out, P, d, "routing_backward", "out");
  require(saved.alpha.size() == N && saved.rinv.size() == N, "routing_backward",
          "saved state is from a forward over ", saved.alpha.size(), " sources, not ", N);
  for (std::size_t i = 0; i < N; ++i)
    require_shape(dsources[i], P, d, "routing_backward", "dsources[i]");
  const RowVec<T> qg = q.cwiseProduct(g);

  // D[h] = Σ_{c∈h} dout ⊙ out   (= Σ_j α_j[h] · a_j[h]): P × H
  Mat<T> D(P, H);
  for (int h = 0; h < H; ++h)
    D.col(h) = cols(dout, h, K).cwiseProduct(cols(out, h, K)).rowwise().sum();

  for (std::size_t i = 0; i < N; ++i) {
    const Mat<T>& S = sources[i];
    const Mat<T>& alpha = saved.alpha[i];
    const Vec<T>& r = saved.rinv[i];
    Mat<T>& dS = dsources[i];
    Vec<T> uS = Vec<T>::Zero(P);  // Σ_c u_i[c] · S_i[c], for the RMS path at (1)
    for (int h = 0; h < H; ++h) {
      const auto S_h = cols(S, h, K);
      const auto dout_h = cols(dout, h, K);
      const auto qg_h = cols(qg, h, K);
      // from (4), value path: dS_i[:, h] += α_i[h] · dout[:, h]
      cols(dS, h, K) += alpha.col(h).asDiagonal() * dout_h;
      // from (4), weight path: a_i[h] = Σ_{c∈h} dout ⊙ S_i   (∂loss/∂α_i[h])
      const Vec<T> a = dout_h.cwiseProduct(S_h).rowwise().sum();
      // from (3): dz_i[h] = α_i[h] · (a_i[h] − D[h])   (softmax Jacobian diag(α) − ααᵀ)
      const Vec<T> dz = alpha.col(h).cwiseProduct(a - D.col(h));
      // from (2): z_i[h] = r_i · Σ_{c∈h} q_c g_c S_i[c]
      //   dq_c += Σ_p dz_i[h] · g_c · r_i · S_i[c];   dg_c += Σ_p dz_i[h] · q_c · r_i · S_i[c]
      const RowVec<T> dzrS = dz.cwiseProduct(r).transpose() * S_h;
      cols(dq, h, K) += dzrS.cwiseProduct(cols(g, h, K));
      cols(dg, h, K) += dzrS.cwiseProduct(cols(q, h, K));
      //   u_i[c] = dz_i[h(c)] · q_c · g_c  (∂loss/∂(r_i S_i[c])), so dS_i[c] += r_i · u_i[c]
      cols(dS, h, K) += dz.cwiseProduct(r) * qg_h;
      uS += dz.cwiseProduct(S_h * qg_h.transpose());
    }
    // from (1), r_i = (mean S_i² + eps)^(−1/2):  dS_i −= (r_i³ / d) · (Σ_c u_i[c] S_i[c]) · S_i
    dS -= (r.array().cube() * uS.array() / T(d)).matrix().asDiagonal() * S;
  }
}

#define MHAR_INSTANTIATE(T)                                                            \
  template void routing_forward<T>(Mat<T>&, RoutingSaved<T>&, std::span<const Mat<T>>, \
                                   const Eigen::Ref<const RowVec<T>>&,                 \
                                   const Eigen::Ref<const RowVec<T>>&, int);           \
  template void routing_backward<T>(                                                   \
      std::span<Mat<T>>, Eigen::Ref<RowVec<T>>, Eigen::Ref<RowVec<T>>, const Mat<T>&,  \
      const Mat<T>&, const RoutingSaved<T>&, std::span<const Mat<T>>,                  \
      const Eigen::Ref<const RowVec<T>>&, const Eigen::Ref<const RowVec<T>>&, int);
MHAR_INSTANTIATE(float)
MHAR_INSTANTIATE(double)
#undef MHAR_INSTANTIATE

}  // namespace mhar
