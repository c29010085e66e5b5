/**
 * @file test_figures.cpp
 * @brief mhar_io's figures, tested by what they show: PNGs decoded again (by Cairo's PNG reader)
 *        and checked for which colours lie where; PDFs read back by poppler's pdftotext, for the
 *        text (UTF-8 included) and where each word lies; the three formats of one figure have
 *        one size. In a build without figures, one case says so and is reported as skipped.
 */
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "figures.h"
#include "temp_dir.h"

#if MHAR_FIGURES
#include <cairo.h>
#endif

using namespace mhar::io;
using mhar::io::test::read_bytes;
using mhar::io::test::TempDir;
namespace fs = std::filesystem;

TEST_CASE("figures: formats are named png, svg and pdf, in the order given", "[figures]") {
  CHECK(parse_formats("png,svg,pdf") == std::vector<Format>{Format::png, Format::svg, Format::pdf});
  CHECK(parse_formats("pdf") == std::vector<Format>{Format::pdf});
  CHECK(parse_formats("svg,png") == std::vector<Format>{Format::svg, Format::png});
  CHECK(format_list({Format::svg, Format::pdf}) == "svg,pdf");
  CHECK(format_list(parse_formats("png,pdf")) == "png,pdf");
  CHECK_THROWS_WITH(parse_formats("png,jpg"), Catch::Contains("unknown figure format 'jpg'") &&
                                                  Catch::Contains("png, svg or pdf"));
  CHECK_THROWS_WITH(parse_formats("png,png"), Catch::Contains("'png' is named twice"));
  CHECK_THROWS_AS(parse_formats(""), std::invalid_argument);
  CHECK_THROWS_AS(parse_formats("png,"), std::invalid_argument);
  CHECK_THROWS_AS(parse_formats("PNG"), std::invalid_argument);
}

#if !MHAR_FIGURES

TEST_CASE("figures: drawing", "[figures]") {
  WARN(
      "MHAR_SKIP: this build has no figures (Cairo not found at configure time, or "
      "-DMHAR_FIGURES=OFF), so nothing is drawn to test");
  CHECK_THROWS_AS(write_lineplot("unused", {Format::png}, LinePlot{}), std::logic_error);
}

#else

