/**
 * @file routing_stack.h
 * @ingroup cpu
 * @brief Routing over a whole stack of sites, F3 (forward) and B3 (backward): one source at a
 *        time, so each source's gradient is written once instead of once a site, and each
 *        source's logits are computed once for every site that reads it. routing_versions.h
 *        lists the versions; routing_stack_forward.cpp and routing_stack_backward.cpp say what
 *        each changes.
 *
 * In AttnRes and MHAR, site s reads the first s + 1 sources S_0 … S_s (the embedding and the
 * sub-layer outputs before it), and there are as many sites as sources. B2
 * (routing_fast.h) runs each site's backward on its own, so over the stack every (site s,
 * source i ≤ s) pair reads S_i and reads and writes dS_i: three rows from memory a pair.
 *
 * B3 changes when that work runs and where its sums are kept. Nothing in site s's
 * backward for source i needs another site's, and the model needs dS_i only when its backward
 * reaches sub-layer i − 1, after every site s ≥ i has its ∂loss/∂out. So it keeps each site's
 * dout (add_site), and when dS_i is due (source_gradient) it goes over S_i once, a few positions
 * at a time: per site s ≥ i, the per-head scalars of the pair (s, i) from one read of dout_s's
 * rows, and that site's terms added into dS_i's rows while dout_s's rows are still in cache;
 * then each site's dq, dg partial sums. S_i's and dS_i's rows stay in cache across the sites;
 * only dout_s comes from memory: one row a pair instead of three. With heads of 8, 16 or 32
 * values it goes row by row instead: per row and head, every site's dout_s read once, dS_i's
 * head summed over the sites in registers and written once, and each site's row a few rows on
 * asked for from memory meanwhile (routing_stack_backward.cpp).
 *
 * The formulas are B1's (docs/design.md §1, backward; routing_stack_backward.cpp numbers them
 * as reference/routing.cpp does). The sums over sites and positions run in another order than
 * in B1 and B2, so the results differ from theirs by rounding (tests/test_routing_stack.cpp
 * holds B3 to B1 in double and float, and to central differences).
 *
 * F3 (RoutingStackForward) is the forward of the same stack. Steps (1) and (2) of a site
 * depend on one source and the site's q ⊙ g only, so they need not wait for the site: when
 * source i is written (add_source), its r_i and its logits z_{s,i} at every later site s are
 * computed at once, per head one small matrix product (positions × K) · (K × sites), while S_i
 * is still in cache. A site's forward (site) is then the softmax over its saved logits,
 * elementwise over (position, head), and step (4), one read of each source row. F2 read
 * every source row twice per site, once for its logits through per-row dot products.
 *
 * Sites also run in pairs (s, s + 1), the pairs ending at the last site: site s + 1 reads the
 * same sources as site s plus S_{s+1}, and its logits over sources 0 … s are known when site s
 * runs. So site s sums, from the same reads, site s + 1's weighted sum over sources 0 … s with
 * weights exp(z'_i − m') left unnormalised (the carry, as in an online softmax); site s + 1
 * then reads two rows, the carry and S_{s+1}, instead of s + 2, and rescales:
 * m = max(m', z'_{s+1}), out = (exp(m' − m) · C + exp(z'_{s+1} − m) · S_{s+1}) / l. Site s
 * leaves each exp(z'_i − m') in site s + 1's α_i, which site s + 1 multiplies by exp(m' − m) / l:
 * a follower computes two exponentials a (position, head), exp(m' − m) and exp(z'_{s+1} − m),
 * instead of s + 3.
 *
 * B3 reads the logits back (RoutingSaved::logits): the RMS path's coefficient
 * (r_i³ / d) · Σ_h dz_i[h] · kp_i[h] is (r_i² / d) · Σ_h dz_i[h] · z_i[h], since z = r · kp, so
 * the backward need not recompute kp_i = Σ_{c∈h} (q ⊙ g)_c · S_i[c].
 *
 * Determinism: as F2 and B2, positions are cut into blocks of kRoutingBlock (by P alone), each
 * block is done by one thread in a fixed order, and each site's dq, dg partial sums are kept per
 * block and added in block order at the end (parameter_gradients). So every bit of every output
 * is the same on every run AND for any number of threads (tests/test_routing_stack.cpp checks
 * 1 thread against 2, twice each). F3 computes each (block, head)'s logits with one
 * Eigen matrix product on the block's thread, and every other value of a position on the
 * thread of its block, so the same holds for it; its exps run through exp_in_place
 * (routing_blocks.h), whose bits do not depend on a buffer's address.
 */
#pragma once

#include <span>
#include <vector>

#include "routing_choice.h"

