/**
 * @file gpu_selfcheck.cpp
 * @brief gpu_selfcheck.h: plan the self-check from the run's models, run it, keep or report the
 *        verdict, and choose the device.
 */
#include "gpu_selfcheck.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <functional>
#include <set>

#include "device_select.h"
#include "gpu_cache.h"
#include "gpu_report.h"
#include "io/file_util.h"

#ifdef MHAR_WITH_CUDA
#include "cuda/check/check_attention.h"
#include "cuda/check/check_layers.h"
#include "cuda/check/check_model.h"
#include "cuda/check/check_routing.h"
#include "cuda/device.h"
#endif

namespace mhar::toy {

namespace {
GpuCheckFlags g_flags;
}  // namespace

void add_gpu_check_flags(CLI::App& cmd, GpuCheckFlags& flags) {
  cmd.add_flag("--recheck-gpu", flags.recheck,
               "run the GPU self-check (the kernels against the CPU reference) even where it "
               "already passed for this GPU, driver and build");
  cmd.add_flag("--skip-gpu-check", flags.skip,
               "use the GPU without the self-check (for those who know it works)");
}

void apply_gpu_check_flags(const GpuCheckFlags& flags) {
  g_flags = flags;
}

#ifdef MHAR_WITH_CUDA
namespace {

namespace fs = std::filesystem;
using mhar::cuda::CheckRow;

/// One group of comparisons, named for the progress line.
struct Stage {
  std::string name;
  std::function<std::vector<CheckRow>()> run;
};

/// The self-check's model: the run's, with at most 8 tokens a sequence.
Config small_step(Config c) {
  c.T = std::min(c.T, 8);
  return c;
}

std::string describe_model(const Config& c, int B) {
  std::string s = mode_name(c.mode);
  if (c.routed()) s += fmt::format(" H={}", c.route_heads());
  return s + fmt::format(" d={} L={} heads={}/{} ffn={} T={} B={}", c.d, c.L, c.n_head, c.n_kv_head,
                         c.ffn, c.T, B);
}

/// The routing versions a model's run uses, each forward and backward at its widest site.
void add_routing(std::vector<Stage>& out, const Config& c, bool warp, unsigned seed) {
  using mhar::cuda::RoutingVersion;
  std::vector<RoutingVersion> versions = {RoutingVersion::Fused};
  if (warp && mhar::cuda::version_supports(RoutingVersion::Warp, c.d, c.route_heads()))
    versions.push_back(RoutingVersion::Warp);
  const mhar::cuda::RoutingShape s{2 * c.L + 1, 37, c.d, c.route_heads()};  // P odd on purpose
  for (RoutingVersion v : versions)
    out.push_back({"routing " + mhar::cuda::version_name(v) + " " + describe(s), [=] {
                     std::vector<CheckRow> rows = mhar::cuda::check_routing_forward(s, v, seed);
                     for (auto& r : mhar::cuda::check_routing_backward(s, v, seed))
                       rows.push_back(r);
                     return rows;
                   }});
}

/// The layer twins, cuBLAS's products, attention, and one training step of model `c`.
void add_model(std::vector<Stage>& out, const Config& c, unsigned seed) {
  namespace cu = mhar::cuda;
  const cu::LayerShape ls{2 * c.T, c.T, c.d, c.n_head, c.head_dim(), c.ffn, c.vocab};
  out.push_back({"layer twins " + describe(ls), [=] {
                   std::vector<CheckRow> rows;
                   for (auto* f :
                        {cu::check_rmsnorm, cu::check_rope, cu::check_swiglu, cu::check_embedding,
                         cu::check_cross_entropy, cu::check_adamw, cu::check_clip})
                     for (auto& r : f(ls, seed)) rows.push_back(r);
                   return rows;
                 }});
  out.push_back({"cuBLAS linear and MLP " + describe(ls), [=] {
                   std::vector<CheckRow> rows = cu::check_linear(ls, seed);
                   for (auto& r : cu::check_mlp(ls, seed)) rows.push_back(r);
                   return rows;
                 }});
  const cu::AttentionShape as{2, c.T, c.n_head, c.n_kv_head, c.head_dim()};
  out.push_back({"attention (cuBLAS) " + describe(as), [=] {
                   std::vector<CheckRow> rows = cu::check_attention_forward(as, seed);
                   for (auto& r : cu::check_attention_backward(as, seed)) rows.push_back(r);
                   return rows;
                 }});
  const cu::ModelCheckCase mc{describe_model(c, 2), c, 2, cu::RoutingVersion::Fused};
  out.push_back({"training step " + mc.name, [=] { return cu::check_model_step(mc, 1, seed); }});
}

/// Every stage for `work`, each once (bench step's three modes share their layer shapes).
std::vector<Stage> plan(const GpuWork& work, unsigned seed) {
  std::vector<Stage> all;
  for (const Config& full : work.models) {
    const Config c = small_step(full);
    if (c.routed()) add_routing(all, c, work.warp, seed);
    add_model(all, c, seed);
  }
  std::vector<Stage> out;
  std::set<std::string> seen;
  for (Stage& s : all)
    if (seen.insert(s.name).second) out.push_back(std::move(s));
  return out;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// Runs every stage, a line each; a CUDA error or fault ends the check (GpuReport::error).
GpuReport run_self_check(const GpuWork& work, const mhar::cuda::DeviceInfo& dev, bool quiet) {
  GpuReport r;
  r.device = dev;
  r.commit = build_commit();
  r.flags = build_flags();
  r.command = "the GPU self-check of mhar-toy train or bench step";
  r.date = utc_now();
  const auto t0 = std::chrono::steady_clock::now();
  // Every launch synchronised and checked (--cuda-sync), so that a kernel fault is reported
  // under the faulting kernel's name: a small price for a few hundred launches.
  const bool was_synced = mhar::cuda::sync_launches();
  mhar::cuda::set_sync_launches(true);
  for (const Stage& s : plan(work, 1)) {
    const auto ts = std::chrono::steady_clock::now();
    try {
      const std::vector<CheckRow> rows = s.run();
      const long failed = std::count_if(rows.begin(), rows.end(), [](auto& x) { return !x.pass; });
      r.rows.insert(r.rows.end(), rows.begin(), rows.end());
      if (!quiet)
        fmt::print(stderr, "GPU self-check: {:<66} {:>3} {} ({:.1f} s)\n", s.name, rows.size(),
                   failed ? fmt::format("compared, {} FAIL", failed) : std::string("pass"),
                   seconds_since(ts));
    } catch (const std::exception& e) {
      r.error = s.name + ": " + e.what();
      break;
    }
  }
  mhar::cuda::set_sync_launches(was_synced);
  r.seconds = seconds_since(t0);
  return r;
}

/// What failed, by how much: the first line of the failure message, naming the first
/// comparison that failed (first_failed: the most specific).
std::string failure_text(const GpuReport& r) {
  const std::string where = fmt::format("GPU self-check FAILED on {} (sm_{}{})", r.device.name,
                                        r.device.cc_major, r.device.cc_minor);
  if (!r.error.empty()) return where + ": a CUDA error while checking " + r.error;
  const auto first = first_failed(r.rows);
  if (first == r.rows.end()) return where + ": no comparison ran";
  const CheckRow& w = *first;
  const long failed = std::count_if(r.rows.begin(), r.rows.end(), [](auto& x) { return !x.pass; });
  return fmt::format(
      "{}: {} ({}, {}) disagrees with the CPU reference: relative error {:.2e}, tolerance "
      "{:.2e} ({:.3g}× over); {} of {} comparisons fail",
      where, w.op(), w.version, w.shape, w.worst_rel_err, w.tolerance, tolerance_ratio(w), failed,
      r.rows.size());
}

/// Writes the failure's report; returns where, or why it could not.
std::string write_failure_report(const GpuReport& r) {
  fs::path dir = gpu_cache_dir();
  if (dir.empty()) dir = fs::temp_directory_path();
  const fs::path file = dir / "gpu-check-report.md";
  try {
    std::error_code ec;
    fs::create_directories(dir, ec);
    io::write_text_file_atomic(file.string(), report_markdown(r));
    return "report: " + file.string() + " (please attach it to an issue)";
  } catch (const std::exception& e) {
    return std::string("no report written: ") + e.what();
  }
}

GpuKey key_of(const mhar::cuda::DeviceInfo& d) {
  return {d.name,           fmt::format("{}.{}", d.cc_major, d.cc_minor),
          d.driver_version, d.runtime_version,
          build_commit(),   build_flags()};
}

/// Keeps a pass in the cache; says where (or why not).
void remember(const GpuReport& r, const GpuKey& key, const fs::path& file, bool quiet) {
  const CheckRow& w = worst_row(r.rows);
  std::string kept = "not cached: no HOME or XDG_CACHE_HOME";
  if (!file.empty()) {
    try {
      remember_passed(file, {key, r.date, static_cast<int>(r.rows.size()), r.seconds});
      kept = "verdict cached in " + file.string() + " (--recheck-gpu runs it again)";
    } catch (const std::exception& e) {
      kept = std::string("not cached: ") + e.what();
    }
  }
  if (!quiet)
    fmt::print(stderr,
               "GPU self-check: {} comparisons pass in {:.1f} s (closest to its tolerance: {} at "
               "{:.2f} of it); {}\n",
               r.rows.size(), r.seconds, w.op(), tolerance_ratio(w), kept);
}

/// The self-check for a GPU that `pick_device` chose: "cuda" when it passes (or passed before).
std::string checked(const std::string& requested, const GpuWork& work, bool quiet) {
  const mhar::cuda::DeviceInfo dev = mhar::cuda::device_info(0);
  const GpuKey key = key_of(dev);
  const fs::path dir = gpu_cache_dir();
  const fs::path file = dir.empty() ? fs::path() : dir / "gpu-check.json";
  if (!g_flags.recheck && !file.empty()) {
    if (const auto v = find_passed(file, key)) {
      if (!quiet)
        fmt::print(stderr,
                   "GPU self-check: passed on {} for this GPU, driver and build ({} comparisons; "
                   "--recheck-gpu runs it again)\n",
                   v->checked, v->comparisons);
      return "cuda";
    }
  }
  if (!quiet)
    fmt::print(stderr,
               "GPU self-check on {} (sm_{}{}, driver CUDA {}, runtime CUDA {}, build {}): the "
               "kernels this run uses against the CPU reference, once per GPU, driver and build\n",
               dev.name, dev.cc_major, dev.cc_minor, cuda_version_text(dev.driver_version),
               cuda_version_text(dev.runtime_version), build_commit());
  const GpuReport r = run_self_check(work, dev, quiet);
  const bool pass = r.error.empty() && !r.rows.empty() &&
                    std::all_of(r.rows.begin(), r.rows.end(), [](auto& x) { return x.pass; });
  if (pass) {
    remember(r, key, file, quiet);
    return "cuda";
  }
  const std::string why = failure_text(r) + ".\n" + write_failure_report(r);
  if (requested == "cuda")
    throw GpuCheckFailed(why +
                         "\nNot using this GPU, as --device cuda asks for it: --device auto falls "
                         "back to the CPU; --skip-gpu-check uses the GPU unchecked.");
  fmt::print(stderr, "mhar-toy: {}\nContinuing on the CPU (--device auto).\n", why);
  return "cpu";
}

}  // namespace
#endif

std::string pick_checked_device(const std::string& requested, const GpuWork& work, bool quiet) {
  const std::string device = pick_device(requested);
  if (device != "cuda") return device;
#ifdef MHAR_WITH_CUDA
  if (g_flags.skip) {
    if (!quiet)
      fmt::print(stderr,
                 "GPU self-check skipped (--skip-gpu-check): the GPU is not compared "
                 "with the CPU reference\n");
    return device;
  }
  return checked(requested, work, quiet);
#else
  (void)work;
  (void)quiet;
  return device;
#endif
}

}  // namespace mhar::toy
