/**
 * @file test_cuda_verify.cpp
 * @brief Every version of the CUDA routing kernels through the verify protocol (docs/verify.md)
 *        on the quick cases, in F32 and BF16: each case a version can serve passes; each it cannot
 *        is reported declined (never passed); two runs give identical bits. On the emulator as
 *        `emu:verify-kernels: ...`, on a GPU as `cuda:verify-kernels: ...` (skipped without one).
 */
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <set>

#include "cases.h"
#include "cuda_test_util.h"
#include "verify.h"
#include "verify_adapter.h"

using namespace mhar::cuda;
namespace fs = std::filesystem;

TEST_CASE("every kernel version passes the quick cases it serves, the rest are declined",
          "[gpu][verify]") {
  if (!test::have_gpu()) return;
  const fs::path root =
      fs::temp_directory_path() / ("mhar_verify_kernels_" + std::to_string(::getpid()));
  fs::remove_all(root);
  const std::string cases = (root / "cases").string();
  mhar::verify::write_cases(cases, "quick", {mhar::verify::DType::F32, mhar::verify::DType::BF16},
                            0);
  for (RoutingVersion v : kRoutingVersions) {
    const std::string name = version_name(v);
    CAPTURE(name);
    const std::string res = (root / name).string(), res2 = (root / (name + "-again")).string();
    const test::AdapterRun run = test::run_kernel_candidate(cases, res, v);
    test::run_kernel_candidate(cases, res2, v);
    const mhar::verify::VerifyReport r = mhar::verify::verify_results({cases, res, res2, false});
    const std::string table = mhar::verify::format_report(r);
    std::printf("verify %s (%d cases served, %zu not):\n%s", name.c_str(), run.served,
                run.not_served.size(), table.c_str());
    for (const auto& [file, why] : run.not_served)
      std::printf("  not served: %s: %s\n", file.c_str(), why.c_str());
    INFO(table);
    CHECK(r.fail == 0);
    CHECK(run.served >= 12);
    // Exactly the cases it did not serve are declined, each as a whole case; none is missing.
    std::set<std::string> declined, refused;
    for (const auto& row : r.rows)
      if (row.verdict == mhar::verify::Verdict::Declined) {
        CHECK(row.tensor == "(case)");
        declined.insert(row.file);
      }
    for (const auto& [file, why] : run.not_served) refused.insert(file);
    CHECK(declined == refused);
    CHECK(r.missing == 0);
    CHECK(r.ok() == refused.empty());
    // Naive and Fused serve everything but the cases with another eps (eps and its H = 1 twin).
    if (v != RoutingVersion::Warp) {
      CHECK(refused.size() == 4);
      for (const auto& f : refused) CHECK(f.find("-eps") != std::string::npos);
    }
  }
  fs::remove_all(root);
}
