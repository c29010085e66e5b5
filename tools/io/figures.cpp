/**
 * @file figures.cpp
 * @brief Heatmaps, line plots and bar charts, laid out once and drawn through Cairo.
 *
 * Reading order: colours → number formatting and ticks → the canvas (the drawing primitives on a
 * Cairo surface) → one layout function per figure → the public writers. Layout is in pixels
 * (points in SVG and PDF); it asks the canvas how wide each string is in DejaVu Sans, then sizes
 * the picture, then draws. The same layout and drawing calls make the PNG, the SVG and the PDF.
 */
#include "figures.h"

#include <cairo-pdf.h>
#include <cairo-svg.h>
#include <cairo.h>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <memory>
#include <numbers>
#include <stdexcept>

#include "file_util.h"

namespace mhar::io {
namespace {

// ---------------------------------------------------------------------------------------------
// Colours
// ---------------------------------------------------------------------------------------------

struct Rgb {
  unsigned char r, g, b;
  bool operator==(const Rgb&) const = default;
};

constexpr Rgb kText{25, 25, 25};
constexpr Rgb kAxis{70, 70, 70};
constexpr Rgb kGrid{228, 228, 228};
constexpr Rgb kNaFill{232, 232, 232};
constexpr Rgb kNaHatch{175, 175, 175};
constexpr Rgb kWhite{255, 255, 255};

/// matplotlib's viridis sampled at t = 0, 1/16, ..., 1; linear in between.
constexpr std::array<Rgb, 17> kViridis{{{68, 1, 84},
                                        {72, 24, 106},
                                        {71, 45, 123},
                                        {66, 64, 134},
                                        {59, 82, 139},
                                        {51, 99, 141},
                                        {44, 114, 142},
                                        {38, 130, 142},
                                        {33, 145, 140},
                                        {31, 160, 136},
                                        {40, 174, 128},
                                        {63, 188, 115},
                                        {94, 201, 98},
                                        {132, 212, 75},
                                        {173, 220, 48},
                                        {216, 226, 25},
                                        {253, 231, 37}}};

/// viridis(t) for t in [0, 1] (clamped).
Rgb viridis(double t) {
  t = std::clamp(t, 0.0, 1.0) * (kViridis.size() - 1);
  const auto i = std::min(static_cast<std::size_t>(t), kViridis.size() - 2);
  const double f = t - static_cast<double>(i);
  auto mix = [f](unsigned char a, unsigned char b) {
    return static_cast<unsigned char>(std::lround(a + f * (b - a)));
  };
  const Rgb a = kViridis[i], b = kViridis[i + 1];
  return {mix(a.r, b.r), mix(a.g, b.g), mix(a.b, b.b)};
}

/// matplotlib's tab10: distinct colours for up to 10 series, then repeated.
Rgb series_colour(std::size_t i) {
  constexpr std::array<Rgb, 10> kTab10{{{31, 119, 180},
                                        {255, 127, 14},
                                        {44, 160, 44},
                                        {214, 39, 40},
                                        {148, 103, 189},
                                        {140, 86, 75},
                                        {227, 119, 194},
                                        {127, 127, 127},
                                        {188, 189, 34},
                                        {23, 190, 207}}};
  return kTab10[i % kTab10.size()];
}

/// Black text on light cells, white on dark ones.
Rgb text_on(Rgb bg) {
  return 0.299 * bg.r + 0.587 * bg.g + 0.114 * bg.b > 140 ? kText : kWhite;
}

// ---------------------------------------------------------------------------------------------
// Numbers
// ---------------------------------------------------------------------------------------------

/// v with `decimals` digits after the point, never "-0.00".
std::string fixed(double v, int decimals) {
  std::string s = fmt::format("{:.{}f}", v, decimals);
  if (s.front() == '-' && s.find_first_not_of("-0.") == std::string::npos) s.erase(0, 1);
  return s;
}

/// Decimals needed to tell apart values `step` apart (0.2 → 1, 0.05 → 2, 5 → 0).
int decimals_for(double step) {
  return std::max(0, static_cast<int>(std::ceil(-std::log10(step) - 1e-9)));
}

/// A tick label: fixed-point for ordinary magnitudes, %g for huge or tiny steps.
std::string tick_label(double v, double step) {
  if (std::abs(v) >= 1e5 || step < 1e-4) return fmt::format("{:g}", v);
  return fixed(v, decimals_for(step));
}

struct Range {
  double lo, hi;
};

/// [lo, hi] of the finite values, widened when empty or a single point.
Range finite_range(const std::vector<double>& v, double empty_lo, double empty_hi) {
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (double x : v)
    if (std::isfinite(x)) lo = std::min(lo, x), hi = std::max(hi, x);
  if (lo > hi) return {empty_lo, empty_hi};
  if (lo == hi) {
    const double d = lo == 0 ? 0.5 : std::abs(lo) * 0.1;
    return {lo - d, hi + d};
  }
  return {lo, hi};
}

// ---------------------------------------------------------------------------------------------
// Canvas: the drawing primitives the layouts use, on one Cairo surface
// ---------------------------------------------------------------------------------------------

enum class Font { Small, Normal, Large };  ///< tick labels / axis labels / titles
enum class Align { Start, Middle, End };   ///< along the text direction

struct Pt {
  double x, y;
};

/// Font size in pixels (1 px = 1 pt in SVG and PDF) and weight.
double font_px(Font f) {
  return f == Font::Small ? 12 : f == Font::Normal ? 14 : 17;
}

/// `s` with every byte that is not part of well-formed UTF-8 replaced by U+FFFD: Cairo refuses
/// malformed strings (and a run directory's name, in a legend, may be any bytes).
std::string valid_utf8(const std::string& s) {
  std::string out;
  for (std::size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    const std::size_t n = b < 0x80         ? 1
                          : (b >> 5) == 6  ? 2
                          : (b >> 4) == 14 ? 3
                          : (b >> 3) == 30 ? 4
                                           : 0;
    bool ok = n > 0 && i + n <= s.size();
    for (std::size_t k = 1; ok && k < n; ++k)
      ok = (static_cast<unsigned char>(s[i + k]) & 0xC0) == 0x80;
    if (ok && n > 1) {  // no overlong forms, surrogates or code points past U+10FFFF
      char32_t cp = b & (0x7F >> n);
      for (std::size_t k = 1; k < n; ++k)
        cp = cp << 6 | (static_cast<unsigned char>(s[i + k]) & 0x3F);
      ok = cp >= (n == 2   ? 0x80u
                  : n == 3 ? 0x800u
                           : 0x10000u) &&
           cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF);
    }
    if (ok) {
      out.append(s, i, n);
      i += n;
    } else {
      out += "\xEF\xBF\xBD";
      ++i;
    }
  }
  return out;
}

/// Dash pattern, in pixels, for a line of width w.
struct Dash {
  double on, off;
};
Dash dash_pattern(double w) {
  return {3 * w + 3, 2 * w + 2};
}

/// Cairo's write callback: appends to a std::string.
cairo_status_t append_bytes(void* closure, const unsigned char* data, unsigned int length) {
  try {
    static_cast<std::string*>(closure)->append(reinterpret_cast<const char*>(data), length);
  } catch (const std::bad_alloc&) {
    return CAIRO_STATUS_NO_MEMORY;
  }
  return CAIRO_STATUS_SUCCESS;
}

struct SurfaceDeleter {
  void operator()(cairo_surface_t* s) const { cairo_surface_destroy(s); }
};
struct ContextDeleter {
  void operator()(cairo_t* c) const { cairo_destroy(c); }
};
using Surface = std::unique_ptr<cairo_surface_t, SurfaceDeleter>;
using Context = std::unique_ptr<cairo_t, ContextDeleter>;

/// A figure on one Cairo surface (image for PNG, SVG or PDF). Layout code measures text first
/// (text_width, line_height: Cairo's extents of the string in DejaVu Sans), then calls begin()
/// with the size it found, then draws; finish() returns the encoded file.
class Canvas {
 public:
  explicit Canvas(Format format)
      : format_(format),
        measure_surface_(cairo_image_surface_create(CAIRO_FORMAT_RGB24, 1, 1)),
        measure_(cairo_create(measure_surface_.get())) {
    setup(measure_.get());
  }

