/**
 * @file cli_bench.cpp
 * @brief `mhar-toy check` (CUDA kernels against the reference) and `mhar-toy bench`
 *        (`step`: CPU training-step time per mode; `routing`: the CUDA kernels' bandwidth).
 *
 * Benchmarks report ratios measured in one run; they are never asserted in tests.
 */
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <memory>

#include "cli_common.h"
#include "errors.h"
#include "optim.h"

#ifdef MHAR_WITH_CUDA
#include "cuda/bench_routing.h"
#include "cuda/check_routing.h"
#include "cuda/device.h"
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

namespace mhar::toy {

namespace {

/// Why the CUDA subcommands cannot run here, or "" when they can.
std::string cuda_unavailable() {
#ifdef MHAR_WITH_CUDA
  std::string why;
  if (mhar::cuda::device_count(&why) == 0) return "no CUDA device (" + why + ")";
  return "";
#else
  return "this mhar-toy was built without CUDA (no nvcc at configure time)";
#endif
}

/// One model ready for timed training steps (forward, backward, clipping, AdamW).
struct StepBench {
  Config cfg;
  int batch;
  Params<float> p, m, v, g;
  std::vector<int> x, y;
  Cache<float> cache;
  long step = 0;

  StepBench(const Config& c, int b) : cfg(c), batch(b) {
    Rng rng(1);
    p = init_params<float>(cfg, rng);
    m = zero_params<float>(cfg);
    v = zero_params<float>(cfg);
    // Open the routing a little so the softmax is not uniform (the cost is the same either way).
    if (cfg.routed())
      p.route_q = rng.normal_matrix<float>(p.route_q.rows(), p.route_q.cols(), 0, 0.1);
    x.resize(static_cast<std::size_t>(batch) * cfg.T);
    y.resize(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) {
      x[i] = static_cast<int>(rng.below(256));
      y[i] = static_cast<int>(rng.below(256));
    }
  }

