/**
 * @file heatmap.cpp
 * @brief Routing heatmaps and head disagreement (see heatmap.h).
 */
#include "heatmap.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <system_error>

#include "file_util.h"
#include "routing_versions.h"
#include "thread_governor.h"

namespace mhar::toy {

namespace {

/// Column order of the heatmaps: null, emb, then sub-layer outputs or blocks, then partial.
int source_rank(const std::string& name) {
  if (name == "null") return 0;
  if (name == "emb") return 1;
  if (name == "partial") return 1 << 20;
  const bool attn = name.starts_with("attn"), mlp = name.starts_with("mlp");
  if (attn || mlp) return 2 + 2 * std::stoi(name.substr(attn ? 4 : 3)) + (mlp ? 1 : 0);
  if (name.starts_with("block")) return 2 + std::stoi(name.substr(5));
  return 1 << 21;
}

/// Jensen–Shannon divergence in bits between two distributions over the same sources.
double js_bits(const std::vector<double>& a, const std::vector<double>& b) {
  double js = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double m = 0.5 * (a[i] + b[i]);
    if (a[i] > 0) js += 0.5 * a[i] * std::log2(a[i] / m);
    if (b[i] > 0) js += 0.5 * b[i] * std::log2(b[i] / m);
  }
  return std::max(0.0, js);
}

}  // namespace

RoutingMap routing_map(const Config& cfg, const Params<float>& p, const Batch& batch, int B) {
  RoutingMap map;
  if (!cfg.routed()) return map;
  Cache<float> cache;
  cache.routing = &fast_routing<float>();
  {
    const OneThread one;  // one small forward; the map's last digits followed the thread count
    model_logits<float>(cfg, p, batch.tokens, B, &cache);
  }
  map.H = cfg.route_heads();
  map.sites = site_names(cfg);
  const int S = cfg.n_sites();
  std::vector<std::vector<std::string>> per_site(S);
  for (int s = 0; s < S; ++s) {
    per_site[s] = site_source_names(cfg, s);
    for (const auto& n : per_site[s])
      if (std::find(map.sources.begin(), map.sources.end(), n) == map.sources.end())
        map.sources.push_back(n);
  }
  std::stable_sort(map.sources.begin(), map.sources.end(),
                   [](const auto& a, const auto& b) { return source_rank(a) < source_rank(b); });
  const auto C = map.sources.size();
  map.alpha.assign(map.H, std::vector<double>(S * C, std::numeric_limits<double>::quiet_NaN()));
  map.disagreement.assign(S, 0.0);
  for (int s = 0; s < S; ++s) {
    const auto& alpha = cache.route[s].alpha;  // N × (P × H)
    const auto P = alpha[0].rows();
    for (std::size_t i = 0; i < alpha.size(); ++i) {
      const auto col =
          std::find(map.sources.begin(), map.sources.end(), per_site[s][i]) - map.sources.begin();
      for (int h = 0; h < map.H; ++h)
        map.alpha[h][s * C + col] = alpha[i].col(h).cast<double>().mean();
    }
    // Mean over positions of the mean pairwise JS divergence between the heads' distributions.
    if (map.H > 1) {
      double total = 0;
      for (Eigen::Index pos = 0; pos < P; ++pos) {
        std::vector<std::vector<double>> dist(map.H, std::vector<double>(alpha.size()));
        for (int h = 0; h < map.H; ++h)
          for (std::size_t i = 0; i < alpha.size(); ++i) dist[h][i] = alpha[i](pos, h);
        double sum = 0;
        int pairs = 0;
        for (int a = 0; a < map.H; ++a)
          for (int b = a + 1; b < map.H; ++b, ++pairs) sum += js_bits(dist[a], dist[b]);
        total += sum / pairs;
      }
      map.disagreement[s] = total / static_cast<double>(P);
    }
  }
  return map;
}

void write_routing_map(const std::string& dir_s, const RoutingMap& map, const std::string& title,
                       const std::vector<io::Format>& formats) {
  namespace fs = std::filesystem;
  const fs::path dir(dir_s);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw std::system_error(ec, "cannot create '" + dir_s + "'");
  const auto S = map.sites.size(), C = map.sources.size();

  std::vector<io::Heatmap> panels;
  for (int h = 0; h < map.H; ++h) {
    io::Heatmap hm;
    hm.title = map.H == 1 ? "single head" : fmt::format("head {}", h);
    hm.row_labels = map.sites;
    hm.col_labels = map.sources;
    hm.row_axis = "routing site (reads)";
    hm.col_axis = "source";
    hm.values = map.alpha[h];
    hm.vmin = 0;
    hm.vmax = 1;
    panels.push_back(std::move(hm));
  }
  if (io::kFiguresBuilt)
    io::write_heatmaps((dir / "heatmap").string(), formats, panels,
                       "mean routing weight α: " + title);

  std::string csv = "head,site,source,alpha\n";
  for (int h = 0; h < map.H; ++h)
    for (std::size_t s = 0; s < S; ++s)
      for (std::size_t c = 0; c < C; ++c)
        if (!std::isnan(map.alpha[h][s * C + c]))
          csv += fmt::format("{},{},{},{:.6f}\n", h, map.sites[s], map.sources[c],
                             map.alpha[h][s * C + c]);
  io::write_text_file_atomic((dir / "alpha.csv").string(), csv);

  nlohmann::json j;
  j["title"] = title;
  j["sites"] = map.sites;
  j["sources"] = map.sources;
  j["H"] = map.H;
  j["alpha"] = nlohmann::json::array();  // [head][site][source], null where not read
  for (int h = 0; h < map.H; ++h) {
    nlohmann::json rows = nlohmann::json::array();
    for (std::size_t s = 0; s < S; ++s) {
      nlohmann::json row = nlohmann::json::array();
      for (std::size_t c = 0; c < C; ++c) {
        const double a = map.alpha[h][s * C + c];
        row.push_back(std::isnan(a) ? nlohmann::json(nullptr) : nlohmann::json(a));
      }
      rows.push_back(row);
    }
    j["alpha"].push_back(rows);
  }
  j["disagreement_js_bits"] = map.disagreement;
  io::write_text_file_atomic((dir / "alpha.json").string(), j.dump(1) + "\n");

  io::BarChart bar;
  bar.title = map.H == 1 ? "head disagreement (H = 1: a single head, none): " + title
                         : "head disagreement, mean pairwise Jensen–Shannon divergence: " + title;
  bar.x_label = "routing site";
  bar.y_label = "JS divergence (bits)";
  bar.labels = map.sites;
  bar.values = map.disagreement;
  if (io::kFiguresBuilt) io::write_barchart((dir / "disagreement").string(), formats, bar);
}

}  // namespace mhar::toy