  /// Starts a width × height picture on white.
  void begin(int width, int height) {
    switch (format_) {
      case Format::png:
        surface_.reset(cairo_image_surface_create(CAIRO_FORMAT_RGB24, width, height));
        break;
      case Format::svg:
        surface_.reset(cairo_svg_surface_create_for_stream(append_bytes, &bytes_, width, height));
        cairo_svg_surface_set_document_unit(surface_.get(), CAIRO_SVG_UNIT_PX);
        break;
      case Format::pdf:
        surface_.reset(cairo_pdf_surface_create_for_stream(append_bytes, &bytes_, width, height));
        cairo_pdf_surface_set_metadata(surface_.get(), CAIRO_PDF_METADATA_CREATOR, "mhar-toy");
        break;
    }
    cr_.reset(cairo_create(surface_.get()));
    setup(cr_.get());
    set_colour(kWhite);
    cairo_paint(cr_.get());
  }

  /// The advance of `s` in font f, in pixels (cairo_text_extents).
  double text_width(const std::string& s, Font f) const {
    if (s.empty()) return 0;
    use_font(measure_.get(), f);
    cairo_text_extents_t e;
    cairo_text_extents(measure_.get(), valid_utf8(s).c_str(), &e);
    return e.x_advance;
  }
  /// Vertical room one line of text needs: the font's line spacing (cairo_font_extents).
  double line_height(Font f) const {
    use_font(measure_.get(), f);
    cairo_font_extents_t e;
    cairo_font_extents(measure_.get(), &e);
    return std::ceil(e.height) + 2;
  }

