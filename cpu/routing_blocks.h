/**
 * @file routing_blocks.h
 * @ingroup cpu
 * @brief What the fast CPU routing versions F2, B2 (routing_fast_*.cpp), F3 and B3
 *        (routing_stack_*.cpp) share: blocks of positions across OpenMP threads, sub-blocks whose
 *        rows stay in cache, per-head sums and the weighted sum of step (4) in fixed-size vector
 *        steps (AVX intrinsics where the build has them), and per-thread scratch. Internal to
 *        cpu/.
 */
#pragma once

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "routing_fast.h"

#ifdef _OPENMP
#include <omp.h>
#endif
#ifdef __AVX__
#include <immintrin.h>
#endif

namespace mhar::routing_blocks {

/// Run the block loop on threads only when there is enough work to pay for waking them
/// (about 64 K source values). Only the speed depends on this, never the result.
inline bool worth_threads(std::size_t N, Eigen::Index P, Eigen::Index d) {
  return static_cast<double>(N) * static_cast<double>(P) * static_cast<double>(d) >= 65536.0;
}

inline int max_threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}
inline int thread_id() {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}

/// f(b) for every block b: on OpenMP threads, blocks split statically, when `parallel`; else in a
/// plain loop, because entering an OpenMP region costs a system call even on one thread (the
/// decode step routes one position per site, 2L + 1 times a byte). The result is the same.
template <typename F>
void for_each_block(Eigen::Index blocks, bool parallel, F&& f) {
  if (parallel) {
#pragma omp parallel for schedule(static)
    for (Eigen::Index b = 0; b < blocks; ++b) f(b);
  } else {
    for (Eigen::Index b = 0; b < blocks; ++b) f(b);
  }
}

/// Values per vector step: one AVX register of floats (two of doubles).
inline constexpr int kLanes = 8;
template <typename T>
using Lanes = Eigen::Matrix<T, kLanes, 1>;
template <typename T>
using In = Eigen::Map<const Lanes<T>>;  // kLanes values read from memory (any alignment)
template <typename T>
using Out = Eigen::Map<Lanes<T>>;

/// Rows of a sub-block: as many positions as keep their N source rows in about 256 KB of cache
/// (1 … kRoutingBlock), and no more than the P there are (so the per-position scratch of one
/// decode step is one row, not kRoutingBlock). Fixed by N, d, P and the scalar's size alone;
/// a block of P < kRoutingBlock positions is one sub-block either way.
inline Eigen::Index sub_block_rows(std::size_t N, Eigen::Index d, Eigen::Index P,
                                   std::size_t scalar_bytes) {
  const auto rows = static_cast<Eigen::Index>((256 * 1024) / (N * d * scalar_bytes));
  return std::clamp<Eigen::Index>(rows, 1, std::min(P, kRoutingBlock));
}

/// Asks the cache for the 32 values at x (two 64-byte lines of floats, four of doubles) ahead of
/// their use; a hint only, so no result depends on it. Callers keep x inside the matrix.
template <typename T>
inline void prefetch_32(const T* x) {
  const char* bytes = reinterpret_cast<const char*>(x);
  for (std::size_t k = 0; k < 32 * sizeof(T); k += 64) __builtin_prefetch(bytes + k, 0, 3);
}

/// Rounds n up to a whole number of vector steps.
inline std::size_t whole_lanes(std::size_t n) {
  return (n + kLanes - 1) / kLanes * kLanes;
}

/**
 * Per-head sums over one row, in one read of x (head h = columns [h·K, (h+1)·K)):
 *   xy[h] = Σ_{c∈h} x[c] · y[c];   if kTwo, also xw[h] = Σ_{c∈h} x[c] · w[c];
 *   if kSquares, returns Σ_c x[c]² over the whole row (else 0).
 * Each sum runs as four vectors of partial sums, added at the end. A plain running sum does not
 * vectorise without -ffast-math (it fixes the order of the additions), and a single vector of
 * partial sums waits on itself (each add needs the one before); four keep the adders busy. The
 * order of every addition is fixed by K and H alone, never by timing or threads. Always inlined:
 * it runs once a row, and once a third caller appeared GCC stopped inlining it, which made
 * B3 slower by about a tenth.
 */
