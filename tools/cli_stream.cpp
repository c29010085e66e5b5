/**
 * @file cli_stream.cpp
 * @brief `mhar-toy stream`: how the hidden state grows with depth and how much each sub-layer
 *        contributes, measured on real text.
 *
 * For each sub-layer j it reports, averaged over positions:
 *   input RMS      RMS of input_j, what RMSNorm_j sees (the stream h_j in `residual` mode)
 *   output RMS     RMS of out_j
 *   share          ‖out_j‖² / Σ_k ‖out_k‖²: the fraction of all sub-layer output energy
 *   cos(out, final) cosine between out_j and the final read (before the final norm)
 * and, with --figure, draws the two RMS columns against depth (lab 1's figure).
 */
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint.h"
#include "cli_common.h"
#include "data.h"
#include "errors.h"
#include "figures.h"
#include "file_util.h"
#include "heatmap.h"  // kFiguresOff
#include "routing_versions.h"

namespace mhar::toy {

namespace fs = std::filesystem;

namespace {

/// Mean over rows of the per-row RMS.
double mean_row_rms(const Mat<float>& x) {
  return (x.cast<double>().array().square().rowwise().mean().sqrt()).mean();
}

/// Mean over rows of the cosine between matching rows.
double mean_row_cos(const Mat<float>& a, const Mat<float>& b) {
  const Mat<double> x = a.cast<double>(), y = b.cast<double>();
  const auto dot = x.cwiseProduct(y).rowwise().sum().array();
  const auto n = (x.rowwise().norm().array() * y.rowwise().norm().array()).max(1e-30);
  return (dot / n).mean();
}

/// One row per sub-layer j (attn2l, mlp2l+1), and the embedding and the final read.
struct StreamTable {
  std::vector<std::string> name;
  std::vector<double> in, out, share, cosine;
  double emb_rms = 0, final_rms = 0;
};

StreamTable measure_stream(const Checkpoint& ck, const Batch& b, int batch) {
  Cache<float> c;
  c.routing = &fast_routing<float>();
  model_logits<float>(ck.cfg, ck.params, b.tokens, batch, &c);
  const int n_sub = 2 * ck.cfg.L;
  double energy = 0;
  for (int j = 0; j < n_sub; ++j) energy += c.prims[j + 1].cast<double>().squaredNorm();
  StreamTable t;
  t.emb_rms = mean_row_rms(c.prims[0]);
  t.final_rms = mean_row_rms(c.final_in);
  for (int j = 0; j < n_sub; ++j) {
    t.name.push_back((j % 2 == 0 ? "attn" : "mlp") + std::to_string(j / 2));
    t.in.push_back(mean_row_rms(c.inputs[j]));
    t.out.push_back(mean_row_rms(c.prims[j + 1]));
    t.share.push_back(c.prims[j + 1].cast<double>().squaredNorm() / energy);
    t.cosine.push_back(mean_row_cos(c.prims[j + 1], c.final_in));
  }
  return t;
}

void print_stream(const StreamTable& t) {
  fmt::print("{:<8} {:>10} {:>11} {:>8} {:>16}\n", "sublayer", "input RMS", "output RMS", "share",
             "cos(out, final)");
  fmt::print("{:<8} {:>10} {:>11.4f}\n", "emb", "-", t.emb_rms);
  for (std::size_t j = 0; j < t.name.size(); ++j)
    fmt::print("{:<8} {:>10.4f} {:>11.4f} {:>8.3f} {:>16.4f}\n", t.name[j], t.in[j], t.out[j],
               t.share[j], t.cosine[j]);
  fmt::print("{:<8} {:>10.4f}   (the final read, before the final norm)\n", "final", t.final_rms);
}

std::string stream_csv(const StreamTable& t) {
  std::string csv = "sublayer,input_rms,output_rms,share,cos_out_final\n";
  for (std::size_t j = 0; j < t.name.size(); ++j)
    csv += fmt::format("{},{:.6f},{:.6f},{:.6f},{:.6f}\n", t.name[j], t.in[j], t.out[j],
                       t.share[j], t.cosine[j]);
  return csv;
}

/// x = j for sub-layer j (2L: the final read): what each reads (input RMS, the stream h_j in
/// residual mode) against what each writes (output RMS); the embedding is the output at x = −1.
io::LinePlot stream_plot(const StreamTable& t, const std::string& title) {
  io::LinePlot plot;
  plot.title = title;
  plot.x_label = "sub-layer j (even: attention, odd: MLP; -1: embedding, 2L: final read)";
  plot.y_label = "RMS, mean over positions";
  io::Series in{"input RMS (what j reads)", {}, {}, false};
  io::Series out{"output RMS (what j writes)", {-1.0}, {t.emb_rms}, true};
  for (std::size_t j = 0; j < t.name.size(); ++j) {
    in.x.push_back(static_cast<double>(j));
    in.y.push_back(t.in[j]);
    out.x.push_back(static_cast<double>(j));
    out.y.push_back(t.out[j]);
  }
  in.x.push_back(static_cast<double>(t.name.size()));
  in.y.push_back(t.final_rms);
  plot.series = {in, out};
  return plot;
}

}  // namespace

Subcommand register_stream(CLI::App& app) {
  struct Opts {
    std::string ckpt, data = kDefaultCorpus, csv, figure, formats = "png";
    int batch = 8;
    std::uint64_t seed = 1;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand(
      "stream", "Hidden-state norm by depth and each sub-layer's contribution, on real text");
  cmd->add_option("ckpt", o->ckpt, "checkpoint file or run directory")->required();
  cmd->add_option("--data", o->data, "text to run (its held-out tail is used)");
  cmd->add_option("--batch,-B", o->batch, "random windows averaged over")->check(positive());
  cmd->add_option("--seed", o->seed, "seed of the windows");
  cmd->add_option("--csv", o->csv, "also write the table as CSV to this file");
  cmd->add_option("--figure", o->figure,
                  "also draw the RMS by depth: FIGURE.png, … (no extension)");
  cmd->add_option("--format", o->formats, "figure formats, comma-separated: png, svg, pdf");
  return {cmd, [o]() -> int {
            // Bad input (exit 2) first, then a missing figure library, before the model runs.
            const std::vector<io::Format> formats = parse_format_flag(o->formats);
            const Checkpoint ck = load_checkpoint(o->ckpt);
            const Corpus corpus = load_corpus(o->data, 0.1, ck.cfg.T);
            if (!o->figure.empty() && !io::kFiguresBuilt)
              throw UnavailableError(std::string("cannot draw --figure: ") + kFiguresOff);
            const Batch b = random_batch(corpus.val, o->batch, ck.cfg.T, o->seed, 0, 2);
            const StreamTable t = measure_stream(ck, b, o->batch);
            fmt::print("{} ({} step {}), {} windows of {} bytes\n", o->ckpt, mode_name(ck.cfg.mode),
                       ck.step, o->batch, ck.cfg.T);
            print_stream(t);
            if (!o->csv.empty()) io::write_text_file_atomic(o->csv, stream_csv(t));
            if (!o->figure.empty()) {
              const std::string title =
                  fmt::format("{} ({} step {})", fs::path(o->ckpt).filename().string(),
                              mode_name(ck.cfg.mode), ck.step);
              fmt::print("wrote {}\n",
                         fmt::join(io::write_lineplot(o->figure, formats, stream_plot(t, title)), ", "));
            }
            return kOk;
          }};
}

}  // namespace mhar::toy
