/**
 * @file solution_routing.cpp
 * @brief Lab 4, the answer: the routing backward (docs/design.md §1) one position at a time, in plain
 *        loops — the same math as mhar::routing_backward (reference/routing.cpp), which is
 *        vectorised over positions with Eigen instead.
 *
 * The forward is steps (1)–(4) of docs/design.md#routing-steps, per position p; the backward
 * below walks them from (4) back to (1). Everything accumulates (+=).
 */
#include <span>
#include <vector>

#include "routing.h"

namespace lab4 {

using mhar::Mat;
using mhar::RowVec;

/// dsources: N × (P × d) +=; dq, dg: 1 × d +=; dout, out: P × d; saved: α (N × P × H), r (N × P);
/// sources: N × (P × d); q, g: 1 × d; H divides d.
template <typename T>
void routing_backward(std::span<Mat<T>> dsources, Eigen::Ref<RowVec<T>> dq,
                      Eigen::Ref<RowVec<T>> dg, const Mat<T>& dout, const Mat<T>& out,
                      const mhar::RoutingSaved<T>& saved, std::span<const Mat<T>> sources,
                      const Eigen::Ref<const RowVec<T>>& q, const Eigen::Ref<const RowVec<T>>& g,
                      int H) {
  const int N = static_cast<int>(sources.size());
  const Eigen::Index P = dout.rows();
  const int d = static_cast<int>(dout.cols()), K = d / H;
  std::vector<T> D(H), dz(H);

  for (Eigen::Index p = 0; p < P; ++p) {
    // D[h] = Σ_{c∈h} dout[p,c] · out[p,c]. Since out = Σ_j α_j S_j on head h, this is
    // Σ_j α_j[h] · a_j[h]: the ⟨α, a⟩ of the softmax Jacobian, without a pass over the sources.
    for (int h = 0; h < H; ++h) {
      D[h] = T(0);
      for (int c = h * K; c < (h + 1) * K; ++c) D[h] += dout(p, c) * out(p, c);
    }

    for (int i = 0; i < N; ++i) {
      const Mat<T>& S = sources[i];
      Mat<T>& dS = dsources[i];
      const T r = saved.rinv[i](p);

      for (int h = 0; h < H; ++h) {
        const T alpha = saved.alpha[i](p, h);
        // from (4), weight path: a_i[h] = ∂loss/∂α_i[h] = Σ_{c∈h} dout[p,c] · S_i[p,c]
        T a = T(0);
        for (int c = h * K; c < (h + 1) * K; ++c) a += dout(p, c) * S(p, c);
        // from (3): dz_i[h] = Σ_j α_i (δ_ij − α_j) a_j = α_i[h] · (a_i[h] − D[h])
        dz[h] = alpha * (a - D[h]);
        // from (4), value path: ∂out[p,c]/∂S_i[p,c] = α_i[h(c)]
        for (int c = h * K; c < (h + 1) * K; ++c) dS(p, c) += alpha * dout(p, c);
      }

      // from (2): z_i[h] = Σ_{c∈h} (q_c g_c) · (r_i S_i[p,c]), so u_c = dz_i[h(c)] · q_c · g_c is
      // ∂loss/∂(r_i S_i[p,c]); holding r fixed, dS_i[p,c] += r · u_c.
      T uS = T(0);
      for (int c = 0; c < d; ++c) {
        const T u = dz[c / K] * q(c) * g(c);
        dS(p, c) += r * u;
        uS += u * S(p, c);
      }
      // from (1): ∂r/∂S_i[p,c] = −(r³/d) · S_i[p,c]; the loss sees r through Σ_c u_c S_i[p,c] = uS
      const T rms = r * r * r / T(d) * uS;
      for (int c = 0; c < d; ++c) dS(p, c) -= rms * S(p, c);

      // from (2), parameters: ∂z_i[h(c)]/∂q_c = g_c r S_i[p,c];  ∂z_i[h(c)]/∂g_c = q_c r S_i[p,c]
      for (int c = 0; c < d; ++c) {
        const T dzrS = dz[c / K] * r * S(p, c);
        dq(c) += dzrS * g(c);
        dg(c) += dzrS * q(c);
      }
    }
  }
}

template void routing_backward<double>(std::span<Mat<double>>, Eigen::Ref<RowVec<double>>,
                                       Eigen::Ref<RowVec<double>>, const Mat<double>&,
                                       const Mat<double>&, const mhar::RoutingSaved<double>&,
                                       std::span<const Mat<double>>,
                                       const Eigen::Ref<const RowVec<double>>&,
                                       const Eigen::Ref<const RowVec<double>>&, int);

}  // namespace lab4