  /// (x, y) is the anchor: `align` along the text, and the middle of a capital letter's height.
  /// Vertical text reads upwards.
  void text(double x, double y, const std::string& s, Font f, Rgb c, Align align,
            bool vertical = false) {
    if (s.empty()) return;
    const double w = text_width(s, f);
    cairo_t* cr = cr_.get();
    cairo_save(cr);
    use_font(cr, f);
    set_colour(c);
    cairo_translate(cr, x, y);
    if (vertical) cairo_rotate(cr, -std::numbers::pi / 2);
    cairo_move_to(cr,
                  align == Align::Start    ? 0.0
                  : align == Align::Middle ? -w / 2
                                           : -w,
                  cap_height(f) / 2);
    cairo_show_text(cr, valid_utf8(s).c_str());
    cairo_restore(cr);
  }
  void rect(double x, double y, double w, double h, Rgb fill) {
    set_colour(fill);
    cairo_rectangle(cr_.get(), x, y, w, h);
    cairo_fill(cr_.get());
  }
  /// A "not applicable" rectangle: light grey with diagonal hatching. The hatch lines are
  /// x + y = 8k in page coordinates, so neighbouring cells join up.
  void na_rect(double x, double y, double w, double h) {
    cairo_t* cr = cr_.get();
    cairo_save(cr);
    cairo_rectangle(cr, x, y, w, h);
    cairo_clip(cr);
    set_colour(kNaFill);
    cairo_paint(cr);
    set_colour(kNaHatch);
    cairo_set_line_width(cr, 1.5);
    for (double k = std::floor((x + y) / 8) * 8; k <= x + w + y + h; k += 8) {
      cairo_move_to(cr, k - y, y);
      cairo_line_to(cr, k - y - h, y + h);
    }
    cairo_stroke(cr);
    cairo_restore(cr);
  }
  void polyline(const std::vector<Pt>& pts, Rgb c, double width, bool dashed = false) {
    if (pts.empty()) return;
    cairo_t* cr = cr_.get();
    // 1-pixel axis-parallel lines (axes, ticks, grid) on pixel centres, so they stay sharp.
    bool axis_parallel = width == 1;
    for (std::size_t i = 1; i < pts.size(); ++i)
      axis_parallel = axis_parallel && (pts[i].x == pts[i - 1].x || pts[i].y == pts[i - 1].y);
    auto snap = [&](double v) { return axis_parallel ? std::floor(v) + 0.5 : v; };
    cairo_new_path(cr);
    cairo_move_to(cr, snap(pts[0].x), snap(pts[0].y));
    for (const Pt& p : pts) cairo_line_to(cr, snap(p.x), snap(p.y));  // a lone point: a dot
    set_colour(c);
    cairo_set_line_width(cr, width);
    cairo_set_line_join(cr, CAIRO_LINE_JOIN_ROUND);
    cairo_set_line_cap(cr, dashed || axis_parallel ? CAIRO_LINE_CAP_BUTT : CAIRO_LINE_CAP_ROUND);
    if (dashed) {
      const Dash d = dash_pattern(width);
      const double pattern[] = {d.on, d.off};
      cairo_set_dash(cr, pattern, 2, 0);
    }
    cairo_stroke(cr);
    cairo_set_dash(cr, nullptr, 0, 0);
  }
  /// A vertical viridis gradient, 1 at the top, 0 at the bottom.
  void colour_bar(double x, double y, double w, double h) {
    cairo_pattern_t* g = cairo_pattern_create_linear(0, y + h, 0, y);
    for (std::size_t i = 0; i < kViridis.size(); ++i) {
      const Rgb c = kViridis[i];
      cairo_pattern_add_color_stop_rgb(g, static_cast<double>(i) / (kViridis.size() - 1),
                                       c.r / 255.0, c.g / 255.0, c.b / 255.0);
    }
    cairo_rectangle(cr_.get(), x, y, w, h);
    cairo_set_source(cr_.get(), g);
    cairo_fill(cr_.get());
    cairo_pattern_destroy(g);
  }
  void frame(double x, double y, double w, double h, Rgb c) {
    polyline({{x, y}, {x + w, y}, {x + w, y + h}, {x, y + h}, {x, y}}, c, 1);
  }

  /// The encoded file. Throws std::runtime_error with Cairo's reason when drawing failed.
  std::string finish() {
    cairo_status_t status = cairo_status(cr_.get());
    cr_.reset();
    if (status == CAIRO_STATUS_SUCCESS) {
      if (format_ == Format::png)
        status = cairo_surface_write_to_png_stream(surface_.get(), append_bytes, &bytes_);
      cairo_surface_finish(surface_.get());  // SVG and PDF write their bytes now
      if (status == CAIRO_STATUS_SUCCESS) status = cairo_surface_status(surface_.get());
    }
    surface_.reset();
    if (status != CAIRO_STATUS_SUCCESS)
      throw std::runtime_error(fmt::format("drawing the {} failed: {}", format_name(format_),
                                           cairo_status_to_string(status)));
    return std::move(bytes_);
  }

 private:
  /// Unhinted metrics, so that a string measures the same on every surface.
  static void setup(cairo_t* cr) {
    cairo_font_options_t* o = cairo_font_options_create();
    cairo_font_options_set_hint_metrics(o, CAIRO_HINT_METRICS_OFF);
    cairo_font_options_set_hint_style(o, CAIRO_HINT_STYLE_NONE);
    cairo_set_font_options(cr, o);
    cairo_font_options_destroy(o);
  }
  static void use_font(cairo_t* cr, Font f) {
    cairo_select_font_face(cr, "DejaVu Sans", CAIRO_FONT_SLANT_NORMAL,
                           f == Font::Large ? CAIRO_FONT_WEIGHT_BOLD : CAIRO_FONT_WEIGHT_NORMAL);
    cairo_set_font_size(cr, font_px(f));
  }
  /// Height of a capital letter: the text is centred on it.
  double cap_height(Font f) const {
    use_font(measure_.get(), f);
    cairo_text_extents_t e;
    cairo_text_extents(measure_.get(), "H", &e);
    return -e.y_bearing;
  }
  void set_colour(Rgb c) { cairo_set_source_rgb(cr_.get(), c.r / 255.0, c.g / 255.0, c.b / 255.0); }

