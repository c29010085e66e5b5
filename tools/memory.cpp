/**
 * @file memory.cpp
 * @brief The memory estimate of memory.h.
 */
#include "memory.h"

#include <fmt/format.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "errors.h"

namespace mhar::toy {

double param_count(const Config& c) {
  double n = 0;
  for_each_shape(c, [&](const std::string&, int rows, int cols, bool) {
    n += static_cast<double>(rows) * cols;
  });
  return n;
}

double memory_needed(const Config& c, int B, int scalar_bytes, Workload w) {
  const double P = static_cast<double>(B) * c.T, d = c.d, L = c.L, hd = c.head_dim();
  const double copies = w == Workload::Training ? 4 : w == Workload::Gradient ? 2 : 1;
  double per_position = (2 * L + 1) * d    // primitives E, out_0 … out_{2L−1}
                        + 2 * (2 * L) * d  // sub-layer inputs and their normed values
                        + L * (2 * c.n_head * hd + 2 * c.n_kv_head * hd)  // q, attn, k, v
                        + L * c.n_head * static_cast<double>(c.T)         // attention probs
                        + L * 3.0 * c.ffn                                 // MLP saved values
                        + 2 * static_cast<double>(c.vocab)                // logits, softmax
                        + 4 * d;                                          // final read
  if (c.routed()) {
    const double sources = c.mode == Mode::Block || c.mode == Mode::Delta ? c.n_blocks + 3 : 1;
    per_position += c.n_sites() * d * sources;  // routing outputs (block, delta: copied sources)
  }
  if (w != Workload::Forward) per_position += (2 * L + 3) * d + L * 3.0 * c.ffn;  // backward
  const double bytes = (copies * param_count(c) + P * per_position) * scalar_bytes;
  return 1.25 * bytes;
}

double memory_available() {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string key;
    double kib = 0;
    if (ls >> key >> kib && key == "MemAvailable:") return kib * 1024.0;
  }
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0.0;
}

void require_memory(const Config& c, int B, int scalar_bytes, Workload w, const std::string& what,
                    int models) {
  const double have = memory_available();
  if (have <= 0) return;
  // A closed-form floor first (the embedding and the MLPs alone): param_count walks every
  // tensor, L of each kind, which for L = 10⁷ would take seconds before refusing.
  const double floor_params =
      static_cast<double>(c.vocab) * c.d + 3.0 * c.L * static_cast<double>(c.d) * c.ffn;
  const bool over_floor = models * floor_params * scalar_bytes > have;
  const double need =
      models * (over_floor ? floor_params * scalar_bytes : memory_needed(c, B, scalar_bytes, w));
  if (need <= have) return;
  constexpr double GiB = 1024.0 * 1024.0 * 1024.0;
  throw UsageError(fmt::format(
      "{} needs about {:.3g} GiB for {}d = {}, L = {}, ffn = {}, T = {}, B = {} ({}{:.3g} "
      "parameters), this machine has {:.3g} GiB available; choose a smaller model or batch",
      what, need / GiB, models > 1 ? fmt::format("{} models at once of ", models) : "", c.d, c.L,
      c.ffn, c.T, B, over_floor ? "at least " : "", over_floor ? floor_params : param_count(c),
      have / GiB));
}

}  // namespace mhar::toy
