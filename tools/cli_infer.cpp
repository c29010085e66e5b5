/**
 * @file cli_infer.cpp
 * @brief The subcommands that read a trained model: `sample`, `eval`, `heatmap`.
 */
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <numbers>
#include <random>

#include "checkpoint.h"
#include "cli_common.h"
#include "data.h"
#include "errors.h"
#include "heatmap.h"

namespace mhar::toy {

namespace {

void require_positive(long v, const char* flag) {
  if (v <= 0) throw UsageError(fmt::format("{} must be positive, got {}", flag, v));
}

/// Next-byte logits of the model for `context` (at most T bytes; RoPE positions from 0).
RowVec<float> next_logits(const Checkpoint& ck, const std::vector<int>& context) {
  Config c = ck.cfg;
  c.T = static_cast<int>(context.size());
  const Mat<float> logits = model_logits<float>(c, ck.params, context, 1);
  return logits.row(logits.rows() - 1);
}

}  // namespace

// ---- sample -----------------------------------------------------------------------------------

Subcommand register_sample(CLI::App& app) {
  struct Opts {
    std::string ckpt, prompt = "ROMEO:";
    int length = 300, top_k = 40;
    double temperature = 0.8;
    std::uint64_t seed = 1;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("sample", "Generate text from a trained model");
  cmd->add_option("ckpt", o->ckpt, "checkpoint file or run directory")->required();
  cmd->add_option("--prompt,-p", o->prompt, "text to continue");
  cmd->add_option("--length,-n", o->length, "bytes to generate");
  cmd->add_option("--temperature,-t", o->temperature, "softmax temperature (0 = greedy)");
  cmd->add_option("--top-k,-k", o->top_k, "sample among the k most likely bytes (0 = all)");
  cmd->add_option("--seed", o->seed, "sampling seed");
  return {cmd, [o]() -> int {
            require_positive(o->length, "--length");
            if (!(o->temperature >= 0)) throw UsageError("--temperature must be 0 or positive");
            if (o->top_k < 0 || o->top_k > 256) throw UsageError("--top-k must be in [0, 256]");
            const Checkpoint ck = load_checkpoint(o->ckpt);
            std::vector<int> text(o->prompt.begin(), o->prompt.end());
            for (auto& b : text) b &= 0xff;
            if (text.empty()) text.push_back('\n');
            std::mt19937_64 gen(o->seed);
            std::string out = o->prompt;
            for (int n = 0; n < o->length; ++n) {
              const auto start =
                  text.size() > static_cast<std::size_t>(ck.cfg.T) ? text.size() - ck.cfg.T : 0;
              const std::vector<int> ctx(text.begin() + static_cast<std::ptrdiff_t>(start),
                                         text.end());
              const RowVec<float> logits = next_logits(ck, ctx);
              int next = 0;
              if (o->temperature == 0) {
                logits.maxCoeff(&next);
              } else {
                // keep the top k logits, softmax at the temperature, draw
                std::vector<int> idx(256);
                for (int i = 0; i < 256; ++i) idx[i] = i;
                const int k = o->top_k == 0 ? 256 : o->top_k;
                std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                                  [&](int a, int b) { return logits(a) > logits(b); });
                std::vector<double> w(k);
                for (int i = 0; i < k; ++i)
                  w[i] = std::exp((logits(idx[i]) - logits(idx[0])) / o->temperature);
                next = idx[std::discrete_distribution<int>(w.begin(), w.end())(gen)];
              }
              text.push_back(next);
              out.push_back(static_cast<char>(next));
            }
            fmt::print("{}\n", out);
            return kOk;
          }};
}

// ---- eval -------------------------------------------------------------------------------------

Subcommand register_eval(CLI::App& app) {
  struct Opts {
    std::string ckpt, data = "data/tinyshakespeare.txt", split = "val";
    double val_fraction = 0.1;
    int batch = 16;
    long max_windows = 0;
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("eval", "Loss and bits per byte of a model on a text file");
  cmd->add_option("ckpt", o->ckpt, "checkpoint file or run directory")->required();
  cmd->add_option("--data", o->data, "text file to evaluate on");
  cmd->add_option("--split", o->split,
                  "val: the held-out tail (as in training); all: the whole file");
  cmd->add_option("--val-fraction", o->val_fraction, "size of the held-out tail");
  cmd->add_option("--batch,-B", o->batch, "sequences per forward pass");
  cmd->add_option("--max-windows", o->max_windows, "evaluate at most this many windows (0 = all)");
  cmd->add_flag("--json", o->json, "print one JSON object instead of text");
  return {
      cmd, [o]() -> int {
        require_positive(o->batch, "--batch");
        if (o->max_windows < 0) throw UsageError("--max-windows must be 0 (all) or positive");
        if (o->split != "val" && o->split != "all")
          throw UsageError("--split must be val or all, got '" + o->split + "'");
        const Checkpoint ck = load_checkpoint(o->ckpt);
        const int T = ck.cfg.T;
        std::vector<std::uint8_t> bytes;
        if (o->split == "val")
          bytes = load_corpus(o->data, o->val_fraction, T).val;
        else
          bytes = read_file_bytes(o->data);
        long windows = window_count(bytes, T);
        if (windows == 0)
          throw UsageError(fmt::format(
              "data file '{}' is shorter than one sequence of T + 1 = {} bytes", o->data, T + 1));
        if (o->max_windows > 0) windows = std::min(windows, o->max_windows);
        double total = 0;
        for (long w = 0; w < windows; w += o->batch) {
          const int B = static_cast<int>(std::min<long>(o->batch, windows - w));
          const Batch b = sequential_batch(bytes, w, B, T);
          total += B * static_cast<double>(model_forward<float>(ck.cfg, ck.params, b.tokens,
                                                                b.targets, B, nullptr));
        }
        const double loss = total / static_cast<double>(windows);
        const double bpb = loss / std::numbers::ln2;
        if (o->json)
          fmt::print(
              "{{\"loss\": {:.8f}, \"bits_per_byte\": {:.8f}, \"bytes\": {}, \"mode\": \"{}\", "
              "\"step\": {}}}\n",
              loss, bpb, windows * T, mode_name(ck.cfg.mode), ck.step);
        else
          fmt::print(
              "{} ({} step {}) on {} [{}]: loss {:.6f} nats/byte, {:.6f} bits/byte over {} bytes\n",
              o->ckpt, mode_name(ck.cfg.mode), ck.step, o->data, o->split, loss, bpb, windows * T);
        return kOk;
      }};
}

// ---- heatmap ----------------------------------------------------------------------------------

Subcommand register_heatmap(CLI::App& app) {
  struct Opts {
    std::string ckpt, data = "data/tinyshakespeare.txt", out;
    int batch = 16;
    double val_fraction = 0.1;
    std::uint64_t seed = 1;
    std::string formats = "png,svg";
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand(
      "heatmap",
      "Where each routing head looks: mean α per [site × source], and head disagreement");
  cmd->add_option("ckpt", o->ckpt, "checkpoint file or run directory")->required();
  cmd->add_option("--data", o->data, "text to route (its held-out tail is used)");
  cmd->add_option("--out,-o", o->out, "output directory (default <run>/heatmaps/step_<step>)");
  cmd->add_option("--batch,-B", o->batch, "random windows averaged over");
  cmd->add_option("--val-fraction", o->val_fraction, "size of the held-out tail");
  cmd->add_option("--seed", o->seed, "seed of the windows");
  cmd->add_option("--format", o->formats, "figure formats, comma-separated: png, svg, pdf");
  return {cmd, [o]() -> int {
            require_positive(o->batch, "--batch");
            const std::vector<io::Format> formats = parse_format_flag(o->formats);
            const Checkpoint ck = load_checkpoint(o->ckpt);
            if (!ck.cfg.routed())
              throw UsageError(o->ckpt +
                               " is a 'residual' model: it has no routing to draw "
                               "(train attnres, mhar, block or delta)");
            const Corpus corpus = load_corpus(o->data, o->val_fraction, ck.cfg.T);
            const Batch b = random_batch(corpus.val, o->batch, ck.cfg.T, o->seed, 0, 2);
            std::string out = o->out;
            if (out.empty()) {
              const auto path = std::filesystem::path(resolve_checkpoint_path(o->ckpt));
              out = (path.parent_path() / "heatmaps" / fmt::format("step_{:06}", ck.step)).string();
            }
            const RoutingMap map = routing_map(ck.cfg, ck.params, b, o->batch);
            write_routing_map(out, map,
                              fmt::format("{} H={}, step {}", mode_name(ck.cfg.mode),
                                          ck.cfg.route_heads(), ck.step),
                              formats);
            if (io::kFiguresBuilt)
              fmt::print("wrote {0}/alpha.csv, alpha.json, heatmap.{1} and disagreement.{1}\n", out,
                         formats.size() == 1 ? io::format_list(formats)
                                             : "{" + io::format_list(formats) + "}");
            else
              fmt::print("wrote {}/alpha.csv and alpha.json ({})\n", out, kFiguresOff);
            for (std::size_t s = 0; s < map.sites.size(); ++s)
              fmt::print("  site {:<6} head disagreement {:.4f} bits\n", map.sites[s],
                         map.disagreement[s]);
            return kOk;
          }};
}

}  // namespace mhar::toy