template <typename T, bool kTwo, bool kSquares>
[[gnu::always_inline]] inline T head_sums(const T* x, const T* y, const T* w, Eigen::Index K, int H,
                                          T* xy, T* xw) {
  Lanes<T> s0 = Lanes<T>::Zero(), s1 = s0, s2 = s0, s3 = s0;  // Σ x², over all heads
  T s_tail = 0;
  for (int h = 0; h < H; ++h) {
    Lanes<T> a0 = Lanes<T>::Zero(), a1 = a0, a2 = a0, a3 = a0;
    Lanes<T> b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    T a_tail = 0, b_tail = 0;
    Eigen::Index c = h * K;
    const Eigen::Index end = c + K;
    for (; c + 4 * kLanes <= end; c += 4 * kLanes) {
      const In<T> x0(x + c), x1(x + c + kLanes), x2(x + c + 2 * kLanes), x3(x + c + 3 * kLanes);
      a0 += x0.cwiseProduct(In<T>(y + c));
      a1 += x1.cwiseProduct(In<T>(y + c + kLanes));
      a2 += x2.cwiseProduct(In<T>(y + c + 2 * kLanes));
      a3 += x3.cwiseProduct(In<T>(y + c + 3 * kLanes));
      if constexpr (kTwo) {
        b0 += x0.cwiseProduct(In<T>(w + c));
        b1 += x1.cwiseProduct(In<T>(w + c + kLanes));
        b2 += x2.cwiseProduct(In<T>(w + c + 2 * kLanes));
        b3 += x3.cwiseProduct(In<T>(w + c + 3 * kLanes));
      }
      if constexpr (kSquares) {
        s0 += x0.cwiseProduct(x0);
        s1 += x1.cwiseProduct(x1);
        s2 += x2.cwiseProduct(x2);
        s3 += x3.cwiseProduct(x3);
      }
    }
    for (; c + kLanes <= end; c += kLanes) {
      const In<T> x0(x + c);
      a0 += x0.cwiseProduct(In<T>(y + c));
      if constexpr (kTwo) b0 += x0.cwiseProduct(In<T>(w + c));
      if constexpr (kSquares) s0 += x0.cwiseProduct(x0);
    }
    for (; c < end; ++c) {
      a_tail += x[c] * y[c];
      if constexpr (kTwo) b_tail += x[c] * w[c];
      if constexpr (kSquares) s_tail += x[c] * x[c];
    }
    xy[h] = ((a0 + a1) + (a2 + a3)).sum() + a_tail;
    if constexpr (kTwo) xw[h] = ((b0 + b1) + (b2 + b3)).sum() + b_tail;
  }
  return kSquares ? ((s0 + s1) + (s2 + s3)).sum() + s_tail : T(0);
}

/**
 * Per-head partial sums over one row, in one read of x: the kLanes values at v + h·kLanes hold
 * Σ_{c∈h} x[c] · y[c] spread over the lanes of one vector, and tail[h] the columns past the
 * head's last whole vector (0 when K is a multiple of kLanes): the sum is their lanes' sum plus
 * tail[h]. Leaving the horizontal
 * sums to lane_sums, which does eight of them at once, is what makes this cheaper than head_sums
 * for a batch of rows. The order of the additions is fixed by K and H alone.
 */
template <typename T, int kVectors>
[[gnu::always_inline]] inline void head_vectors_fixed(const T* x, const T* y, int H, T* v, T* tail) {
  // K = kVectors whole vectors: the same sums as the loop below, unrolled by the compiler
  for (int h = 0; h < H; ++h, x += kVectors * kLanes, y += kVectors * kLanes) {
    Lanes<T> acc = In<T>(x).cwiseProduct(In<T>(y));
    for (int j = 1; j < kVectors; ++j)
      acc += In<T>(x + j * kLanes).cwiseProduct(In<T>(y + j * kLanes));
    Out<T>(v + h * kLanes) = acc;
    tail[h] = 0;
  }
}