namespace {

// --- PNG: decoded by Cairo ---------------------------------------------------------------------

struct Image {
  int w = 0, h = 0;
  std::vector<unsigned char> rgb;
  const unsigned char* at(int x, int y) const {
    return &rgb[(static_cast<std::size_t>(y) * w + x) * 3];
  }
};

Image decode_png(const std::string& path) {
  cairo_surface_t* s = cairo_image_surface_create_from_png(path.c_str());
  REQUIRE(cairo_surface_status(s) == CAIRO_STATUS_SUCCESS);
  Image img;
  img.w = cairo_image_surface_get_width(s);
  img.h = cairo_image_surface_get_height(s);
  const int stride = cairo_image_surface_get_stride(s);
  const unsigned char* data = cairo_image_surface_get_data(s);
  REQUIRE(cairo_image_surface_get_format(s) == CAIRO_FORMAT_RGB24);  // opaque: no premultiplying
  for (int y = 0; y < img.h; ++y)
    for (int x = 0; x < img.w; ++x) {
      std::uint32_t px;
      std::memcpy(&px, data + static_cast<std::size_t>(y) * stride + 4 * x, 4);  // 0x__RRGGBB
      img.rgb.push_back(static_cast<unsigned char>(px >> 16));
      img.rgb.push_back(static_cast<unsigned char>(px >> 8));
      img.rgb.push_back(static_cast<unsigned char>(px));
    }
  cairo_surface_destroy(s);
  return img;
}

double colour_distance(const unsigned char* p, int r, int g, int b) {
  return std::sqrt((p[0] - r) * (p[0] - r) + (p[1] - g) * (p[1] - g) + (p[2] - b) * (p[2] - b));
}

struct Blob {
  std::size_t count = 0;
  double cx = 0, cy = 0;
};

/// Pixels within `tol` of (r, g, b): how many, and their centroid.
Blob find_colour(const Image& img, int r, int g, int b, double tol) {
  Blob blob;
  for (int y = 0; y < img.h; ++y)
    for (int x = 0; x < img.w; ++x)
      if (colour_distance(img.at(x, y), r, g, b) <= tol) ++blob.count, blob.cx += x, blob.cy += y;
  if (blob.count)
    blob.cx /= static_cast<double>(blob.count), blob.cy /= static_cast<double>(blob.count);
  return blob;
}

/// Solid rectangles of exactly (r, g, b), at least min_w × min_h pixels: how many distinct
/// ones. Each counts once, at its top-left pixel (left and above it, another colour).
int count_boxes(const Image& img, int r, int g, int b, int min_w, int min_h) {
  auto is = [&](int x, int y) {
    return x >= 0 && y >= 0 && x < img.w && y < img.h && colour_distance(img.at(x, y), r, g, b) < 1;
  };
  int n = 0;
  for (int y = 0; y < img.h; ++y)
    for (int x = 0; x < img.w; ++x) {
      if (!is(x, y) || is(x - 1, y) || is(x, y - 1)) continue;
      bool solid = true;
      for (int dy = 0; dy < min_h && solid; ++dy)
        for (int dx = 0; dx < min_w && solid; ++dx) solid = is(x + dx, y + dy);
      n += solid;
    }
  return n;
}

// --- PDF: read back by pdftotext ---------------------------------------------------------------

struct Word {
  std::string text;
  double x0, y0, x1, y1;
};
struct PdfText {
  double width = 0, height = 0;  ///< the page
  std::vector<Word> words;
  std::string all;  ///< the words, space-separated
  bool has(const std::string& w) const {
    for (const Word& x : words)
      if (x.text == w) return true;
    return false;
  }
};

/// The words of a one-page PDF and their boxes (`pdftotext -bbox`), or nothing when pdftotext
/// is not installed (the caller skips).
std::optional<PdfText> pdf_text(const std::string& pdf) {
  const std::string tool = MHAR_PDFTOTEXT;
  if (tool.empty()) return std::nullopt;
  const std::string html = pdf + ".html";
  const std::string cmd = tool + " -bbox '" + pdf + "' '" + html + "'";
  REQUIRE(std::system(cmd.c_str()) == 0);
  const std::string text = read_bytes(html);
  PdfText out;
  std::smatch m;
  const std::regex page(R"re(<page width="([0-9.]+)" height="([0-9.]+)">)re");
  REQUIRE(std::regex_search(text, m, page));
  out.width = std::stod(m[1]);
  out.height = std::stod(m[2]);
  const std::regex word(
      R"re(<word xMin="([0-9.-]+)" yMin="([0-9.-]+)" xMax="([0-9.-]+)" yMax="([0-9.-]+)">([^<]*)</word>)re");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), word); it != std::sregex_iterator();
       ++it) {
    std::string w = (*it)[5];
    for (auto [from, to] : {std::pair<std::string, std::string>{"&lt;", "<"},
                            {"&gt;", ">"},
                            {"&quot;", "\""},
                            {"&amp;", "&"}})
      for (auto p = w.find(from); p != std::string::npos; p = w.find(from, p + to.size()))
        w.replace(p, from.size(), to);
    out.words.push_back(
        {w, std::stod((*it)[1]), std::stod((*it)[2]), std::stod((*it)[3]), std::stod((*it)[4])});
    out.all += (out.all.empty() ? "" : " ") + w;
  }
  return out;
}

