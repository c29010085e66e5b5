/**
 * @file probe.h
 * @ingroup tools
 * @brief The forced-compromise probe of trained routing queries (`mhar-toy probe`).
 *
 * One routing query makes every column read the same depths in the same proportions. The probe
 * asks how much the parts of the width would disagree if each could choose for itself. At a site
 * with N ≥ 2 sources, cut the query q into S contiguous slices of d / S columns. For position p:
 *
 *     k_n[c]  = g_c · r_n · S_n[p,c]                 the routing key (r_n: RMS over the FULL width)
 *     α       = softmax_n  Σ_c   q_c · k_n[c]         the one shared softmax a single head uses
 *     a_s     = softmax_n  Σ_{c∈s} q_c · k_n[c]       what slice s alone would choose
 *     width disagreement = mean over p and s of KL(a_s ‖ α)
 *
 * For H = 1 models α is the routing's own α. For H > 1 models the same probe of the concatenated
 * query says how much one head would have to compromise there; the heads' actual disagreement is
 * reported beside it. The null is the same statistic for random queries of the trained query's
 * norm (same g), drawn from a seeded generator; learned excess = trained − null mean. Source
 * collinearity is the mean |cos| between distinct sources at a position.
 */
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "data.h"
#include "model.h"

namespace mhar::toy {

/// Mean over positions and slices of KL(a_s ‖ α) for query q (1 × d) at one site.
/// sources: N × (P × d). Throws UsageError unless `slices` divides d.
double width_disagreement(std::span<const Mat<double>> sources, const RowVec<double>& q,
                          const RowVec<double>& g, int slices);

/// Mean |cos| over positions and pairs of distinct sources (0 for N = 1).
double source_collinearity(std::span<const Mat<double>> sources);

/// A random query with the norm of q: N(0, I) scaled to ‖q‖, from a generator seeded by (seed,
/// draw). A zero q gives a zero query.
RowVec<double> null_query(const RowVec<double>& q, std::uint64_t seed, int draw);

struct ProbeOptions {
  int slices = 4;
  int null_draws = 8;
  std::uint64_t null_seed = 1;
};

struct SiteProbe {
  std::string site;
  int n_sources = 0;
  double kl_trained = 0, kl_null = 0, kl_null_sd = 0, excess = 0, collinearity = 0;
  double head_disagreement = 0;  ///< H > 1: mean pairwise JS divergence between heads (bits)
};

struct ProbeResult {
  std::vector<SiteProbe> sites;  ///< the sites with N ≥ 2, in model order
  SiteProbe mean;                ///< means over those sites (site = "mean")
  int H = 1;
};

/**
 * @brief Probes every routing site with N ≥ 2 on the B windows of `batch` (forward in double).
 * Throws UsageError for a residual model or a bad option.
 */
ProbeResult probe_model(const Config& cfg, const Params<float>& p, const Batch& batch, int B,
                        const ProbeOptions& opt);

}  // namespace mhar::toy