template <typename T>
[[gnu::always_inline]] inline void head_vectors(const T* x, const T* y, Eigen::Index K, int H,
                                                T* v, T* tail) {
  // The usual head widths, with loops the compiler unrolls (a tenth of B3 at d = 128, H = 4);
  // every other K takes the loop, with the same order of additions.
  switch (K) {
    case kLanes: return head_vectors_fixed<T, 1>(x, y, H, v, tail);
    case 2 * kLanes: return head_vectors_fixed<T, 2>(x, y, H, v, tail);
    case 4 * kLanes: return head_vectors_fixed<T, 4>(x, y, H, v, tail);
    case 8 * kLanes: return head_vectors_fixed<T, 8>(x, y, H, v, tail);
    case 16 * kLanes: return head_vectors_fixed<T, 16>(x, y, H, v, tail);
    default: break;
  }
  const Eigen::Index whole = K / kLanes * kLanes;  // the head's columns in whole vectors
  for (int h = 0; h < H; ++h) {
    const T* xh = x + h * K;
    const T* yh = y + h * K;
    // One vector of sums a head: the heads (and the rows of a batch) are independent, so the
    // core overlaps their chains without more accumulators.
    Lanes<T> acc = Lanes<T>::Zero();
    for (Eigen::Index c = 0; c < whole; c += kLanes) acc += In<T>(xh + c).cwiseProduct(In<T>(yh + c));
    T t = 0;
    for (Eigen::Index c = whole; c < K; ++c) t += xh[c] * yh[c];
    Out<T>(v + h * kLanes) = acc;
    tail[h] = t;
  }
}

/**
 * s[j] = (sum of the kLanes values at v + j·kLanes) + tail[j] for j < n (head_vectors' output). With AVX and floats, eight vectors at a time
 * are summed as one transposed reduction (three rounds of pairwise sums, nine instructions for
 * eight sums, against about six for each sum alone); otherwise, and for the last n mod 8, one
 * vector at a time. Which of the two sums an entry gets depends on n and j alone.
 */
template <typename T>
inline void lane_sums(const T* v, const T* tail, Eigen::Index n, T* s) {
  Eigen::Index j = 0;
#ifdef __AVX__
  if constexpr (std::is_same_v<T, float>) {
    for (; j + 8 <= n; j += 8) {
      auto ld = [&](Eigen::Index k) { return _mm256_loadu_ps(v + (j + k) * kLanes); };
      // pairwise sums: after three rounds, lane l of lo holds vector l's lanes 0–3 summed and
      // lane l of hi its lanes 4–7
      const __m256 t0 = _mm256_hadd_ps(ld(0), ld(1)), t1 = _mm256_hadd_ps(ld(2), ld(3));
      const __m256 t2 = _mm256_hadd_ps(ld(4), ld(5)), t3 = _mm256_hadd_ps(ld(6), ld(7));
      const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
      const __m256 lo = _mm256_permute2f128_ps(u0, u1, 0x20);
      const __m256 hi = _mm256_permute2f128_ps(u0, u1, 0x31);
      _mm256_storeu_ps(s + j, _mm256_add_ps(_mm256_add_ps(lo, hi), _mm256_loadu_ps(tail + j)));
    }
  }
#endif
  for (; j < n; ++j) s[j] = In<T>(v + j * kLanes).sum() + tail[j];
}

/**
 * Step (4) for one position: o[c] = Σ_i w[i][h(c)] · rows[i][c], where rows[i] is the
 * position's row of source i (d = H·K values) and w[i] its H routing weights there; if kTwo,
 * also o2[c] = Σ_i w2[i][h(c)] · rows[i][c] from the same reads (F3: a site's output and
 * the next site's partial sum). Column tiles of one head are summed over i in registers (four
 * independent vectors an output, so each source's multiply-adds need not wait on the last) and
 * stored once. With ahead > 0 it also asks the cache for rows[i] + ahead (a hint only: no result
 * depends on it; callers keep it inside the matrix). The order of the additions is fixed by N, K
 * and H alone. Always inlined, as head_sums.
 */