/// Every word inside the page, and no two words overlapping (by more than `slack` points on
/// each axis: the boxes are a font's, a little taller than the ink).
void check_words_placed(const PdfText& t, double slack = 1.0) {
  for (const Word& w : t.words) {
    CAPTURE(w.text, w.x0, w.y0, w.x1, w.y1, t.width, t.height);
    CHECK(w.x0 >= 0);
    CHECK(w.y0 >= 0);
    CHECK(w.x1 <= t.width);
    CHECK(w.y1 <= t.height);
  }
  for (std::size_t i = 0; i < t.words.size(); ++i)
    for (std::size_t j = i + 1; j < t.words.size(); ++j) {
      const Word &a = t.words[i], &b = t.words[j];
      const double ox = std::min(a.x1, b.x1) - std::max(a.x0, b.x0);
      const double oy = std::min(a.y1, b.y1) - std::max(a.y0, b.y0);
      CAPTURE(a.text, a.x0, a.y0, a.x1, a.y1, b.text, b.x0, b.y0, b.x1, b.y1);
      CHECK_FALSE((ox > slack && oy > slack));
    }
}

#define REQUIRE_PDF_TEXT(var, path)                                                       \
  const std::optional<PdfText> var##_opt = pdf_text(path);                                \
  if (!var##_opt) {                                                                       \
    WARN("MHAR_SKIP: pdftotext (Debian: poppler-utils) was not found at configure time"); \
    return;                                                                               \
  }                                                                                       \
  const PdfText& var = *var##_opt

/// The page size of a PDF written by Cairo ("/MediaBox [ 0 0 W H ]", uncompressed).
std::pair<double, double> pdf_page_size(const std::string& pdf) {
  std::smatch m;
  const std::string bytes = read_bytes(pdf);
  const std::regex box(R"(/MediaBox \[ *0 0 ([0-9.]+) ([0-9.]+) *\])");
  REQUIRE(std::regex_search(bytes, m, box));
  return {std::stod(m[1]), std::stod(m[2])};
}

Heatmap sample_heatmap(const std::string& title) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Heatmap h;
  h.title = title;
  h.row_labels = {"site 1", "site 2", "site 3"};
  h.col_labels = {"embedding", "block 1", "block 2", "block 3"};
  h.row_axis = "routing site";
  h.col_axis = "source";
  h.values = {0.9, 0.1, nan, nan, 0.2, 0.5, 0.3, nan, 0.0, 0.25, 0.25, 0.5};
  return h;
}

const std::vector<Format> kPng{Format::png}, kPdf{Format::pdf},
    kAll{Format::png, Format::svg, Format::pdf};

}  // namespace

TEST_CASE("figures: nice_ticks steps by 1, 2 or 5 × 10^k within the range", "[figures]") {
  struct Case {
    double lo, hi;
    int max_ticks;
  };
  const Case c =
      GENERATE(Case{0, 1, 6}, Case{0, 0.37, 6}, Case{-3.2, 17.9, 5}, Case{0.11, 0.19, 4},
               Case{1e-7, 3e-6, 8}, Case{0, 12345, 7}, Case{-1, 1, 3}, Case{0.9, 1.1, 2});
  CAPTURE(c.lo, c.hi, c.max_ticks);
  const std::vector<double> t = nice_ticks(c.lo, c.hi, c.max_ticks);
  REQUIRE(!t.empty());
  CHECK(static_cast<int>(t.size()) <= c.max_ticks);
  const double tol = 1e-9 * (c.hi - c.lo);
  CHECK(t.front() >= c.lo - tol);
  CHECK(t.back() <= c.hi + tol);
  if (t.size() >= 2) {
    const double step = t[1] - t[0];
    const double mantissa = step / std::pow(10.0, std::floor(std::log10(step) + 1e-9));
    CAPTURE(step, mantissa);
    CHECK((std::abs(mantissa - 1) < 1e-6 || std::abs(mantissa - 2) < 1e-6 ||
           std::abs(mantissa - 5) < 1e-6));
    for (std::size_t i = 1; i < t.size(); ++i) CHECK(t[i] - t[i - 1] == Approx(step));
    CHECK(std::abs(std::remainder(t[0], step)) < 1e-6 * step);  // ticks are multiples of the step
  }
}

