/**
 * @file routing_stack_backward.cpp
 * @ingroup cpu
 * @brief B3, the routing backward of a whole attnres or mhar stack (routing_stack.h). Changes
 *        from B2 (routing_fast_backward.cpp): source by source instead of site by site, so each
 *        source's gradient is written once, summed over every site that reads it, and of each
 *        (site, source) pair only the site's dout row comes from memory.
 *
 * The formulas are B1's (reference/routing.cpp), steps numbered (1)–(4) as there. For source i
 * and each sub-block of R positions (R rows of S_i, of dS_i and of every reading site's dout in
 * about 256 KB of cache):
 *   1. dS_i's rows and each site's dzr, in one of two orders:
 *      - heads of K = 8, 16 or 32 values (the default model's 32): row by row (source_row).
 *        Per row and head, site by site: one read of dout_s's head gives a_i[h], dz and dzr,
 *        and adds the value and key paths into dS_i's head, which stays in registers with
 *        S_i's head across the sites; then the RMS path, summed over the sites. Each site's
 *        row a few rows on is asked for meanwhile: in the training step, where dout_s comes
 *        from memory, that is what makes this order faster (docs/benchmarks.md).
 *      - wider heads: site by site (R contiguous rows of dout_s: one stream from memory):
 *        a. per row, one read of dout_s's and S_i's rows gives a vector of partial sums per
 *           head, and the horizontal sums, eight at a time, give a_i[h] (head_vectors,
 *           lane_sums); with the saved logits, dzr and Σ_h dz·z for the RMS path, elementwise
 *           over the sub-block's (position, head) entries;
 *        b. from cache, the value and key paths added into the sub-block's rows of dS_i, and
 *           with the last site the RMS path, summed over the sites.
 *        (For K = 128, the paper shape's, the row-by-row order was about 10 % slower.)
 *   2. site by site, from cache: the block's dq, dg partial sum Σ_p dzr · S_i for each site.
 * Either way each source row is read from memory once, and dS_i's rows are written once
 * (row by row) or stay in cache from the first site to the last (site by site).
 */
#include <type_traits>

#include "routing_blocks.h"
#include "routing_stack.h"