template <typename T, bool kTwo = false>
[[gnu::always_inline]] inline void weighted_row_sum(T* o, const T* const* rows, std::size_t N,
                                                    const T* const* w, Eigen::Index K, int H,
                                                    Eigen::Index ahead, T* o2 = nullptr,
                                                    const T* const* w2 = nullptr) {
  for (int h = 0; h < H; ++h) {
    Eigen::Index c = h * K;
    const Eigen::Index end = c + K;
    for (; c + 4 * kLanes <= end; c += 4 * kLanes) {
      Lanes<T> acc0 = Lanes<T>::Zero(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
      Lanes<T> two0 = acc0, two1 = acc0, two2 = acc0, two3 = acc0;
      for (std::size_t i = 0; i < N; ++i) {
        const T* S = rows[i] + c;
        const T a = w[i][h];
        if (ahead) prefetch_32(S + ahead);
        const In<T> x0(S), x1(S + kLanes), x2(S + 2 * kLanes), x3(S + 3 * kLanes);
        acc0 += a * x0;
        acc1 += a * x1;
        acc2 += a * x2;
        acc3 += a * x3;
        if constexpr (kTwo) {
          const T a2 = w2[i][h];
          two0 += a2 * x0;
          two1 += a2 * x1;
          two2 += a2 * x2;
          two3 += a2 * x3;
        }
      }
      Out<T>(o + c) = acc0;
      Out<T>(o + c + kLanes) = acc1;
      Out<T>(o + c + 2 * kLanes) = acc2;
      Out<T>(o + c + 3 * kLanes) = acc3;
      if constexpr (kTwo) {
        Out<T>(o2 + c) = two0;
        Out<T>(o2 + c + kLanes) = two1;
        Out<T>(o2 + c + 2 * kLanes) = two2;
        Out<T>(o2 + c + 3 * kLanes) = two3;
      }
    }
    for (; c + kLanes <= end; c += kLanes) {
      Lanes<T> acc = Lanes<T>::Zero(), two = acc;
      for (std::size_t i = 0; i < N; ++i) {
        const In<T> x(rows[i] + c);
        acc += w[i][h] * x;
        if constexpr (kTwo) two += w2[i][h] * x;
      }
      Out<T>(o + c) = acc;
      if constexpr (kTwo) Out<T>(o2 + c) = two;
    }
    for (; c < end; ++c) {
      T acc = 0, two = 0;
      for (std::size_t i = 0; i < N; ++i) {
        acc += w[i][h] * rows[i][c];
        if constexpr (kTwo) two += w2[i][h] * rows[i][c];
      }
      o[c] = acc;
      if constexpr (kTwo) o2[c] = two;
    }
  }
}

/**
 * x[k] = exp(x[k]) for k < n, in vector steps only, the last one padded. So an entry's value
 * depends on its input alone, never on its address: Eigen's own loops over a Map begin with
 * scalar steps up to the first aligned address, and its scalar exp rounds differently from its
 * vector one, which made F3's weights differ between runs in the last bit.
 */
template <typename T>
inline void exp_in_place(T* x, Eigen::Index n) {
  Eigen::Index k = 0;
  for (; k + kLanes <= n; k += kLanes) Out<T>(x + k) = In<T>(x + k).array().exp().matrix();
  if (k < n) {
    Lanes<T> t = Lanes<T>::Zero();
    std::copy(x + k, x + n, t.data());
    t = t.array().exp().matrix();
    std::copy_n(t.data(), n - k, x + k);
  }
}

/// Per-thread scratch, allocated before the parallel loop (so a failed allocation is an
/// ordinary exception, not a crash inside an OpenMP region): n values for each thread, n a
/// whole number of vector steps. Aligned as Eigen aligns its own matrices, so an Eigen loop over
/// a Map into it starts its vector steps at the same offset on every run (where its scalar and
/// vector steps could round differently, the bits would otherwise depend on where malloc put it).
template <typename T>
struct Scratch {
  std::vector<T, Eigen::aligned_allocator<T>> values;
  std::size_t n;
  explicit Scratch(std::size_t n_per_thread)
      : values(whole_lanes(n_per_thread) * max_threads()), n(whole_lanes(n_per_thread)) {}
  T* mine() { return values.data() + n * thread_id(); }
};

}  // namespace mhar::routing_blocks