TEST_CASE("figures: nice_ticks gives the finest step that fits", "[figures]") {
  const std::vector<double> t = nice_ticks(0, 1, 6);
  REQUIRE(t.size() == 6);
  for (int i = 0; i < 6; ++i) CHECK(t[i] == Approx(0.2 * i).margin(1e-12));
  CHECK(nice_ticks(0, 0.37, 6).size() == 4);  // 0, 0.1, 0.2, 0.3
  CHECK(nice_ticks(2, 2, 6) == std::vector<double>{2});
  CHECK_THROWS_AS(nice_ticks(1, 0, 6), std::invalid_argument);
}

TEST_CASE("figures: one figure in three formats: one size, the paths in the order asked",
          "[figures]") {
  TempDir dir;
  const std::vector<std::string> paths =
      write_heatmaps(dir.file("heat"), {Format::svg, Format::pdf, Format::png},
                     {sample_heatmap("head 0"), sample_heatmap("head 1")}, "Routing weights");
  CHECK(paths ==
        std::vector<std::string>{dir.file("heat.svg"), dir.file("heat.pdf"), dir.file("heat.png")});
  CHECK(dir.entries() == std::vector<std::string>{"heat.pdf", "heat.png", "heat.svg"});
  const Image img = decode_png(dir.file("heat.png"));
  CHECK(img.w > 300);
  CHECK(img.h > 150);
  const auto [pw, ph] = pdf_page_size(dir.file("heat.pdf"));
  CHECK(pw == img.w);
  CHECK(ph == img.h);
  const std::string svg = read_bytes(dir.file("heat.svg"));
  CHECK(svg.find("<svg") != std::string::npos);
  CHECK(svg.find("width=\"" + std::to_string(img.w) + "px\"") != std::string::npos);
  CHECK(svg.find("height=\"" + std::to_string(img.h) + "px\"") != std::string::npos);
  CHECK(svg.find("<use xlink:href=\"#glyph") != std::string::npos);  // text drawn as glyphs
  CHECK(svg.substr(svg.size() - 7) == "</svg>\n");
}

TEST_CASE("figures: heatmap text is real UTF-8 text, every word on the page, none overlapping",
          "[figures]") {
  Heatmap h0 = sample_heatmap("head α"), h1 = sample_heatmap("head 1");
  h1.col_labels[3] = "⟨q,k⟩";
  h1.col_axis = "source Δ";
  TempDir dir;
  write_heatmaps(dir.file("heat"), kPdf, {h0, h1}, "mean routing weight α, step 100");
  REQUIRE_PDF_TEXT(t, dir.file("heat.pdf"));
  CAPTURE(t.all);
  for (const char* w : {"mean", "routing", "weight", "α,", "step", "100", "head", "α", "1", "site",
                        "source", "Δ", "embedding", "block", "⟨q,k⟩", "0.90", "0.25"})
    CHECK(t.has(w));
  check_words_placed(t);
  // The suptitle is centred over the figure; head 0's panel is left of head 1's.
  double title_x0 = 1e9, title_x1 = 0, alpha_x = 0, one_x = 0;
  for (const Word& w : t.words) {
    if (w.text == "mean" && w.y0 < 30) title_x0 = w.x0;
    if (w.text == "100" && w.y0 < 30) title_x1 = w.x1;
    if (w.text == "α") alpha_x = w.x0;
    if (w.text == "1" && w.y0 < 50) one_x = w.x0;
  }
  CHECK(std::abs((title_x0 + title_x1) / 2 - t.width / 2) < 2);
  CHECK(alpha_x > 0);
  CHECK(alpha_x < one_x);
}

