/**
 * @file sweep.h
 * @ingroup tools
 * @brief `mhar-toy sweep`: a grid of ordinary training runs (mode × width × heads × seed), run
 *        J at a time as child `mhar-toy train` processes, and its summary table.
 *
 * Each run is a normal run directory `DIR/<mode>-d<d>[-H<H>]-seed<s>` that `eval`, `heatmap` and
 * `probe` open as they are. Calling the sweep again skips finished runs, resumes interrupted ones
 * from their checkpoint (`train --resume`, bit for bit the uninterrupted run at the same thread
 * count), and starts over a run that was stopped before its first checkpoint.
 *
 * The summary (DIR/summary.csv, DIR/summary.md) has one row per (mode, d, H):
 * mode,d,H,n,val_mean,val_sd,delta_vs_residual,excess_mean — val is each run's final validation
 * loss from its metrics.jsonl; the excess is `probe`'s mean learned excess, on single-head runs.
 * DIR/summary-paired.csv (and a section of summary.md) compare the rows at each width seed by
 * seed (sweep_stats.h): d,a,b,n,mean,sd,ci_lo,ci_hi,a_wins.
 */
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "model.h"

namespace mhar::toy {

/// One cell of the grid.
struct SweepRun {
  std::string mode;
  int d = 0, H = 0;  ///< H: the routing heads asked for (0 = the model's default); residual: 0
  int seed = 0;
  int ffn = 0;
  std::string name;  ///< directory name under the sweep's DIR
};

struct SweepGrid {
  std::vector<std::string> modes = {"residual", "attnres", "mhar"};
  std::vector<int> widths = {64, 128, 256};
  std::vector<int> heads = {0};
  std::vector<int> seeds = {1, 2, 3};
  double ffn_ratio = 2.75;  ///< ffn = round(ratio · d), rounded to a multiple of 8
  Config base;              ///< the other shape flags (layers, n_head, n_kv_head, T, blocks)
};

/**
 * @brief Expands the grid into runs, validating every one before any starts. Throws UsageError
 * naming the culprit: an unknown mode, H not dividing a width, n_head not dividing a width, …
 * `attnres` and `residual` ignore --heads (one run per width and seed).
 */
std::vector<SweepRun> expand_grid(const SweepGrid& grid);

/// One row of the summary.
struct SweepRow {
  std::string mode;
  int d = 0, H = 0, n = 0;
  double val_mean = 0, val_sd = 0;
  double delta_vs_residual = 0;  ///< NaN when no residual run at this width
  double excess_mean = 0;        ///< NaN unless single-head routing
  std::map<int, double> val_by_seed;  ///< each finished run's final val loss, by seed
};

/// Reads every finished run of `dir` (its config.json and metrics.jsonl), probes the single-head
/// ones, and returns the rows in grid order. Runs that have not finished are left out, and named
/// in `unfinished` when it is not null.
std::vector<SweepRow> summarize_sweep(const std::string& dir,
                                      std::vector<std::string>* unfinished = nullptr);

/// Writes DIR/summary.csv and DIR/summary.md (atomically) from the rows, the paired statistics
/// by seed (DIR/summary-paired.csv and a section of summary.md; sweep_stats.h), and the figures.
void write_sweep_summary(const std::string& dir, const std::vector<SweepRow>& rows);

/// DIR/val-vs-width.{png,svg} (mean ± sd per mode over width) and DIR/excess-vs-width.{png,svg}
/// (single-head runs); returns the paths written, none in a build without figures.
std::vector<std::string> write_sweep_figures(const std::string& dir,
                                             const std::vector<SweepRow>& rows);

}  // namespace mhar::toy