namespace mhar {

using namespace routing_blocks;

namespace {
/// Rows ahead of the current position that B3 asks the cache for, in every reading
/// site's dout (4 was the fastest of 2, 4, 6, 8, 12 inside the training step).
constexpr Eigen::Index kBackAhead = 4;

/// One reading site's arrays, as source i's backward uses them (m = 0 … M − 1 is site
/// s = n − 1 − m).
template <typename T>
struct SiteArrays {
  const T* dout;    ///< P × d: ∂loss/∂out_s
  const T* qg;      ///< 1 × d: (q ⊙ g)_s
  const T* alpha;   ///< P × H: the forward's α_i at site s
  const T* D;       ///< P × H: Σ_{c∈h} dout_s ⊙ out_s
  const T* logits;  ///< P × H: z_i at site s
  T* partial;       ///< blocks × d: the site's dq, dg partial sums, one row a block
};

/// Asks the cache for row q of every reading site's dout, α, D and z (a hint only: no result
/// depends on it; q inside [0, P)).
template <typename T>
[[gnu::always_inline]] inline void ask_for_row(const SiteArrays<T>* site, int M, Eigen::Index q,
                                               Eigen::Index d, int H) {
  for (int m = 0; m < M; ++m) {
    const T* o = site[m].dout + q * d;
    for (Eigen::Index c = 0; c < d; c += 64 / sizeof(T)) __builtin_prefetch(o + c, 0, 3);
    __builtin_prefetch(site[m].alpha + q * H, 0, 3);
    __builtin_prefetch(site[m].D + q * H, 0, 3);
    __builtin_prefetch(site[m].logits + q * H, 0, 3);
  }
}

/**
 * Pass 1 for narrow heads (K = kVectors whole vectors, kVectors = 1, 2 or 4): row p of dS_i
 * through every site that reads S_i, head by head, with the head's S_i and dS_i in registers
 * across the sites. For site s and head h, from one read of dout_s's head:
 *   from (4): a = Σ_{c∈h} dout[c] · S_i[c];   from (3): dz = α_i[h] · (a − D[h]);
 *   from (2): dzr = r_i · dz (kept at zr[m · zr_stride + h] for the dq, dg partials of pass 2);
 *   the value and key paths: dS_i[c] += α_i[h] · dout[c] + dzr · (q ⊙ g)_s[c];
 *   and Σ_s Σ_h dz · z_i[h] for the RMS path (from (1)), whose coefficient is summed over the
 *   sites and heads: coef = (r_i² / d) · Σ_s Σ_h dz · z_i[h]; then dS_i[c] −= coef · S_i[c].
 */
template <typename T, int kVectors>
[[gnu::always_inline]] inline void source_row_fixed(T* dS, const T* S, T r, Eigen::Index p,
                                                    Eigen::Index d, int H,
                                                    const SiteArrays<T>* site, int M, T* zr,
                                                    Eigen::Index zr_stride, T inv_d) {
  constexpr Eigen::Index K = kVectors * kLanes;
  T dz_z = 0;  // Σ_s Σ_h dz · z_i[h]
  for (int h = 0; h < H; ++h) {
    const Eigen::Index c0 = h * K, row = p * d + c0, e = p * H + h;
    Lanes<T> s[kVectors], acc[kVectors];  // the head of S_i's row, and of dS_i's
    for (int j = 0; j < kVectors; ++j) {
      s[j] = In<T>(S + c0 + j * kLanes);
      acc[j].setZero();
    }
    T* z = zr + h;
    for (int m = 0; m < M; ++m, z += zr_stride) {
      const SiteArrays<T>& x = site[m];
      const T* o = x.dout + row;
      Lanes<T> ov[kVectors];  // dout's head, read once for both uses
      for (int j = 0; j < kVectors; ++j) ov[j] = In<T>(o + j * kLanes);
      // (4) a = Σ_{c∈h} dout[c] · S_i[c], in two chains of multiply-adds when K allows
      Lanes<T> v = ov[0].cwiseProduct(s[0]);
      if constexpr (kVectors > 1) {
        Lanes<T> v2 = ov[1].cwiseProduct(s[1]);
        for (int j = 2; j < kVectors; j += 2) {
          v += ov[j].cwiseProduct(s[j]);
          v2 += ov[j + 1].cwiseProduct(s[j + 1]);
        }
        v += v2;
      }
      const T al = x.alpha[e];
      const T dz = al * (v.sum() - x.D[e]);  // (3) dz = α_i[h] · (a − D[h])
      const T dzr = r * dz;                  // (2) dzr = r_i · dz
      *z = dzr;
      dz_z += dz * x.logits[e];  // (1) the RMS path's Σ_s Σ_h dz · z_i[h]
      // the value and key paths: dS_i[c] += α_i[h] · dout[c] + dzr · (q ⊙ g)_s[c]
      const T* u = x.qg + c0;
      for (int j = 0; j < kVectors; ++j) {
        acc[j] += al * ov[j];
        acc[j] += dzr * In<T>(u + j * kLanes);
      }
    }
    for (int j = 0; j < kVectors; ++j) Out<T>(dS + c0 + j * kLanes) = acc[j];
  }
  // (1) dS_i[c] −= coef · S_i[c],  coef = (r_i² / d) · Σ_s Σ_h dz · z_i[h]
  const T coef = r * r * dz_z * inv_d;
  for (Eigen::Index c = 0; c < d; c += kLanes) Out<T>(dS + c) -= coef * In<T>(S + c);
}

/// Whether source_row (below) takes heads of K values: K = 8, 16 or 32 floats or doubles.
constexpr bool row_by_row(Eigen::Index K) {
  return K == kLanes || K == 2 * kLanes || K == 4 * kLanes;
}

/// source_row_fixed for K (row_by_row(K) must hold).
template <typename T>
void source_row(T* dS, const T* S, T r, Eigen::Index p, Eigen::Index d, Eigen::Index K, int H,
                const SiteArrays<T>* site, int M, T* zr, Eigen::Index zr_stride, T inv_d) {
  if (K == kLanes) return source_row_fixed<T, 1>(dS, S, r, p, d, H, site, M, zr, zr_stride, inv_d);
  if (K == 2 * kLanes)
    return source_row_fixed<T, 2>(dS, S, r, p, d, H, site, M, zr, zr_stride, inv_d);
  return source_row_fixed<T, 4>(dS, S, r, p, d, H, site, M, zr, zr_stride, inv_d);
}

/// One site's value and key paths for one row of dS_i (d = H·K values):
///   dS[c] (+)= α[h(c)] · dout[c] + dzr[h(c)] · u[c]  (− c_rms · S[c] if kLast),  u = (q ⊙ g)_s;
/// the first site writes the row, the others add to it, and the last also subtracts the RMS path
/// summed over all the sites. kVectors > 0: K = kVectors whole vectors, unrolled by the
/// compiler; 0: any K.
template <typename T, bool kFirst, bool kLast, int kVectors>
[[gnu::always_inline]] inline void add_paths_row(T* dS, const T* dout, const T* u, const T* al,
                                                 const T* zr, const T* S, T c_rms, Eigen::Index K,
                                                 int H) {
  const Eigen::Index whole = kVectors > 0 ? kVectors * kLanes : K / kLanes * kLanes;
  for (int h = 0; h < H; ++h, dS += K, dout += K, u += K, S += K) {
    const T a = al[h], z = zr[h];
    for (Eigen::Index c = 0; c < whole; c += kLanes) {
      Lanes<T> v = a * In<T>(dout + c) + z * In<T>(u + c);
      if constexpr (!kFirst) v = In<T>(dS + c) + v;
      if constexpr (kLast) v -= c_rms * In<T>(S + c);
      Out<T>(dS + c) = v;
    }
    for (Eigen::Index c = whole; c < K; ++c) {
      T v = a * dout[c] + z * u[c];
      if constexpr (!kFirst) v = dS[c] + v;
      if constexpr (kLast) v -= c_rms * S[c];
      dS[c] = v;
    }
  }
}

/// add_paths_row for every row of a sub-block (rows of dS, dout and S d apart; c_rms one a row,
/// read if kLast), with the usual head widths unrolled. With ahead > 0 it also asks the cache
/// for each dout row ahead values on, one line at a time (a hint only: the caller keeps those
/// rows inside the matrix).
template <typename T, bool kFirst, bool kLast>
void add_paths(T* dS, const T* dout, const T* u, const T* al, const T* zr, const T* S,
               const T* c_rms, Eigen::Index rows, Eigen::Index d, Eigen::Index K, int H,
               Eigen::Index ahead) {
  auto each_row = [&](auto vectors) {
    constexpr int kVectors = decltype(vectors)::value;
    for (Eigen::Index k = 0; k < rows; ++k) {
      for (Eigen::Index c = 0; ahead && c < d; c += 64 / sizeof(T))
        __builtin_prefetch(dout + k * d + ahead + c, 0, 3);
      add_paths_row<T, kFirst, kLast, kVectors>(dS + k * d, dout + k * d, u, al + k * H,
                                                zr + k * H, S + k * d, kLast ? c_rms[k] : T(0),
                                                K, H);
    }
  };
  switch (K) {
    case 2 * kLanes: return each_row(std::integral_constant<int, 2>());
    case 4 * kLanes: return each_row(std::integral_constant<int, 4>());
    case 8 * kLanes: return each_row(std::integral_constant<int, 8>());
    case 16 * kLanes: return each_row(std::integral_constant<int, 16>());
    default: return each_row(std::integral_constant<int, 0>());
  }
}
}  // namespace


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
void RoutingStackBackward<T>::add_site(int s, const Mat<T>& dout, const Mat<T>& out,
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
  require(saved.alpha.size() == N && saved.logits.size() == N && saved.rinv.size() == N, where,
          "saved holds ", saved.alpha.size(), " sources, site ", s, " reads ", N);
  for (std::size_t i = 0; i < N; ++i) {
    require_shape(saved.alpha[i], P_, H_, where, "saved.alpha[i]");
    require_shape(saved.logits[i], P_, H_, where, "saved.logits[i]");
    require(saved.rinv[i].size() == P_, where, "saved.rinv[i] must have P = ", P_, " entries");
  }
  Site& site = sites_[s];
  site.dout = &dout;
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
      head_sums<T, false, false>(dout.data() + p * d_, out.data() + p * d_, nullptr, K, H_,
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
  const T inv_d = T(1) / T(d);
  const int M = n - i;  // the sites that read S_i: s = i … n − 1, taken last first (m = n − 1 − s)
  dsource.resize(P, d);
  // r_i depends on S_i alone, so every site saved the same r_i: take site i's.
  const T* r_i = sites_[i].saved->rinv[i].data();
  // Each reading site's arrays, in the order m = 0 … M − 1 (site s = n − 1 − m).
  std::vector<SiteArrays<T>> reading(M);
  for (int m = 0; m < M; ++m) {
    Site& site = sites_[n - 1 - m];
    reading[m] = {site.dout->data(),
                  site.qg.data(),
                  site.saved->alpha[i].data(),
                  site.D.data(),
                  site.saved->logits[i].data(),
                  site.partial.data()};
  }
  // Rows of a sub-block: R rows of S_i, of dS_i and of each site's dout in about 256 KB of cache.
  const Eigen::Index R = sub_block_rows(static_cast<std::size_t>(M) + 2, d, P, sizeof(T));
  // Per site m: dzr[p][h] (R × H). Then a[p][h], its vectors of partial sums and their tails,
  // r_i for each entry and Σ_s dz·z (R × H each but the vectors, R × H × kLanes).
  const std::size_t entries = static_cast<std::size_t>(R) * H;
  Scratch<T> scratch(entries * (M + kLanes + 4));

  for_each_block(blocks_, worth_threads(M, P, d), [&](Eigen::Index b) {
    using Arr = Eigen::Array<T, Eigen::Dynamic, 1>;
    T* const w = scratch.mine();
    auto zr_of = [&](int m) { return w + m * entries; };  // R × H
    T* const a = w + M * entries;
    T* const vec = a + entries;
    T* const tail = vec + entries * kLanes;
    T* const r_buf = tail + entries;
    T* const dz_z_buf = r_buf + entries;
    const Eigen::Index b_end = std::min(P, (b + 1) * kRoutingBlock);
    for (Eigen::Index p0 = b * kRoutingBlock; p0 < b_end; p0 += R) {
      const Eigen::Index p1 = std::min(b_end, p0 + R);  // the sub-block [p0, p1)
      // Pass 1: dS_i's rows of the sub-block, and each site's dzr for them (for pass 2).
      if (row_by_row(K)) {
        // Heads of 8, 16 or 32 values: row by row (source_row), every site's dout_s row read
        // once, and each site's row kBackAhead on asked for meanwhile (near the end, the last
        // row again: a hint only). Row p's dzr of site m go to zr_of(m) + (p − p0) · H.
        for (Eigen::Index p = p0; p < p1; ++p) {
          ask_for_row(reading.data(), M, std::min(p + kBackAhead, P - 1), d, H);
          source_row(dsource.data() + p * d, Si.data() + p * d, r_i[p], p, d, K, H, reading.data(),
                     M, w + (p - p0) * H, static_cast<Eigen::Index>(entries), inv_d);
        }
      } else {
        // Wider heads: site by site (each site's R rows of dout: one stream from memory). (a)
        // One read of S_i's and dout_s's rows gives, per (position, head),
        //   from (4): a_i[h] = Σ_{c∈h} dout ⊙ S_i;  from (3): dz_i = α_i ⊙ (a_i − D)
        //   from (2), (1): Σ_c u_i S_i = Σ_h dz_i[h] · kp_i[h],  kp_i[h] = Σ_{c∈h} q_c g_c S_i[c]
        //                   = Σ_h dz_i[h] · z_i[h] / r_i  (the saved logits: z = r · kp)
        // and the RMS path's coefficient
        //   coef = (r_i³ / d) · Σ_c u_i S_i = (r_i² / d) · Σ_h dz_i z_i.
        // r_i depends on S_i alone, so only Σ_s Σ_h dz_i z_i is kept, and coef is summed over the
        // sites once, with the last site.
        const Eigen::Index e = (p1 - p0) * H;  // the sub-block's (position, head) entries
        Eigen::Map<Arr> dz(a, e), r_of(r_buf, e), dz_z(dz_z_buf, e);  // dz holds a_i first
        for (Eigen::Index k = 0; k < p1 - p0; ++k) r_of.segment(k * H, H).setConstant(r_i[p0 + k]);
        dz_z.setZero();
        for (int m = 0; m < M; ++m) {
          const SiteArrays<T>& site = reading[m];
          // a_i for the e entries: per row one vector of partial sums a head, then the horizontal
          // sums eight at a time
          for (Eigen::Index p = p0; p < p1; ++p)
            head_vectors(Si.data() + p * d, site.dout + p * d, K, H, vec + (p - p0) * H * kLanes,
                         tail + (p - p0) * H);
          lane_sums(vec, tail, e, a);
          // elementwise over the entries:
          auto entries_of = [&](const T* x) { return Eigen::Map<const Arr>(x + p0 * H, e); };
          dz = entries_of(site.alpha) * (dz - entries_of(site.D));  // dz_i = α_i ⊙ (a_i − D)
          Eigen::Map<Arr>(zr_of(m), e) = r_of * dz;                 // dzr = r_i · dz_i
          dz_z += dz * entries_of(site.logits);                     // Σ_s dz_i · z_i, the RMS path
          // (b) From cache (just read): the value and key paths,
          //   dS_i += α_i[h(c)] · dout_s + dzr[h(c)] · (q ⊙ g)_s   (the first site writes)
          // and, with the last site, the RMS path summed over the sites (from (1)):
          //   dS_i −= (Σ_s coef) · S_i,  Σ_s coef = (r_i² / d) Σ_h Σ_s dz_i z_i;
          // meanwhile asking for this site's rows of the next sub-block.
          const bool first = m == 0, last = m == M - 1;
          T* const c_rms = a;  // dz is used up: a holds Σ_s coef for the last site
          if (last)
            for (Eigen::Index k = 0; k < p1 - p0; ++k) {
              T t = 0;
              for (int h = 0; h < H; ++h) t += dz_z[k * H + h];
              c_rms[k] = r_of[k * H] * r_of[k * H] * t * inv_d;
            }
          T* dS = dsource.data() + p0 * d;
          const T* dO = site.dout + p0 * d;
          const T* S = Si.data() + p0 * d;
          const T* al = site.alpha + p0 * H;
          const Eigen::Index ahead = p1 + R <= P ? R * d : 0;  // the next sub-block's rows
          if (ahead)  // and its entries of α, D and z (hints only)
            for (Eigen::Index j = 0; j < e; j += 64 / sizeof(T)) {
              __builtin_prefetch(site.alpha + p1 * H + j, 0, 3);
              __builtin_prefetch(site.D + p1 * H + j, 0, 3);
              __builtin_prefetch(site.logits + p1 * H + j, 0, 3);
            }
          const Eigen::Index rows = p1 - p0;
          if (first && last)
            add_paths<T, true, true>(dS, dO, site.qg, al, zr_of(m), S, c_rms, rows, d, K, H,
                                     ahead);
          else if (first)
            add_paths<T, true, false>(dS, dO, site.qg, al, zr_of(m), S, c_rms, rows, d, K, H,
                                      ahead);
          else if (last)
            add_paths<T, false, true>(dS, dO, site.qg, al, zr_of(m), S, c_rms, rows, d, K, H,
                                      ahead);
          else
            add_paths<T, false, false>(dS, dO, site.qg, al, zr_of(m), S, c_rms, rows, d, K, H,
                                       ahead);
        }
      }
      // Pass 2, site by site, S_i's rows from cache: this block's dq, dg partial for site s,
      //   partial_s[c] += Σ_p dzr[p][h(c)] · S_i[p, c]   (from (2); × g or q at the end)
      for (int m = 0; m < M; ++m) {
        T* A = reading[m].partial + b * d;
        const T* zr = zr_of(m);
        for (int h = 0; h < H; ++h) {
          Eigen::Index c = h * K;
          const Eigen::Index end = c + K;
          for (; c + 4 * kLanes <= end; c += 4 * kLanes) {
            Lanes<T> acc0 = Lanes<T>::Zero(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
            for (Eigen::Index p = p0; p < p1; ++p) {
              const T z = zr[(p - p0) * H + h];
              const T* S = Si.data() + p * d + c;
              acc0 += z * In<T>(S);
              acc1 += z * In<T>(S + kLanes);
              acc2 += z * In<T>(S + 2 * kLanes);
              acc3 += z * In<T>(S + 3 * kLanes);
            }
            Out<T>(A + c) += acc0;
            Out<T>(A + c + kLanes) += acc1;
            Out<T>(A + c + 2 * kLanes) += acc2;
            Out<T>(A + c + 3 * kLanes) += acc3;
          }
          for (; c + kLanes <= end; c += kLanes) {
            Lanes<T> acc = Lanes<T>::Zero();
            for (Eigen::Index p = p0; p < p1; ++p)
              acc += zr[(p - p0) * H + h] * In<T>(Si.data() + p * d + c);
            Out<T>(A + c) += acc;
          }
          for (; c < end; ++c) {
            T acc = 0;
            for (Eigen::Index p = p0; p < p1; ++p) acc += zr[(p - p0) * H + h] * Si(p, c);
            A[c] += acc;
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