TEST_CASE("figures: a long title widens the figure to hold it", "[figures]") {
  const std::string long_title =
      "mean routing weight α over 16 held-out windows of tiny-Shakespeare, mhar H=4, step 600, "
      "seed 1, d = 128, L = 4";
  TempDir dir;
  write_heatmaps(dir.file("short"), kAll, {sample_heatmap("head 0")}, "α");
  write_heatmaps(dir.file("long"), kAll, {sample_heatmap("head 0")}, long_title);
  const Image s = decode_png(dir.file("short.png")), l = decode_png(dir.file("long.png"));
  CHECK(l.w > s.w + 300);
  REQUIRE_PDF_TEXT(t, dir.file("long.pdf"));
  CHECK(t.all.find(long_title) != std::string::npos);
  check_words_placed(t);
}

TEST_CASE("figures: labels that are not valid UTF-8 print with a replacement character",
          "[figures]") {
  Heatmap h = sample_heatmap("bad \xff byte");
  h.row_labels[0] = "cut \xe2\x9f";  // a truncated 3-byte sequence
  TempDir dir;
  write_heatmaps(dir.file("heat"), kAll, {h}, "title");
  REQUIRE_PDF_TEXT(t, dir.file("heat.pdf"));
  CAPTURE(t.all);
  CHECK(t.has("bad"));
  CHECK(t.has("byte"));
  CHECK(t.has("\xEF\xBF\xBD"));
  CHECK(t.has("cut"));
}

TEST_CASE("figures: heatmaps with inconsistent input are refused, and nothing is written",
          "[figures]") {
  TempDir dir;
  Heatmap h = sample_heatmap("head 0");
  h.values.pop_back();
  CHECK_THROWS_WITH(write_heatmaps(dir.file("h"), kAll, {h}, ""),
                    Catch::Contains("values has 11 entries, expected rows × cols = 3 × 4 = 12"));
  h = sample_heatmap("head 0");
  h.vmin = h.vmax = 1;
  CHECK_THROWS_WITH(write_heatmaps(dir.file("h"), kAll, {h}, ""),
                    Catch::Contains("needs vmin < vmax"));
  CHECK_THROWS_AS(write_heatmaps(dir.file("h"), kAll, {}, ""), std::invalid_argument);
  CHECK(dir.entries().empty());
  const std::string bad = dir.file("missing/h");
  CHECK_THROWS_WITH(write_heatmaps(bad, kPng, {sample_heatmap("h")}, "t"),
                    Catch::StartsWith(bad + ".png: "));
}

TEST_CASE("figures: heatmap PNG cells take viridis colours in the order of the values",
          "[figures]") {
  // One row 0 | 0.5 | 1, one row of NaN: the low cell must be viridis' dark purple and left of the
  // high cell's yellow, the cell between them viridis(0.5) teal, and the NaN row grey below.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Heatmap h;
  h.title = "ordering";
  h.row_labels = {"r0", "r1"};
  h.col_labels = {"lo", "mid", "hi"};
  h.values = {0.0, 0.5, 1.0, nan, nan, nan};
  h.annotate = false;
  TempDir dir;
  write_heatmaps(dir.file("order"), kPng, {h}, "Heatmap ordering");
  const Image img = decode_png(dir.file("order.png"));
  REQUIRE(img.w > 100);
  REQUIRE(img.h > 100);

  const Blob lo = find_colour(img, 68, 1, 84, 12), hi = find_colour(img, 253, 231, 37, 12);
  CAPTURE(lo.count, hi.count, lo.cx, hi.cx);
  REQUIRE(lo.count >= 28 * 28);  // a whole cell, not a few pixels of the colour bar
  REQUIRE(hi.count >= 28 * 28);
  CHECK(lo.cx < hi.cx);
  CHECK(std::abs(lo.cy - hi.cy) < 10);
  const unsigned char* mid =
      img.at(static_cast<int>((lo.cx + hi.cx) / 2), static_cast<int>((lo.cy + hi.cy) / 2));
  CAPTURE(int(mid[0]), int(mid[1]), int(mid[2]));
  CHECK(colour_distance(mid, 33, 145, 140) < 20);
  const Blob grey = find_colour(img, 232, 232, 232, 4);
  CHECK(grey.count >= 3 * 28 * 14);  // three hatched cells (about half their pixels light grey)
  CHECK(grey.cy > lo.cy + 20);
}

