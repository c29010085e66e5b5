/**
 * @file gpu_cache.h
 * @ingroup tools
 * @brief Where the GPU self-check (gpu_selfcheck.h) keeps its verdicts: one JSON file in the
 *        user's cache folder, a passed self-check per GPU, driver, CUDA runtime and build.
 *
 * The file, $XDG_CACHE_HOME/mhar/gpu-check.json (or ~/.cache/mhar/gpu-check.json):
 *
 *     {"format": 1, "passed": [{"device": "NVIDIA GeForce RTX 4070 Laptop GPU",
 *       "compute_capability": "8.9", "driver": 13000, "runtime": 13000,
 *       "commit": "3be5b2057787", "flags": "Release GNU 12.2.0 -O3 …",
 *       "checked": "2026-12-03T15:40:12Z", "comparisons": 97, "seconds": 2.4}]}
 *
 * Only passes are kept: a GPU that failed is checked again at its next use (its driver may have
 * been fixed), and says so each time. A new build, driver or runtime finds no entry and runs the
 * check again. The file is a cache: one that cannot be read or parsed counts as empty and is
 * replaced; the newest kKeptVerdicts entries are kept. No CUDA here (plain C++, tested without a
 * GPU).
 */
#pragma once

#include <filesystem>
#include <optional>
#include <string>

namespace mhar::toy {

/// What a verdict holds for: the GPU, the CUDA it runs under, and this build of mhar-toy.
struct GpuKey {
  std::string device;              ///< cudaDeviceProp::name
  std::string compute_capability;  ///< "8.9"
  int driver = 0;                  ///< cudaDriverGetVersion (13000 = 13.0)
  int runtime = 0;                 ///< cudaRuntimeGetVersion
  std::string commit;              ///< the build's commit (cmake/build_info.cmake)
  std::string flags;               ///< the build's flags
  bool operator==(const GpuKey&) const = default;
};

/// A passed self-check, as the cache file keeps it.
struct GpuVerdict {
  GpuKey key;
  std::string checked;  ///< when, UTC, "2026-12-03T15:40:12Z"
  int comparisons = 0;
  double seconds = 0;
};

/// Entries the cache file keeps (the newest).
inline constexpr int kKeptVerdicts = 16;

/// The build's commit and flags, as compiled in (cmake/build_info.cmake).
std::string build_commit();
std::string build_flags();

/// "13.0" for a CUDA version number 13000 (major · 1000 + minor · 10).
std::string cuda_version_text(int version);

/// $XDG_CACHE_HOME/mhar when that is an absolute path, else $HOME/.cache/mhar; empty when
/// neither is set (then nothing is cached).
std::filesystem::path gpu_cache_dir();

/// The passed verdict for `key` in `file`, if there is one.
std::optional<GpuVerdict> find_passed(const std::filesystem::path& file, const GpuKey& key);

/// Adds `v` to `file` (replacing an entry with the same key), creating its folder. Throws
/// std::runtime_error naming the file when it cannot be written.
void remember_passed(const std::filesystem::path& file, const GpuVerdict& v);

/// Now, UTC, as "2026-12-03T15:40:12Z".
std::string utc_now();

}  // namespace mhar::toy