  Format format_;
  Surface measure_surface_;
  Context measure_;
  std::string bytes_;  // what the SVG and PDF surfaces, and the PNG encoder, write
  Surface surface_;
  Context cr_;
};

// ---------------------------------------------------------------------------------------------
// Heatmaps
// ---------------------------------------------------------------------------------------------

constexpr double kPad = 14;  // margin around a figure and between its parts

void check_heatmaps(const std::vector<Heatmap>& panels) {
  if (panels.empty()) throw std::invalid_argument("heatmap: no panel to draw");
  for (const Heatmap& p : panels) {
    const std::size_t rows = p.row_labels.size(), cols = p.col_labels.size();
    if (p.values.size() != rows * cols)
      throw std::invalid_argument(
          fmt::format("heatmap '{}': values has {} entries, expected rows × cols = {} × {} = {}",
                      p.title, p.values.size(), rows, cols, rows * cols));
    if (!(p.vmin < p.vmax))
      throw std::invalid_argument(fmt::format(
          "heatmap '{}': needs vmin < vmax, got vmin = {}, vmax = {}", p.title, p.vmin, p.vmax));
  }
}

/// The colour scale every panel shares, and the decimals of the cell annotations.
struct HeatScale {
  double lo, hi;
  int decimals;
  bool any_nan;  // some cell is "n/a": the colour bar gets an n/a swatch
};

/// 1. One colour scale for all panels.
HeatScale heat_scale(const std::vector<Heatmap>& panels) {
  HeatScale s{panels[0].vmin, panels[0].vmax, 0, false};
  for (const Heatmap& p : panels) {
    s.lo = std::min(s.lo, p.vmin), s.hi = std::max(s.hi, p.vmax);
    s.any_nan = s.any_nan || std::any_of(p.values.begin(), p.values.end(),
                                         [](double v) { return std::isnan(v); });
  }
  s.decimals = std::clamp(2 - static_cast<int>(std::floor(std::log10(s.hi - s.lo))), 0, 4);
  return s;
}

struct CellSize {
  double w, h;
  bool annotate;  // the values fit in their cells and are written there
};

/// 2. Cell size: 36 px, wider (up to 60) when the annotations need it, else no annotations.
CellSize cell_size(const Canvas& cv, const std::vector<Heatmap>& panels, const HeatScale& s) {
  double ann_w = 0;
  for (const Heatmap& p : panels)
    if (p.annotate)
      for (double v : p.values)
        if (!std::isnan(v))
          ann_w = std::max(ann_w, cv.text_width(fixed(v, s.decimals), Font::Small));
  const bool annotate = ann_w > 0 && ann_w + 8 <= 60;
  return {std::ceil(std::max(36.0, annotate ? ann_w + 8 : 0.0)),
          std::ceil(std::max(32.0, cv.line_height(Font::Small) + 8)), annotate};
}

/// Where one panel goes, in pixels.
struct PanelBox {
  bool row_labels;  // drawn (else the panel shares panel 0's, further left)
  double left, grid_x, grid_y, grid_w, grid_h;
  double width;  // the grid, its row labels and the title
  bool vertical_cols;
  double col_label_h;
  double below_h;  // under the grid: column labels and the column axis name
};

/// 3. Panel i at x, its grid's top at grid_y: row labels (unless the same as panel 0's), column
/// labels, axis names.
PanelBox panel_box(const Canvas& cv, const std::vector<Heatmap>& panels, std::size_t i, double x,
                   double grid_y, const CellSize& cell) {
  const Heatmap& p = panels[i];
  PanelBox b{};
  b.row_labels = i == 0 || p.row_labels != panels[0].row_labels || p.row_axis != panels[0].row_axis;
  double row_label_w = 0;
  for (const auto& l : p.row_labels)
    row_label_w = std::max(row_label_w, cv.text_width(l, Font::Small));
  double col_w = 0;
  for (const auto& l : p.col_labels) col_w = std::max(col_w, cv.text_width(l, Font::Small));
  b.vertical_cols = col_w > cell.w - 4;
  b.col_label_h = b.vertical_cols ? col_w : cv.line_height(Font::Small);
  b.left = x;
  const double axis_w = p.row_axis.empty() ? 0 : cv.line_height(Font::Normal) + 10;
  b.grid_x = std::round(x + (b.row_labels ? axis_w + row_label_w + 6 : 0));
  b.grid_y = grid_y;
  b.grid_w = cell.w * static_cast<double>(p.col_labels.size());
  b.grid_h = cell.h * static_cast<double>(p.row_labels.size());
  b.width = std::max(b.grid_x - x + b.grid_w, cv.text_width(p.title, Font::Normal));
  b.below_h = 4 + b.col_label_h + (p.col_axis.empty() ? 0 : 4 + cv.line_height(Font::Normal));
  return b;
}

/// The colour bar and its ticks.
struct ColourBar {
  double x, y, w, h;
  std::vector<double> ticks;
  double step;     // between ticks
  double label_w;  // room its tick labels, or the n/a label, take to its right
};

/// 4. The colour bar at (x, y), at least 160 px tall and as tall as the tallest grid.
ColourBar colour_bar_box(const Canvas& cv, const HeatScale& s, double x, double y,
                         double max_grid_h) {
  ColourBar bar{x, y, 18, std::max(max_grid_h, 160.0), {}, 0, 0};
  const int max_ticks =
      std::clamp(static_cast<int>(bar.h / (2 * cv.line_height(Font::Small))), 2, 6);
  bar.ticks = nice_ticks(s.lo, s.hi, max_ticks);
  bar.step = bar.ticks.size() > 1 ? bar.ticks[1] - bar.ticks[0] : s.hi - s.lo;
  double tick_w = 0;
  for (double t : bar.ticks)
    tick_w = std::max(tick_w, cv.text_width(tick_label(t, bar.step), Font::Small));
  bar.label_w = std::max(tick_w, cv.text_width("n/a", Font::Small) + 8);
  return bar;
}

/// 5a. A panel's title, centred over its grid but not left of its box.
void draw_panel_title(Canvas& cv, const Heatmap& p, const PanelBox& b, double panel_title_h) {
  const double title_x =
      std::max(b.grid_x + b.grid_w / 2, b.left + cv.text_width(p.title, Font::Normal) / 2);
  cv.text(title_x, b.grid_y - panel_title_h / 2, p.title, Font::Normal, kText, Align::Middle);
}

/// 5b. A panel's cells: viridis, annotated when they fit, hatched where the value is NaN.
void draw_cells(Canvas& cv, const Heatmap& p, const PanelBox& b, const CellSize& cell,
                const HeatScale& s) {
  const std::size_t rows = p.row_labels.size(), cols = p.col_labels.size();
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t c = 0; c < cols; ++c) {
      const double v = p.values[r * cols + c];
      const double cx = b.grid_x + cell.w * static_cast<double>(c),
                   cy = b.grid_y + cell.h * static_cast<double>(r);
      if (std::isnan(v)) {
        cv.na_rect(cx, cy, cell.w - 1, cell.h - 1);
        continue;
      }
      const Rgb col = viridis((v - s.lo) / (s.hi - s.lo));
      cv.rect(cx, cy, cell.w - 1, cell.h - 1, col);
      if (cell.annotate && p.annotate)
        cv.text(cx + (cell.w - 1) / 2, cy + (cell.h - 1) / 2, fixed(v, s.decimals), Font::Small,
                text_on(col), Align::Middle);
    }
}

