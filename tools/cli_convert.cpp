/**
 * @file cli_convert.cpp
 * @brief `mhar-toy convert`: a trained `residual` run → a new `delta` run whose gates are zero,
 *        so it computes exactly the same logits; `train --resume` then opens the gates.
 */
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <memory>

#include "checkpoint.h"
#include "cli_common.h"
#include "errors.h"
#include "file_util.h"
#include "train.h"

namespace mhar::toy {

namespace fs = std::filesystem;

Subcommand register_convert(CLI::App& app) {
  struct Opts {
    std::string ckpt, out;
    int heads = 0, blocks = 2, steps = 200;
    double lr = 1e-3;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand(
      "convert", "Turn a trained residual model into a delta-routing run with identical outputs");
  cmd->add_option("ckpt", o->ckpt, "the residual run directory or checkpoint")->required();
  cmd->add_option("--out,-o", o->out, "the new run directory (must not exist)")->required();
  cmd->add_option("--heads,-H", o->heads, "routing heads of the delta sites (0 = n_kv_head)")
      ->check(non_negative());
  cmd->add_option("--blocks", o->blocks, "blocks the delta sources sum over (clamped to L)")
      ->check(positive());
  cmd->add_option("--steps", o->steps, "steps the continued training will run")->check(positive());
  cmd->add_option("--lr", o->lr, "peak learning rate of the continued training")->check(positive());
  return {cmd, [o]() -> int {
            const Checkpoint ck = load_checkpoint(o->ckpt);
            if (ck.cfg.mode != Mode::Residual)
              throw UsageError(o->ckpt + " is a '" + mode_name(ck.cfg.mode) +
                               "' model; convert takes a 'residual' one");
            if (fs::exists(o->out))
              throw UsageError("--out " + o->out + " already exists (nothing is overwritten)");
            TrainOptions t;
            // Keep the source run's training options where it has them.
            const fs::path src_cfg =
                fs::path(resolve_checkpoint_path(o->ckpt)).parent_path() / "config.json";
            if (std::ifstream in(src_cfg); in) {
              try {
                t = train_options_from_json(nlohmann::json::parse(in), src_cfg.string());
              } catch (const std::exception&) {
                t = TrainOptions();
              }
            }
            Config dcfg;
            Params<float> p;
            try {
              p = convert_residual_to_delta(dcfg, ck.cfg, ck.params, o->heads,
                                            std::min(o->blocks, ck.cfg.L));
            } catch (const ShapeError& e) {
              throw UsageError(e.what());
            }
            t.cfg = dcfg;
            t.out = o->out;
            t.steps = o->steps;
            t.lr = o->lr;
            t.warmup = std::min(t.warmup, o->steps / 10);
            validate(t);
            fs::create_directories(o->out);
            io::write_text_file_atomic((fs::path(o->out) / "config.json").string(),
                                       train_options_to_json(t).dump(2) + "\n");
            const Params<float> zero = zero_params<float>(dcfg);
            save_optimizer((fs::path(o->out) / "optimizer.safetensors").string(), zero, zero, 0);
            save_checkpoint((fs::path(o->out) / "checkpoint.safetensors").string(), dcfg, p, 0,
                            {{"converted_from", resolve_checkpoint_path(o->ckpt)},
                             {"converted_from_step", std::to_string(ck.step)}});
            fmt::print(
                "{}: delta model (H={}, {} blocks, gates 0) converted from {} (step {}).\n"
                "  same loss:  mhar-toy eval {}   (compare: mhar-toy eval {})\n"
                "  train it:   mhar-toy train --resume {}\n",
                o->out, dcfg.route_heads(), dcfg.n_blocks, o->ckpt, ck.step, o->out, o->ckpt,
                o->out);
            return kOk;
          }};
}

}  // namespace mhar::toy
