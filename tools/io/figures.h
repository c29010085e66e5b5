/**
 * @file figures.h
 * @ingroup tools
 * @brief Figures for mhar-toy as PNG, SVG and PDF: routing-weight heatmaps (one panel per
 *        routing head, shared colour bar), line plots (training curves) and bar charts.
 *
 * Each figure is laid out once and drawn once, through Cairo, onto the surface of the format
 * asked for: an image surface encoded as PNG, an SVG surface or a PDF surface. Text is DejaVu Sans
 * (UTF-8: α, Δ, ⟨q,k⟩ print as themselves), and the layout makes room for each string by its
 * measured extents. Colours: viridis for values (perceptually uniform, readable in grey), the
 * tab10 palette for series. Every file is written with write_text_file_atomic (file_util.h): a
 * failure throws an exception naming the path and never leaves a half-written file behind.
 *
 * A build without Cairo (MHAR_FIGURES=OFF, or Cairo not found at configure time) has
 * kFiguresBuilt = false: the formats still parse, and the write_* functions throw
 * std::logic_error; callers check kFiguresBuilt first and say that figures are off.
 */
#pragma once

#include <string>
#include <string_view>
#include <vector>

#ifndef MHAR_FIGURES
#error "MHAR_FIGURES must be defined (0 or 1) by the mhar_io target"
#endif

namespace mhar::io {

/// True when this build draws figures (it found Cairo at configure time).
inline constexpr bool kFiguresBuilt = MHAR_FIGURES != 0;

enum class Format { png, svg, pdf };

/// "png", "svg" or "pdf": the name, which is also the file extension.
const char* format_name(Format f);
/// "png,svg,pdf" → {png, svg, pdf}, in the order given. Throws std::invalid_argument naming the
/// entry for an unknown or repeated format, or when the list is empty.
std::vector<Format> parse_formats(std::string_view list);
/// The inverse of parse_formats: "png,svg".
std::string format_list(const std::vector<Format>& formats);

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

/// One line of a line plot; NaN points (and non-positive ones on a log axis) break the line.
struct Series {
  std::string label;
  std::vector<double> x, y;
  bool dashed = false;
};

/// Vertical error bars of one series (its index in LinePlot::series): at point i, a bar from
/// lo[i] to hi[i] in the series' colour, with end caps; a point whose ends are NaN has none.
struct ErrorBars {
  std::size_t series = 0;
  std::vector<double> lo, hi;
};

/// Axes with 1-2-5 ticks (decades when log_y), a legend to the right, one colour per series.
struct LinePlot {
  std::string title, x_label, y_label;
  std::vector<Series> series;
  bool log_y = false;
  std::vector<ErrorBars> error_bars;
};

/// One bar per label, from 0 to the value (negative values go down), the value printed above.
struct BarChart {
  std::string title, x_label, y_label;
  std::vector<std::string> labels;
  std::vector<double> values;
};

/// Each writer draws its figure once per format into `stem` + "." + format_name, and returns the
/// paths written, in the order of `formats`.

/// Panels side by side under `suptitle`, one colour bar for all of them spanning the smallest
/// vmin to the largest vmax. Throws std::invalid_argument when there is no panel, when
/// values.size() ≠ rows × cols, or when vmin < vmax does not hold.
std::vector<std::string> write_heatmaps(const std::string& stem, const std::vector<Format>& formats,
                                        const std::vector<Heatmap>& panels,
                                        const std::string& suptitle);
/// Throws std::invalid_argument when a series has x.size() ≠ y.size(), or error bars name no
/// series or do not have one lo and one hi per point of theirs.
std::vector<std::string> write_lineplot(const std::string& stem, const std::vector<Format>& formats,
                                        const LinePlot& plot);
/// Throws std::invalid_argument when labels.size() ≠ values.size().
std::vector<std::string> write_barchart(const std::string& stem, const std::vector<Format>& formats,
                                        const BarChart& chart);

/// Tick values inside [lo, hi] (up to rounding): the multiples of the finest step 1, 2 or 5 × 10^k
/// that gives at most `max_ticks` (≥ 2) of them; {lo} when lo == hi. Throws std::invalid_argument
/// unless lo ≤ hi are finite.
std::vector<double> nice_ticks(double lo, double hi, int max_ticks = 6);

}  // namespace mhar::io