/// 5c. A panel's row labels and axis name (when it has its own), its column labels and axis name.
void draw_panel_labels(Canvas& cv, const Heatmap& p, const PanelBox& b, const CellSize& cell) {
  if (b.row_labels) {
    for (std::size_t r = 0; r < p.row_labels.size(); ++r)
      cv.text(b.grid_x - 6, b.grid_y + cell.h * (static_cast<double>(r) + 0.5), p.row_labels[r],
              Font::Small, kText, Align::End);
    if (!p.row_axis.empty())
      cv.text(b.left + cv.line_height(Font::Normal) / 2, b.grid_y + b.grid_h / 2, p.row_axis,
              Font::Normal, kText, Align::Middle, true);
  }
  const double label_y = b.grid_y + b.grid_h + 4;
  for (std::size_t c = 0; c < p.col_labels.size(); ++c) {
    const double cx = b.grid_x + cell.w * (static_cast<double>(c) + 0.5);
    if (b.vertical_cols)
      cv.text(cx, label_y, p.col_labels[c], Font::Small, kText, Align::End, true);
    else
      cv.text(cx, label_y + cv.line_height(Font::Small) / 2, p.col_labels[c], Font::Small, kText,
              Align::Middle);
  }
  if (!p.col_axis.empty())
    cv.text(b.grid_x + b.grid_w / 2, label_y + b.col_label_h + 4 + cv.line_height(Font::Normal) / 2,
            p.col_axis, Font::Normal, kText, Align::Middle);
}

/// 5d. The colour bar, its ticks, and the n/a swatch below it when some cell is NaN.
void draw_colour_bar(Canvas& cv, const ColourBar& bar, const HeatScale& s) {
  cv.colour_bar(bar.x, bar.y, bar.w, bar.h);
  cv.frame(bar.x, bar.y, bar.w, bar.h, kAxis);
  for (double t : bar.ticks) {
    const double ty = bar.y + bar.h * (1 - (t - s.lo) / (s.hi - s.lo));
    cv.polyline({{bar.x + bar.w, ty}, {bar.x + bar.w + 4, ty}}, kAxis, 1);
    cv.text(bar.x + bar.w + 6, ty, tick_label(t, bar.step), Font::Small, kText, Align::Start);
  }
  if (s.any_nan) {
    const double lh = cv.line_height(Font::Small);
    const double y = bar.y + bar.h + 8;
    cv.na_rect(bar.x, y, bar.w, lh);
    cv.text(bar.x + bar.w + 6, y + lh / 2, "n/a", Font::Small, kText, Align::Start);
  }
}

/// Heatmap panels side by side with one colour bar: laid out (1-4), then drawn (5).
void draw_heatmaps(Canvas& cv, const std::vector<Heatmap>& panels, const std::string& suptitle) {
  check_heatmaps(panels);
  const HeatScale scale = heat_scale(panels);
  const CellSize cell = cell_size(cv, panels, scale);
  const double title_h = suptitle.empty() ? 0 : cv.line_height(Font::Large) + 6;
  const double panel_title_h = cv.line_height(Font::Normal) + 4;
  const double grid_y = std::round(kPad + title_h + panel_title_h);
  std::vector<PanelBox> boxes;
  double x = kPad, max_grid_h = 0, below_h = 0;
  for (std::size_t i = 0; i < panels.size(); ++i) {
    const PanelBox b = panel_box(cv, panels, i, x, grid_y, cell);
    max_grid_h = std::max(max_grid_h, b.grid_h);
    below_h = std::max(below_h, b.below_h);
    boxes.push_back(b);
    x += b.width + 2 * kPad;
  }
  const ColourBar bar = colour_bar_box(cv, scale, x - kPad, grid_y, max_grid_h);
  const double na_h = scale.any_nan ? 8 + cv.line_height(Font::Small) : 0;
  const double width = std::max(bar.x + bar.w + 6 + bar.label_w + kPad,
                                cv.text_width(suptitle, Font::Large) + 2 * kPad);
  const double height = grid_y + std::max(max_grid_h + below_h, bar.h + na_h) + kPad;
  cv.begin(static_cast<int>(std::ceil(width)), static_cast<int>(std::ceil(height)));

  if (!suptitle.empty())
    cv.text(width / 2, kPad + title_h / 2, suptitle, Font::Large, kText, Align::Middle);
  for (std::size_t i = 0; i < panels.size(); ++i) {
    draw_panel_title(cv, panels[i], boxes[i], panel_title_h);
    draw_cells(cv, panels[i], boxes[i], cell, scale);
    draw_panel_labels(cv, panels[i], boxes[i], cell);
  }
  draw_colour_bar(cv, bar, scale);
}

// ---------------------------------------------------------------------------------------------
// Line plots and bar charts share the axes
// ---------------------------------------------------------------------------------------------

