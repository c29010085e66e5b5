/**
 * @file figure_formats.cpp
 * @brief The figure formats (png, svg, pdf) by name; in a build without Cairo, also the writers,
 *        which then refuse (figures.h).
 */
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <stdexcept>

#include "figures.h"

namespace mhar::io {

namespace {
constexpr std::array kFormats{Format::png, Format::svg, Format::pdf};
}

const char* format_name(Format f) {
  switch (f) {
    case Format::png:
      return "png";
    case Format::svg:
      return "svg";
    case Format::pdf:
      return "pdf";
  }
  return "?";
}

std::vector<Format> parse_formats(std::string_view list) {
  std::vector<Format> out;
  for (std::size_t begin = 0; begin <= list.size();) {
    const std::size_t end = std::min(list.find(',', begin), list.size());
    const std::string_view name = list.substr(begin, end - begin);
    const auto* f = std::find_if(kFormats.begin(), kFormats.end(),
                                 [&](Format k) { return name == format_name(k); });
    if (f == kFormats.end())
      throw std::invalid_argument(fmt::format(
          "unknown figure format '{}' in '{}': use png, svg or pdf, separated by commas", name,
          list));
    if (std::find(out.begin(), out.end(), *f) != out.end())
      throw std::invalid_argument(
          fmt::format("figure format '{}' is named twice in '{}'", name, list));
    out.push_back(*f);
    begin = end + 1;
  }
  return out;
}

std::string format_list(const std::vector<Format>& formats) {
  std::string s;
  for (Format f : formats) {
    if (!s.empty()) s += ',';
    s += format_name(f);
  }
  return s;
}

#if !MHAR_FIGURES
namespace {
[[noreturn]] void no_figures() {
  throw std::logic_error("this build of mhar has no figures (built without Cairo)");
}
}  // namespace

std::vector<std::string> write_heatmaps(const std::string&, const std::vector<Format>&,
                                        const std::vector<Heatmap>&, const std::string&) {
  no_figures();
}
std::vector<std::string> write_lineplot(const std::string&, const std::vector<Format>&,
                                        const LinePlot&) {
  no_figures();
}
std::vector<std::string> write_barchart(const std::string&, const std::vector<Format>&,
                                        const BarChart&) {
  no_figures();
}
std::vector<double> nice_ticks(double, double, int) {
  no_figures();
}
#endif

}  // namespace mhar::io
