/**
 * @file bench_routing_main.cpp
 * @brief bench_routing_main N P d H [repeats]: prints the device, then one table row per
 *        routing kernel version (bench_routing.h), for scripts/gpu-check.sh.
 */
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "bench_routing.h"
#include "device.h"

int main(int argc, char** argv) {
  if (argc < 5 || argc > 6) {
    std::fprintf(
        stderr,
        "usage: %s N P d H [repeats = 10]\n"
        "  times the copy kernel and each routing version (forward, backward) at one site\n",
        argv[0]);
    return 2;
  }
  try {
    const int N = std::stoi(argv[1]), P = std::stoi(argv[2]), d = std::stoi(argv[3]),
              H = std::stoi(argv[4]);
    const int repeats = argc == 6 ? std::stoi(argv[5]) : 10;
    std::string why;
    if (mhar::cuda::device_count(&why) == 0) {
      std::fprintf(stderr, "bench_routing_main: no CUDA device (%s)\n", why.c_str());
      return 1;
    }
    std::printf("# routing bench on %s: N=%d P=%d d=%d H=%d, mean of %d calls\n",
                mhar::cuda::device_name(0).c_str(), N, P, d, H, repeats);
    std::printf("| N | P | d | H | op | version | ms | MB | GB/s | %% copy |\n");
    std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
    for (const auto& r : mhar::cuda::bench_routing(N, P, d, H, repeats))
      std::printf("| %d | %d | %d | %d | %s | %s | %.4f | %.1f | %.1f | %.1f |\n", N, P, d, H,
                  r.op.c_str(), r.version.c_str(), r.ms, r.bytes / 1e6, r.gbps, r.pct_copy);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_routing_main: %s\n", e.what());
    return 1;
  }
  return 0;
}