/// A plot area with a linear x axis and a linear or log10 y axis, mapped to pixels.
struct Axes {
  double x0, y0, x1, y1;  // plot area in pixels (y0 at the top)
  Range xr, yr;           // data ranges; yr in log10 units when log_y
  bool log_y;
  double px(double x) const { return x0 + (x - xr.lo) / (xr.hi - xr.lo) * (x1 - x0); }
  double py(double y) const {
    const double v = log_y ? std::log10(y) : y;
    return y1 - (v - yr.lo) / (yr.hi - yr.lo) * (y1 - y0);
  }
};

struct Ticks {
  std::vector<double> values;
  std::vector<std::string> labels;
};

Ticks linear_ticks(Range r, int max_ticks) {
  Ticks t;
  t.values = nice_ticks(r.lo, r.hi, max_ticks);
  const double step = t.values.size() > 1 ? t.values[1] - t.values[0] : r.hi - r.lo;
  for (double v : t.values) t.labels.push_back(tick_label(v, step));
  return t;
}

/// Ticks for a log axis over [10^r.lo, 10^r.hi]: decades when there are two or more, else
/// 1-2-5 multiples, else linear ticks.
Ticks log_ticks(Range r, int max_ticks) {
  Ticks t;
  const int k0 = static_cast<int>(std::ceil(r.lo - 1e-9)),
            k1 = static_cast<int>(std::floor(r.hi + 1e-9));
  if (k1 - k0 + 1 >= 2) {
    const int every = (k1 - k0) / std::max(1, max_ticks - 1) + 1;
    for (int k = k0; k <= k1; k += every) t.values.push_back(std::pow(10.0, k));
  } else {
    for (int k = k0 - 1; k <= k1; ++k)
      for (double m : {1.0, 2.0, 5.0}) {
        const double v = m * std::pow(10.0, k);
        if (std::log10(v) >= r.lo - 1e-9 && std::log10(v) <= r.hi + 1e-9) t.values.push_back(v);
      }
    if (t.values.size() < 2 || static_cast<int>(t.values.size()) > max_ticks) {
      t.values.clear();
      for (double v : nice_ticks(std::pow(10.0, r.lo), std::pow(10.0, r.hi), max_ticks))
        if (v > 0) t.values.push_back(v);
    }
  }
  for (double v : t.values) t.labels.push_back(fmt::format("{:g}", v));
  return t;
}

/// Grid, tick marks and labels, the title and the y axis name (the caller places the x axis
/// name under its own labels). `x_ticks` may be empty: bar charts label their categories.
void draw_axes(Canvas& cv, const Axes& ax, const Ticks& x_ticks, const Ticks& y_ticks,
               const std::string& title, const std::string& y_label, double width,
               double y_label_x) {
  const double lh = cv.line_height(Font::Small);
  for (double v : y_ticks.values) cv.polyline({{ax.x0, ax.py(v)}, {ax.x1, ax.py(v)}}, kGrid, 1);
  for (double v : x_ticks.values) cv.polyline({{ax.px(v), ax.y0}, {ax.px(v), ax.y1}}, kGrid, 1);
  for (std::size_t i = 0; i < y_ticks.values.size(); ++i) {
    const double y = ax.py(y_ticks.values[i]);
    cv.polyline({{ax.x0 - 4, y}, {ax.x0, y}}, kAxis, 1);
    cv.text(ax.x0 - 7, y, y_ticks.labels[i], Font::Small, kText, Align::End);
  }
  for (std::size_t i = 0; i < x_ticks.values.size(); ++i) {
    const double x = ax.px(x_ticks.values[i]);
    cv.polyline({{x, ax.y1}, {x, ax.y1 + 4}}, kAxis, 1);
    cv.text(x, ax.y1 + 7 + lh / 2, x_ticks.labels[i], Font::Small, kText, Align::Middle);
  }
  if (!title.empty())
    cv.text(width / 2, kPad + cv.line_height(Font::Large) / 2, title, Font::Large, kText,
            Align::Middle);
  if (!y_label.empty())
    cv.text(y_label_x, (ax.y0 + ax.y1) / 2, y_label, Font::Normal, kText, Align::Middle, true);
}

/// Throws std::invalid_argument for series or error bars whose sizes do not match.
void check_lineplot(const LinePlot& plot) {
  for (const Series& s : plot.series)
    if (s.x.size() != s.y.size())
      throw std::invalid_argument(
          fmt::format("line plot '{}': series '{}' has {} x values and {} y values", plot.title,
                      s.label, s.x.size(), s.y.size()));
  for (const ErrorBars& e : plot.error_bars)
    if (e.series >= plot.series.size() || e.lo.size() != plot.series[e.series].x.size() ||
        e.hi.size() != e.lo.size())
      throw std::invalid_argument(fmt::format(
          "line plot '{}': error bars of series {} (of {}) need one lo and one hi per point",
          plot.title, e.series, plot.series.size()));
}

