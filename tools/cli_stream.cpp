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
 */
#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <memory>

#include "checkpoint.h"
#include "cli_common.h"
#include "data.h"
#include "errors.h"
#include "file_util.h"
#include "routing_versions.h"

namespace mhar::toy {

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

}  // namespace

Subcommand register_stream(CLI::App& app) {
  struct Opts {
    std::string ckpt, data = kDefaultCorpus, csv;
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
  return {cmd, [o]() -> int {
            const Checkpoint ck = load_checkpoint(o->ckpt);
            const Corpus corpus = load_corpus(o->data, 0.1, ck.cfg.T);
            const Batch b = random_batch(corpus.val, o->batch, ck.cfg.T, o->seed, 0, 2);
            Cache<float> c;
            c.routing = &fast_routing<float>();
            model_logits<float>(ck.cfg, ck.params, b.tokens, o->batch, &c);
            const int n_sub = 2 * ck.cfg.L;
            double energy = 0;
            for (int j = 0; j < n_sub; ++j) energy += c.prims[j + 1].cast<double>().squaredNorm();
            std::string csv = "sublayer,input_rms,output_rms,share,cos_out_final\n";
            fmt::print("{} ({} step {}), {} windows of {} bytes\n", o->ckpt, mode_name(ck.cfg.mode),
                       ck.step, o->batch, ck.cfg.T);
            fmt::print("{:<8} {:>10} {:>11} {:>8} {:>16}\n", "sublayer", "input RMS", "output RMS",
                       "share", "cos(out, final)");
            fmt::print("{:<8} {:>10} {:>11.4f}\n", "emb", "-", mean_row_rms(c.prims[0]));
            for (int j = 0; j < n_sub; ++j) {
              const std::string name = (j % 2 == 0 ? "attn" : "mlp") + std::to_string(j / 2);
              const double in = mean_row_rms(c.inputs[j]), out = mean_row_rms(c.prims[j + 1]);
              const double share = c.prims[j + 1].cast<double>().squaredNorm() / energy;
              const double cosine = mean_row_cos(c.prims[j + 1], c.final_in);
              fmt::print("{:<8} {:>10.4f} {:>11.4f} {:>8.3f} {:>16.4f}\n", name, in, out, share,
                         cosine);
              csv += fmt::format("{},{:.6f},{:.6f},{:.6f},{:.6f}\n", name, in, out, share, cosine);
            }
            fmt::print("{:<8} {:>10.4f}   (the final read, before the final norm)\n", "final",
                       mean_row_rms(c.final_in));
            if (!o->csv.empty()) io::write_text_file_atomic(o->csv, csv);
            return kOk;
          }};
}

}  // namespace mhar::toy
