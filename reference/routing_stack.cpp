/**
 * @file routing_stack.cpp
 * @brief Routing backward, CPU version 3 (see routing_stack.h): version 2's per-pair backward,
 *        run source by source over every site that reads the source. The readable reference is
 *        routing.cpp (version 1); the loop body is version 2's (routing_fast.cpp), line for line.
 *
 * For source i, per sub-block of R positions (R rows of S_i and of dS_i stay in cache), for
 * each site s = n − 1 … i, per position: one read of S_i's row (from cache after the first
 * site) and dout_s's row (from memory) gives a_i[h] and kp_i[h]; then one more pass over the
 * same rows (from cache) adds site s's terms to dS_i and to site s's dq, dg partial sums.
 */
#include "routing_stack.h"

#include "routing_blocks.h"

namespace mhar {

using namespace routing_blocks;

template <typename T>
RoutingStackBackward<T>::RoutingStackBackward(std::span<const Mat<T>> sources, int H)
    : sources_(sources), H_(H) {
  require(!sources.empty(), "routing stack", "needs at least one source");
  P_ = sources[0].rows();
  d_ = sources[0].cols();
  require(H >= 1 && d_ % H == 0, "routing stack", "H = ", H, " must divide d = ", d_);
  for (std::size_t i = 0; i < sources.size(); ++i)
    require(sources[i].rows() == P_ && sources[i].cols() == d_, "routing stack", "source ", i,
            " is ", sources[i].rows(), "×", sources[i].cols(), ", source 0 is ", P_, "×", d_);
  blocks_ = (P_ + kRoutingBlock - 1) / kRoutingBlock;
  sites_.resize(sources.size());
  source_done_.assign(sources.size(), false);
}

template <typename T>
void RoutingStackBackward<T>::add_site(int s, Mat<T> dout, const Mat<T>& out,
                                       const RoutingSaved<T>& saved,
                                       const Eigen::Ref<const RowVec<T>>& q,
                                       const Eigen::Ref<const RowVec<T>>& g) {
  const char* where = "routing stack add_site";
  require(s >= 0 && s < size(), where, "site ", s, " outside [0, ", size(), ")");
  require(!sites_[s].added, where, "site ", s, " was already added");
  require_shape(dout, P_, d_, where, "dout");
  require_shape(out, P_, d_, where, "out");
  require_shape(q, 1, d_, where, "q");
  require_shape(g, 1, d_, where, "g");
  const std::size_t N = static_cast<std::size_t>(s) + 1;  // site s reads sources 0 … s
  require(saved.alpha.size() == N && saved.rinv.size() == N, where, "saved holds ",
          saved.alpha.size(), " sources, site ", s, " reads ", N);
  for (std::size_t i = 0; i < N; ++i) {
    require_shape(saved.alpha[i], P_, H_, where, "saved.alpha[i]");
    require(saved.rinv[i].size() == P_, where, "saved.rinv[i] must have P = ", P_, " entries");
  }
  Site& site = sites_[s];
  site.dout = std::move(dout);
  site.saved = &saved;
  site.q = q;
  site.g = g;
  site.qg = q.cwiseProduct(g);  // the key projection q ⊙ g
  site.D.resize(P_, H_);
  site.partial = Mat<T>::Zero(blocks_, d_);
  // D[p][h] = Σ_{c∈h} dout ⊙ out   (= Σ_j α_j[h] · a_j[h], the softmax's backward term)
  const Eigen::Index K = d_ / H_;
  for_each_block(blocks_, worth_threads(1, P_, d_), [&](Eigen::Index b) {
    for (Eigen::Index p = b * kRoutingBlock; p < std::min(P_, (b + 1) * kRoutingBlock); ++p)
      head_sums<T, false, false>(site.dout.data() + p * d_, out.data() + p * d_, nullptr, K, H_,
                                 site.D.data() + p * H_, nullptr);
  });
  site.added = true;
}

template <typename T>
void RoutingStackBackward<T>::source_gradient(int i, Mat<T>& dsource) {
  const char* where = "routing stack source_gradient";
  const int n = size();
  require(i >= 0 && i < n, where, "source ", i, " outside [0, ", n, ")");
  require(!source_done_[i], where, "source ", i, "'s gradient was already taken");
  for (int s = i; s < n; ++s)
    require(sites_[s].added, where, "site ", s, " reads source ", i, " but was not added yet");
  // S_i: P × d; dS_i: P × d (written); per site s ≥ i: dout_s P × d, α_i P × H, r_i P, D_s P × H
  const Mat<T>& Si = sources_[i];
  const Eigen::Index P = P_, d = d_, K = d_ / H_;
  const int H = H_;
  dsource.resize(P, d);
  // Rows of a sub-block: R rows each of S_i, dS_i and one dout_s in about 256 KB of cache.
  const Eigen::Index R = sub_block_rows(3, d, P, sizeof(T));
  Scratch<T> scratch(3 * static_cast<std::size_t>(H));  // a[h], kp[h], dzr[h]

  for_each_block(blocks_, worth_threads(n - i, P, d), [&](Eigen::Index b) {
    T* a = scratch.mine();
    T* kp = a + H;
    T* dzr = kp + H;
    const Eigen::Index b_end = std::min(P, (b + 1) * kRoutingBlock);
    for (Eigen::Index p0 = b * kRoutingBlock; p0 < b_end; p0 += R) {
      const Eigen::Index p1 = std::min(b_end, p0 + R);  // the sub-block [p0, p1)
      // Site by site, last first: the order the model's backward reaches them, so dS_i's sums
      // run in version 2's order.
      for (int s = n - 1; s >= i; --s) {
        Site& site = sites_[s];
        const T* qg = site.qg.data();
        T* A = site.partial.data() + b * d;  // this block's dq, dg partial for site s
        for (Eigen::Index p = p0; p < p1; ++p) {
          const T* dO = site.dout.data() + p * d;
          const T* D = site.D.data() + p * H;
          const T* S = Si.data() + p * d;
          const T* alpha = site.saved->alpha[i].data() + p * H;
          const T r = site.saved->rinv[i].data()[p];
          // First read of the rows. Per head:
          //   from (4): a_i[h] = Σ_{c∈h} dout ⊙ S_i;  from (3): dz_i = α_i ⊙ (a_i − D)
          //   from (2), (1): Σ_c u_i S_i = Σ_h dz_i[h] · kp_i[h],  kp_i[h] = Σ_{c∈h} q_c g_c S_i[c]
          head_sums<T, true, false>(S, dO, qg, K, H, a, kp);
          T uS = 0;
          for (int h = 0; h < H; ++h) {
            const T dz = alpha[h] * (a[h] - D[h]);
            dzr[h] = r * dz;
            uS += dz * kp[h];
          }
          // from (1): the RMS path's coefficient (r_i³ / d) · Σ_c u_i S_i
          const T coef = r * r * r * uS / T(d);
          // Second pass over the rows (from cache):
          //   dS_i += α_i[h(c)] · dout + r_i · u_i − coef · S_i   (value path, key path, RMS)
          //   dq, dg partial += dzr[h(c)] · S_i[c]
          // The last site writes dS_i (as adding to zero would), the others add to it.
          T* dS = dsource.data() + p * d;
          const bool first = s == n - 1;
          for (int h = 0; h < H; ++h) {
            const T al = alpha[h], zr = dzr[h];
            Eigen::Index c = h * K;
            const Eigen::Index end = c + K;
            for (; c + kLanes <= end; c += kLanes) {
              const In<T> x(S + c);
              if (first)
                Out<T>(dS + c) = al * In<T>(dO + c) + zr * In<T>(qg + c) - coef * x;
              else
                Out<T>(dS + c) += al * In<T>(dO + c) + zr * In<T>(qg + c) - coef * x;
              Out<T>(A + c) += zr * x;
            }
            for (; c < end; ++c) {
              const T term = al * dO[c] + zr * qg[c] - coef * S[c];
              dS[c] = first ? term : dS[c] + term;
              A[c] += zr * S[c];
            }
          }
        }
      }
    }
  });
  source_done_[i] = true;
}

template <typename T>
void RoutingStackBackward<T>::parameter_gradients(Eigen::Ref<Mat<T>> dq,
                                                  Eigen::Ref<Mat<T>> dg) const {
  const char* where = "routing stack parameter_gradients";
  require_shape(dq, size(), d_, where, "dq");
  require_shape(dg, size(), d_, where, "dg");
  for (int i = 0; i < size(); ++i)
    require(source_done_[i], where, "source ", i, "'s gradient was not taken yet");
  for (int s = 0; s < size(); ++s) {
    // The block partials in block order: the same sum whatever thread did which block.
    RowVec<T> total = RowVec<T>::Zero(d_);
    for (Eigen::Index b = 0; b < blocks_; ++b) total += sites_[s].partial.row(b);
    // from (2): dq_c += Σ_p dzr[h(c)] · g_c · S_i[c];  dg_c += Σ_p dzr[h(c)] · q_c · S_i[c]
    dq.row(s) += total.cwiseProduct(sites_[s].g);
    dg.row(s) += total.cwiseProduct(sites_[s].q);
  }
}

template class RoutingStackBackward<float>;
template class RoutingStackBackward<double>;

}  // namespace mhar
