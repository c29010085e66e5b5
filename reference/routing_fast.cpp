/**
 * @file routing_fast.cpp
 * @brief Depth routing, CPU version 2: docs/design.md §1 one position at a time, blocks of
 *        positions across OpenMP threads. The readable reference is routing.cpp (version 1).
 *
 * Version 1 runs each step over all P positions, so every step streams all N sources from
 * memory again. Here the loop over positions is outermost: a position's N source rows
 * (N · d values, 50 KB at N = 25, d = 512) are read from memory once and re-read from cache.
 * The formulas are version 1's, step for step; their numbers (1)–(4) match routing.cpp.
 *
 * Row p of a row-major P × d matrix is d contiguous values; head h is its segment [h·K, (h+1)·K).
 */
#include "routing_fast.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace mhar {

namespace {

/// Run the block loop on threads only when there is enough work to pay for waking them
/// (about 64 K source values). Only the speed depends on this, never the result.
bool worth_threads(std::size_t N, Eigen::Index P, Eigen::Index d) {
  return static_cast<double>(N) * static_cast<double>(P) * static_cast<double>(d) >= 65536.0;
}

/// Values per partial sum: one AVX register of floats.
constexpr int kLanes = 8;
template <typename T>
using Lanes = Eigen::Matrix<T, kLanes, 1>;

// The sums below run as kLanes partial sums added at the end. A plain running sum does not
// vectorise without -ffast-math (it fixes the order of additions); these do, and their order is
// still fixed by the shapes alone, never by timing. One call does all heads of one row.

/// Σ_{c<d} x[c] · y[c] (d = H · K), for D = ⟨dout, out⟩ per head: xy[h].
template <typename T>
void head_dots(const T* x, const T* y, Eigen::Index K, int H, T* xy) {
  for (int h = 0; h < H; ++h) {
    Lanes<T> a = Lanes<T>::Zero();
    T tail = 0;
    Eigen::Index c = h * K;
    for (; c + kLanes <= (h + 1) * K; c += kLanes)
      a += Eigen::Map<const Lanes<T>>(x + c).cwiseProduct(Eigen::Map<const Lanes<T>>(y + c));
    for (; c < (h + 1) * K; ++c) tail += x[c] * y[c];
    xy[h] = a.sum() + tail;
  }
}

/// In one read of the row S: returns Σ_c S[c]², and sets Sw[h] = Σ_{c∈h} S[c] · w[c].
template <typename T>
T sumsq_and_head_dots(const T* S, const T* w, Eigen::Index K, int H, T* Sw) {
  Lanes<T> ss = Lanes<T>::Zero();
  T ss_tail = 0;
  for (int h = 0; h < H; ++h) {
    Lanes<T> a = Lanes<T>::Zero();
    T tail = 0;
    Eigen::Index c = h * K;
    for (; c + kLanes <= (h + 1) * K; c += kLanes) {
      const Eigen::Map<const Lanes<T>> x(S + c);
      ss += x.cwiseProduct(x);
      a += x.cwiseProduct(Eigen::Map<const Lanes<T>>(w + c));
    }
    for (; c < (h + 1) * K; ++c) {
      ss_tail += S[c] * S[c];
      tail += S[c] * w[c];
    }
    Sw[h] = a.sum() + tail;
  }
  return ss.sum() + ss_tail;
}

/// In one read of the row S: Sy[h] = Σ_{c∈h} S[c] · y[c] and Sw[h] = Σ_{c∈h} S[c] · w[c].
template <typename T>
void head_dots2(const T* S, const T* y, const T* w, Eigen::Index K, int H, T* Sy, T* Sw) {
  for (int h = 0; h < H; ++h) {
    Lanes<T> a = Lanes<T>::Zero(), b = Lanes<T>::Zero();
    T ta = 0, tb = 0;
    Eigen::Index c = h * K;
    for (; c + kLanes <= (h + 1) * K; c += kLanes) {
      const Eigen::Map<const Lanes<T>> x(S + c);
      a += x.cwiseProduct(Eigen::Map<const Lanes<T>>(y + c));
      b += x.cwiseProduct(Eigen::Map<const Lanes<T>>(w + c));
    }
    for (; c < (h + 1) * K; ++c) {
      ta += S[c] * y[c];
      tb += S[c] * w[c];
    }
    Sy[h] = a.sum() + ta;
    Sw[h] = b.sum() + tb;
  }
}

}  // namespace

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
  saved.rinv.resize(N);
  for (std::size_t i = 0; i < N; ++i) {
    saved.alpha[i].resize(P, H);
    saved.rinv[i].resize(P);
  }
  out.resize(P, d);
  const Eigen::Index blocks = (P + kRoutingBlock - 1) / kRoutingBlock;