void draw_lineplot(Canvas& cv, const LinePlot& plot) {
  check_lineplot(plot);
  auto usable = [&](double x, double y) {
    return std::isfinite(x) && std::isfinite(y) && (!plot.log_y || y > 0);
  };

  // 1. Data ranges over the usable points; y in log10 units on a log axis.
  std::vector<double> xs, ys;
  const auto bar = [&](const ErrorBars& e, std::size_t i) {  // a bar to draw at point i
    const double x = plot.series[e.series].x[i];
    return usable(x, e.lo[i]) && usable(x, e.hi[i]);
  };
  for (const Series& s : plot.series)
    for (std::size_t i = 0; i < s.x.size(); ++i)
      if (usable(s.x[i], s.y[i]))
        xs.push_back(s.x[i]), ys.push_back(plot.log_y ? std::log10(s.y[i]) : s.y[i]);
  for (const ErrorBars& e : plot.error_bars)
    for (std::size_t i = 0; i < e.lo.size(); ++i)
      if (bar(e, i))
        for (double v : {e.lo[i], e.hi[i]}) ys.push_back(plot.log_y ? std::log10(v) : v);
  Range xr = finite_range(xs, 0, 1), yr = finite_range(ys, 0, 1);
  const double xm = 0.02 * (xr.hi - xr.lo), ym = 0.05 * (yr.hi - yr.lo);
  xr = {xr.lo - xm, xr.hi + xm};
  yr = {yr.lo - ym, yr.hi + ym};

  // 2. Margins from the text they hold; a 900 × 600 picture, wider when the title needs it.
  const double W = std::max(900.0, std::ceil(cv.text_width(plot.title, Font::Large) + 2 * kPad));
  const double H = 600, lh = cv.line_height(Font::Small);
  const double top = kPad + (plot.title.empty() ? 0 : cv.line_height(Font::Large) + 8);
  const double bottom =
      H - kPad - (plot.x_label.empty() ? 0 : cv.line_height(Font::Normal) + 4) - lh - 8;
  const Ticks yt =
      plot.log_y
          ? log_ticks(yr, std::clamp(static_cast<int>((bottom - top) / (2.5 * lh)), 2, 8))
          : linear_ticks(yr, std::clamp(static_cast<int>((bottom - top) / (2.5 * lh)), 2, 8));
  double ytick_w = 0;
  for (const auto& l : yt.labels) ytick_w = std::max(ytick_w, cv.text_width(l, Font::Small));
  const double y_label_w = plot.y_label.empty() ? 0 : cv.line_height(Font::Normal) + 6;
  const double left = std::round(kPad + y_label_w + ytick_w + 8);
  double legend_w = 0;
  for (const Series& s : plot.series)
    legend_w = std::max(legend_w, 36 + cv.text_width(s.label, Font::Small));
  const double right = W - kPad - (legend_w > 0 ? legend_w + kPad : 0);
  Axes ax{left, top, right, bottom, xr, yr, plot.log_y};
  const double xlabel_w = cv.text_width(tick_label(xr.hi, (xr.hi - xr.lo) / 10), Font::Small) + 24;
  const Ticks xt = linear_ticks(xr, std::clamp(static_cast<int>((right - left) / xlabel_w), 2, 10));

  // 3. Draw: grid and labels, the series, the frame on top, the legend.
  cv.begin(static_cast<int>(W), static_cast<int>(H));
  draw_axes(cv, ax, xt, yt, plot.title, plot.y_label, W, kPad + cv.line_height(Font::Normal) / 2);
  if (!plot.x_label.empty())
    cv.text((left + right) / 2, H - kPad - cv.line_height(Font::Normal) / 2, plot.x_label,
            Font::Normal, kText, Align::Middle);
  for (std::size_t k = 0; k < plot.series.size(); ++k) {
    const Series& s = plot.series[k];
    std::vector<Pt> piece;  // unusable points break the line
    for (std::size_t i = 0; i <= s.x.size(); ++i) {
      if (i < s.x.size() && usable(s.x[i], s.y[i])) {
        piece.push_back({ax.px(s.x[i]), ax.py(s.y[i])});
      } else {
        cv.polyline(piece, series_colour(k), 2, s.dashed);
        piece.clear();
      }
    }
  }
  for (const ErrorBars& e : plot.error_bars)  // a vertical line with end caps
    for (std::size_t i = 0; i < e.lo.size(); ++i)
      if (bar(e, i)) {
        const double x = ax.px(plot.series[e.series].x[i]), y0 = ax.py(e.lo[i]),
                     y1 = ax.py(e.hi[i]);
        cv.polyline({{x, y0}, {x, y1}}, series_colour(e.series), 1.5);
        for (double y : {y0, y1})
          cv.polyline({{x - 5, y}, {x + 5, y}}, series_colour(e.series), 1.5);
      }
  cv.frame(left, top, right - left, bottom - top, kAxis);
  for (std::size_t k = 0; k < plot.series.size(); ++k) {
    const double y = top + 8 + lh * 1.3 * static_cast<double>(k) + lh / 2, x = right + kPad;
    cv.polyline({{x, y}, {x + 28, y}}, series_colour(k), 2, plot.series[k].dashed);
    cv.text(x + 34, y, plot.series[k].label, Font::Small, kText, Align::Start);
  }
}

