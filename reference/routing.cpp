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
 * The backward walks (4) → (1). M is the d × H head indicator (routing.h).
 * The CUDA twin is cuda/routing.cu.
 */
#include "routing.h"

#include <cmath>

namespace mhar {

template <typename T>
Mat<T> head_indicator(int d, int H) {
  require(H >= 1 && d >= 1 && d % H == 0, "routing", "H = ", H, " must divide d = ", d,
          " (allowed: a divisor of d)");
  const int K = d / H;
  Mat<T> M = Mat<T>::Zero(d, H);
  for (int c = 0; c < d; ++c) M(c, c / K) = T(1);
  return M;
}

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
  require(H >= 1 && d % H == 0, "routing", "H = ", H, " must divide d = ", d);
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
  const Mat<T> M = head_indicator<T>(d, H);
  // The key projection q ⊙ g, summed per head by M: a d × H matrix.
  const Mat<T> QG = q.cwiseProduct(g).asDiagonal() * M;

  saved.alpha.assign(N, Mat<T>());
  saved.rinv.assign(N, Vec<T>());
  std::vector<Mat<T>> z(N);
  for (std::size_t i = 0; i < N; ++i) {
    const Mat<T>& S = sources[i];
    // (1) r_i = 1 / sqrt( mean_c S_i² + eps )
    saved.rinv[i] = ((S.array().square().rowwise().sum() / T(d)) + T(kRoutingEps)).rsqrt();
    // (2) z_i = diag(r_i) · S_i · diag(q ⊙ g) · M
    z[i] = saved.rinv[i].asDiagonal() * (S * QG);
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

  // (4) out = Σ_i (α_i · Mᵀ) ⊙ S_i
  out = Mat<T>::Zero(P, d);
  for (std::size_t i = 0; i < N; ++i)
    out += (saved.alpha[i] * M.transpose()).cwiseProduct(sources[i]);
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
  const int d = static_cast<int>(sources[0].cols());
  require(dsources.size() == N, "routing_backward", "dsources has ", dsources.size(),
          " entries, sources has ", N);
  require_shape(dout, P, d, "routing_backward", "dout");
  require_shape(out, P, d, "routing_backward", "out");
  require(saved.alpha.size() == N && saved.rinv.size() == N, "routing_backward",
          "saved state is from a forward over ", saved.alpha.size(), " sources, not ", N);
  for (std::size_t i = 0; i < N; ++i) require_shape(dsources[i], P, d, "routing_backward", "dsources[i]");
  const Mat<T> M = head_indicator<T>(d, H);
  const RowVec<T> qg = q.cwiseProduct(g);

  // D[h] = Σ_{c∈h} dout ⊙ out  (= Σ_j α_j[h] · a_j[h]): P × H
  const Mat<T> D = dout.cwiseProduct(out) * M;
  for (std::size_t i = 0; i < N; ++i) {
    const Mat<T>& S = sources[i];
    const Mat<T>& alpha = saved.alpha[i];
    const Vec<T>& r = saved.rinv[i];

    // from (4), value path: dS_i += (α_i · Mᵀ) ⊙ dout
    dsources[i] += (alpha * M.transpose()).cwiseProduct(dout);
    // from (4), weight path: a_i[h] = Σ_{c∈h} dout ⊙ S_i   (∂loss/∂α_i)
    const Mat<T> a = dout.cwiseProduct(S) * M;

    // from (3): dz_i = α_i ⊙ (a_i − D)   (softmax Jacobian diag(α) − ααᵀ)
    const Mat<T> dz = alpha.cwiseProduct(a - D);

    // from (2): spread dz over its head's columns; n_i = r_i · S_i is the normalised source
    const Mat<T> dz_cols = dz * M.transpose();                        // P × d
    const Mat<T> n = r.asDiagonal() * S;                               // P × d
    const RowVec<T> dz_n = dz_cols.cwiseProduct(n).colwise().sum();   // Σ_p dz_i[h(c)] · n_i[p,c]
    // dq_c += Σ_p dz_i[h(c)] · g_c · r_i · S_i[p,c];  dg_c likewise with q_c
    dq += dz_n.cwiseProduct(g);
    dg += dz_n.cwiseProduct(q);
    // u_i = dz_i[h(c)] · q_c · g_c   (∂loss/∂n_i)
    const Mat<T> u = dz_cols * qg.asDiagonal();

    // from (1), through n_i = r_i · S_i with r_i = (mean S_i² + eps)^(-1/2):
    // dS_i += r_i · u_i − (r_i³ / d) · (Σ_c' u_i[c'] · S_i[c']) · S_i
    const Vec<T> uS = u.cwiseProduct(S).rowwise().sum();
    const Vec<T> coef = (r.array().cube() * uS.array() / T(d)).matrix();
    dsources[i] += r.asDiagonal() * u - coef.asDiagonal() * S;
  }
}

template Mat<float> head_indicator<float>(int, int);
template Mat<double> head_indicator<double>(int, int);

#define MHAR_INSTANTIATE(T)                                                                     \
  template void routing_forward<T>(Mat<T>&, RoutingSaved<T>&, std::span<const Mat<T>>,         \
                                   const Eigen::Ref<const RowVec<T>>&,                          \
                                   const Eigen::Ref<const RowVec<T>>&, int);                    \
  template void routing_backward<T>(                                                            \
      std::span<Mat<T>>, Eigen::Ref<RowVec<T>>, Eigen::Ref<RowVec<T>>, const Mat<T>&,           \
      const Mat<T>&, const RoutingSaved<T>&, std::span<const Mat<T>>,                           \
      const Eigen::Ref<const RowVec<T>>&, const Eigen::Ref<const RowVec<T>>&, int);
MHAR_INSTANTIATE(float)
MHAR_INSTANTIATE(double)
#undef MHAR_INSTANTIATE

}  // namespace mhar
