/**
 * @file cli_grad.cpp
 * @brief `mhar-toy grad`: the loss and every parameter gradient on one deterministic batch,
 *        written as safetensors so another implementation can be checked against this one.
 *
 * The file holds "tokens" and "targets" (I64, B × T), "loss" (F64, a scalar), and for every
 * parameter "param.<name>" and "grad.<name>" (F64 by default), with the config in the metadata.
 */
#include <fmt/format.h>

#include <memory>
#include <utility>

#include "checkpoint.h"
#include "cli_common.h"
#include "data.h"
#include "errors.h"
#include "memory.h"
#include "routing_versions.h"
#include "safetensors.h"
#include "thread_governor.h"

namespace mhar::toy {

namespace {

/// The options of `grad`.
struct GradArgs {
  std::string ckpt, data = kDefaultCorpus, out = "grads.safetensors", mode = "mhar";
  std::string precision = "f64";
  Config cfg;
  int batch = 2;
  std::uint64_t seed = 1, batch_seed = 0;
};

/// The model `grad` differentiates: the checkpoint's, else a fresh one from the model flags.
std::pair<Config, Params<double>> grad_model(const GradArgs& o) {
  if (!o.ckpt.empty()) {
    const Checkpoint ck = load_checkpoint(o.ckpt);
    return {ck.cfg, cast_params<double>(ck.params)};
  }
  const Config cfg = model_config(o.cfg, o.mode);
  require_memory(cfg, o.batch, 8, Workload::Gradient, "grad");
  Rng rng(o.seed);
  return {cfg, cast_params<double>(init_params<float>(cfg, rng))};  // the float init, exactly
}

/// The loss on batch b, and its gradient into g, in `precision` (f64 or f32). On one thread: the
/// file is a reference to check other code against, and a step shared between threads sums its
/// matrix products in another order, so its last bits followed the thread count.
double loss_and_grad(Params<double>& g, const Config& cfg, const Params<double>& p, const Batch& b,
                     int batch, const std::string& precision) {
  const OneThread one;
  if (precision == "f64") {
    Cache<double> cache;
    cache.routing = &fast_routing<double>();
    const double loss = model_forward<double>(cfg, p, b.tokens, b.targets, batch, &cache);
    model_backward(g, cfg, p, cache);
    return loss;
  }
  const Params<float> pf = cast_params<float>(p);
  Cache<float> cache;
  cache.routing = &fast_routing<float>();
  const double loss = model_forward<float>(cfg, pf, b.tokens, b.targets, batch, &cache);
  Params<float> gf;
  model_backward(gf, cfg, pf, cache);
  g = cast_params<double>(gf);
  return loss;
}

/// Adds every matrix of ps as a tensor named prefix + its name, in `precision` (f64 or f32).
void add_params(io::SafeTensors& st, const std::string& prefix, const Params<double>& ps,
                const std::string& precision) {
  ps.for_each([&](const std::string& name, const Mat<double>& m, bool) {
    if (precision == "f64") {
      st.tensors.emplace_back(prefix + name, io::Tensor::from_f64({m.rows(), m.cols()}, m.data()));
    } else {
      const Mat<float> mf = m.cast<float>();
      st.tensors.emplace_back(prefix + name, io::Tensor::from_f32({m.rows(), m.cols()}, mf.data()));
    }
  });
}

/// The file `grad` writes: the batch, the loss, then every parameter and its gradient.
io::SafeTensors grad_file(const GradArgs& o, const Config& cfg, const Batch& b, double loss,
                          const Params<double>& p, const Params<double>& g) {
  io::SafeTensors st;
  st.metadata = {{"format", "mhar.grad"},
                 {"format_version", "1"},
                 {"config", config_to_json(cfg).dump()},
                 {"precision", o.precision},
                 {"loss", fmt::format("{:.17g}", loss)}};
  const std::vector<std::int64_t> tok(b.tokens.begin(), b.tokens.end()),
      tgt(b.targets.begin(), b.targets.end());
  st.tensors.emplace_back("tokens", io::Tensor::from_i64({o.batch, cfg.T}, tok.data()));
  st.tensors.emplace_back("targets", io::Tensor::from_i64({o.batch, cfg.T}, tgt.data()));
  st.tensors.emplace_back("loss", io::Tensor::from_f64({}, &loss));
  add_params(st, "param.", p, o.precision);
  add_params(st, "grad.", g, o.precision);
  return st;
}

/// Runs `grad`.
int run_grad(const GradArgs& o) {
  const auto [cfg, p] = grad_model(o);
  require_memory(cfg, o.batch, 8, Workload::Gradient, "grad");
  const Corpus corpus = load_corpus(o.data, 0.1, cfg.T);
  const Batch b = random_batch(corpus.train, o.batch, cfg.T, o.batch_seed, 0, 3);
  Params<double> g;
  const double loss = loss_and_grad(g, cfg, p, b, o.batch, o.precision);
  const io::SafeTensors st = grad_file(o, cfg, b, loss, p, g);
  io::save_safetensors(o.out, st);
  fmt::print("{}: loss {:.10f} on {} × {} bytes; {} parameter and gradient tensors ({})\n", o.out,
             loss, o.batch, cfg.T, (st.tensors.size() - 3) / 2, o.precision);
  return kOk;
}

}  // namespace

Subcommand register_grad(CLI::App& app) {
  auto o = std::make_shared<GradArgs>();
  auto* cmd = app.add_subcommand(
      "grad", "Loss and every parameter gradient on one deterministic batch, as safetensors");
  cmd->add_option("--ckpt", o->ckpt, "checkpoint or run directory (default: a fresh model)");
  add_model_flags(*cmd, o->cfg, o->mode);
  cmd->add_option("--seed", o->seed, "initialisation seed of a fresh model");
  cmd->add_option("--data", o->data, "text the batch is drawn from");
  cmd->add_option("--batch,-B", o->batch, "sequences in the batch")->check(positive());
  cmd->add_option("--batch-seed", o->batch_seed, "seed of the batch's windows");
  cmd->add_option("--precision", o->precision,
                  "f64 (double: the truth) or f32 (what training uses)")
      ->check(one_of({"f64", "f32"}));
  cmd->add_option("--out,-o", o->out, "output file");
  return {cmd, [o]() -> int { return run_grad(*o); }};
}

}  // namespace mhar::toy
