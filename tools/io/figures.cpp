/**
 * @file figures.cpp
 * @brief Heatmaps, line plots and bar charts, laid out once and drawn on an SVG or PNG canvas.
 *
 * Reading order: colours → number formatting and ticks → the canvas (interface, SVG backend,
 * PNG rasteriser) → one layout function per figure → the public writers. Layout is in pixels;
 * each backend says how wide a string is in its own font, so the same layout code fits both.
 * The rasteriser is deliberately simple: axis-aligned rectangles, text as stb_easy_font quads
 * (scaled 2× or 3×), lines anti-aliased by distance to the segment. No clipping beyond the image.
 */
#include "figures.h"

#include <fmt/format.h>

#include "file_util.h"

#define STB_IMAGE_WRITE_IMPLEMENTATION
#include <stb_easy_font.h>
#include <stb_image_write.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string_view>

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

std::string hex(Rgb c) {
  return fmt::format("#{:02x}{:02x}{:02x}", c.r, c.g, c.b);
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
// Canvas: the drawing primitives the layouts use, with an SVG and a PNG backend
// ---------------------------------------------------------------------------------------------

enum class Font { Small, Normal, Large };  ///< tick labels / axis labels / titles
enum class Align { Start, Middle, End };   ///< along the text direction

struct Pt {
  double x, y;
};

class Canvas {
 public:
  virtual ~Canvas() = default;
  /// Starts a width × height picture on white.
  virtual void begin(int width, int height) = 0;
  virtual double text_width(const std::string& s, Font f) const = 0;
  /// Vertical room one line of text needs.
  virtual double line_height(Font f) const = 0;
  /// (x, y) is the anchor: `align` along the text, vertically centred. Vertical text reads upwards.
  virtual void text(double x, double y, const std::string& s, Font f, Rgb c, Align align,
                    bool vertical = false) = 0;
  /// `cls` names the element in SVG (tests count class="cell" and class="bar").
  virtual void rect(double x, double y, double w, double h, Rgb fill,
                    const char* cls = nullptr) = 0;
  /// A "not applicable" rectangle: light grey, hatched.
  virtual void na_rect(double x, double y, double w, double h, const char* cls = nullptr) = 0;
  virtual void polyline(const std::vector<Pt>& pts, Rgb c, double width, bool dashed = false) = 0;
  /// A vertical viridis gradient, 1 at the top, 0 at the bottom.
  virtual void colour_bar(double x, double y, double w, double h) = 0;

  void frame(double x, double y, double w, double h, Rgb c) {
    polyline({{x, y}, {x + w, y}, {x + w, y + h}, {x, y + h}, {x, y}}, c, 1);
  }
};

/// Dash pattern shared by both backends, in pixels, for a line of width w.
struct Dash {
  double on, off;
};
Dash dash_pattern(double w) {
  return {3 * w + 3, 2 * w + 2};
}

/// Number of code points of a UTF-8 string.
std::size_t utf8_length(const std::string& s) {
  return static_cast<std::size_t>(std::count_if(
      s.begin(), s.end(), [](char ch) { return (static_cast<unsigned char>(ch) & 0xC0) != 0x80; }));
}

class SvgCanvas final : public Canvas {
 public:
  void begin(int width, int height) override {
    width_ = width;
    height_ = height;
    body_.clear();
  }
  static double font_px(Font f) { return f == Font::Small ? 11 : f == Font::Normal ? 13 : 16; }
  // A generous average advance for sans-serif fonts (DejaVu Sans digits are 0.64 em).
  double text_width(const std::string& s, Font f) const override {
    return 0.62 * font_px(f) * static_cast<double>(utf8_length(s));
  }
  double line_height(Font f) const override { return std::ceil(1.35 * font_px(f)); }

  void text(double x, double y, const std::string& s, Font f, Rgb c, Align align,
            bool vertical) override {
    const char* anchor = align == Align::Start    ? "start"
                         : align == Align::Middle ? "middle"
                                                  : "end";
    body_ += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" font-size="{}" text-anchor="{}")"
                         R"( dominant-baseline="central" fill="{}")",
                         x, y, font_px(f), anchor, hex(c));
    if (f == Font::Large) body_ += R"( font-weight="bold")";
    if (vertical) body_ += fmt::format(R"~( transform="rotate(-90 {:.1f} {:.1f})")~", x, y);
    body_ += '>';
    body_ += escape(s);
    body_ += "</text>\n";
  }
  void rect(double x, double y, double w, double h, Rgb fill, const char* cls) override {
    rect_with(x, y, w, h, hex(fill), cls);
  }
  void na_rect(double x, double y, double w, double h, const char* cls) override {
    rect_with(x, y, w, h, "url(#na)", cls);
  }
  void polyline(const std::vector<Pt>& pts, Rgb c, double width, bool dashed) override {
    if (pts.empty()) return;
    body_ += fmt::format(R"(<polyline fill="none" stroke="{}" stroke-width="{}")"
                         R"( stroke-linejoin="round" stroke-linecap="round")",
                         hex(c), width);
    if (dashed) {
      const Dash d = dash_pattern(width);
      body_ += fmt::format(R"( stroke-dasharray="{} {}")", d.on, d.off);
    }
    body_ += R"( points=")";
    for (const Pt& p : pts) body_ += fmt::format("{:.1f},{:.1f} ", p.x, p.y);
    // A lone point becomes a zero-length segment, which round caps draw as a dot.
    if (pts.size() == 1) body_ += fmt::format("{:.1f},{:.1f}", pts[0].x, pts[0].y);
    body_ += "\"/>\n";
  }
  void colour_bar(double x, double y, double w, double h) override {
    rect_with(x, y, w, h, "url(#viridis)", nullptr);
  }

  /// The complete document.
  std::string finish() const {
    std::string s = fmt::format(
        R"(<svg xmlns="http://www.w3.org/2000/svg" width="{0}" height="{1}" viewBox="0 0 {0} {1}")"
        R"( font-family="DejaVu Sans, Helvetica, Arial, sans-serif">)"
        "\n<defs>\n",
        width_, height_);
    s += fmt::format(R"(<pattern id="na" width="6" height="6" patternUnits="userSpaceOnUse")"
                     R"~( patternTransform="rotate(45)">)~"
                     R"(<rect width="6" height="6" fill="{}"/>)"
                     R"(<line x1="0" y1="0" x2="0" y2="6" stroke="{}" stroke-width="2"/></pattern>)"
                     "\n",
                     hex(kNaFill), hex(kNaHatch));
    s += R"(<linearGradient id="viridis" x1="0" y1="1" x2="0" y2="0">)";
    for (std::size_t i = 0; i < kViridis.size(); ++i)
      s += fmt::format(R"(<stop offset="{:.4f}" stop-color="{}"/>)",
                       static_cast<double>(i) / (kViridis.size() - 1), hex(kViridis[i]));
    s += "</linearGradient>\n</defs>\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
    return s + body_ + "</svg>\n";
  }

 private:
  static std::string escape(const std::string& s) {
    std::string out;
    for (char ch : s) {
      switch (ch) {
        case '&':
          out += "&amp;";
          break;
        case '<':
          out += "&lt;";
          break;
        case '>':
          out += "&gt;";
          break;
        case '"':
          out += "&quot;";
          break;
        default:
          out += ch;
      }
    }
    return out;
  }
  void rect_with(double x, double y, double w, double h, const std::string& fill, const char* cls) {
    body_ += "<rect";
    if (cls) body_ += fmt::format(R"( class="{}")", cls);
    body_ += fmt::format(R"( x="{:.1f}" y="{:.1f}" width="{:.1f}" height="{:.1f}" fill="{}"/>)", x,
                         y, w, h, fill);
    body_ += "\n";
  }

  int width_ = 0, height_ = 0;
  std::string body_;
};

