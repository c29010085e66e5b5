/**
 * @file kernel_candidate_main.cpp
 * @brief mhar-kernel-candidate: runs one version of the CUDA routing kernels on a verify cases
 *        directory and writes its results, for `mhar-toy verify` (docs/verify.md). Built for the
 *        GPU (tests/cuda) and the emulator (tests/emu, `mhar-kernel-candidate-emu`).
 *
 *   mhar-kernel-candidate CASES RESULTS [naive|fused|warp]
 */
#include <cstdio>
#include <exception>
#include <string>

#include "verify_adapter.h"

int main(int argc, char** argv) {
  using namespace mhar::cuda;
  if (argc < 3 || argc > 4) {
    std::fprintf(stderr, "usage: %s CASES RESULTS [naive|fused|warp]\n", argv[0]);
    return 2;
  }
  const std::string want = argc == 4 ? argv[3] : "fused";
  for (RoutingVersion v : kRoutingVersions) {
    if (version_name(v) != want) continue;
    try {
      const test::AdapterRun run = test::run_kernel_candidate(argv[1], argv[2], v);
      std::printf("%s: wrote results for %d cases to %s\n", want.c_str(), run.served, argv[2]);
      for (const auto& [file, why] : run.not_served)
        std::printf("  not served (verify reports it declined): %s: %s\n", file.c_str(),
                    why.c_str());
      return 0;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s: error: %s\n", argv[0], e.what());
      return 1;
    }
  }
  std::fprintf(stderr, "%s: unknown version '%s' (allowed: naive, fused, warp)\n", argv[0],
               want.c_str());
  return 2;
}
