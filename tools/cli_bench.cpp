/**
 * @file cli_bench.cpp
 * @brief `mhar-toy bench` (`step`: training-step time per mode, CPU or GPU; `routing`: the CUDA
 *        kernels' bandwidth, or with `--device cpu` the CPU routing versions', against a copy
 *        loop), and the benchmarks of `mhar-toy check --report` (cli_bench.h; check itself is
 *        cli_check.cpp).
 *
 * Benchmarks report ratios measured in one run; they are never asserted in tests.
 */
#include "cli_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <memory>
#include <optional>

#include "backend.h"
#include "bench_routing_cpu.h"
#include "busy_load.h"
#include "cli_common.h"
#include "device_select.h"
#include "errors.h"
#include "gpu_report.h"
#include "gpu_selfcheck.h"
#include "memory.h"
#include "optim.h"
#include "routing_versions.h"
#include "thread_governor.h"

#ifdef MHAR_WITH_CUDA
#include "cuda/bench/bench_routing.h"
#include "cuda/device.h"
#include "cuda/model.h"
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

namespace mhar::toy {

namespace {

/// One model ready for timed training steps (forward, backward, clipping, AdamW), taken through
/// train's own CPU Backend (backend.h) with train's default routing, so the bench times the step
/// that training takes, data-parallel threads included, its batch cut into `shards` shards as
/// train cuts it (ThreadGovernor::shards; 0: one per CPU). Not movable: the backend holds p, m, v.
struct StepBench {
  Config cfg;
  int batch;
  Params<float> p, m, v;
  Batch b;
  std::unique_ptr<Backend> backend;
  long step = 0;

  StepBench(const Config& c, int rows, int shards = 0) : cfg(c), batch(rows) {
    Rng rng(1);
    p = init_params<float>(cfg, rng);
    m = zero_params<float>(cfg);
    v = zero_params<float>(cfg);
    // Open the routing a little so the softmax is not uniform (the cost is the same either way).
    if (cfg.routed())
      p.route_q = rng.normal_matrix<float>(p.route_q.rows(), p.route_q.cols(), 0, 0.1);
    b.tokens.resize(static_cast<std::size_t>(batch) * cfg.T);
    b.targets.resize(b.tokens.size());
    for (std::size_t i = 0; i < b.tokens.size(); ++i) {
      b.tokens[i] = static_cast<int>(rng.below(256));
      b.targets[i] = static_cast<int>(rng.below(256));
    }
    backend = make_backend("cpu", cfg, batch, p, m, v, CpuRouting::Fast, shards);
  }
  StepBench(const StepBench&) = delete;
  StepBench& operator=(const StepBench&) = delete;

  /// Seconds of one training step.
  double run() {
    const auto t0 = std::chrono::steady_clock::now();
    backend->forward(b);
    backend->backward();
    backend->clip(1.0);
    backend->adamw(++step, 1e-3, AdamWHyper{});
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
};

#ifdef MHAR_WITH_CUDA
/// StepBench on the GPU (cuda/model.h): the same step, parameters and batch, every tensor on
/// the device; timed from the first launch until the GPU has finished the AdamW step.
struct GpuStepBench {
  Config cfg;
  int batch;
  mhar::cuda::DeviceParams p, m, v, g;
  mhar::cuda::DeviceCache cache;
  std::vector<int> x, y;
  long step = 0;

  GpuStepBench(const Config& c, int b,
               mhar::cuda::RoutingVersion routing = mhar::cuda::RoutingVersion::Fused)
      : cfg(c), batch(b), p(c), m(c), v(c), g(c), cache(c, b) {
    cache.routing = routing;
    const StepBench host(c, b);  // the same initial parameters and batch as the CPU bench
    p.upload(host.p);
    x = host.b.tokens;
    y = host.b.targets;
  }