/// The ASCII that stb_easy_font can draw: other code points become '?', control characters ' '.
std::string printable_ascii(const std::string& s) {
  std::string out;
  for (char ch : s) {
    const auto u = static_cast<unsigned char>(ch);
    if (u >= 32 && u < 127)
      out += ch;
    else if (u >= 0xC0)
      out += '?';  // lead byte of a multi-byte code point
    else if (u < 0x80)
      out += ' ';  // control character; continuation bytes are dropped
  }
  return out;
}

class PngCanvas final : public Canvas {
 public:
  void begin(int width, int height) override {
    width_ = width;
    height_ = height;
    pixels_.assign(static_cast<std::size_t>(width) * height * 3, 255);
    coverage_.assign(static_cast<std::size_t>(width) * height, 0.0f);
  }
  /// stb_easy_font draws 7-unit capitals; 2× makes them 14 px, 3× for titles.
  static int scale(Font f) { return f == Font::Large ? 3 : 2; }
  double text_width(const std::string& s, Font f) const override {
    std::string a = printable_ascii(s);
    return stb_easy_font_width(a.data()) * scale(f);
  }
  double line_height(Font f) const override { return 11.0 * scale(f); }

  void text(double x, double y, const std::string& s, Font f, Rgb c, Align align,
            bool vertical) override {
    std::string a = printable_ascii(s);
    if (a.empty()) return;
    const int sc = scale(f);
    std::vector<char> quads(a.size() * 1000 + 64);
    const int n =
        stb_easy_font_print(0, 0, a.data(), nullptr, quads.data(), static_cast<int>(quads.size()));
    const double w = text_width(s, f);
    // Offsets of the text box from the anchor, in the text's own frame (u along, v down).
    const long uo = std::lround(align == Align::Start ? 0.0 : align == Align::Middle ? -w / 2 : -w);
    const long vo = std::lround(-3.5 * sc);  // capitals span v = 0..7 units: centre them
    const long X = std::lround(x), Y = std::lround(y);
    for (int q = 0; q < n; ++q) {
      float v0[4], v2[4];  // the quad's first and third vertices are opposite corners
      std::memcpy(v0, quads.data() + (4 * q) * 16, sizeof v0);
      std::memcpy(v2, quads.data() + (4 * q + 2) * 16, sizeof v2);
      const long u0 = uo + std::lround(std::min(v0[0], v2[0]) * sc),
                 u1 = uo + std::lround(std::max(v0[0], v2[0]) * sc);
      const long t0 = vo + std::lround(std::min(v0[1], v2[1]) * sc),
                 t1 = vo + std::lround(std::max(v0[1], v2[1]) * sc);
      if (vertical)  // rotate by −90°: along the text is up the page, down the glyph is right
        fill(X + t0, Y - u1, X + t1, Y - u0, c);
      else
        fill(X + u0, Y + t0, X + u1, Y + t1, c);
    }
  }
  void rect(double x, double y, double w, double h, Rgb c, const char*) override {
    fill(std::lround(x), std::lround(y), std::lround(x + w), std::lround(y + h), c);
  }
  void na_rect(double x, double y, double w, double h, const char*) override {
    const long x0 = std::lround(x), y0 = std::lround(y), x1 = std::lround(x + w),
               y1 = std::lround(y + h);
    fill(x0, y0, x1, y1, kNaFill);
    // Diagonal hatching in page coordinates, so that neighbouring cells join up.
    for (long py = std::max(0L, y0); py < std::min<long>(y1, height_); ++py)
      for (long px = std::max(0L, x0); px < std::min<long>(x1, width_); ++px)
        if ((px + py) % 7 < 2) put(px, py, kNaHatch, 1.0);
  }
  void polyline(const std::vector<Pt>& pts, Rgb c, double width, bool dashed) override {
    if (pts.empty()) return;
    const double hw = width / 2;
    box_ = {width_, height_, 0, 0};
    if (!dashed) {
      stamp(pts, hw);
    } else {
      for (const auto& piece : dashes(pts, dash_pattern(width))) stamp(piece, hw);
    }
    // Blend once per pixel with the largest coverage, so that joints are not painted twice.
    for (long py = box_[1]; py < box_[3]; ++py)
      for (long px = box_[0]; px < box_[2]; ++px) {
        float& cov = coverage_[static_cast<std::size_t>(py) * width_ + px];
        if (cov > 0) put(px, py, c, cov);
        cov = 0;
      }
  }
  void colour_bar(double x, double y, double w, double h) override {
    const long x0 = std::lround(x), y0 = std::lround(y), x1 = std::lround(x + w),
               y1 = std::lround(y + h);
    for (long py = y0; py < y1; ++py)
      fill(x0, py, x1, py + 1,
           viridis(1.0 - (static_cast<double>(py - y0) + 0.5) / static_cast<double>(y1 - y0)));
  }

