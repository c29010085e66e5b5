/**
 * @file heatmap.h
 * @ingroup tools
 * @brief Where each routing head looks: the mean routing weight α over real text, as a
 *        [site × source] matrix per head (figures, CSV, JSON), and how much the heads disagree
 *        at each site (mean pairwise Jensen–Shannon divergence, figures).
 */
#pragma once

#include <string>
#include <vector>

#include "data.h"
#include "figures.h"
#include "model.h"

namespace mhar::toy {

/// Mean α over the positions of a batch: per head, a sites × sources matrix (NaN where a site
/// cannot read a source), with the labels of its rows and columns.
struct RoutingMap {
  std::vector<std::string> sites, sources;
  int H = 0;
  std::vector<std::vector<double>> alpha;  ///< H × (sites × sources), row-major
  std::vector<double> disagreement;        ///< per site: mean pairwise JS divergence (bits)
};

/// The map of one forward over `batch` (B rows), run on one thread: the same bits on any
/// thread count.
RoutingMap routing_map(const Config& cfg, const Params<float>& p, const Batch& batch, int B);

/// Writes alpha.csv and alpha.json into `dir` (created), and `heatmap.<format>` and
/// `disagreement.<format>` for each of `formats` (none in a build without figures,
/// io::kFiguresBuilt). `title` heads the figures (e.g. "mhar H=4, step 100").
void write_routing_map(const std::string& dir, const RoutingMap& map, const std::string& title,
                       const std::vector<io::Format>& formats);

/// What mhar-toy says, once, when it would draw figures in a build without them.
inline constexpr const char* kFiguresOff =
    "figures are off: this mhar-toy was built without Cairo (not found at configure time, or "
    "-DMHAR_FIGURES=OFF)";

}  // namespace mhar::toy
