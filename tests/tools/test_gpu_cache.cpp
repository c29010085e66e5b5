/**
 * @file test_gpu_cache.cpp
 * @brief The GPU self-check's bookkeeping, without a GPU: the cache of passed verdicts
 *        (tools/gpu_cache.h) and the Markdown report (tools/gpu_report.h).
 */
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "gpu_cache.h"
#include "gpu_report.h"

namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using mhar::toy::GpuKey;
using mhar::toy::GpuVerdict;

namespace {

fs::path fresh(const std::string& name) {
  const fs::path d =
      fs::temp_directory_path() / ("mhar-gpu-cache-" + std::to_string(getpid())) / name;
  fs::remove_all(d);
  return d;
}

GpuKey key(int driver) {
  return {"NVIDIA Test GPU", "8.9", driver, 13000, mhar::toy::build_commit(), "Release"};
}

}  // namespace

TEST_CASE("a passed verdict is found for its own key only", "[gpu-cache]") {
  const fs::path file = fresh("roundtrip") / "mhar" / "gpu-check.json";
  CHECK_FALSE(mhar::toy::find_passed(file, key(13000)));  // no file yet
  mhar::toy::remember_passed(file, {key(13000), "2026-12-03T15:40:12Z", 97, 2.5});
  const auto v = mhar::toy::find_passed(file, key(13000));
  REQUIRE(v);
  CHECK(v->comparisons == 97);
  CHECK(v->checked == "2026-12-03T15:40:12Z");
  CHECK_FALSE(mhar::toy::find_passed(file, key(13010)));  // a new driver
  GpuKey other_build = key(13000);
  other_build.commit += "-dirty-0123abcd";
  CHECK_FALSE(mhar::toy::find_passed(file, other_build));
}

TEST_CASE("a damaged cache file counts as empty and is replaced", "[gpu-cache]") {
  const fs::path file = fresh("damaged") / "gpu-check.json";
  fs::create_directories(file.parent_path());
  std::ofstream(file) << "{\"format\": 1, \"passed\": [{\"device\": 3";
  CHECK_FALSE(mhar::toy::find_passed(file, key(13000)));
  mhar::toy::remember_passed(file, {key(13000), "now", 1, 0.1});
  CHECK(mhar::toy::find_passed(file, key(13000)));
}

TEST_CASE("the cache keeps the newest verdicts, one per key", "[gpu-cache]") {
  const fs::path file = fresh("newest") / "gpu-check.json";
  for (int k = 0; k < mhar::toy::kKeptVerdicts + 3; ++k)
    mhar::toy::remember_passed(file, {key(13000 + k), "now", k, 0.1});
  mhar::toy::remember_passed(file, {key(13000 + 5), "later", 5, 0.1});  // replaces, moves last
  CHECK_FALSE(mhar::toy::find_passed(file, key(13000 + 2)));            // dropped
  CHECK(mhar::toy::find_passed(file, key(13000 + 3)));
  CHECK(mhar::toy::find_passed(file, key(13000 + 5))->checked == "later");
}

TEST_CASE("the cache folder is XDG_CACHE_HOME's when absolute, else HOME's", "[gpu-cache]") {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const std::string saved = xdg ? xdg : "";
  setenv("XDG_CACHE_HOME", "/somewhere/cache", 1);
  CHECK(mhar::toy::gpu_cache_dir() == fs::path("/somewhere/cache/mhar"));
  setenv("XDG_CACHE_HOME", "relative", 1);  // the XDG spec: ignored when relative
  CHECK(mhar::toy::gpu_cache_dir() == fs::path(std::getenv("HOME")) / ".cache" / "mhar");
  if (xdg)
    setenv("XDG_CACHE_HOME", saved.c_str(), 1);
  else
    unsetenv("XDG_CACHE_HOME");
}

TEST_CASE("the report names the card, the build and every row, failures first in the verdict",
          "[gpu-cache]") {
  mhar::toy::GpuReport r;
  r.device = {"NVIDIA Test GPU", 8, 9, 36, 13010, 13000};
  r.commit = "3be5b2057787";
  r.flags = "Release";
  r.command = "mhar-toy check --report x.md";
  r.date = "2026-12-03T15:40:12Z";
  r.seconds = 12.34;
  r.rows = {{"routing forward", "out", "fused", 1e-8, 1e-7, true, "N=3 P=5 d=8 H=2"},
            {"rmsnorm_forward", "y", "v1", 9.8e-4, 2.4e-7, false, "P=16 T=8 d=32"},
            {"step 1", "loss", "fused", 5e-8, 1e-7, true, "mhar"}};
  r.routing = {{"tiny shape: N=9 P=2048 d=128 H=4",
                {{"copy", "kernel", 0.5, 2e7, 40, 100}, {"forward", "fused", 0.6, 1.2e7, 20, 50}}}};
  r.steps = {{"tiny shape", {{"residual", "-", 2.0, 40.0}, {"mhar", "4", 2.2, 0}}}};
  r.notes = {"bench step, paper 100M shape: not measured: out of memory"};
  CHECK(mhar::toy::worst_row(r.rows).op() == "rmsnorm_forward y");
  const std::string md = mhar::toy::report_markdown(r);
  CHECK_THAT(md, Contains("### NVIDIA Test GPU, sm_89 — 2026-12-03T15:40:12Z"));
  CHECK_THAT(md, Contains("| compute capability | 8.9 |") &&
                     Contains("| driver | CUDA 13.1 (13010) |") &&
                     Contains("| runtime | CUDA 13.0 (13000) |") &&
                     Contains("| commit | 3be5b2057787 |") && Contains("| time taken | 12.3 s |"));
  CHECK_THAT(md, Contains("**check: 1 of 3 comparisons FAIL.** First: rmsnorm_forward y (v1, "
                          "P=16 T=8 d=32): relative error 9.80e-04, tolerance 2.40e-07. Worst: "
                          "rmsnorm_forward y"));
  CHECK_THAT(
      md, Contains("| rmsnorm_forward y | v1 | P=16 T=8 d=32 | 9.80e-04 | 2.40e-07 | **FAIL** |"));
  CHECK_THAT(md, Contains("| forward | fused | 0.6000 | 12.00 | 20.0 | 50.0 % |"));
  CHECK_THAT(md, Contains("| residual | - | 2.00 | 1.000× | 40.00 | 0.050× |") &&
                     Contains("| mhar | 4 | 2.20 | 1.100× | - | - |"));
  CHECK_THAT(md, Contains("- bench step, paper 100M shape: not measured: out of memory"));
}