  int width() const { return width_; }
  int height() const { return height_; }
  const std::vector<unsigned char>& pixels() const { return pixels_; }

 private:
  void put(long px, long py, Rgb c, double a) {
    unsigned char* p = &pixels_[(static_cast<std::size_t>(py) * width_ + px) * 3];
    const unsigned char src[3] = {c.r, c.g, c.b};
    for (int k = 0; k < 3; ++k)
      p[k] = static_cast<unsigned char>(std::lround(p[k] + a * (src[k] - p[k])));
  }
  /// Fills pixels [x0, x1) × [y0, y1), clipped to the image.
  void fill(long x0, long y0, long x1, long y1, Rgb c) {
    for (long py = std::max(0L, y0); py < std::min<long>(y1, height_); ++py)
      for (long px = std::max(0L, x0); px < std::min<long>(x1, width_); ++px) put(px, py, c, 1.0);
  }
  /// Coverage of a polyline of half-width hw: 1 inside, fading over one pixel at the edge.
  void stamp(const std::vector<Pt>& pts, double hw) {
    // Segments i → i+1; a lone point is a zero-length segment, drawn as a dot.
    const std::size_t segments = std::max<std::size_t>(pts.size() - 1, 1);
    for (std::size_t i = 0; i < segments; ++i) {
      const Pt a = pts[i], b = pts[std::min(i + 1, pts.size() - 1)];
      const long x0 = std::max(0L, static_cast<long>(std::floor(std::min(a.x, b.x) - hw - 1)));
      const long x1 =
          std::min<long>(width_, static_cast<long>(std::ceil(std::max(a.x, b.x) + hw + 1)));
      const long y0 = std::max(0L, static_cast<long>(std::floor(std::min(a.y, b.y) - hw - 1)));
      const long y1 =
          std::min<long>(height_, static_cast<long>(std::ceil(std::max(a.y, b.y) + hw + 1)));
      box_ = {std::min(box_[0], x0), std::min(box_[1], y0), std::max(box_[2], x1),
              std::max(box_[3], y1)};
      const double dx = b.x - a.x, dy = b.y - a.y, len2 = dx * dx + dy * dy;
      for (long py = y0; py < y1; ++py)
        for (long px = x0; px < x1; ++px) {
          const double cx = px + 0.5 - a.x, cy = py + 0.5 - a.y;
          const double t = len2 > 0 ? std::clamp((cx * dx + cy * dy) / len2, 0.0, 1.0) : 0.0;
          const double d = std::hypot(cx - t * dx, cy - t * dy);
          const auto cov = static_cast<float>(std::clamp(hw + 0.5 - d, 0.0, 1.0));
          float& slot = coverage_[static_cast<std::size_t>(py) * width_ + px];
          slot = std::max(slot, cov);
        }
    }
  }
  /// The "on" pieces of a dashed polyline.
  static std::vector<std::vector<Pt>> dashes(const std::vector<Pt>& pts, Dash pattern) {
    std::vector<std::vector<Pt>> out{{pts[0]}};
    bool on = true;
    double left = pattern.on;  // length left in the current dash or gap
    for (std::size_t i = 1; i < pts.size(); ++i) {
      Pt a = pts[i - 1];
      const Pt b = pts[i];
      double seg = std::hypot(b.x - a.x, b.y - a.y);
      while (seg > left) {
        const double f = left / seg;
        a = {a.x + f * (b.x - a.x), a.y + f * (b.y - a.y)};
        seg -= left;
        if (on)
          out.back().push_back(a);
        else
          out.push_back({a});
        on = !on;
        left = on ? pattern.on : pattern.off;
      }
      left -= seg;
      if (on) out.back().push_back(b);
    }
    return out;
  }

