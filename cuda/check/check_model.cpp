/**
 * @file check_model.cpp
 * @brief check_model.h: GPU training step against the reference, per mode and per tensor.
 */
#include "cuda/check/check_model.h"

#include <cmath>
#include <stdexcept>
#include <string>

#include "cuda/device.h"
#include "cuda/model.h"
#include "reference/optim.h"

namespace mhar::cuda {

namespace {

template <typename T>
std::vector<T> flat(const Mat<T>& m) {
  return std::vector<T>(m.data(), m.data() + m.size());  // Mat is row-major
}

/// Parameters far from the DESIGN initialisation (see check_model.h), in double.
Params<double> draw_params(const Config& cfg, Rng& rng) {
  Params<double> p = zero_params<double>(cfg);
  p.for_each([&](const std::string& name, Mat<double>& m, bool decay) {
    if (decay)
      m = rng.normal_matrix<double>(m.rows(), m.cols(), 0.0, 0.1);
    else if (name.ends_with("norm") || name == "route.g")
      m = rng.normal_matrix<double>(m.rows(), m.cols(), 1.0, 0.2);  // gains near one
    else
      m = rng.normal_matrix<double>(m.rows(), m.cols(), 0.0, 0.5);  // q, ν, gates
  });
  return p;
}

std::vector<int> draw_tokens(Rng& rng, std::size_t n, int vocab) {
  std::vector<int> t(n);
  for (int& x : t) x = static_cast<int>(rng.below(static_cast<std::uint64_t>(vocab)));
  return t;
}

std::string describe(const Config& cfg, int B) {
  std::string s = mode_name(cfg.mode);
  if (cfg.routed()) s += " H=" + std::to_string(cfg.route_heads());
  if (cfg.mode == Mode::Block || cfg.mode == Mode::Delta)
    s += " blocks=" + std::to_string(cfg.n_blocks);
  return s + " B=" + std::to_string(B) + " T=" + std::to_string(cfg.T) +
         " d=" + std::to_string(cfg.d) + " L=" + std::to_string(cfg.L) +
         " heads=" + std::to_string(cfg.n_head) + "/" + std::to_string(cfg.n_kv_head);
}

}  // namespace

std::vector<ModelCheckCase> model_check_cases() {
  Config base;
  base.vocab = 37;
  base.d = 24;
  base.L = 2;
  base.n_head = 2;
  base.n_kv_head = 1;  // grouped-query: two query heads per key/value head
  base.ffn = 40;
  base.T = 7;
  base.n_blocks = 2;
  std::vector<ModelCheckCase> cases;
  auto add = [&](Mode mode, int H, int B, auto&& tweak) {
    Config c = base;
    c.mode = mode;
    c.H = H;
    tweak(c);
    c.validate();
    cases.push_back({describe(c, B), c, B});
  };
  auto same = [](Config&) {};
  add(Mode::Residual, 0, 2, same);
  add(Mode::AttnRes, 0, 2, same);
  add(Mode::Mhar, 4, 2, same);                        // K = 6
  add(Mode::Mhar, 24, 2, same);                       // H = d, K = 1
  add(Mode::Block, 2, 2, same);                       // two blocks of one layer
  add(Mode::Delta, 3, 2, same);                       // K = 8, null source, gates
  add(Mode::Mhar, 2, 3, [](Config& c) { c.T = 1; });  // T = 1
  add(Mode::Block, 4, 1, [](Config& c) {              // three layers in two blocks
    c.L = 3;
    c.n_kv_head = 2;
  });
  add(Mode::Delta, 1, 1, [](Config& c) { c.n_blocks = 1; });  // one block
  // The Warp routing kernels inside the model (K = 8: three heads in one float4 chunk).
  for (Mode mode : {Mode::Mhar, Mode::Delta}) {
    add(mode, 3, 2, same);
    cases.back().routing = RoutingVersion::Warp;
    cases.back().name += " routing=warp";
  }
  return cases;
}

std::vector<CheckRow> check_model_step(const ModelCheckCase& c, int steps, unsigned seed) {
  const Config& cfg = c.cfg;
  Rng rng(seed * 7919u + static_cast<unsigned>(c.name.size()));
  Params<double> pd = draw_params(cfg, rng);
  Params<double> m = zero_params<double>(cfg), v = zero_params<double>(cfg), gd;
  Params<float> gf;
  DeviceParams gpu_p(cfg), gpu_g(cfg);
  DeviceCache cache;
  std::vector<CheckRow> rows;
  for (int t = 1; t <= steps; ++t) {
    // The same float parameters and batch for all three runs.
    const Params<float> pf = cast_params<float>(pd);
    const Params<double> pe = cast_params<double>(pf);
    const std::size_t n = static_cast<std::size_t>(c.B) * cfg.T;
    const std::vector<int> x = draw_tokens(rng, n, cfg.vocab), y = draw_tokens(rng, n, cfg.vocab);
    Cache<double> cd;
    Cache<float> cf;
    const double loss_d = model_forward<double>(cfg, pe, x, y, c.B, &cd);
    model_backward(gd, cfg, pe, cd);
    const float loss_f = model_forward<float>(cfg, pf, x, y, c.B, &cf);
    model_backward(gf, cfg, pf, cf);
    gpu_p.upload(pf);
    // Poison every activation and work buffer: a step that reads what no earlier step wrote
    // turns the loss or a gradient into NaN. (Gradients need no poison: model_backward zeroes
    // them first, as the reference does.)
    if (cache.B != c.B) cache = DeviceCache(cfg, c.B);
    cache.routing = c.routing;
    cache.poison();
    const float loss_g = model_forward(cfg, gpu_p, x, y, c.B, cache);
    model_backward(gpu_g, cfg, gpu_p, cache);
    const Params<float> gg = gpu_g.download();
    const std::string step = "step " + std::to_string(t);
    rows.push_back(compare_with_truth(step, "loss", "v1", c.name, {loss_d}, {loss_f}, {loss_g}));
    // every gradient tensor, in Params::for_each order
    std::vector<std::vector<double>> td;
    std::vector<std::vector<float>> tf, tg;
    std::vector<std::string> names;
    gd.for_each([&](const std::string& name, const Mat<double>& g, bool) {
      names.push_back(name);
      td.push_back(flat(g));
    });
    gf.for_each([&](const std::string&, const Mat<float>& g, bool) { tf.push_back(flat(g)); });
    gg.for_each([&](const std::string&, const Mat<float>& g, bool) { tg.push_back(flat(g)); });
    for (std::size_t k = 0; k < names.size(); ++k)
      rows.push_back(
          compare_with_truth(step + " grad", names[k], "v1", c.name, td[k], tf[k], tg[k]));
    // advance the trajectory: a clipped AdamW step of the double run
    std::vector<Mat<double>*> gl, pl, ml, vl;
    std::vector<bool> decay;
    gd.for_each([&](const std::string&, Mat<double>& g, bool) { gl.push_back(&g); });
    pd.for_each([&](const std::string&, Mat<double>& p, bool dc) {
      pl.push_back(&p);
      decay.push_back(dc);
    });
    m.for_each([&](const std::string&, Mat<double>& x_, bool) { ml.push_back(&x_); });
    v.for_each([&](const std::string&, Mat<double>& x_, bool) { vl.push_back(&x_); });
    mhar::clip_grad_norm<double>(gl, 1.0);
    for (std::size_t k = 0; k < pl.size(); ++k)
      mhar::adamw_step(*pl[k], *ml[k], *vl[k], *gl[k], t, 2e-2, AdamWHyper{}, decay[k]);
  }
  return rows;
}

std::vector<CheckRow> check_model(unsigned seed) {
  std::string why;
  if (device_count(&why) == 0)
    throw std::runtime_error("check_model: no CUDA device (" + why + ")");
  std::vector<CheckRow> rows;
  for (const auto& c : model_check_cases())
    for (auto& r : check_model_step(c, 3, seed)) rows.push_back(std::move(r));
  return rows;
}

}  // namespace mhar::cuda