  double run() {
    mhar::cuda::synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    mhar::cuda::model_forward(cfg, p, x, y, batch, cache);
    mhar::cuda::model_backward(g, cfg, p, cache);
    mhar::cuda::clip_grad_norm(g, 1.0);
    mhar::cuda::adamw_step(p, m, v, g, ++step, 1e-3, AdamWHyper{});
    mhar::cuda::synchronize();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
};
#endif

/// The value a fraction q of the way through v once sorted (nearest rank; v not empty).
double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<std::size_t>(std::lround(q * static_cast<double>(v.size() - 1)))];
}

/// The middle value (the upper of the two middle ones for an even count).
double median(std::vector<double> v) {
  return quantile(std::move(v), 0.5);
}

/// The H column of a step table: the routing heads, "-" for residual.
std::string heads_column(const Config& c) {
  return c.mode == Mode::Residual ? std::string("-") : std::to_string(c.route_heads());
}

/// One timed training step per mode, the modes taking turns (so a change in the machine's load
/// hits them alike); prints the median step time of each and its ratio to the first (residual).
/// Returns the medians in seconds.
std::vector<double> print_step_table(const std::vector<Config>& configs,
                                     const std::vector<std::string>& labels, int batch,
                                     const std::vector<std::function<double()>>& runs,
                                     int repeats) {
  for (const auto& run : runs) run();  // warm-up: caches, allocations, cuBLAS heuristics
  std::vector<std::vector<double>> times(runs.size());
  for (int r = 0; r < repeats; ++r)
    for (std::size_t k = 0; k < runs.size(); ++k) times[k].push_back(runs[k]());
  const double residual = median(times[0]);
  fmt::print("{:<10} {:>4} {:>12} {:>12} {:>14}\n", "mode", "H", "step (ms)", "tokens/s",
             "÷ residual");
  std::vector<double> medians;
  for (std::size_t k = 0; k < runs.size(); ++k) {
    const Config& c = configs[k];
    const double s = median(times[k]);
    medians.push_back(s);
    fmt::print("{:<10} {:>4} {:>12.2f} {:>12.0f} {:>13.3f}×\n", labels[k], heads_column(c), s * 1e3,
               batch * c.T / s, s / residual);
  }
  // Each round's own ratio (the mode's step over residual's, timed one after the other): a slow
  // stretch of the machine hits both, so the spread of these says how far the table's ratio of
  // medians can be trusted. The lines start with "round" so that tools reading the table's rows
  // by their first word ("mhar") never take them for one.
  for (std::size_t k = 1; k < runs.size(); ++k) {
    std::vector<double> ratios;
    for (int r = 0; r < repeats; ++r) ratios.push_back(times[k][r] / times[0][r]);
    fmt::print(
        "round by round, {} ÷ residual: median {:.3f}×, middle half {:.3f}×–{:.3f}× ({} "
        "round{})\n",
        labels[k], median(ratios), quantile(ratios, 0.25), quantile(ratios, 0.75), repeats,
        repeats == 1 ? "" : "s");
  }
  return medians;
}

/// After the CPU table: what the mhar step's routing would cost if it moved its bytes at the speed
/// of a copy too large for the caches (64 MiB a buffer; the step's activations do not fit either),
/// measured now on the same threads, and the mhar ÷ residual ratio that would give. An estimate,
/// not a bound: some sources are still in cache when a site reads them, and the step's medians
/// carry the machine's noise. Then the same at the speed of a 64 MiB read, for the bytes read
/// (most of them: the routing writes only each site's output and each source's gradient), the
/// written ones at copy speed, each also read first as a copy's are: what memory allows a
/// routing whose sources and douts all come from memory.
void print_routing_floor(const Config& mhar, int batch, double residual_s, int repeats) {
  const int P = batch * mhar.T;
  const double bytes = cpu_step_routing_bytes(mhar.L, P, mhar.d, mhar.route_heads());
  const double gbps = cpu_copy_gbps(16L << 20, repeats);
  const double ms = bytes / (gbps * 1e6);
  fmt::print(
      "routing at copy speed: mhar's routing moves {:.1f} MB a step (forward + backward at its "
      "{} sites, docs/kernels.md); a 64 MiB copy ran at {:.1f} GB/s, so that is {:.1f} ms, "
      "mhar ÷ residual ≈ {:.3f}× if every byte came from memory\n",
      bytes / 1e6, 2 * mhar.L + 1, gbps, ms, 1.0 + ms / (residual_s * 1e3));
  const double written = cpu_step_routing_written_bytes(mhar.L, P, mhar.d);
  const double read_gbps = cpu_read_gbps(64L << 20, repeats);
  const double read_ms = (bytes - written) / (read_gbps * 1e6) + 2.0 * written / (gbps * 1e6);
  fmt::print(
      "routing at read speed: of those, {:.1f} MB are read and {:.1f} MB written; a 64 MiB read "
      "ran at {:.1f} GB/s, so with the writes at copy speed that is {:.1f} ms, mhar ÷ residual ≈ "
      "{:.3f}× if every byte came from memory\n",
      (bytes - written) / 1e6, written / 1e6, read_gbps, read_ms,
      1.0 + read_ms / (residual_s * 1e3));
}

/// residual, attnres, mhar variants of `base`, validated.
std::vector<Config> step_modes(const Config& base) {
  std::vector<Config> out;
  for (Mode m : {Mode::Residual, Mode::AttnRes, Mode::Mhar}) {
    Config c = base;
    c.mode = m;
    try {
      c.validate();
    } catch (const ShapeError& e) {
      throw UsageError(e.what());
    }
    out.push_back(c);
  }
  return out;
}

/// Times training steps of residual, attnres and mhar on `device` ("cpu" or "cuda"); on the CPU
/// each step first lets `threads` choose its thread count, as train does. Returns each row's
/// median, in StepTiming::cpu_ms or gpu_ms.
std::vector<StepTiming> bench_steps(const Config& base, int batch, int repeats,
                                    const std::string& device,
                                    const std::shared_ptr<ThreadGovernor>& threads = nullptr) {
  std::vector<Config> configs = step_modes(base);
  std::vector<std::string> labels;
  for (const Config& c : configs) labels.push_back(mode_name(c.mode));
  std::vector<std::function<double()>> runs;
  if (device == "cpu") {
    auto benches = std::make_shared<std::vector<std::unique_ptr<StepBench>>>();
    const int shards = threads ? threads->shards() : 0;  // as train cuts them
    for (const Config& c : configs)
      benches->push_back(std::make_unique<StepBench>(c, batch, shards));
    for (std::size_t k = 0; k < configs.size(); ++k)
      runs.push_back([benches, k, threads] {
        if (threads) threads->before_step();
        return (*benches)[k]->run();
      });
  } else {
#ifdef MHAR_WITH_CUDA
    auto benches = std::make_shared<std::vector<std::unique_ptr<GpuStepBench>>>();
    for (const Config& c : configs) benches->push_back(std::make_unique<GpuStepBench>(c, batch));
    // mhar again with the Warp routing kernels (version 3), where the shape allows them.
    const Config routed = configs.back();
    if (mhar::cuda::version_supports(mhar::cuda::RoutingVersion::Warp, routed.d,
                                     routed.route_heads())) {
      configs.push_back(routed);
      labels.push_back("mhar-warp");
      benches->push_back(
          std::make_unique<GpuStepBench>(routed, batch, mhar::cuda::RoutingVersion::Warp));
    }
    for (std::size_t k = 0; k < configs.size(); ++k)
      runs.push_back([benches, k] { return (*benches)[k]->run(); });
#endif
  }
  const std::vector<double> medians = print_step_table(configs, labels, batch, runs, repeats);
  if (device == "cpu") print_routing_floor(configs.back(), batch, medians[0], repeats);
  std::vector<StepTiming> out;
  for (std::size_t k = 0; k < configs.size(); ++k) {
    out.push_back({labels[k], heads_column(configs[k]), 0, 0});
    (device == "cpu" ? out.back().cpu_ms : out.back().gpu_ms) = medians[k] * 1e3;
  }
  return out;
}

/// The paper's 100M model (L = 12, d = 512, H = 4, T = 512): the one place its shape is written.
/// The GPU tables run it at kPaperBatch sequences; the CPU routing table at the default T.
Config paper_100m() {
  Config c;
  c.d = 512;
  c.L = 12;
  c.n_head = 8;
  c.n_kv_head = 4;
  c.ffn = 1376;  // ≈ 8/3 · d, a multiple of 32
  c.T = 512;
  c.H = 4;
  return c;
}

/// The tiny (default) model with H = 4 routing heads: the other shape of every table.
Config tiny_step_shape() {
  Config tiny;
  tiny.H = 4;
  return tiny;
}

/// One routing site's shape for a routing table.
struct RoutingBenchShape {
  std::string name;
  int N, P, d, H;
};

/// The final routing site of model c (the widest read: N = 2L + 1 sources) at `batch` sequences.
RoutingBenchShape final_site(const std::string& name, const Config& c, int batch) {
  return {name, 2 * c.L + 1, batch * c.T, c.d, c.H};
}

/// The site --sources, --positions, --width and --route-heads give, or none when no flag is;
/// throws UsageError when only some are.
std::optional<RoutingBenchShape> given_shape(int N, int P, int d, int H) {
  if (N <= 0 && P <= 0 && d <= 0 && H <= 0) return std::nullopt;
  if (N < 1 || P < 1 || d < 1 || H < 1)
    throw UsageError("give all of --sources, --positions, --width, --route-heads");
  return RoutingBenchShape{"given", N, P, d, H};
}

/// One CPU routing table: its title line, the column names, a row per measurement.
void print_cpu_routing_rows(const std::string& title, const std::vector<CpuRoutingRow>& rows) {
  fmt::print("{}\n", title);
  fmt::print("{:<10} {:<8} {:>7} {:>10} {:>10} {:>8} {:>8}\n", "op", "version", "threads", "ms",
             "MB", "GB/s", "% copy");
  for (const auto& r : rows)
    fmt::print("{:<10} {:<8} {:>7} {:>10.3f} {:>10.2f} {:>8.2f} {:>7.1f}%\n", r.op, r.version,
               r.threads, r.ms, r.bytes / 1e6, r.gbps, r.pct_copy);
}

/// `bench routing --device cpu`: the CPU versions at the given shape or at the final routing
/// site of the two CPU step shapes of docs/benchmarks.md (N = 2L + 1 sources): the default
/// model at batch 16, and the paper's 100M model (d 512, L 12) at batch 4 (P = 4 · 128).
void bench_routing_cpu_table(int N, int P, int d, int H, int repeats, int threads) {
  std::vector<RoutingBenchShape> shapes;
  if (const auto given = given_shape(N, P, d, H)) {
    if (d % H != 0) throw UsageError("--route-heads must divide --width");
    // the stack's table holds the most: 6 · N · P · d floats (bench_routing_cpu.h), 25 % more;
    // refused before anything is allocated (it allocated until the kernel would kill it)
    const double need = 1.25 * 6.0 * N * P * d * sizeof(float), have = memory_available();
    if (have > 0 && need > have)
      throw UsageError(fmt::format(
          "bench routing at N = {}, P = {}, width {} needs about {:.3g} GiB, this machine has "
          "{:.3g} GiB available; choose smaller --sources, --positions or --width",
          N, P, d, need / 0x1p30, have / 0x1p30));
    shapes = {*given};
  } else {
    Config big = paper_100m();
    big.T = Config().T;  // the CPU step shape of docs/benchmarks.md: P = 4 · 128
    shapes = {final_site("default", tiny_step_shape(), 16), final_site("paper 100M", big, 4)};
  }
#ifdef _OPENMP
  const int all = threads > 0 ? threads : omp_get_num_procs();
#else
  const int all = 1;
#endif
  std::vector<int> counts = {1};
  if (all > 1) counts.push_back(all);
  for (const RoutingBenchShape& sh : shapes) {
    print_cpu_routing_rows(
        fmt::format("CPU routing, {} shape: N={} P={} d={} H={}, float, fastest of {} interleaved "
                    "rounds (bytes: docs/kernels.md)",
                    sh.name, sh.N, sh.P, sh.d, sh.H, repeats),
        bench_routing_cpu(sh.N, sh.P, sh.d, sh.H, repeats, counts));
    print_cpu_routing_rows(
        fmt::format("CPU routing, {} shape, all {} sites of the stack (site s reads sources 0 … "
                    "s, as in attnres and mhar): P={} d={} H={}",
                    sh.name, sh.N, sh.P, sh.d, sh.H),
        bench_routing_stack_cpu(sh.N, sh.P, sh.d, sh.H, repeats, counts));
  }
}

struct BenchOptions {
  std::string what = "step";
  Config cfg;
  std::string mode = "mhar";
  std::string device = "cpu";
  int batch = 16, repeats = 5, threads = 0, busy = 0;
  int N = 0, P = 0, d = 0, H = 0;
  bool kernels_only = false;
  bool cuda_sync = false;
  GpuCheckFlags gpu_check;
};

/// The spinning processes of --busy, as the benches' first lines name them, between `before`
/// and `after` ("" for none).
std::string busy_text(const BenchOptions& o, const char* before, const char* after) {
  return o.busy > 0 ? fmt::format("{}{} other process{} spinning (--busy){}", before, o.busy,
                                  o.busy == 1 ? "" : "es", after)
                    : "";
}

/// "CPU (2 threads)", or for --threads 0 "CPU (threads follow the load: 1 to 2)", and the
/// spinning processes of --busy.
std::string cpu_label(const BenchOptions& o, const ThreadGovernor& threads) {
  const std::string busy = busy_text(o, ", ", "");
  if (o.threads > 0)
    return fmt::format("CPU ({} thread{}{})", o.threads, o.threads == 1 ? "" : "s", busy);
  return fmt::format("CPU (threads follow the load: 1 to {}{})", threads.cpus(), busy);
}

/// `bench step`: one training step per mode on `device` ("cpu" or "cuda").
int run_bench_step(const BenchOptions& o, const std::string& device) {
  if (device == "cpu") {  // every mode's step is built before the first is timed: mhar's size,
    const std::vector<Config> modes = step_modes(o.cfg);  // the largest, once per mode
    require_memory(modes.back(), o.batch, sizeof(float), Workload::Training, "bench step",
                   static_cast<int>(modes.size()));
  }
  const auto threads = std::make_shared<ThreadGovernor>(o.threads);
  // on the GPU too: its step's launches and copies run on the CPU's cores
  const BusyLoad busy(o.busy);
  fmt::print(
      "{} training step (forward + backward + clipping + AdamW), d={} L={} T={} batch={}, {} "
      "interleaved repeat{}, median:\n",
      device == "cpu" ? cpu_label(o, *threads)
#ifdef MHAR_WITH_CUDA
                      : "GPU " + mhar::cuda::device_name(0) + busy_text(o, " (", ")"),
#else
                      : "GPU" + busy_text(o, " (", ")"),
#endif
      o.cfg.d, o.cfg.L, o.cfg.T, o.batch, o.repeats, o.repeats == 1 ? "" : "s");
  bench_steps(o.cfg, o.batch, o.repeats, device, threads);
  if (device == "cpu" && o.threads == 0)
    fmt::print("threads: {} at the last step (--threads 0: one per idle core)\n",
               threads->threads());
  return kOk;
}

#ifdef MHAR_WITH_CUDA
/// Sequences per step of the paper's 100M model in the GPU tables: P = 32 × 512 = 16384.
constexpr int kPaperBatch = 32;

/// The site the flags give, or the final routing site of the tiny model (batch 16) and of the
/// paper's 100M model (kPaperBatch).
std::vector<RoutingBenchShape> routing_bench_shapes(const BenchOptions& o) {
  if (const auto given = given_shape(o.N, o.P, o.d, o.H)) return {*given};
  return {final_site("tiny", tiny_step_shape(), 16),
          final_site("paper 100M", paper_100m(), kPaperBatch)};
}

/// "tiny shape: N=9 P=2048 d=128 H=4"
std::string describe(const RoutingBenchShape& sh) {
  return fmt::format("{} shape: N={} P={} d={} H={}", sh.name, sh.N, sh.P, sh.d, sh.H);
}

/// Every GPU routing version at one shape, next to the copy bandwidth; returns the rows.
std::vector<mhar::cuda::BenchRow> print_gpu_routing_table(const RoutingBenchShape& sh,
                                                          int repeats) {
  fmt::print("routing, {} (bytes: docs/kernels.md)\n", describe(sh));
  fmt::print("{:<10} {:<9} {:>10} {:>12} {:>10} {:>8}\n", "op", "version", "ms", "MB", "GB/s",
             "% copy");
  bool one_block = false;
  const std::vector<mhar::cuda::BenchRow> rows =
      mhar::cuda::bench_routing(sh.N, sh.P, sh.d, sh.H, repeats);
  for (const auto& r : rows) {
    fmt::print("{:<10} {:<9} {:>10.4f} {:>12.2f} {:>10.1f} {:>7.1f}%\n", r.op, r.version, r.ms,
               r.bytes / 1e6, r.gbps, r.pct_copy);
    one_block = one_block || r.version == mhar::cuda::kFusedOneBlockName;
  }
  if (one_block)
    fmt::print("({}: the fused kernels under __launch_bounds__(512, 1); docs/kernels.md)\n",
               mhar::cuda::kFusedOneBlockName);
  return rows;
}

/// The GPU training step at the tiny and the paper's 100M shapes (MHAR ÷ residual ratios).
void print_gpu_step_ratios(int repeats) {
  const Config tiny = tiny_step_shape();
  fmt::print("GPU training step, tiny shape: d={} L={} T={} batch 16\n", tiny.d, tiny.L, tiny.T);
  bench_steps(tiny, 16, repeats, "cuda");
  const Config big = paper_100m();
  fmt::print("GPU training step, paper 100M shape: d={} L={} T={} batch {} (P = {})\n", big.d,
             big.L, big.T, kPaperBatch, kPaperBatch * big.T);
  bench_steps(big, kPaperBatch, repeats, "cuda");
}

/// One benchmark of the report; a failure (the 100M shape out of a small GPU's memory) becomes
/// a note in the report instead of ending it.
void report_bench(GpuReport& r, const std::string& what, const std::function<void()>& run) {
  try {
    run();
  } catch (const std::exception& e) {
    r.notes.push_back(what + ": not measured: " + e.what());
    fmt::print(stderr, "mhar-toy check --report: {}: not measured: {}\n", what, e.what());
  }
}
#endif

/// `bench routing`: the CPU versions when `on_cpu`, else the GPU kernels (exit 4 without one).
int run_bench_routing(const BenchOptions& o, bool on_cpu) {
  if (on_cpu) {
    const BusyLoad busy(o.busy);
    if (o.busy > 0) fmt::print("{}\n", busy_text(o, "CPU routing under load: ", ""));
    bench_routing_cpu_table(o.N, o.P, o.d, o.H, o.repeats, o.threads);
    return kOk;
  }
  const std::string why = cuda_unavailable();
  if (!why.empty()) {
    fmt::print(stderr, "mhar-toy bench routing: cannot run: {}\n", why);
    return kUnavailable;
  }
#ifdef MHAR_WITH_CUDA
  const std::vector<RoutingBenchShape> shapes = routing_bench_shapes(o);
  const BusyLoad busy(o.busy);
  fmt::print("device: {}{}\n", mhar::cuda::device_name(0), busy_text(o, " (", ")"));
  for (const RoutingBenchShape& sh : shapes) print_gpu_routing_table(sh, o.repeats);
  if (!o.kernels_only) print_gpu_step_ratios(o.repeats);
  return kOk;
#else
  return kUnavailable;
#endif
}

}  // namespace

#ifdef MHAR_WITH_CUDA
/// See cli_bench.h.
void report_benches(GpuReport& r, int repeats, bool tiny_only) {
  std::vector<RoutingBenchShape> shapes = routing_bench_shapes(BenchOptions{});
  if (tiny_only) shapes.resize(1);
  for (const RoutingBenchShape& sh : shapes)
    report_bench(r, "bench routing, " + describe(sh), [&] {
      r.routing.push_back({describe(sh), print_gpu_routing_table(sh, repeats)});
    });
  const Config tiny = tiny_step_shape();
  const std::string tiny_title =
      fmt::format("tiny shape: d={} L={} T={} batch 16", tiny.d, tiny.L, tiny.T);
  report_bench(r, "bench step, " + tiny_title, [&] {
    fmt::print("GPU training step, {}\n", tiny_title);
    std::vector<StepTiming> rows = bench_steps(tiny, 16, repeats, "cuda");
    fmt::print("CPU training step, {}\n", tiny_title);
    for (const StepTiming& c : bench_steps(tiny, 16, repeats, "cpu"))
      for (StepTiming& g : rows)
        if (g.mode == c.mode) g.cpu_ms = c.cpu_ms;
    r.steps.push_back({tiny_title, rows});
  });
  if (tiny_only) return;
  const Config big = paper_100m();
  const std::string big_title =
      fmt::format("paper 100M shape: d={} L={} T={} batch {}", big.d, big.L, big.T, kPaperBatch);
  report_bench(r, "bench step, " + big_title, [&] {
    fmt::print("GPU training step, {}\n", big_title);
    r.steps.push_back({big_title, bench_steps(big, kPaperBatch, repeats, "cuda")});
  });
}
#endif

Subcommand register_bench(CLI::App& app) {
  auto o = std::make_shared<BenchOptions>();
  auto* cmd =
      app.add_subcommand("bench",
                         "Measure speed: `bench step` (a training step per mode, CPU or GPU) or "
                         "`bench routing` (the CUDA routing kernels and the GPU step ratio; "
                         "with --device cpu the CPU routing versions)");
  cmd->add_option("what", o->what, "step | routing")->check(one_of({"step", "routing"}));
  add_model_flags(*cmd, o->cfg, o->mode);
  cmd->add_option("--batch,-B", o->batch, "step: sequences per step")->check(positive());
  cmd->add_option("--repeats", o->repeats,
                  "timed repetitions (step: median; CPU routing: fastest; GPU routing: mean)")
      ->check(positive());
  cmd->add_option("--threads", o->threads,
                  "on the CPU: threads (step: 0 = one per idle core, as train; routing: 0 = all "
                  "cores, timed on 1 and on this many)")
      ->check(thread_count());
  cmd->add_option("--busy", o->busy,
                  "start N other processes that each keep a core busy while the bench runs "
                  "(the contended case)")
      ->check(thread_count());
  auto* device_opt = cmd->add_option(
      "--device", o->device, "step: cpu | cuda | auto (default cpu); routing: cuda unless given");
  device_opt->check(one_of(kDeviceChoices));
  cmd->add_option("--sources,-N", o->N,
                  "routing: sources N (default: the tiny and the paper's 100M shapes)")
      ->check(positive());
  cmd->add_option("--positions,-P", o->P, "routing: positions P")->check(positive());
  cmd->add_option("--width", o->d, "routing: width d")->check(positive());
  cmd->add_option("--route-heads", o->H, "routing: heads H")->check(positive());
  cmd->add_flag("--kernels-only", o->kernels_only,
                "routing: leave out the GPU training-step ratios");
  add_cuda_sync_flag(*cmd, o->cuda_sync);
  add_gpu_check_flags(*cmd, o->gpu_check);
  return {cmd, [o, device_opt]() -> int {
            apply_cuda_sync(o->cuda_sync);
            apply_gpu_check_flags(o->gpu_check);
            if (o->what == "step")  // the GPU's step only after the self-check (or on the CPU)
              return run_bench_step(
                  *o, pick_checked_device(
                          o->device, GpuWork{.models = step_modes(o->cfg), .warp = true}, false));
            const std::string device = pick_device(o->device);  // exit 4: cuda without a GPU
            // routing: the GPU kernels unless --device says cpu (or auto finds no GPU)
            return run_bench_routing(*o, device_opt->count() > 0 && device == "cpu");
          }};
}

}  // namespace mhar::toy