  int width_ = 0, height_ = 0;
  std::vector<unsigned char> pixels_;  // RGB, row-major
  std::vector<float> coverage_;        // scratch for polyline(), all zero between calls
  std::array<long, 4> box_{};          // x0, y0, x1, y1 touched by the current polyline
};

/// Encodes the canvas as PNG and writes it atomically.
void write_png(const std::string& path, const PngCanvas& canvas) {
  std::string png;
  auto append = [](void* ctx, void* data, int size) {
    static_cast<std::string*>(ctx)->append(static_cast<const char*>(data),
                                           static_cast<std::size_t>(size));
  };
  if (!stbi_write_png_to_func(append, &png, canvas.width(), canvas.height(), 3,
                              canvas.pixels().data(), canvas.width() * 3))
    throw std::runtime_error(path + ": PNG encoding failed (" + std::to_string(canvas.width()) +
                             "×" + std::to_string(canvas.height()) + " pixels)");
  write_text_file_atomic(path, png);
}

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

void draw_heatmaps(Canvas& cv, const std::vector<Heatmap>& panels, const std::string& suptitle) {
  check_heatmaps(panels);
  // 1. One colour scale for all panels.
  double lo = panels[0].vmin, hi = panels[0].vmax;
  bool any_nan = false;
  for (const Heatmap& p : panels) {
    lo = std::min(lo, p.vmin), hi = std::max(hi, p.vmax);
    any_nan = any_nan ||
              std::any_of(p.values.begin(), p.values.end(), [](double v) { return std::isnan(v); });
  }
  const int decimals = std::clamp(2 - static_cast<int>(std::floor(std::log10(hi - lo))), 0, 4);

  // 2. Cell size: 36 px, wider (up to 60) when the annotations need it, else no annotations.
  const double lh = cv.line_height(Font::Small);
  double ann_w = 0;
  for (const Heatmap& p : panels)
    if (p.annotate)
      for (double v : p.values)
        if (!std::isnan(v)) ann_w = std::max(ann_w, cv.text_width(fixed(v, decimals), Font::Small));
  const bool annotate = ann_w > 0 && ann_w + 8 <= 60;
  const double cw = std::ceil(std::max(36.0, annotate ? ann_w + 8 : 0.0));
  const double ch = std::ceil(std::max(32.0, lh + 8));

  // 3. Per panel: row labels (unless the same as panel 0's), column labels, axis names.
  struct Box {
    bool row_labels;
    double row_label_w, left, grid_x, width, grid_h;
    bool vertical_cols;
    double col_label_h;
  };
  std::vector<Box> boxes;
  double x = kPad, max_grid_h = 0, below_h = 0;
  const double title_h = suptitle.empty() ? 0 : cv.line_height(Font::Large) + 6;
  const double panel_title_h = cv.line_height(Font::Normal) + 4;
  for (std::size_t i = 0; i < panels.size(); ++i) {
    const Heatmap& p = panels[i];
    Box b{};
    b.row_labels =
        i == 0 || p.row_labels != panels[0].row_labels || p.row_axis != panels[0].row_axis;
    for (const auto& l : p.row_labels)
      b.row_label_w = std::max(b.row_label_w, cv.text_width(l, Font::Small));
    double col_w = 0;
    for (const auto& l : p.col_labels) col_w = std::max(col_w, cv.text_width(l, Font::Small));
    b.vertical_cols = col_w > cw - 4;
    b.col_label_h = b.vertical_cols ? col_w : lh;
    b.left = x;
    const double axis_w = p.row_axis.empty() ? 0 : cv.line_height(Font::Normal) + 10;
    b.grid_x = std::round(x + (b.row_labels ? axis_w + b.row_label_w + 6 : 0));
    const double grid_w = cw * static_cast<double>(p.col_labels.size());
    b.grid_h = ch * static_cast<double>(p.row_labels.size());
    b.width = std::max(b.grid_x - x + grid_w, cv.text_width(p.title, Font::Normal));
    max_grid_h = std::max(max_grid_h, b.grid_h);
    below_h = std::max(
        below_h, 4 + b.col_label_h + (p.col_axis.empty() ? 0 : 4 + cv.line_height(Font::Normal)));
    boxes.push_back(b);
    x += b.width + 2 * kPad;
  }

  // 4. Colour bar to the right, at least 160 px tall; "n/a" swatch below it when needed.
  const double bar_h = std::max(max_grid_h, 160.0), bar_w = 18;
  const int max_ticks = std::clamp(static_cast<int>(bar_h / (2 * lh)), 2, 6);
  const std::vector<double> ticks = nice_ticks(lo, hi, max_ticks);
  const double step = ticks.size() > 1 ? ticks[1] - ticks[0] : hi - lo;
  double tick_w = 0;
  for (double t : ticks) tick_w = std::max(tick_w, cv.text_width(tick_label(t, step), Font::Small));
  const double bar_x = x - kPad;
  const double na_h = any_nan ? 8 + lh : 0;
  const double width =
      std::max(bar_x + bar_w + 6 + std::max(tick_w, cv.text_width("n/a", Font::Small) + 8) + kPad,
               cv.text_width(suptitle, Font::Large) + 2 * kPad);
  const double grid_y = std::round(kPad + title_h + panel_title_h);
  const double height = grid_y + std::max(max_grid_h + below_h, bar_h + na_h) + kPad;
  cv.begin(static_cast<int>(std::ceil(width)), static_cast<int>(std::ceil(height)));

  // 5. Draw.
  if (!suptitle.empty())
    cv.text(width / 2, kPad + title_h / 2, suptitle, Font::Large, kText, Align::Middle);
  for (std::size_t i = 0; i < panels.size(); ++i) {
    const Heatmap& p = panels[i];
    const Box& b = boxes[i];
    const std::size_t rows = p.row_labels.size(), cols = p.col_labels.size();
    const double grid_w = cw * static_cast<double>(cols);
    // The title centred over the grid, but not left of the panel's box.
    const double title_x =
        std::max(b.grid_x + grid_w / 2, b.left + cv.text_width(p.title, Font::Normal) / 2);
    cv.text(title_x, grid_y - panel_title_h / 2, p.title, Font::Normal, kText, Align::Middle);
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t c = 0; c < cols; ++c) {
        const double v = p.values[r * cols + c];
        const double cx = b.grid_x + cw * static_cast<double>(c),
                     cy = grid_y + ch * static_cast<double>(r);
        if (std::isnan(v)) {
          cv.na_rect(cx, cy, cw - 1, ch - 1, "cell");
          continue;
        }
        const Rgb col = viridis((v - lo) / (hi - lo));
        cv.rect(cx, cy, cw - 1, ch - 1, col, "cell");
        if (annotate && p.annotate)
          cv.text(cx + (cw - 1) / 2, cy + (ch - 1) / 2, fixed(v, decimals), Font::Small,
                  text_on(col), Align::Middle);
      }
    if (b.row_labels) {
      for (std::size_t r = 0; r < rows; ++r)
        cv.text(b.grid_x - 6, grid_y + ch * (static_cast<double>(r) + 0.5), p.row_labels[r],
                Font::Small, kText, Align::End);
      if (!p.row_axis.empty())
        cv.text(b.left + cv.line_height(Font::Normal) / 2, grid_y + b.grid_h / 2, p.row_axis,
                Font::Normal, kText, Align::Middle, true);
    }
    const double label_y = grid_y + b.grid_h + 4;
    for (std::size_t c = 0; c < cols; ++c) {
      const double cx = b.grid_x + cw * (static_cast<double>(c) + 0.5);
      if (b.vertical_cols)
        cv.text(cx, label_y, p.col_labels[c], Font::Small, kText, Align::End, true);
      else
        cv.text(cx, label_y + lh / 2, p.col_labels[c], Font::Small, kText, Align::Middle);
    }
    if (!p.col_axis.empty())
      cv.text(b.grid_x + grid_w / 2, label_y + b.col_label_h + 4 + cv.line_height(Font::Normal) / 2,
              p.col_axis, Font::Normal, kText, Align::Middle);
  }
  cv.colour_bar(bar_x, grid_y, bar_w, bar_h);
  cv.frame(bar_x, grid_y, bar_w, bar_h, kAxis);
  for (double t : ticks) {
    const double ty = grid_y + bar_h * (1 - (t - lo) / (hi - lo));
    cv.polyline({{bar_x + bar_w, ty}, {bar_x + bar_w + 4, ty}}, kAxis, 1);
    cv.text(bar_x + bar_w + 6, ty, tick_label(t, step), Font::Small, kText, Align::Start);
  }
  if (any_nan) {
    const double y = grid_y + bar_h + 8;
    cv.na_rect(bar_x, y, bar_w, lh);
    cv.text(bar_x + bar_w + 6, y + lh / 2, "n/a", Font::Small, kText, Align::Start);
  }
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