namespace mhar {

/**
 * @brief The routing forward (F3) of every site of a stack where site s reads sources
 * 0 … s.
 *
 * Use: construct over the sites' parameters and saved state; then, in the model's order,
 * add_source(0), site(0), add_source(1), site(1), …: a site once its sources are added. Each
 * call checks its arguments and that order, and throws ShapeError (nothing changed) when
 * either is wrong.
 */
template <typename T>
class RoutingStackForward final : public StackForward<T> {
 public:
  /**
   * q, g: n × d, row s is site s's pseudo-query and key gain (copied); H: routing heads
   * (divides d); saved: the n sites' saved state, which this object fills and which must outlive
   * it (saved[s] is resized to s + 1 sources here).
   */
  RoutingStackForward(const Mat<T>& q, const Mat<T>& g, int H, std::span<RoutingSaved<T>> saved);

  /// Source i (the next one: 0, 1, … in order) is written: steps (1) and (2) for every site
  /// s ≥ i that will read it, into saved[s].rinv[i] and saved[s].logits[i]. Keeps S by
  /// reference until the last site has run.
  void add_source(int i, const Mat<T>& S) override;

  /// Site s's forward, steps (3) and (4), from its saved logits: out (=) P × d, saved[s].alpha.
  /// Needs sources 0 … s added and sites 0 … s − 1 done (sites run in order).
  void site(int s, Mat<T>& out) override;

  /// Sites (= sources) in the stack.
  int size() const { return static_cast<int>(saved_.size()); }

 private:
  /// Whether site s also sums the next site's partial sum (the carry), from the same reads.
  bool leads(int s) const;

  Mat<T> qg_;  ///< n × d: row s is (q ⊙ g) of site s
  int H_;
  std::span<RoutingSaved<T>> saved_;
  std::vector<const Mat<T>*> sources_;  ///< the sources added so far
  int next_site_ = 0;                   ///< the site to run next
  Mat<T> carry_;                        ///< P × d: a leader's Σ_i exp(z'_i − m') · S_i
  Mat<T> carry_max_, carry_sum_;  ///< P × H: its m' = max_i z'_i and l' = Σ_i exp(z'_i − m')
};

/**
 * @brief The routing backward of every site of a stack where site s reads sources 0 … s.
 *
 * Needs each site's saved logits (RoutingSaved::logits: every CPU forward saves them).
 *
 * Use: construct over the sources; add_site(s, …) once ∂loss/∂out_s is known; source_gradient(i)
 * once every site s ≥ i is added; parameter_gradients once every source is done. Each call
 * checks its arguments and that order, and throws ShapeError (nothing changed) when either is
 * wrong. The sources, and each site's dout and `saved`, must outlive the object; q and g are
 * copied.
 */
template <typename T>
class RoutingStackBackward final : public StackBackward<T> {
 public:
  /// sources: S_0 … S_{n−1}, all P × d, one site per source; H: routing heads (divides d).
  RoutingStackBackward(std::span<const Mat<T>> sources, int H);

  /// Site s's backward can run: keeps dout = ∂loss/∂out_s, the forward's saved α and r (both by
  /// reference), q and g; and computes D_s[p][h] = Σ_{c∈h} dout[p,c] · out[p,c] (one read of
  /// each).
  void add_site(int s, const Mat<T>& dout, const Mat<T>& out, const RoutingSaved<T>& saved,
                const Eigen::Ref<const RowVec<T>>& q,
                const Eigen::Ref<const RowVec<T>>& g) override;

  /// dsource = ∂loss/∂S_i through every site that reads it (s = i … n − 1). Writes (=), unlike
  /// B1 and B2; each of those sites must be added, and each source is done once.
  void source_gradient(int i, Mat<T>& dsource) override;

  /// dq.row(s) += ∂loss/∂q_s and dg.row(s) += ∂loss/∂g_s for every site (n × d each); needs
  /// every source's gradient done.
  void parameter_gradients(Eigen::Ref<Mat<T>> dq, Eigen::Ref<Mat<T>> dg) const override;

  /// Sources (= sites) in the stack.
  int size() const { return static_cast<int>(sources_.size()); }

 private:
  struct Site {
    bool added = false;
    const Mat<T>* dout = nullptr;            ///< P × d, ∂loss/∂out_s
    const RoutingSaved<T>* saved = nullptr;  ///< α_i (P × H) and r_i (P), i ≤ s
    RowVec<T> q, g, qg;                      ///< 1 × d; qg = q ⊙ g
    Mat<T> D;                                ///< P × H, Σ_{c∈h} dout ⊙ out
    Mat<T> partial;                          ///< blocks × d: Σ dzr_i[h(c)] · S_i[p,c] per block
  };
  std::span<const Mat<T>> sources_;
  int H_;
  Eigen::Index P_, d_, blocks_;
  std::vector<Site> sites_;
  std::vector<bool> source_done_;
};

}  // namespace mhar
