/**
 * @file routing_fast_backward.cpp
 * @ingroup cpu
 * @brief B2, the routing backward at one site (routing_fast.h). Changes from B1
 *        (reference/routing.cpp): F2's loop order (a few positions at a time, each source row
 *        from memory once, blocks of positions on OpenMP threads), and D = ⟨dout, out⟩ once a
 *        position instead of a pass over the weights.
 *
 * Per sub-block of R positions (routing_fast_forward.cpp says how R is chosen): D[h] for each
 * position, then source by source, R contiguous rows at a time, one read of each row for
 * a_i[h] and kp_i[h] and a second, from cache, for dS_i and the dq, dg partial sums. The
 * formulas are B1's, step for step; their numbers (1)–(4) match routing.cpp. The dq, dg partial
 * sums are kept per block of positions and added in block order after the parallel loop, so the
 * bits do not depend on the thread count (routing_fast.h).
 */
#include "routing_blocks.h"
#include "routing_fast.h"

namespace mhar {

using namespace routing_blocks;

template <typename T>
void routing_backward_fast(std::span<Mat<T>> dsources, Eigen::Ref<RowVec<T>> dq,
                           Eigen::Ref<RowVec<T>> dg, const Mat<T>& dout, const Mat<T>& out,
                           const RoutingSaved<T>& saved, std::span<const Mat<T>> sources,
                           const Eigen::Ref<const RowVec<T>>& q,
                           const Eigen::Ref<const RowVec<T>>& g, int H) {
  check_routing_backward_args(dsources, dout, out, saved, sources, q, g, H);
  require(dq.cols() == q.cols() && dg.cols() == g.cols(), "routing_backward",
          "dq and dg must have d = ", q.cols(), " entries");
  // dsources, sources: N × (P × d); dout, out: P × d; dq, dg, q, g: 1 × d
  const std::size_t N = sources.size();
  const Eigen::Index P = sources[0].rows(), d = sources[0].cols(), K = d / H;
  const RowVec<T> qg = q.cwiseProduct(g);
  const Eigen::Index blocks = (P + kRoutingBlock - 1) / kRoutingBlock;
  // Row b: Σ over block b's positions and all sources of dzr_i[h(c)] · S_i[p, c], where
  // dzr = r_i · dz_i; dq and dg are this times g and q (from (2)). blocks × d.
  Mat<T> partial = Mat<T>::Zero(blocks, d);
  const Eigen::Index R = sub_block_rows(N, d, P, sizeof(T));
  // D[p][h] for the R positions of a sub-block, then a[h], kp[h], dzr[h]
  Scratch<T> scratch(static_cast<std::size_t>(H) * (R + 3));

  for_each_block(blocks, worth_threads(N, P, d), [&](Eigen::Index b) {
    T* Dall = scratch.mine();
    T* a = Dall + R * H;
    T* kp = a + H;
    T* dzr = kp + H;
    T* A = partial.data() + b * d;
    const Eigen::Index b_end = std::min(P, (b + 1) * kRoutingBlock);
    for (Eigen::Index p0 = b * kRoutingBlock; p0 < b_end; p0 += R) {
      const Eigen::Index p1 = std::min(b_end, p0 + R);
      // D[h] = Σ_{c∈h} dout ⊙ out   (= Σ_j α_j[h] · a_j[h]), for each position of the sub-block
      for (Eigen::Index p = p0; p < p1; ++p)
        head_sums<T, false, false>(dout.data() + p * d, out.data() + p * d, nullptr, K, H,
                                   Dall + (p - p0) * H, nullptr);
      // Source by source, R contiguous rows at a time (one stream from memory, as the forward).
      for (std::size_t i = 0; i < N; ++i) {
        for (Eigen::Index p = p0; p < p1; ++p) {
          const T* dO = dout.data() + p * d;
          const T* D = Dall + (p - p0) * H;
          const T* S = sources[i].data() + p * d;
          const T* alpha = saved.alpha[i].data() + p * H;
          const T r = saved.rinv[i].data()[p];
          // First read of S_i's row. Per head:
          //   from (4): a_i[h] = Σ_{c∈h} dout ⊙ S_i;  from (3): dz_i = α_i ⊙ (a_i − D)
          //   from (2), (1): Σ_c u_i S_i = Σ_h dz_i[h] · kp_i[h],  kp_i[h] = Σ_{c∈h} q_c g_c S_i[c]
          head_sums<T, true, false>(S, dO, qg.data(), K, H, a, kp);
          T uS = 0;
          for (int h = 0; h < H; ++h) {
            const T dz = alpha[h] * (a[h] - D[h]);
            dzr[h] = r * dz;
            uS += dz * kp[h];
          }
          // from (1): the RMS path's coefficient (r_i³ / d) · Σ_c u_i S_i
          const T coef = r * r * r * uS / T(d);
          // Second read of S_i's row (from cache):
          //   dS_i += α_i[h(c)] · dout + r_i · u_i − coef · S_i   (value path, key path, RMS)
          //   dq, dg partial += dzr[h(c)] · S_i[c]
          T* dS = dsources[i].data() + p * d;
          for (int h = 0; h < H; ++h) {
            const T al = alpha[h], zr = dzr[h];
            Eigen::Index c = h * K;
            const Eigen::Index end = c + K;
            for (; c + kLanes <= end; c += kLanes) {
              const In<T> x(S + c);
              Out<T>(dS + c) += al * In<T>(dO + c) + zr * In<T>(qg.data() + c) - coef * x;
              Out<T>(A + c) += zr * x;
            }
            for (; c < end; ++c) {
              dS[c] += al * dO[c] + zr * qg(c) - coef * S[c];
              A[c] += zr * S[c];
            }
          }
        }
      }
    }
  });
  // The block partials in block order: the same sum whatever thread did which block.
  RowVec<T> total = RowVec<T>::Zero(d);
  for (Eigen::Index b = 0; b < blocks; ++b) total += partial.row(b);
  // from (2): dq_c += Σ_p dzr[h(c)] · g_c · S_i[c];  dg_c += Σ_p dzr[h(c)] · q_c · S_i[c]
  dq += total.cwiseProduct(g);
  dg += total.cwiseProduct(q);
}

template void routing_backward_fast<float>(std::span<Mat<float>>, Eigen::Ref<RowVec<float>>,
                                           Eigen::Ref<RowVec<float>>, const Mat<float>&,
                                           const Mat<float>&, const RoutingSaved<float>&,
                                           std::span<const Mat<float>>,
                                           const Eigen::Ref<const RowVec<float>>&,
                                           const Eigen::Ref<const RowVec<float>>&, int);
template void routing_backward_fast<double>(std::span<Mat<double>>, Eigen::Ref<RowVec<double>>,
                                            Eigen::Ref<RowVec<double>>, const Mat<double>&,
                                            const Mat<double>&, const RoutingSaved<double>&,
                                            std::span<const Mat<double>>,
                                            const Eigen::Ref<const RowVec<double>>&,
                                            const Eigen::Ref<const RowVec<double>>&, int);

}  // namespace mhar
