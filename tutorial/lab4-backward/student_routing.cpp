/**
 * @file student_routing.cpp
 * @brief Lab 4, YOUR file: the routing backward (docs/design.md §1), written by you, one position at a
 *        time. As shipped it only has the value path, so the checker says FAIL and tells you
 *        where to look.
 *
 * Build and check (from the repository root, after the project is configured in build/):
 *
 *     cmake --build build --target lab4_check_student && build/tutorial/lab4_check_student
 *
 * The forward you are differentiating is steps (1)–(4) of docs/design.md#routing-steps, per
 * position p (r_i and α_i are saved for you).
 *
 * Letters: P positions, d width, N sources, H routing heads, K = d / H; head h owns the columns
 * [h·K, (h+1)·K). Same signature as mhar::routing_backward (reference/routing.h), namespace lab4.
 * Everything ACCUMULATES (+=): dsources, dq and dg already hold the gradients of other sites.
 *
 * Fill in STEP 1 … STEP 6 below; each says which forward line it differentiates. Remove a
 * [[maybe_unused]] once your line uses the variable. The answer is in solution_routing.cpp:
 * try without it first; the checker's hints are meant to be enough.
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
void routing_backward(std::span<Mat<T>> dsources, [[maybe_unused]] Eigen::Ref<RowVec<T>> dq,
                      [[maybe_unused]] Eigen::Ref<RowVec<T>> dg, const Mat<T>& dout,
                      [[maybe_unused]] const Mat<T>& out, const mhar::RoutingSaved<T>& saved,
                      std::span<const Mat<T>> sources,
                      [[maybe_unused]] const Eigen::Ref<const RowVec<T>>& q,
                      [[maybe_unused]] const Eigen::Ref<const RowVec<T>>& g, int H) {
  const int N = static_cast<int>(sources.size());
  const Eigen::Index P = dout.rows();
  const int d = static_cast<int>(dout.cols()), K = d / H;

  for (Eigen::Index p = 0; p < P; ++p) {
    // STEP 1 (needed by (3)): D[h] = Σ_{c∈h} dout[p,c] · out[p,c]   (it equals Σ_j α_j[h] a_j[h])
    std::vector<T> D(H, T(0));
    //   write: for h < H, for c in [h·K, (h+1)·K): D[h] += dout(p, c) * out(p, c);

    for (int i = 0; i < N; ++i) {
      [[maybe_unused]] const Mat<T>& S = sources[i];
      Mat<T>& dS = dsources[i];
      [[maybe_unused]] const T r = saved.rinv[i](p);  // r_i at position p, from (1)
      std::vector<T> dz(H, T(0));                     // dz_i[h] = ∂loss/∂z_i[h]

      for (int h = 0; h < H; ++h) {
        const T alpha = saved.alpha[i](p, h);  // α_i[h] at position p, from (3)
        // STEP 2 (from (4), the weight path): a = Σ_{c∈h} dout[p,c] · S_i[p,c]   (∂loss/∂α_i[h])
        [[maybe_unused]] T a = T(0);
        //   write: the loop over the head's columns that sums into a.

        // STEP 3 (from (3), the softmax Jacobian diag(α) − ααᵀ): dz_i[h] = α_i[h] · (a − D[h])
        //   write: dz[h] = ...;

        // Given (from (4), the value path): dS_i[p,c] += α_i[h] · dout[p,c] for c in head h.
        for (int c = h * K; c < (h + 1) * K; ++c) dS(p, c) += alpha * dout(p, c);
      }

      // STEP 4 (from (2), the key path): u_c = dz_i[h(c)] · q_c · g_c is ∂loss/∂(r_i·S_i[p,c]),
      //   so dS_i[p,c] += r · u_c. Also sum uS = Σ_c u_c · S_i[p,c] for STEP 5.
      //   write: T uS = 0; then a loop over c < d (h(c) = c / K).

      // STEP 5 (from (1), the RMS path: ∂r/∂S_i[p,c] = −(r³/d) · S_i[p,c]):
      //   dS_i[p,c] −= (r³ / d) · uS · S_i[p,c]   for every c < d.

      // STEP 6 (from (2), the parameters), for every c < d:
      //   dq_c += dz_i[h(c)] · g_c · r · S_i[p,c]
      //   dg_c += dz_i[h(c)] · q_c · r · S_i[p,c]
      //   (dq and dg are 1 × d row vectors: dq(c), dg(c).)
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
