/**
 * @file cli_plot.cpp
 * @brief `mhar-toy plot`: train and validation loss of one or more runs in one figure (PNG, SVG,
 *        PDF).
 */
#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli_common.h"
#include "errors.h"
#include "figures.h"
#include "heatmap.h"  // kFiguresOff
#include "json_types.h"
#include "strict_json.h"

namespace mhar::toy {

namespace fs = std::filesystem;

namespace {

/// --out without a figure format's extension: "loss.png" is "loss", which writes loss.png (and
/// loss.svg), where it used to write loss.png.png and loss.png.svg.
std::string without_figure_extension(const std::string& out) {
  for (const io::Format f : {io::Format::png, io::Format::svg, io::Format::pdf}) {
    const std::string e = std::string(".") + io::format_name(f);
    if (out.size() > e.size() && out.compare(out.size() - e.size(), e.size(), e) == 0)
      return out.substr(0, out.size() - e.size());
  }
  return out;
}

struct RunCurves {
  std::string label;
  std::vector<double> step, train, val_step, val;
};

RunCurves read_run(const std::string& dir) {
  RunCurves r;
  const fs::path metrics = fs::path(dir) / "metrics.jsonl";
  std::ifstream in(metrics);
  if (!in)
    throw UsageError("cannot read " + metrics.string() + " (is '" + dir + "' a run directory?)");
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    try {
      const auto row = io::parse_json_strict(line, metrics.string()).get<MetricsRow>();
      r.step.push_back(static_cast<double>(row.step));
      r.train.push_back(row.train_loss);
      if (row.val_loss) {
        r.val_step.push_back(r.step.back());
        r.val.push_back(*row.val_loss);
      }
    } catch (const io::StrictJsonError& e) {
      throw UsageError(std::string(e.what()) + " (a line of " + metrics.string() + ")");
    } catch (const nlohmann::json::exception&) {  // a field missing or of another type
      throw UsageError(metrics.string() +
                       ": a line lacks a number 'step', 'train_loss', 'lr', "
                       "'grad_norm', 'tokens_per_s' or 'elapsed_s': " +
                       io::printable_excerpt(line));
    }
  }
  if (r.step.empty()) throw UsageError(metrics.string() + " holds no steps yet");
  r.label = fs::path(dir).lexically_normal().filename().string();
  if (r.label.empty()) r.label = fs::path(dir).lexically_normal().parent_path().filename().string();
  if (std::ifstream c(fs::path(dir) / "config.json"); c) {
    try {
      const auto j = nlohmann::json::parse(c).at("model");
      const std::string mode = j.at("mode").get<std::string>();
      r.label += mode == "residual" ? " (residual)"
                                    : fmt::format(" ({} H={})", mode, j.at("H").get<int>());
    } catch (const std::exception&) {
    }
  }
  return r;
}

/// Trailing moving average over `window` points.
std::vector<double> smooth(const std::vector<double>& y, int window) {
  if (window <= 1) return y;
  std::vector<double> s(y.size());
  double sum = 0;
  for (std::size_t i = 0; i < y.size(); ++i) {
    sum += y[i];
    if (i >= static_cast<std::size_t>(window)) sum -= y[i - window];
    s[i] = sum / static_cast<double>(std::min<std::size_t>(i + 1, window));
  }
  return s;
}

}  // namespace

Subcommand register_plot(CLI::App& app) {
  struct Opts {
    std::vector<std::string> runs;
    std::string out = "loss", metric = "both", title = "loss per byte", formats = "png,svg";
    int smooth = 20;
    bool log_y = false;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("plot", "Loss curves of one or more runs in one figure");
  cmd->add_option("runs", o->runs, "run directories")->required();
  cmd->add_option("--out,-o", o->out,
                  "output path: writes OUT.png, OUT.svg, … (OUT.png names the same files as OUT)");
  cmd->add_option("--format", o->formats, "figure formats, comma-separated: png, svg, pdf");
  cmd->add_option("--metric", o->metric, "train | val | both (train solid, validation dashed)")
      ->check(one_of({"train", "val", "both"}));
  cmd->add_option("--smooth", o->smooth, "moving average of the train loss over N steps (1 = off)")
      ->check(positive());
  cmd->add_option("--title", o->title, "figure title");
  cmd->add_flag("--log-y", o->log_y, "logarithmic loss axis");
  return {
      cmd, [o]() -> int {
        const std::vector<io::Format> formats = parse_format_flag(o->formats);
        io::LinePlot plot;
        plot.title = o->title;
        plot.x_label = "step";
        plot.y_label = "cross-entropy (nats/byte)";
        plot.log_y = o->log_y;
        for (const auto& dir : o->runs) {
          const RunCurves r = read_run(dir);
          if (o->metric != "val")
            plot.series.push_back({r.label + " train", r.step, smooth(r.train, o->smooth), false});
          if (o->metric != "train" && !r.val.empty())
            plot.series.push_back({r.label + " val", r.val_step, r.val, true});
          fmt::print("{}: {} steps, last train loss {:.4f}{}\n", r.label, r.step.size(),
                     r.train.back(),
                     r.val.empty() ? "" : fmt::format(", last val loss {:.4f}", r.val.back()));
        }
        // Bad input (exit 2) is reported first, even in a build without figures.
        if (!io::kFiguresBuilt) throw UnavailableError(std::string("cannot plot: ") + kFiguresOff);
        fmt::print(
            "wrote {}\n",
            fmt::join(io::write_lineplot(without_figure_extension(o->out), formats, plot), ", "));
        return kOk;
      }};
}

}  // namespace mhar::toy