TEST_CASE("figures: a heatmap draws one cell per value, in the panel's grid", "[figures]") {
  // Every value distinct and unannotated: each must show as one solid box of its own colour.
  Heatmap h;
  h.title = "cells";
  h.row_labels = {"a", "b", "c"};
  h.col_labels = {"x", "y", "z", "w"};
  for (int i = 0; i < 12; ++i) h.values.push_back(i / 11.0);
  h.annotate = false;
  TempDir dir;
  write_heatmaps(dir.file("cells"), kPng, {h, h}, "");
  const Image img = decode_png(dir.file("cells.png"));
  // viridis at 0 and at 1 (the corners of each panel): exactly one box per panel.
  CHECK(count_boxes(img, 68, 1, 84, 20, 20) == 2);
  CHECK(count_boxes(img, 253, 231, 37, 20, 20) == 2);
  const Blob first = find_colour(img, 68, 1, 84, 0.5), last = find_colour(img, 253, 231, 37, 0.5);
  CHECK(first.cx < last.cx);  // value 0 top-left, value 1 bottom-right of its panel
  CHECK(first.cy < last.cy);
}

TEST_CASE("figures: line plot PNG shows each series in its colour", "[figures]") {
  LinePlot p;
  p.title = "Loss";
  p.x_label = "step";
  p.y_label = "loss";
  Series a{"train", {}, {}, false}, b{"val", {}, {}, true};
  for (int i = 0; i < 100; ++i) {
    a.x.push_back(i), a.y.push_back(std::exp(-i / 30.0));
    b.x.push_back(i), b.y.push_back(std::exp(-i / 40.0) + 0.1);
  }
  b.y[50] = std::numeric_limits<double>::quiet_NaN();  // breaks the line
  p.series = {a, b};
  TempDir dir;
  write_lineplot(dir.file("loss"), kPng, p);
  const Image img = decode_png(dir.file("loss.png"));
  CHECK(img.w == 900);
  CHECK(img.h == 600);
  const Blob blue = find_colour(img, 31, 119, 180, 10), orange = find_colour(img, 255, 127, 14, 10);
  CHECK(blue.count > 500);
  CHECK(orange.count > 300);
  CHECK(orange.count < blue.count);  // dashed
  // The train curve falls: its pixels left of the middle lie higher than those right of it.
  double left_y = 0, right_y = 0;
  int nl = 0, nr = 0;
  for (int y = 0; y < img.h; ++y)
    for (int x = 0; x < img.w * 3 / 4; ++x)  // the legend is on the right
      if (colour_distance(img.at(x, y), 31, 119, 180) < 10) {
        if (x < img.w * 3 / 8)
          left_y += y, ++nl;
        else
          right_y += y, ++nr;
      }
  REQUIRE(nl > 0);
  REQUIRE(nr > 0);
  CHECK(left_y / nl < right_y / nr);
}

