/**
 * @file gpu_cache.cpp
 * @brief gpu_cache.h: the self-check's verdicts in one JSON file.
 */
#include "gpu_cache.h"

#include <fmt/format.h>

#include <chrono>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <vector>

#include "io/file_util.h"
#include "mhar_build_info.h"

namespace mhar::toy {

namespace fs = std::filesystem;

namespace {

nlohmann::json to_json(const GpuVerdict& v) {
  return {{"device", v.key.device}, {"compute_capability", v.key.compute_capability},
          {"driver", v.key.driver}, {"runtime", v.key.runtime},
          {"commit", v.key.commit}, {"flags", v.key.flags},
          {"checked", v.checked},   {"comparisons", v.comparisons},
          {"seconds", v.seconds}};
}

GpuVerdict from_json(const nlohmann::json& j) {
  GpuVerdict v;
  v.key = {j.at("device").get<std::string>(), j.at("compute_capability").get<std::string>(),
           j.at("driver").get<int>(),         j.at("runtime").get<int>(),
           j.at("commit").get<std::string>(), j.at("flags").get<std::string>()};
  v.checked = j.at("checked").get<std::string>();
  v.comparisons = j.at("comparisons").get<int>();
  v.seconds = j.at("seconds").get<double>();
  return v;
}

/// Every entry of the file; none when it is missing, unreadable or not what this code writes.
std::vector<GpuVerdict> read_entries(const fs::path& file) {
  std::ifstream in(file);
  if (!in) return {};
  try {
    const nlohmann::json j = nlohmann::json::parse(in);
    if (j.at("format").get<int>() != 1) return {};
    std::vector<GpuVerdict> out;
    for (const auto& e : j.at("passed")) out.push_back(from_json(e));
    return out;
  } catch (const std::exception&) {
    return {};  // a cache: a damaged file is replaced, never an error
  }
}

}  // namespace

std::string build_commit() {
  return MHAR_BUILD_COMMIT;
}

std::string build_flags() {
#ifdef MHAR_CUDA_EMULATOR
  return std::string(MHAR_BUILD_FLAGS) + ", CUDA emulator (tests/emu)";
#else
  return MHAR_BUILD_FLAGS;
#endif
}

std::string cuda_version_text(int version) {
  return fmt::format("{}.{}", version / 1000, (version % 1000) / 10);
}

fs::path gpu_cache_dir() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg && fs::path(xdg).is_absolute()) return fs::path(xdg) / "mhar";
  const char* home = std::getenv("HOME");
  if (home && *home) return fs::path(home) / ".cache" / "mhar";
  return {};
}

std::optional<GpuVerdict> find_passed(const fs::path& file, const GpuKey& key) {
  for (const GpuVerdict& v : read_entries(file))
    if (v.key == key) return v;
  return std::nullopt;
}

void remember_passed(const fs::path& file, const GpuVerdict& v) {
  std::vector<GpuVerdict> entries = read_entries(file);
  std::erase_if(entries, [&](const GpuVerdict& e) { return e.key == v.key; });
  entries.push_back(v);
  if (entries.size() > static_cast<std::size_t>(kKeptVerdicts))
    entries.erase(entries.begin(), entries.end() - kKeptVerdicts);
  nlohmann::json j = {{"format", 1}, {"passed", nlohmann::json::array()}};
  for (const GpuVerdict& e : entries) j["passed"].push_back(to_json(e));
  std::error_code ec;
  fs::create_directories(file.parent_path(), ec);
  if (ec)
    throw std::runtime_error(file.parent_path().string() + ": cannot create: " + ec.message());
  io::write_text_file_atomic(file.string(), j.dump(2) + "\n");
}

std::string utc_now() {
  const std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace mhar::toy
