/**
 * @file routing_fast_forward.cpp
 * @ingroup cpu
 * @brief F2, the routing forward at one site (routing_fast.h). Changes from F1
 *        (reference/routing.cpp): the loop over positions is outermost, a few positions at a
 *        time, so each source row comes from memory once instead of once a step; blocks of
 *        positions run on OpenMP threads.
 *
 * F1 runs each step over all P positions, so every step streams all N sources from
 * memory again. Here the loop over positions is outermost, in sub-blocks of R positions whose
 * N · R source rows fit in about 256 KB of cache (R = 1 … 32, sub_block_rows). Within a
 * sub-block, the first pass reads one source at a time, R contiguous rows of it (one stream
 * from memory, which the hardware prefetcher follows; reading row p of all N sources at once
 * is N streams, and N = 25 of them left the forward at half the copy speed). The second pass
 * re-reads the rows from cache. The formulas are F1's, step for step; their numbers
 * (1)–(4) match routing.cpp.
 *
 * Row p of a row-major P × d matrix is d contiguous values; head h is its segment [h·K, (h+1)·K).
 *
 * What keeps it at memory speed rather than arithmetic speed (docs/benchmarks.md has the numbers):
 *   - every sum over columns (RMS, logits) and every column tile of step (4) runs as four
 *     independent vectors, so the multiply-adds overlap instead of waiting on each other;
 *   - a position's N · H logits sit in one small array, padded to whole vectors, so step (3)'s
 *     exp is one vector call per 8 values and its divisions are one per head;
 *   - the loops read rows through raw pointers in fixed-size vector steps (Eigen's fixed-size
 *     maps): no per-row size checks or alignment prologues.
 */
#include "routing_blocks.h"
#include "routing_fast.h"

namespace mhar {

using namespace routing_blocks;

template <typename T>
void routing_forward_fast(Mat<T>& out, RoutingSaved<T>& saved, std::span<const Mat<T>> sources,
                          const Eigen::Ref<const RowVec<T>>& q,
                          const Eigen::Ref<const RowVec<T>>& g, int H) {
  check_routing_args(sources, q, g, H);
  // sources: N × (P × d); q, g: 1 × d; out: P × d; α_i: P × H; r_i: P
  const std::size_t N = sources.size();
  const Eigen::Index P = sources[0].rows(), d = sources[0].cols(), K = d / H;
  const RowVec<T> qg = q.cwiseProduct(g);  // the key projection q ⊙ g
  saved.alpha.resize(N);
  saved.logits.resize(N);
  saved.rinv.resize(N);
  for (std::size_t i = 0; i < N; ++i) {
    saved.alpha[i].resize(P, H);
    saved.logits[i].resize(P, H);
    saved.rinv[i].resize(P);
  }
  out.resize(P, d);
  const Eigen::Index blocks = (P + kRoutingBlock - 1) / kRoutingBlock;
  const std::size_t NH = N * static_cast<std::size_t>(H);
  // Position p's z_i[h], then α_i[h], at w_p[i·H + h]; each position's N·H values are padded with
  // zeros to a whole number of vector steps, so the exp of step (3) runs as vectors only.
  const std::size_t NHp = whole_lanes(NH);
  const Eigen::Index R = sub_block_rows(N, d, P, sizeof(T));
  Scratch<T> scratch(NHp * R);  // R positions' w_p

  Scratch<const T*> row_ptrs(2 * N);  // row p of each source and its weights, for step (4)

  for_each_block(blocks, worth_threads(N, P, d), [&](Eigen::Index b) {
    T* const w0 = scratch.mine();
    const T** rows = row_ptrs.mine();
    const T** weights = rows + N;
    const Eigen::Index b_end = std::min(P, (b + 1) * kRoutingBlock);
    for (Eigen::Index p0 = b * kRoutingBlock; p0 < b_end; p0 += R) {
      const Eigen::Index p1 = std::min(b_end, p0 + R);  // the sub-block [p0, p1)
      // The one read of each source from memory, R contiguous rows at a time: steps (1), (2).
      for (std::size_t i = 0; i < N; ++i) {
        for (Eigen::Index p = p0; p < p1; ++p) {
          const T* S = sources[i].data() + p * d;  // row p of S_i
          T* z = w0 + (p - p0) * NHp + i * H;
          // kp[h] = Σ_{c∈h} S_i[c] · (q ⊙ g)_c into z[h], and Σ_c S_i[c]², in one read
          const T ss = head_sums<T, false, true>(S, qg.data(), nullptr, K, H, z, nullptr);
          // (1) r_i = 1 / sqrt( mean_c S_i² + eps )
          const T r = T(1) / std::sqrt(ss / T(d) + T(kRoutingEps));
          saved.rinv[i].data()[p] = r;
          // (2) z_i[h] = r_i · kp[h]
          for (int h = 0; h < H; ++h) z[h] *= r;
          std::copy_n(z, H, saved.logits[i].data() + p * H);
        }
      }
      for (Eigen::Index p = p0; p < p1; ++p) {
        T* w = w0 + (p - p0) * NHp;
        // (3) α_i[h] = exp(z_i[h] − m[h]) / Σ_j exp(z_j[h] − m[h]),  m[h] = max_j z_j[h]
        for (int h = 0; h < H; ++h) {
          T m = w[h];
          for (std::size_t i = 1; i < N; ++i) m = std::max(m, w[i * H + h]);
          for (std::size_t i = 0; i < N; ++i) w[i * H + h] -= m;
        }
        std::fill(w + NH, w + NHp, T(0));  // the padding, never read: exp(0) = 1
        exp_in_place(w, static_cast<Eigen::Index>(NHp));
        for (int h = 0; h < H; ++h) {
          T sum = 0;
          for (std::size_t i = 0; i < N; ++i) sum += w[i * H + h];
          const T inv = T(1) / sum;
          for (std::size_t i = 0; i < N; ++i) w[i * H + h] *= inv;
        }
        for (std::size_t i = 0; i < N; ++i)
          std::copy_n(w + i * H, H, saved.alpha[i].data() + p * H);
        // (4) out[p, c] = Σ_i α_i[h(c)] · S_i[p, c]   (the sub-block's rows are still in cache)
        // While this pass works from cache, ask for the next sub-block's rows (R rows on, the
        // same columns), so the next first pass finds them on their way: 2 lines per 32 values.
        for (std::size_t i = 0; i < N; ++i) {
          rows[i] = sources[i].data() + p * d;
          weights[i] = saved.alpha[i].data() + p * H;
        }
        weighted_row_sum(out.data() + p * d, rows, N, weights, K, H, p + R < P ? R * d : 0);
      }
    }
  });
}

template void routing_forward_fast<float>(Mat<float>&, RoutingSaved<float>&,
                                          std::span<const Mat<float>>,
                                          const Eigen::Ref<const RowVec<float>>&,
                                          const Eigen::Ref<const RowVec<float>>&, int);
template void routing_forward_fast<double>(Mat<double>&, RoutingSaved<double>&,
                                           std::span<const Mat<double>>,
                                           const Eigen::Ref<const RowVec<double>>&,
                                           const Eigen::Ref<const RowVec<double>>&, int);

}  // namespace mhar