  /// Seconds of one training step.
  double run() {
    const auto t0 = std::chrono::steady_clock::now();
    model_forward<float>(cfg, p, x, y, batch, &cache);
    model_backward(g, cfg, p, cache);
    std::vector<Mat<float>*> gl, pl, ml, vl;
    std::vector<bool> decay;
    g.for_each([&](const std::string&, Mat<float>& t, bool) { gl.push_back(&t); });
    p.for_each([&](const std::string&, Mat<float>& t, bool dc) {
      pl.push_back(&t);
      decay.push_back(dc);
    });
    m.for_each([&](const std::string&, Mat<float>& t, bool) { ml.push_back(&t); });
    v.for_each([&](const std::string&, Mat<float>& t, bool) { vl.push_back(&t); });
    clip_grad_norm<float>(gl, 1.0);
    ++step;
    for (std::size_t k = 0; k < pl.size(); ++k)
      adamw_step(*pl[k], *ml[k], *vl[k], *gl[k], step, 1e-3, AdamWHyper{}, decay[k]);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

Subcommand register_check(CLI::App& app) {
  auto seed = std::make_shared<unsigned>(1);
  auto* cmd = app.add_subcommand(
      "check", "Compare every CUDA routing kernel with the CPU reference on this machine's GPU");
  cmd->add_option("--seed", *seed, "seed of the random inputs");
  return {cmd, [seed]() -> int {
            const std::string why = cuda_unavailable();
            if (!why.empty()) {
              fmt::print(stderr, "mhar-toy check: nothing to check: {}\n", why);
              return kUnavailable;
            }
#ifdef MHAR_WITH_CUDA
            fmt::print("device: {}\n", mhar::cuda::device_name(0));
            fmt::print("{:<20} {:<8} {:<26} {:>12} {:>12}  {}\n", "op", "version", "shape",
                       "worst rel", "tolerance", "verdict");
            int failed = 0;
            for (const auto& r : mhar::cuda::check_routing(*seed)) {
              fmt::print("{:<20} {:<8} {:<26} {:>12.3e} {:>12.3e}  {}\n", r.op, r.version, r.shape,
                         r.worst_rel_err, r.tolerance, r.pass ? "pass" : "FAIL");
              failed += r.pass ? 0 : 1;
            }
            fmt::print("{}\n", failed == 0 ? "all pass" : fmt::format("{} FAILED", failed));
            return failed == 0 ? kOk : kFailure;
#else
            return kUnavailable;
#endif
          }};
}

Subcommand register_bench(CLI::App& app) {
  struct Opts {
    std::string what = "step", mode_list = "residual,attnres,mhar";
    Config cfg;
    std::string mode = "mhar";
    int batch = 16, repeats = 5, threads = 0;
    int N = 9, P = 16384, d = 512, H = 4;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd =
      app.add_subcommand("bench", "Measure speed: `bench step` (CPU) or `bench routing` (GPU)");
  cmd->add_option("what", o->what, "step | routing");
  add_model_flags(*cmd, o->cfg, o->mode);
  cmd->add_option("--batch,-B", o->batch, "step: sequences per step");
  cmd->add_option("--repeats", o->repeats, "timed repetitions (median for step, mean for routing)");
  cmd->add_option("--threads", o->threads, "step: CPU threads (0 = all cores)");
  cmd->add_option("--sources,-N", o->N, "routing: sources N (a site of the paper's 100M shape)");
  cmd->add_option("--positions,-P", o->P, "routing: positions P");
  cmd->add_option("--width", o->d, "routing: width d");
  cmd->add_option("--route-heads", o->H, "routing: heads H");
  return {cmd, [o]() -> int {
            if (o->repeats < 1) throw UsageError("--repeats must be at least 1");
            if (o->what == "step") {
#ifdef _OPENMP
              if (o->threads > 0) omp_set_num_threads(o->threads);
#endif
              const Config base = o->cfg;
              fmt::print(
                  "CPU training step (forward + backward + AdamW), d={} L={} T={} batch={}, "
                  "{} interleaved repeats, median:\n",
                  base.d, base.L, base.T, o->batch, o->repeats);
              std::vector<StepBench> benches;
              for (Mode m : {Mode::Residual, Mode::AttnRes, Mode::Mhar}) {
                Config c = base;
                c.mode = m;
                try {
                  c.validate();
                } catch (const ShapeError& e) {
                  throw UsageError(e.what());
                }
                benches.emplace_back(c, o->batch);
                benches.back().run();  // warm-up: caches, allocations
              }
              // Modes take turns, so a change in the machine's load hits them alike.
              std::vector<std::vector<double>> times(benches.size());
              for (int r = 0; r < o->repeats; ++r)
                for (std::size_t k = 0; k < benches.size(); ++k)
                  times[k].push_back(benches[k].run());
              const double residual = median(times[0]);
              fmt::print("{:<10} {:>4} {:>12} {:>12} {:>14}\n", "mode", "H", "step (ms)",
                         "tokens/s", "÷ residual");
              for (std::size_t k = 0; k < benches.size(); ++k) {
                const Config& c = benches[k].cfg;
                const double s = median(times[k]);
                fmt::print(
                    "{:<10} {:>4} {:>12.1f} {:>12.0f} {:>13.3f}×\n", mode_name(c.mode),
                    c.mode == Mode::Residual ? std::string("-") : std::to_string(c.route_heads()),
                    s * 1e3, o->batch * c.T / s, s / residual);
              }
              return kOk;
            }
            if (o->what != "routing")
              throw UsageError("bench: what must be step or routing, got '" + o->what + "'");
            const std::string why = cuda_unavailable();
            if (!why.empty()) {
              fmt::print(stderr, "mhar-toy bench routing: cannot run: {}\n", why);
              return kUnavailable;
            }
#ifdef MHAR_WITH_CUDA
            fmt::print("device: {}; routing N={} P={} d={} H={}\n", mhar::cuda::device_name(0),
                       o->N, o->P, o->d, o->H);
            fmt::print("{:<10} {:<8} {:>10} {:>12} {:>10} {:>8}\n", "op", "version", "ms", "MB",
                       "GB/s", "% copy");
            for (const auto& r : mhar::cuda::bench_routing(o->N, o->P, o->d, o->H, o->repeats))
              fmt::print("{:<10} {:<8} {:>10.4f} {:>12.2f} {:>10.1f} {:>7.1f}%\n", r.op, r.version,
                         r.ms, r.bytes / 1e6, r.gbps, r.pct_copy);
            return kOk;
#else
            return kUnavailable;
#endif
          }};
}

}  // namespace mhar::toy