void draw_lineplot(Canvas& cv, const LinePlot& plot) {
  for (const Series& s : plot.series)
    if (s.x.size() != s.y.size())
      throw std::invalid_argument(
          fmt::format("line plot '{}': series '{}' has {} x values and {} y values", plot.title,
                      s.label, s.x.size(), s.y.size()));
  auto usable = [&](double x, double y) {
    return std::isfinite(x) && std::isfinite(y) && (!plot.log_y || y > 0);
  };

  // 1. Data ranges over the usable points; y in log10 units on a log axis.
  std::vector<double> xs, ys;
  for (const Series& s : plot.series)
    for (std::size_t i = 0; i < s.x.size(); ++i)
      if (usable(s.x[i], s.y[i]))
        xs.push_back(s.x[i]), ys.push_back(plot.log_y ? std::log10(s.y[i]) : s.y[i]);
  Range xr = finite_range(xs, 0, 1), yr = finite_range(ys, 0, 1);
  const double xm = 0.02 * (xr.hi - xr.lo), ym = 0.05 * (yr.hi - yr.lo);
  xr = {xr.lo - xm, xr.hi + xm};
  yr = {yr.lo - ym, yr.hi + ym};

  // 2. Margins from the text they hold; fixed 900 × 600 picture.
  const double W = 900, H = 600, lh = cv.line_height(Font::Small);
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

  // 2. One slot of at least 48 px per bar, 600 px wide at least; category labels vertical when
  //    wider than their slot.
  const Ticks yt = linear_ticks(yr, 6);
  const double step = yt.values.size() > 1 ? yt.values[1] - yt.values[0] : 1;
  double ytick_w = 0;
  for (const auto& l : yt.labels) ytick_w = std::max(ytick_w, cv.text_width(l, Font::Small));
  const double left = std::round(
      kPad + (chart.y_label.empty() ? 0 : cv.line_height(Font::Normal) + 6) + ytick_w + 8);
  const double W = std::max(600.0, left + 48 * static_cast<double>(n) + kPad);
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
      cv.rect(cx - bw / 2, std::min(y, zero), bw, std::abs(zero - y), series_colour(0), "bar");
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

std::string heatmap_svg(const std::vector<Heatmap>& panels, const std::string& suptitle) {
  SvgCanvas cv;
  draw_heatmaps(cv, panels, suptitle);
  return cv.finish();
}

void write_heatmap_png(const std::string& path, const std::vector<Heatmap>& panels,
                       const std::string& suptitle) {
  PngCanvas cv;
  draw_heatmaps(cv, panels, suptitle);
  write_png(path, cv);
}

std::string lineplot_svg(const LinePlot& plot) {
  SvgCanvas cv;
  draw_lineplot(cv, plot);
  return cv.finish();
}

void write_lineplot_png(const std::string& path, const LinePlot& plot) {
  PngCanvas cv;
  draw_lineplot(cv, plot);
  write_png(path, cv);
}

std::string barchart_svg(const BarChart& chart) {
  SvgCanvas cv;
  draw_barchart(cv, chart);
  return cv.finish();
}

void write_barchart_png(const std::string& path, const BarChart& chart) {
  PngCanvas cv;
  draw_barchart(cv, chart);
  write_png(path, cv);
}

}  // namespace mhar::io
