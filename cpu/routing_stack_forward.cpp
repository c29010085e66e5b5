/**
 * @file routing_stack_forward.cpp
 * @ingroup cpu
 * @brief F3, the routing forward of a whole attnres or mhar stack (routing_stack.h). Changes
 *        from F2 (routing_fast_forward.cpp): each source's logits at every later site are
 *        computed once, when the source is written, so a site is a softmax of saved logits and
 *        one read of each source row; and sites run in pairs that share those reads.
 *
 * The formulas are F1's (reference/routing.cpp), steps numbered (1)–(4) as there.
 *   add_source(i): per block of positions, (1) r_i for each row, and (2) per head one matrix
 *     product that gives S_i's logits at every site s ≥ i at once (the rows come from cache:
 *     the model has just written S_i);
 *   site(s): per block of positions, (3) the softmax over i of the saved logits, elementwise over
 *     the block's (position, head) entries, and (4) each output row summed over the N source
 *     rows in registers (weighted_row_sum, as F2), one read of each row.
 */
#include <type_traits>

#include "routing_blocks.h"
#include "routing_stack.h"

namespace mhar {

using namespace routing_blocks;

namespace {
/// Positions per block of F3's logits: each (block, head) is one matrix product
/// (rows × K) · (K × sites), so a block is larger than kRoutingBlock to pay for the product's
/// set-up; fixed, like kRoutingBlock, so the result never depends on the thread count.
constexpr Eigen::Index kLogitBlock = 256;
/// Rows ahead of the current position that step (4) of F3 asks the cache for.
constexpr Eigen::Index kAheadRows = 4;
template <typename T>
using ColMat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic>;  // column-major
}  // namespace

template <typename T>
RoutingStackForward<T>::RoutingStackForward(const Mat<T>& q, const Mat<T>& g, int H,
                                            std::span<RoutingSaved<T>> saved)
    : H_(H), saved_(saved) {
  const char* where = "routing stack forward";
  require(!saved.empty(), where, "needs at least one site");
  require(q.rows() == size() && g.rows() == size() && q.cols() >= 1 && g.cols() == q.cols(), where,
          "q and g must both be ", size(), " × d (one row a site), got ", q.rows(), "×", q.cols(),
          " and ", g.rows(), "×", g.cols());
  require(H >= 1 && q.cols() % H == 0, where, "H = ", H, " must divide d = ", q.cols());
  qg_ = q.cwiseProduct(g);  // row s: the key projection q ⊙ g of site s
  for (int s = 0; s < size(); ++s) {
    const std::size_t N = static_cast<std::size_t>(s) + 1;
    saved_[s].alpha.assign(N, Mat<T>());
    saved_[s].logits.assign(N, Mat<T>());
    saved_[s].rinv.assign(N, Vec<T>());
  }
  sources_.reserve(saved.size());
}

template <typename T>
void RoutingStackForward<T>::add_source(int i, const Mat<T>& S) {
  const char* where = "routing stack forward add_source";
  const int n = size();
  require(static_cast<int>(sources_.size()) < n, where, "all ", n, " sources are added already");
  require(i == static_cast<int>(sources_.size()), where, "source ", i,
          " added out of order: the next is source ", sources_.size());
  const Eigen::Index d = qg_.cols(), K = d / H_;
  require(S.rows() >= 1 && S.cols() == d, where, "source ", i, " is ", S.rows(), "×", S.cols(),
          ", must be P × d with d = ", d);
  if (i > 0)
    require(S.rows() == sources_[0]->rows(), where, "source ", i, " has ", S.rows(),
            " positions, source 0 has ", sources_[0]->rows());
  // S_i: P × d; per site s = i … n − 1 (m = s − i): z_{s,i} P × H, r_i P
  const Eigen::Index P = S.rows();
  const int H = H_;
  const int M = n - i;  // the sites that read S_i
  // W: d × M, column m is site i + m's q ⊙ g; head h's K rows of it are that head's keys.
  const ColMat<T> W = qg_.bottomRows(M).transpose();
  for (int s = i; s < n; ++s) saved_[s].logits[i].resize(P, H);
  Vec<T> r(P);
  const Eigen::Index blocks = (P + kLogitBlock - 1) / kLogitBlock;
  Scratch<T> scratch(static_cast<std::size_t>(std::min(P, kLogitBlock)) * M);  // Z: rows × M

  // Eigen runs each product below on the calling thread: inside a parallel region it never
  // starts threads of its own, and outside one the products are too small for it to (under
  // 64 K values, worth_threads). So a logit's value depends on its block (fixed by P) alone.
  for_each_block(blocks, worth_threads(M, P, d), [&](Eigen::Index b) {
    const Eigen::Index p0 = b * kLogitBlock, rows = std::min(P, p0 + kLogitBlock) - p0;
    const Eigen::Map<const Mat<T>> Sb(S.data() + p0 * d, rows, d);  // the block's rows of S_i
    // (1) r_i = 1 / sqrt( mean_c S_i² + eps )
    for (Eigen::Index p = 0; p < rows; ++p)
      r(p0 + p) = T(1) / std::sqrt(Sb.row(p).squaredNorm() / T(d) + T(kRoutingEps));
    Eigen::Map<ColMat<T>> Z(scratch.mine(), rows, M);
    for (int h = 0; h < H; ++h) {
      // (2) z_{s,i}[h] = r_i · Σ_{c∈h} S_i[c] · (q ⊙ g)_s[c] for every site s ≥ i at once:
      //     Z = (head h's columns of S_i) · (head h's rows of W), rows × M
      Z.noalias() = Sb.middleCols(h * K, K) * W.middleRows(h * K, K);
      for (int m = 0; m < M; ++m) {
        T* z = saved_[i + m].logits[i].data() + p0 * H + h;
        for (Eigen::Index p = 0; p < rows; ++p) z[p * H] = r(p0 + p) * Z(p, m);
      }
    }
  });
  for (int s = i; s < n; ++s) saved_[s].rinv[i] = r;
  sources_.push_back(&S);
}

template <typename T>
bool RoutingStackForward<T>::leads(int s) const {
  // Pairs (s, s + 1) end at the last site: followers n − 1, n − 3, …, none below 2 (a follower
  // reads two rows, its carry and its newest source, so pairing only pays from three sources).
  return s >= 1 && s + 1 < size() && (size() - 2 - s) % 2 == 0;
}

template <typename T>
void RoutingStackForward<T>::site(int s, Mat<T>& out) {
  const char* where = "routing stack forward site";
  require(s >= 0 && s < size(), where, "site ", s, " outside [0, ", size(), ")");
  require(s < static_cast<int>(sources_.size()), where, "site ", s, " reads sources 0 … ", s,
          " but ", sources_.size(), " are added");
  require(s == next_site_, where, "sites run in order: site ", s, " asked, the next is site ",
          next_site_);
  // sources 0 … s: P × d; out: P × d; α_i, z_i: P × H; carry: P × d, its m and l: P × H
  RoutingSaved<T>& sv = saved_[s];
  const std::size_t N = static_cast<std::size_t>(s) + 1;
  const Eigen::Index P = sources_[0]->rows(), d = qg_.cols(), K = d / H_;
  const int H = H_;
  const bool lead = leads(s), follow = s >= 1 && leads(s - 1);
  for (auto& a : sv.alpha) a.resize(P, H);
  out.resize(P, d);
  if (lead) {
    carry_.resize(P, d);
    carry_max_.resize(P, H);
    carry_sum_.resize(P, H);
  }
  // A leader leaves the next site's exponentials for sources 0 … s in that site's α, to be
  // scaled there (see the follower below).
  RoutingSaved<T>* next = lead ? &saved_[s + 1] : nullptr;
  if (lead)
    for (std::size_t i = 0; i < N; ++i) next->alpha[i].resize(P, H);
  const Eigen::Index blocks = (P + kRoutingBlock - 1) / kRoutingBlock;
  const std::size_t per_block = static_cast<std::size_t>(kRoutingBlock) * H;
  // m, 1 / Σ and the carry's scale for the block's (position, head) entries
  Scratch<T> scratch(3 * per_block);
  Scratch<const T*> row_ptrs(3 * N);  // row p of each source, its weights, the carry's weights

  for_each_block(blocks, worth_threads(N, P, d), [&](Eigen::Index b) {
    using Arr = Eigen::Array<T, Eigen::Dynamic, 1>;
    const Eigen::Index p0 = b * kRoutingBlock, p1 = std::min(P, p0 + kRoutingBlock);
    const Eigen::Index e = (p1 - p0) * H;  // the block's (position, head) entries, contiguous
    auto block = [&](const Mat<T>& A) { return Eigen::Map<const Arr>(A.data() + p0 * H, e); };
    auto z = [&](std::size_t i) { return block(sv.logits[i]); };
    auto alpha = [&](std::size_t i) { return Eigen::Map<Arr>(sv.alpha[i].data() + p0 * H, e); };
    T* const buf = scratch.mine();
    Eigen::Map<Arr> m(buf, e), inv(buf + per_block, e), scale(buf + 2 * per_block, e);
    // e_i = exp(z_i − m) into out, at any address the same bits (exp_in_place)
    auto exp_of_difference = [&](Eigen::Map<Arr> out, const auto& zi, const Eigen::Map<Arr>& mi) {
      out = zi - mi;
      exp_in_place(out.data(), e);
    };
    // Over i < N: mx = max_i z_i, e_i = exp(z_i − mx), sum = Σ_i e_i (a softmax before its
    // division), for the block's entries.
    auto exp_terms = [&](auto&& z_of, auto&& e_of, Eigen::Map<Arr> mx, Eigen::Map<Arr> sum) {
      mx = z_of(0);
      for (std::size_t i = 1; i < N; ++i) mx = mx.max(z_of(i));
      sum.setZero();
      for (std::size_t i = 0; i < N; ++i) {
        exp_of_difference(e_of(i), z_of(i), mx);
        sum += e_of(i);
      }
    };
    const T** rows = row_ptrs.mine();
    const T** weights = rows + N;
    const T** carry_weights = weights + N;
    const Eigen::Index ahead = kAheadRows * d;
    if (follow) {
      // The previous site left this one's sum over sources 0 … s − 1 (the carry): l' and C with
      //   C = Σ_{i<s} exp(z_i − m') · S_i,  l' = Σ_{i<s} exp(z_i − m'),  m' = max_{i<s} z_i,
      // and each exp(z_i − m') in α_i. With the newest source: m = max(m', z_s),
      // l = l' · exp(m' − m) + exp(z_s − m), and
      // (3) α_i = exp(z_i − m') · exp(m' − m) / l  (i < s),  α_s = exp(z_s − m) / l
      // (4) out = exp(m' − m) / l · C + α_s · S_s   (two rows read, not s + 1)
      const auto m_old = block(carry_max_), l_old = block(carry_sum_);
      m = m_old.max(z(s));
      scale = m_old - m;
      exp_in_place(scale.data(), e);  // exp(m' − m)
      exp_of_difference(alpha(s), z(s), m);
      inv = (l_old * scale + alpha(s)).inverse();
      alpha(s) *= inv;
      inv *= scale;  // exp(m' − m) / l: the carry's weight, and each older source's factor
      for (std::size_t i = 0; i < N - 1; ++i) alpha(i) *= inv;
      for (Eigen::Index p = p0; p < p1; ++p) {
        rows[0] = carry_.data() + p * d;
        rows[1] = sources_[s]->data() + p * d;
        weights[0] = inv.data() + (p - p0) * H;
        weights[1] = sv.alpha[s].data() + p * H;
        weighted_row_sum(out.data() + p * d, rows, 2, weights, K, H,
                         p + kAheadRows < P ? ahead : 0);
      }
      return;
    }
    // (3) α_i = exp(z_i − m) / Σ_j exp(z_j − m), m = max_j z_j, for every (p, h) of the block
    exp_terms(z, alpha, m, inv);
    inv = inv.inverse();
    for (std::size_t i = 0; i < N; ++i) alpha(i) *= inv;
    if (lead) {
      // The next site's sum over the same sources, left unnormalised for it (the carry): its
      // logits z'_i (i ≤ s) are saved already; m' = max_i z'_i, l' = Σ_i exp(z'_i − m'),
      // each exp(z'_i − m') into the next site's α_i.
      auto zn = [&](std::size_t i) { return block(next->logits[i]); };
      auto ei = [&](std::size_t i) { return Eigen::Map<Arr>(next->alpha[i].data() + p0 * H, e); };
      exp_terms(zn, ei, Eigen::Map<Arr>(carry_max_.data() + p0 * H, e),
                Eigen::Map<Arr>(carry_sum_.data() + p0 * H, e));
    }
    // (4) out[p, c] = Σ_i α_i[h(c)] · S_i[p, c]: one read of each source row, from memory;
    //     the rows kAheadRows on are asked for meanwhile. A leader sums the carry from the
    //     same reads: C[p, c] = Σ_i exp(z'_i[h(c)] − m') · S_i[p, c].
    for (Eigen::Index p = p0; p < p1; ++p) {
      for (std::size_t i = 0; i < N; ++i) {
        rows[i] = sources_[i]->data() + p * d;
        weights[i] = sv.alpha[i].data() + p * H;
      }
      if (lead) {
        for (std::size_t i = 0; i < N; ++i) carry_weights[i] = next->alpha[i].data() + p * H;
        weighted_row_sum<T, true>(out.data() + p * d, rows, N, weights, K, H,
                                  p + kAheadRows < P ? ahead : 0, carry_.data() + p * d,
                                  carry_weights);
      } else {
        weighted_row_sum(out.data() + p * d, rows, N, weights, K, H,
                         p + kAheadRows < P ? ahead : 0);
      }
    }
  });
  next_site_ = s + 1;
}

template class RoutingStackForward<float>;
template class RoutingStackForward<double>;

}  // namespace mhar
