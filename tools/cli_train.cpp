/**
 * @file cli_train.cpp
 * @brief `mhar-toy train`: flags → TrainOptions → train() or resume(); TrainOptions::to_args,
 *        the same flags written back for a child run.
 */
#include "cli_train.h"

#include <fmt/format.h>

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "cli_common.h"
#include "device_select.h"
#include "errors.h"
#include "gpu_selfcheck.h"
#include "routing_versions.h"

namespace mhar::toy {

void add_train_options(CLI::App& cmd, TrainOptions& o, std::string& mode) {
  add_model_flags(cmd, o.cfg, mode);
  cmd.add_option("--steps", o.steps, "optimizer steps")->check(positive());
  cmd.add_option("--batch,-B", o.batch, "sequences per step")->check(positive());
  cmd.add_option("--lr", o.lr, "peak learning rate (linear warmup, then cosine)")
      ->check(positive());
  cmd.add_option("--min-lr-ratio", o.min_lr_ratio, "final learning rate as a fraction of --lr")
      ->check(in_range(0, 1, "FLOAT"));
  cmd.add_option("--warmup", o.warmup, "warmup steps")->check(non_negative());
  cmd.add_option("--weight-decay", o.weight_decay, "AdamW decoupled weight decay (matrices only)")
      ->check(non_negative());
  cmd.add_option("--clip", o.clip, "global gradient-norm clipping (0 = off)")
      ->check(non_negative());
  cmd.add_option("--seed", o.seed, "seed of the initialisation and the batches");
  cmd.add_option("--data", o.data, "training text (any file: bytes are tokens)");
  cmd.add_option("--out,-o", o.out, "run directory (never overwritten)")
      ->default_str("runs/<mode>-h<H>-seed<seed>");
  cmd.add_option("--device", o.device, "where to train (auto: the GPU when there is one)")
      ->check(one_of(kDeviceChoices));
  cmd.add_option("--val-fraction", o.val_fraction, "held-out tail of the data for validation")
      ->check(in_range(0, 1, "FLOAT"));
  cmd.add_option("--eval-every", o.eval_every, "validate every N steps")->check(positive());
  cmd.add_option("--eval-batches", o.eval_batches, "batches per validation")->check(positive());
  cmd.add_option("--ckpt-every", o.ckpt_every, "checkpoint every N steps (and at the end)")
      ->check(positive());
  cmd.add_option("--heatmap-every", o.heatmap_every,
                 "write routing heatmaps every N steps (0 = only at the end)")
      ->check(non_negative());
  cmd.add_option("--format", o.figure_formats,
                 "figure formats of the heatmaps, comma-separated: png, svg, pdf");
  cmd.add_option("--log-every", o.log_every, "print a progress line every N steps (no terminal)")
      ->check(positive());
  cmd.add_option("--threads", o.threads,
                 "CPU threads (0 = one per idle core, read again every half second)")
      ->check(thread_count());
  cmd.add_option("--routing", o.routing,
                 "the CPU's routing: reference (reference/routing.cpp at every site) or fast "
                 "(cpu/routing_versions.h); the GPU picks its own")
      ->check(one_of(cpu_routing_names()));
  cmd.add_flag("--quiet,-q", o.quiet, "print nothing but errors");
}

std::vector<std::string> TrainOptions::to_args() const {
  // fmt's "{}" writes a double's shortest text that reads back as the same double.
  const auto s = [](auto v) { return fmt::format("{}", v); };
  const std::pair<const char*, std::string> flags[] = {{"--mode", mode_name(cfg.mode)},
                                                       {"--heads", s(cfg.H)},
                                                       {"--d", s(cfg.d)},
                                                       {"--layers", s(cfg.L)},
                                                       {"--n-head", s(cfg.n_head)},
                                                       {"--n-kv-head", s(cfg.n_kv_head)},
                                                       {"--ffn", s(cfg.ffn)},
                                                       {"--seq-len", s(cfg.T)},
                                                       {"--blocks", s(cfg.n_blocks)},
                                                       {"--steps", s(steps)},
                                                       {"--batch", s(batch)},
                                                       {"--lr", s(lr)},
                                                       {"--min-lr-ratio", s(min_lr_ratio)},
                                                       {"--warmup", s(warmup)},
                                                       {"--weight-decay", s(weight_decay)},
                                                       {"--clip", s(clip)},
                                                       {"--seed", s(seed)},
                                                       {"--data", data},
                                                       {"--out", out},
                                                       {"--device", device},
                                                       {"--val-fraction", s(val_fraction)},
                                                       {"--eval-every", s(eval_every)},
                                                       {"--eval-batches", s(eval_batches)},
                                                       {"--ckpt-every", s(ckpt_every)},
                                                       {"--heatmap-every", s(heatmap_every)},
                                                       {"--format", figure_formats},
                                                       {"--log-every", s(log_every)},
                                                       {"--threads", s(threads)},
                                                       {"--routing", routing}};
  std::vector<std::string> a;
  for (const auto& [flag, value] : flags) a.insert(a.end(), {flag, value});
  if (quiet) a.push_back("-q");
  return a;
}

Subcommand register_train(CLI::App& app) {
  auto o = std::make_shared<TrainOptions>();
  auto mode = std::make_shared<std::string>("mhar");
  auto resume_dir = std::make_shared<std::string>();
  auto cuda_sync = std::make_shared<bool>(false);
  auto* cmd = app.add_subcommand(
      "train", "Train a tiny model on a text file (on the GPU when there is one, else the CPU)");
  add_train_options(*cmd, *o, *mode);
  cmd->add_option("--resume", *resume_dir,
                  "continue the run in DIR with its saved options (--steps N extends it)");
  add_cuda_sync_flag(*cmd, *cuda_sync);
  auto gpu_check = std::make_shared<GpuCheckFlags>();
  add_gpu_check_flags(*cmd, *gpu_check);
  auto* steps = cmd->get_option("--steps");
  auto* out = cmd->get_option("--out");
  return {cmd, [o, mode, resume_dir, out, steps, cuda_sync, gpu_check]() -> int {
            apply_cuda_sync(*cuda_sync);
            apply_gpu_check_flags(*gpu_check);
            if (!resume_dir->empty())
              return resume(*resume_dir, steps->count() ? o->steps : 0, o->quiet);
            o->cfg = model_config(o->cfg, *mode);
            if (out->count() == 0) {
              validate(*o);
              const std::string base = "runs/" + *mode + "-h" +
                                       std::to_string(o->cfg.route_heads()) + "-seed" +
                                       std::to_string(o->seed);
              o->out = base;
              for (int k = 2; std::filesystem::exists(o->out); ++k)
                o->out = base + "-" + std::to_string(k);
            }
            return train(*o);
          }};
}

}  // namespace mhar::toy
