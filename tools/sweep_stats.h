/**
 * @file sweep_stats.h
 * @ingroup tools
 * @brief Paired statistics of a sweep: for each width and each pair of configurations (mode, H),
 *        the per-seed difference of the final validation loss, its mean, sd, 95 % t interval and
 *        how many seeds the first one wins; and the figure of Δ validation loss over width.
 *
 * Runs with the same seed see the same training batches (they depend only on seed and step), so
 * A − B at one seed removes the batch-order noise: the comparison is paired, seed by seed, over the
 * seeds both configurations finished. The t quantile is computed from the Student t distribution
 * (Abramowitz & Stegun 26.7.3–4, exact for integer degrees of freedom), not read from a table.
 */
#pragma once

#include <map>
#include <string>
#include <vector>

#include "sweep.h"

namespace mhar::toy {

/// P(|T| < t) for Student's t with `dof` ≥ 1 degrees of freedom (exact finite sums).
double student_t_central(double t, int dof);
/// The quantile t_p of Student's t with `dof` ≥ 1 degrees of freedom, 0 < p < 1 (bisection on
/// student_t_central, to 1e-12 relative). Throws std::invalid_argument outside that domain.
double student_t_quantile(double p, int dof);

/// A − B over the seeds both have (loss: lower is better, so a negative mean favours A).
struct PairedStat {
  std::string a, b;  ///< configuration labels, e.g. "mhar H=4", "residual"
  int d = 0;
  int n = 0;              ///< seeds in both
  double mean = 0;        ///< mean of A − B
  double sd = 0;          ///< sample sd of A − B (n − 1); NaN when n < 2
  double lo = 0, hi = 0;  ///< 95 % t interval of the mean; NaN when n < 2
  int a_wins = 0;         ///< seeds where A's loss is strictly lower than B's
};

/// The paired difference of two configurations' final losses, keyed by seed.
PairedStat paired_difference(const std::map<int, double>& a, const std::map<int, double>& b);

/// Label of a summary row's configuration: "residual", "attnres", "mhar H=4".
std::string config_label(const SweepRow& r);

/// Every pair of rows at the same width, later configuration minus earlier in the rows' order
/// (residual, attnres, mhar by H, …): attnres − residual, mhar H=4 − residual, mhar − attnres, …;
/// sorted by width.
std::vector<PairedStat> paired_stats(const std::vector<SweepRow>& rows);

/// The paired table as Markdown (a section for summary.md) and as CSV
/// (d,a,b,n,mean,sd,ci_lo,ci_hi,a_wins).
std::string paired_markdown(const std::vector<PairedStat>& stats);
std::string paired_csv(const std::vector<PairedStat>& stats);

/// DIR/delta-vs-width.{png,svg}: A − B over width for every pair whose B is residual, with the
/// 95 % interval as error bars; returns the paths written (none without figures or such pairs).
std::vector<std::string> write_delta_figure(const std::string& dir,
                                            const std::vector<PairedStat>& stats);

}  // namespace mhar::toy
