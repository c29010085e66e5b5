/**
 * @file figures.h
 * @ingroup tools
 * @brief Figures for mhar-toy as SVG (text) and PNG: routing-weight heatmaps (one panel per
 *        routing head, shared colour bar), line plots (training curves) and bar charts.
 *
 * Each figure is laid out once and drawn through a small canvas with two backends: SVG elements,
 * or a software rasteriser (anti-aliased lines, stb_easy_font text at 2× scale) whose pixels
 * stb_image_write encodes as PNG. No font files, no plotting library, no Eigen: plain vectors.
 * The PNG text is ASCII only (other characters print as '?'); the SVG keeps UTF-8 as is.
 *
 * Colours: viridis for values (perceptually uniform, readable in grey), the tab10 palette for
 * series. Every file is written with write_text_file_atomic (file_util.h): a failure throws
 * an exception naming the path and never leaves a half-written file behind.
 */
#pragma once

#include <string>
#include <vector>

namespace mhar::io {

/// One heatmap panel: rows × cols values, row-major. A NaN value means "not applicable" (e.g. a
/// source a site cannot read) and is drawn hatched grey. Values outside [vmin, vmax] are clamped.
struct Heatmap {
  std::string title;
  std::vector<std::string> row_labels, col_labels;
  std::string row_axis, col_axis;
  std::vector<double> values;  ///< rows × cols, row-major
  double vmin = 0, vmax = 1;
  bool annotate = true;  ///< print the values in the cells when they fit
};

/// Panels side by side under `suptitle`, one colour bar for all of them spanning the smallest
/// vmin to the largest vmax. Throws std::invalid_argument when there is no panel, when
/// values.size() ≠ rows × cols, or when vmin < vmax does not hold.
std::string heatmap_svg(const std::vector<Heatmap>& panels, const std::string& suptitle);
void write_heatmap_png(const std::string& path, const std::vector<Heatmap>& panels,
                       const std::string& suptitle);

/// One line of a line plot; NaN points (and non-positive ones on a log axis) break the line.
struct Series {
  std::string label;
  std::vector<double> x, y;
  bool dashed = false;
};

/// Axes with 1-2-5 ticks (decades when log_y), a legend to the right, one colour per series.
/// Throws std::invalid_argument when a series has x.size() ≠ y.size().
struct LinePlot {
  std::string title, x_label, y_label;
  std::vector<Series> series;
  bool log_y = false;
};

std::string lineplot_svg(const LinePlot& plot);
void write_lineplot_png(const std::string& path, const LinePlot& plot);

/// One bar per label, from 0 to the value (negative values go down), the value printed above.
/// Throws std::invalid_argument when labels.size() ≠ values.size().
struct BarChart {
  std::string title, x_label, y_label;
  std::vector<std::string> labels;
  std::vector<double> values;
};

std::string barchart_svg(const BarChart& chart);
void write_barchart_png(const std::string& path, const BarChart& chart);

/// Tick values inside [lo, hi] (up to rounding): the multiples of the finest step 1, 2 or 5 × 10^k
/// that gives at most `max_ticks` (≥ 2) of them; {lo} when lo == hi. Throws std::invalid_argument
/// unless lo ≤ hi are finite.
std::vector<double> nice_ticks(double lo, double hi, int max_ticks = 6);

}  // namespace mhar::io