TEST_CASE("figures: line plot text: title, axes, legend and 1-2-5 ticks", "[figures]") {
  LinePlot p;
  p.title = "Training loss, Δ = 0.1";
  p.x_label = "step";
  p.y_label = "loss ⟨nats⟩";
  p.series.push_back({"train", {0, 1, 2, 3}, {4, 3, 2.5, 2.2}, false});
  p.series.push_back({"validation", {0, 1, 2, 3}, {4.2, 3.3, 2.9, 2.8}, true});
  TempDir dir;
  write_lineplot(dir.file("lin"), kPdf, p);
  p.log_y = true;
  p.series[0].y = {1, 0.1, 0.01, -1};  // a non-positive value is left out on a log axis
  write_lineplot(dir.file("log"), kPdf, p);
  {
    REQUIRE_PDF_TEXT(t, dir.file("lin.pdf"));
    CAPTURE(t.all);
    for (const char* w : {"Training", "loss,", "Δ", "step", "⟨nats⟩", "train", "validation", "2.5"})
      CHECK(t.has(w));
    check_words_placed(t);
  }
  REQUIRE_PDF_TEXT(t, dir.file("log.pdf"));
  CAPTURE(t.all);
  CHECK(t.has("0.01"));
  CHECK(t.has("1"));
  check_words_placed(t);

  p.series[0].y.pop_back();
  CHECK_THROWS_WITH(write_lineplot(dir.file("bad"), kAll, p),
                    Catch::Contains("series 'train' has 4 x values and 3 y values"));
  CHECK_FALSE(fs::exists(dir.file("bad.png")));
}

TEST_CASE("figures: error bars span lo to hi in their series' colour", "[figures]") {
  LinePlot p;
  p.series.push_back({"flat", {0, 1, 2}, {0, 0, 0}, false});
  p.series.push_back({"reference", {0, 2}, {-4, 4}, true});  // fixes the y range to [-4, 4]
  p.error_bars.push_back({0, {-2, -2, std::nan("")}, {2, 2, std::nan("")}});
  TempDir dir;
  write_lineplot(dir.file("bars"), kPng, p);
  const Image img = decode_png(dir.file("bars.png"));
  // The flat line sits at one row; its bars reach half way to the frame above and below it.
  int line_row = -1, top = img.h, bottom = -1;
  for (int y = 0; y < img.h; ++y)
    for (int x = 0; x < img.w * 3 / 4; ++x)
      if (colour_distance(img.at(x, y), 31, 119, 180) < 10) {
        top = std::min(top, y), bottom = std::max(bottom, y);
        if (x > img.w * 11 / 20 && x < img.w * 7 / 10) line_row = y;  // past the bar at x = 1
      }
  REQUIRE(line_row > 0);
  CHECK(line_row - top > 60);
  CHECK(bottom - line_row > 60);
  CHECK(std::abs((line_row - top) - (bottom - line_row)) <= 3);  // symmetric, ±2
  p.error_bars[0].hi.pop_back();
  CHECK_THROWS_WITH(write_lineplot(dir.file("bad"), kAll, p),
                    Catch::Contains("error bars of series 0 (of 2) need one lo and one hi"));
  p.error_bars[0] = {5, {}, {}};
  CHECK_THROWS_AS(write_lineplot(dir.file("bad"), kAll, p), std::invalid_argument);
}

TEST_CASE("figures: bar chart has one bar per finite value, and its labels", "[figures]") {
  BarChart c;
  c.title = "Head disagreement, mean pairwise Jensen–Shannon divergence: mhar H=4, step 600";
  c.x_label = "site";
  c.y_label = "JS divergence";
  c.labels = {"s1", "s2", "s3", "s4"};
  c.values = {0.1, 0.4, -0.05, std::numeric_limits<double>::quiet_NaN()};
  TempDir dir;
  write_barchart(dir.file("bars"), kAll, c);
  const Image img = decode_png(dir.file("bars.png"));
  CHECK(count_boxes(img, 31, 119, 180, 20, 10) == 3);
  REQUIRE_PDF_TEXT(t, dir.file("bars.pdf"));
  CAPTURE(t.all);
  for (const char* w : {"Head", "Jensen–Shannon", "600", "site", "JS", "s1", "s4", "n/a"})
    CHECK(t.has(w));
  check_words_placed(t);  // the long title too: the chart widens to hold it
  c.values.pop_back();
  CHECK_THROWS_WITH(write_barchart(dir.file("bad"), kAll, c),
                    Catch::Contains("4 labels but 3 values"));
}

#endif  // MHAR_FIGURES