#pragma omp parallel for schedule(static) if (worth_threads(N, P, d))
  for (Eigen::Index b = 0; b < blocks; ++b) {
    Mat<T> w(H, N);  // z_i[h], then α_i[h], of one position: H × N (a head's N values in a row)
    Vec<T> kp(H);
    const Eigen::Index p_end = std::min(P, (b + 1) * kRoutingBlock);
    for (Eigen::Index p = b * kRoutingBlock; p < p_end; ++p) {
      // The one read of each source row from memory: steps (1) and (2).
      for (std::size_t i = 0; i < N; ++i) {
        // kp[h] = Σ_{c∈h} S_i[c] · (q ⊙ g)_c, and Σ_c S_i[c]², in one read of the row
        const T ss = sumsq_and_head_dots(sources[i].row(p).data(), qg.data(), K, H, kp.data());
        // (1) r_i = 1 / sqrt( mean_c S_i² + eps )
        const T r = T(1) / std::sqrt(ss / T(d) + T(kRoutingEps));
        saved.rinv[i](p) = r;
        // (2) z_i[h] = r_i · Σ_{c∈h} S_i[c] · (q ⊙ g)_c
        w.col(i) = r * kp;
      }
      // (3) α_i[h] = exp(z_i[h] − m[h]) / Σ_j exp(z_j[h] − m[h]),  m[h] = max_j z_j[h]
      for (int h = 0; h < H; ++h) {
        auto zh = w.row(h);
        zh = (zh.array() - zh.maxCoeff()).exp().matrix();
        zh /= zh.sum();
      }
      // (4) out[p, c] = Σ_i α_i[h(c)] · S_i[p, c]   (the rows are still in cache)
      // In tiles of kLanes columns of one head, summed over i in registers, stored once.
      T* o = out.row(p).data();
      for (int h = 0; h < H; ++h) {
        Eigen::Index c = h * K;
        for (; c + kLanes <= (h + 1) * K; c += kLanes) {
          Lanes<T> acc = Lanes<T>::Zero();
          for (std::size_t i = 0; i < N; ++i)
            acc += w(h, i) * Eigen::Map<const Lanes<T>>(sources[i].row(p).data() + c);
          Eigen::Map<Lanes<T>>(o + c) = acc;
        }
        for (; c < (h + 1) * K; ++c) {
          T acc = 0;
          for (std::size_t i = 0; i < N; ++i) acc += w(h, i) * sources[i](p, c);
          o[c] = acc;
        }
      }
      for (std::size_t i = 0; i < N; ++i) saved.alpha[i].row(p) = w.col(i).transpose();
    }
  }
}

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
  Mat<T> partial(blocks, d);

#pragma omp parallel for schedule(static) if (worth_threads(N, P, d))
  for (Eigen::Index b = 0; b < blocks; ++b) {
    RowVec<T> D(H), dzr(H), a(H), kp(H);
    auto acc = partial.row(b);
    acc.setZero();
    const Eigen::Index p_end = std::min(P, (b + 1) * kRoutingBlock);
    for (Eigen::Index p = b * kRoutingBlock; p < p_end; ++p) {
      const T* dO = dout.row(p).data();
      const T* O = out.row(p).data();
      // D[h] = Σ_{c∈h} dout ⊙ out   (= Σ_j α_j[h] · a_j[h])
      head_dots(dO, O, K, H, D.data());
      for (std::size_t i = 0; i < N; ++i) {
        const T* S = sources[i].row(p).data();
        const auto alpha = saved.alpha[i].row(p);
        const T r = saved.rinv[i](p);
        // First read of S_i's row. Per head:
        //   from (4): a_i[h] = Σ_{c∈h} dout ⊙ S_i;  from (3): dz_i = α_i ⊙ (a_i − D)
        //   from (2), (1): Σ_c u_i S_i = Σ_h dz_i[h] · kp_i[h],  kp_i[h] = Σ_{c∈h} q_c g_c S_i[c]
        head_dots2(S, dO, qg.data(), K, H, a.data(), kp.data());
        T uS = 0;
        for (int h = 0; h < H; ++h) {
          const T dz = alpha(h) * (a(h) - D(h));
          dzr(h) = r * dz;
          uS += dz * kp(h);
        }
        // from (1): the RMS path's coefficient (r_i³ / d) · Σ_c u_i S_i
        const T coef = r * r * r * uS / T(d);
        // Second read of S_i's row (from cache):
        //   dS_i += α_i[h(c)] · dout + r_i · u_i − coef · S_i   (value path, key path, RMS)
        //   dq, dg partial += dzr[h(c)] · S_i[c]
        T* dS = dsources[i].row(p).data();
        T* A = acc.data();
        for (int h = 0; h < H; ++h) {
          const T al = alpha(h), zr = dzr(h);
          for (Eigen::Index c = h * K; c < (h + 1) * K; ++c) {
            dS[c] += al * dO[c] + zr * qg(c) - coef * S[c];
            A[c] += zr * S[c];
          }
        }
      }
    }
  }
  // The block partials in block order: the same sum whatever thread did which block.
  RowVec<T> total = RowVec<T>::Zero(d);
  for (Eigen::Index b = 0; b < blocks; ++b) total += partial.row(b);
  // from (2): dq_c += Σ_p dzr[h(c)] · g_c · S_i[c];  dg_c += Σ_p dzr[h(c)] · q_c · S_i[c]
  dq += total.cwiseProduct(g);
  dg += total.cwiseProduct(q);
}

#define MHAR_INSTANTIATE(T)                                                                 \
  template void routing_forward_fast<T>(Mat<T>&, RoutingSaved<T>&, std::span<const Mat<T>>, \
                                        const Eigen::Ref<const RowVec<T>>&,                 \
                                        const Eigen::Ref<const RowVec<T>>&, int);           \
  template void routing_backward_fast<T>(                                                   \
      std::span<Mat<T>>, Eigen::Ref<RowVec<T>>, Eigen::Ref<RowVec<T>>, const Mat<T>&,       \
      const Mat<T>&, const RoutingSaved<T>&, std::span<const Mat<T>>,                       \
      const Eigen::Ref<const RowVec<T>>&, const Eigen::Ref<const RowVec<T>>&, int);
MHAR_INSTANTIATE(float)
MHAR_INSTANTIATE(double)
#undef MHAR_INSTANTIATE

}  // namespace mhar
