/**
 * @file routing_blocks.h
 * @brief What CPU routing versions 2 (routing_fast.cpp), 3 and 4 (routing_stack.cpp) share:
 *        blocks of positions across OpenMP threads, sub-blocks whose rows stay in cache, per-head
 *        sums and the weighted sum of step (4) in fixed-size vector steps, and per-thread
 *        scratch. Internal to reference/.
 */
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "routing_fast.h"

#ifdef _OPENMP
#include <omp.h>
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
 * version 3's backward slower by about a tenth.
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
 * Step (4) for one position: o[c] = Σ_i w[i·H + h(c)] · rows[i][c], where rows[i] is the
 * position's row of source i (d = H·K values) and w its N × H routing weights; if kTwo, also
 * o2[c] = Σ_i w2[i·H + h(c)] · rows[i][c] from the same reads (version 4: a site's output and
 * the next site's partial sum). Column tiles of one head are summed over i in registers (four
 * independent vectors an output, so each source's multiply-adds need not wait on the last) and
 * stored once. With ahead > 0 it also asks the cache for rows[i] + ahead (a hint only: no result
 * depends on it; callers keep it inside the matrix). The order of the additions is fixed by N, K
 * and H alone. Always inlined, as head_sums.
 */
template <typename T, bool kTwo = false>
[[gnu::always_inline]] inline void weighted_row_sum(T* o, const T* const* rows, std::size_t N,
                                                    const T* w, Eigen::Index K, int H,
                                                    Eigen::Index ahead, T* o2 = nullptr,
                                                    const T* w2 = nullptr) {
  for (int h = 0; h < H; ++h) {
    Eigen::Index c = h * K;
    const Eigen::Index end = c + K;
    for (; c + 4 * kLanes <= end; c += 4 * kLanes) {
      Lanes<T> acc0 = Lanes<T>::Zero(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
      Lanes<T> two0 = acc0, two1 = acc0, two2 = acc0, two3 = acc0;
      for (std::size_t i = 0; i < N; ++i) {
        const T* S = rows[i] + c;
        const T a = w[i * H + h];
        if (ahead) prefetch_32(S + ahead);
        const In<T> x0(S), x1(S + kLanes), x2(S + 2 * kLanes), x3(S + 3 * kLanes);
        acc0 += a * x0;
        acc1 += a * x1;
        acc2 += a * x2;
        acc3 += a * x3;
        if constexpr (kTwo) {
          const T a2 = w2[i * H + h];
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
        acc += w[i * H + h] * x;
        if constexpr (kTwo) two += w2[i * H + h] * x;
      }
      Out<T>(o + c) = acc;
      if constexpr (kTwo) Out<T>(o2 + c) = two;
    }
    for (; c < end; ++c) {
      T acc = 0, two = 0;
      for (std::size_t i = 0; i < N; ++i) {
        acc += w[i * H + h] * rows[i][c];
        if constexpr (kTwo) two += w2[i * H + h] * rows[i][c];
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
 * vector one, which made version 4's weights differ between runs in the last bit.
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
/// whole number of vector steps.
template <typename T>
struct Scratch {
  std::vector<T> values;
  std::size_t n;
  explicit Scratch(std::size_t n_per_thread)
      : values(whole_lanes(n_per_thread) * max_threads()), n(whole_lanes(n_per_thread)) {}
  T* mine() { return values.data() + n * thread_id(); }
};

}  // namespace mhar::routing_blocks
