/**
 * @file data.cpp
 * @brief Byte corpus loading and batch sampling (see data.h).
 */
#include "data.h"

#include <fmt/format.h>

#include <filesystem>
#include <random>

#include "errors.h"
#include "file_util.h"
#include "memory.h"

namespace mhar::toy {

std::string resolve_data_path(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (path != kDefaultCorpus || fs::exists(path, ec)) return path;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return path;
  const fs::path name = fs::path(path).filename();
  for (const fs::path& dir : {exe.parent_path().parent_path().parent_path() / "data",
                              exe.parent_path().parent_path() / "share" / "mhar" / "data"}) {
    if (fs::is_regular_file(dir / name, ec)) return (dir / name).string();
  }
  return path;
}

std::vector<std::uint8_t> read_file_bytes(const std::string& given) {
  const std::string path = resolve_data_path(given);
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw UsageError("'" + path + "' is a directory, not a file (give a text file, e.g. --data " +
                     kDefaultCorpus + ")");
  try {
    // A regular file only (a FIFO would block, /dev/zero never ends), and one that fits.
    const io::InputFile in(path);
    if (static_cast<double>(in.size()) > memory_available())
      throw UsageError(
          fmt::format("'{}' is {} bytes, more than this machine has available", path, in.size()));
    std::vector<std::uint8_t> bytes(static_cast<std::size_t>(in.size()));
    in.read_at(0, bytes.size(), bytes.data());
    return bytes;
  } catch (const io::InputError& e) {
    throw UsageError(e.what());
  }
}

Corpus load_corpus(const std::string& path, double val_fraction, int T) {
  if (!(val_fraction > 0.0 && val_fraction < 1.0))
    throw UsageError("--val-fraction must be in (0, 1), got " + std::to_string(val_fraction));
  Corpus c;
  c.path = resolve_data_path(path);
  const auto bytes = read_file_bytes(path);
  const auto n_val = static_cast<std::size_t>(static_cast<double>(bytes.size()) * val_fraction);
  const std::size_t need = static_cast<std::size_t>(T) + 1;
  if (bytes.size() - n_val < need || n_val < need)
    throw UsageError("data file '" + path + "' has " + std::to_string(bytes.size()) +
                     " bytes: too short for sequences of T = " + std::to_string(T) +
                     " (each of the training and validation splits needs at least T + 1 = " +
                     std::to_string(need) + " bytes; use a longer file or a smaller --seq-len)");
  c.train.assign(bytes.begin(), bytes.end() - static_cast<std::ptrdiff_t>(n_val));
  c.val.assign(bytes.end() - static_cast<std::ptrdiff_t>(n_val), bytes.end());
  return c;
}

Batch random_batch(const std::vector<std::uint8_t>& data, int B, int T, std::uint64_t seed,
                   std::uint64_t step, std::uint64_t stream) {
  // One generator per (seed, step, stream): batches do not depend on what ran before.
  std::seed_seq seq{static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32),
                    static_cast<std::uint32_t>(step), static_cast<std::uint32_t>(step >> 32),
                    static_cast<std::uint32_t>(stream)};
  std::mt19937_64 gen(seq);
  std::uniform_int_distribution<std::size_t> start(0,
                                                   data.size() - static_cast<std::size_t>(T) - 1);
  Batch b;
  b.tokens.reserve(static_cast<std::size_t>(B) * T);
  b.targets.reserve(static_cast<std::size_t>(B) * T);
  for (int s = 0; s < B; ++s) {
    const std::size_t o = start(gen);
    for (int t = 0; t < T; ++t) {
      b.tokens.push_back(data[o + t]);
      b.targets.push_back(data[o + t + 1]);
    }
  }
  return b;
}

long window_count(const std::vector<std::uint8_t>& data, int T) {
  if (data.size() < static_cast<std::size_t>(T) + 1) return 0;
  return static_cast<long>((data.size() - 1) / static_cast<std::size_t>(T));
}

Batch sequential_batch(const std::vector<std::uint8_t>& data, long first_window, int B, int T) {
  Batch b;
  for (int s = 0; s < B; ++s) {
    const std::size_t o = static_cast<std::size_t>(first_window + s) * static_cast<std::size_t>(T);
    for (int t = 0; t < T; ++t) {
      b.tokens.push_back(data[o + t]);
      b.targets.push_back(data[o + t + 1]);
    }
  }
  return b;
}

}  // namespace mhar::toy