void draw_barchart(Canvas& cv, const BarChart& chart) {
  if (chart.labels.size() != chart.values.size())
    throw std::invalid_argument(fmt::format("bar chart '{}': {} labels but {} values", chart.title,
                                            chart.labels.size(), chart.values.size()));
  const std::size_t n = chart.values.size();
  const double lh = cv.line_height(Font::Small);

  // 1. y range always includes 0; room above (and below) for the value labels.
  Range yr = finite_range(chart.values, 0, 1);
  yr = {std::min(0.0, yr.lo), std::max(0.0, yr.hi)};
  if (yr.lo == yr.hi) yr.hi = 1;
  const double ym = 0.1 * (yr.hi - yr.lo);
  yr = {yr.lo < 0 ? yr.lo - ym : 0.0, yr.hi > 0 ? yr.hi + ym : 0.0};

  // 2. One slot of at least 48 px per bar, 600 px wide at least (more when the title needs it);
  //    category labels vertical when wider than their slot.
  const Ticks yt = linear_ticks(yr, 6);
  const double step = yt.values.size() > 1 ? yt.values[1] - yt.values[0] : 1;
  double ytick_w = 0;
  for (const auto& l : yt.labels) ytick_w = std::max(ytick_w, cv.text_width(l, Font::Small));
  const double left = std::round(
      kPad + (chart.y_label.empty() ? 0 : cv.line_height(Font::Normal) + 6) + ytick_w + 8);
  const double W = std::max({600.0, left + 48 * static_cast<double>(n) + kPad,
                             std::ceil(cv.text_width(chart.title, Font::Large) + 2 * kPad)});
  const double right = W - kPad,
               bar_slot = (right - left) / std::max<double>(1, static_cast<double>(n));
  double label_w = 0;
  for (const auto& l : chart.labels) label_w = std::max(label_w, cv.text_width(l, Font::Small));
  const bool vertical = label_w > bar_slot - 6;
  const double labels_h = vertical ? label_w : lh;
  const double plot_h = 360;
  const double top = kPad + (chart.title.empty() ? 0 : cv.line_height(Font::Large) + 8);
  const double H = top + plot_h + 8 + labels_h +
                   (chart.x_label.empty() ? 0 : 6 + cv.line_height(Font::Normal)) + kPad;
  Axes ax{left, top, right, top + plot_h, {0, static_cast<double>(n == 0 ? 1 : n)}, yr, false};

  // 3. Draw.
  cv.begin(static_cast<int>(std::ceil(W)), static_cast<int>(std::ceil(H)));
  draw_axes(cv, ax, {}, yt, chart.title, chart.y_label, W, kPad + cv.line_height(Font::Normal) / 2);
  const double zero = ax.py(0);
  for (std::size_t i = 0; i < n; ++i) {
    const double cx = left + bar_slot * (static_cast<double>(i) + 0.5), v = chart.values[i];
    const double bw = std::min(bar_slot * 0.7, 60.0);
    if (std::isfinite(v)) {
      const double y = ax.py(v);
      cv.rect(cx - bw / 2, std::min(y, zero), bw, std::abs(zero - y), series_colour(0));
      cv.text(cx, v >= 0 ? y - lh / 2 - 2 : y + lh / 2 + 2, tick_label(v, step / 10), Font::Small,
              kText, Align::Middle);
    } else {
      cv.text(cx, zero - lh / 2 - 2, "n/a", Font::Small, kText, Align::Middle);
    }
    if (vertical)
      cv.text(cx, ax.y1 + 6, chart.labels[i], Font::Small, kText, Align::End, true);
    else
      cv.text(cx, ax.y1 + 6 + lh / 2, chart.labels[i], Font::Small, kText, Align::Middle);
  }
  cv.polyline({{left, zero}, {right, zero}}, kAxis, 1);
  cv.frame(left, top, right - left, plot_h, kAxis);
  if (!chart.x_label.empty())
    cv.text((left + right) / 2, H - kPad - cv.line_height(Font::Normal) / 2, chart.x_label,
            Font::Normal, kText, Align::Middle);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Public functions
// ---------------------------------------------------------------------------------------------

std::vector<double> nice_ticks(double lo, double hi, int max_ticks) {
  if (!std::isfinite(lo) || !std::isfinite(hi) || lo > hi)
    throw std::invalid_argument(
        fmt::format("nice_ticks: needs finite lo <= hi, got [{}, {}]", lo, hi));
  if (lo == hi) return {lo};
  max_ticks = std::max(max_ticks, 2);
  // The finest step 1, 2 or 5 × 10^k that gives at most max_ticks ticks.
  const double raw = (hi - lo) / (max_ticks - 1);
  double mag = std::pow(10.0, std::floor(std::log10(raw)) - 1);
  for (;; mag *= 10)
    for (double m : {1.0, 2.0, 5.0}) {
      const double step = m * mag;
      const double k0 = std::ceil(lo / step - 1e-9), k1 = std::floor(hi / step + 1e-9);
      if (k1 - k0 + 1 > max_ticks) continue;
      if (k1 < k0) return {lo, hi};  // cannot happen in exact arithmetic; guards rounding
      std::vector<double> ticks;
      for (double k = k0; k <= k1; ++k) ticks.push_back(k * step);
      return ticks;
    }
}

namespace {

/// Draws a figure once per format (`draw` lays it out and draws it on the canvas given) and
/// writes each file atomically.
template <typename Draw>
std::vector<std::string> write_formats(const std::string& stem, const std::vector<Format>& formats,
                                       const Draw& draw) {
  std::vector<std::string> paths;
  for (Format f : formats) {
    Canvas cv(f);
    draw(cv);
    const std::string path = stem + "." + format_name(f);
    std::string bytes;
    try {
      bytes = cv.finish();
    } catch (const std::runtime_error& e) {
      throw std::runtime_error(path + ": " + e.what());
    }
    write_text_file_atomic(path, bytes);
    paths.push_back(path);
  }
  return paths;
}

}  // namespace

std::vector<std::string> write_heatmaps(const std::string& stem, const std::vector<Format>& formats,
                                        const std::vector<Heatmap>& panels,
                                        const std::string& suptitle) {
  return write_formats(stem, formats, [&](Canvas& cv) { draw_heatmaps(cv, panels, suptitle); });
}

std::vector<std::string> write_lineplot(const std::string& stem, const std::vector<Format>& formats,
                                        const LinePlot& plot) {
  return write_formats(stem, formats, [&](Canvas& cv) { draw_lineplot(cv, plot); });
}

std::vector<std::string> write_barchart(const std::string& stem, const std::vector<Format>& formats,
                                        const BarChart& chart) {
  return write_formats(stem, formats, [&](Canvas& cv) { draw_barchart(cv, chart); });
}

}  // namespace mhar::io
