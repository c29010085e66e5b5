/**
 * @file cli_train.cpp
 * @brief `mhar-toy train`: flags → TrainOptions → train() or resume().
 */
#include <filesystem>
#include <string>

#include "cli_common.h"
#include "device_select.h"
#include "errors.h"
#include "gpu_selfcheck.h"
#include "routing_versions.h"
#include "train.h"

#ifdef MHAR_WITH_CUDA
#include "cuda/device.h"
#endif

namespace mhar::toy {

namespace {

/// A validator that parses the value as a double and accepts it when ok(value).
CLI::Validator number_where(bool (*ok)(double), const std::string& name, const std::string& need) {
  return CLI::Validator(
      [ok, need](std::string& input) -> std::string {
        double v = 0;
        std::size_t used = 0;
        try {
          v = std::stod(input, &used);
        } catch (const std::exception&) {
          return "'" + input + "' is not a number";
        }
        if (used != input.size()) return "'" + input + "' is not a number";
        return ok(v) ? std::string() : need + ", got " + input;
      },
      name);
}

}  // namespace

const CLI::Validator& positive() {
  static const CLI::Validator v =
      number_where([](double x) { return x > 0; }, "POSITIVE", "must be positive");
  return v;
}

const CLI::Validator& non_negative() {
  static const CLI::Validator v =
      number_where([](double x) { return x >= 0; }, "NONNEGATIVE", "must be 0 or positive");
  return v;
}

void add_cuda_sync_flag(CLI::App& cmd, bool& on) {
  cmd.add_flag("--cuda-sync", on,
               "debug: synchronise and check after every CUDA launch, so a fault names its "
               "kernel (slow; same as MHAR_CUDA_SYNC=1)");
}

void apply_cuda_sync(bool on) {
#ifdef MHAR_WITH_CUDA
  if (on) mhar::cuda::set_sync_launches(true);
#else
  (void)on;
#endif
}

void add_model_flags(CLI::App& cmd, Config& cfg, std::string& mode) {
  cmd.add_option("--mode", mode, "residual mode")->check(CLI::IsMember(mode_names()));
  cmd.add_option("--heads,-H", cfg.H,
                 "routing heads H (must divide d; 0 = n_kv_head; attnres uses 1)")
      ->check(non_negative());
  cmd.add_option("--d", cfg.d, "model width d")->check(positive());
  cmd.add_option("--layers,-L", cfg.L, "transformer blocks L")->check(positive());
  cmd.add_option("--n-head", cfg.n_head, "attention query heads")->check(positive());
  cmd.add_option("--n-kv-head", cfg.n_kv_head, "attention key/value heads (grouped-query)")
      ->check(positive());
  cmd.add_option("--ffn", cfg.ffn, "SwiGLU hidden width")->check(positive());
  cmd.add_option("--seq-len,-T", cfg.T, "tokens (bytes) per sequence T")->check(positive());
  cmd.add_option("--blocks", cfg.n_blocks, "blocks for the block and delta modes")
      ->check(positive());
}

Config model_config(Config cfg, const std::string& mode) {
  try {
    cfg.mode = parse_mode(mode);
    cfg.validate();
  } catch (const ShapeError& e) {
    throw UsageError(e.what());
  }
  return cfg;
}

std::vector<io::Format> parse_format_flag(const std::string& list) {
  try {
    return io::parse_formats(list);
  } catch (const std::invalid_argument& e) {
    throw UsageError(std::string("--format: ") + e.what());
  }
}

Subcommand register_train(CLI::App& app) {
  auto o = std::make_shared<TrainOptions>();
  auto mode = std::make_shared<std::string>("mhar");
  auto resume_dir = std::make_shared<std::string>();
  auto cuda_sync = std::make_shared<bool>(false);
  auto* cmd = app.add_subcommand(
      "train", "Train a tiny model on a text file (on the GPU when there is one, else the CPU)");
  add_model_flags(*cmd, o->cfg, *mode);
  cmd->add_option("--steps", o->steps, "optimizer steps")->check(positive());
  cmd->add_option("--batch,-B", o->batch, "sequences per step")->check(positive());
  cmd->add_option("--lr", o->lr, "peak learning rate (linear warmup, then cosine)")
      ->check(positive());
  cmd->add_option("--min-lr-ratio", o->min_lr_ratio, "final learning rate as a fraction of --lr")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--warmup", o->warmup, "warmup steps")->check(non_negative());
  cmd->add_option("--weight-decay", o->weight_decay, "AdamW decoupled weight decay (matrices only)")
      ->check(non_negative());
  cmd->add_option("--clip", o->clip, "global gradient-norm clipping (0 = off)")
      ->check(non_negative());
  cmd->add_option("--seed", o->seed, "seed of the initialisation and the batches");
  cmd->add_option("--data", o->data, "training text (any file: bytes are tokens)");
  auto* out = cmd->add_option("--out,-o", o->out, "run directory (never overwritten)");
  out->default_str("runs/<mode>-h<H>-seed<seed>");
  cmd->add_option("--device", o->device, "where to train (auto: the GPU when there is one)")
      ->check(CLI::IsMember(kDeviceChoices));
  cmd->add_option("--val-fraction", o->val_fraction, "held-out tail of the data for validation")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--eval-every", o->eval_every, "validate every N steps")->check(positive());
  cmd->add_option("--eval-batches", o->eval_batches, "batches per validation")->check(positive());
  cmd->add_option("--ckpt-every", o->ckpt_every, "checkpoint every N steps (and at the end)")
      ->check(positive());
  cmd->add_option("--heatmap-every", o->heatmap_every,
                  "write routing heatmaps every N steps (0 = only at the end)")
      ->check(non_negative());
  cmd->add_option("--format", o->figure_formats,
                  "figure formats of the heatmaps, comma-separated: png, svg, pdf");
  cmd->add_option("--log-every", o->log_every, "print a progress line every N steps (no terminal)")
      ->check(positive());
  cmd->add_option("--threads", o->threads, "CPU threads (0 = all cores)")->check(non_negative());
  cmd->add_option("--routing", o->routing,
                  "the CPU's routing: reference (reference/routing.cpp at every site) or fast "
                  "(cpu/routing_versions.h); the GPU picks its own")
      ->check(CLI::IsMember(cpu_routing_names()));
  cmd->add_flag("--quiet,-q", o->quiet, "print nothing but errors");
  cmd->add_option("--resume", *resume_dir,
                  "continue the run in DIR with its saved options (--steps N extends it)");
  add_cuda_sync_flag(*cmd, *cuda_sync);
  auto gpu_check = std::make_shared<GpuCheckFlags>();
  add_gpu_check_flags(*cmd, *gpu_check);
  auto* steps = cmd->get_option("--steps");
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
