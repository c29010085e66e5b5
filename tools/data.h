/**
 * @file data.h
 * @ingroup tools
 * @brief The byte-level corpus: any file is a sequence of bytes 0…255. A contiguous tail is held
 *        out for validation; training batches are random windows drawn from a generator seeded
 *        by (seed, step), so a resumed run sees exactly the batches of an uninterrupted one.
 */
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mhar::toy {

struct Corpus {
  std::string path;
  std::vector<std::uint8_t> train;  ///< the first (1 − val_fraction) of the bytes
  std::vector<std::uint8_t> val;    ///< the held-out tail
};

/**
 * Reads `path` and splits it. Throws UsageError (naming the file) when it is missing, unreadable,
 * or shorter than one training sequence (T + 1 bytes) in either split.
 */
Corpus load_corpus(const std::string& path, double val_fraction, int T);

/// B windows of T + 1 bytes: tokens = bytes [0, T), targets = bytes [1, T + 1). Sequence-major.
struct Batch {
  std::vector<int> tokens, targets;
};

/// B random windows from `data`, from a generator seeded by (seed, step, stream).
Batch random_batch(const std::vector<std::uint8_t>& data, int B, int T, std::uint64_t seed,
                   std::uint64_t step, std::uint64_t stream = 0);

/// Window k of the non-overlapping windows of T + 1 bytes (stride T) that tile `data`.
Batch sequential_batch(const std::vector<std::uint8_t>& data, long first_window, int B, int T);

/// How many non-overlapping windows of stride T fit in `data`.
long window_count(const std::vector<std::uint8_t>& data, int T);

/// The default --data: tiny-Shakespeare, as a path relative to the repository (or install) root.
inline constexpr const char* kDefaultCorpus = "data/tinyshakespeare.txt";

/**
 * @brief Where to read `path` from. Any path but kDefaultCorpus is returned unchanged. The
 * default corpus is looked up in the current folder first, then beside the executable: in the
 * build tree (`<exe>/../../data/`, for build/tools/mhar-toy) and installed
 * (`<exe>/../share/mhar/data/`, see `cmake --install`). If none exists the path is returned
 * unchanged and reading it gives the usual "cannot open" error.
 */
std::string resolve_data_path(const std::string& path);

/// Reads a whole file into memory; throws UsageError naming the file and the OS error, or
/// saying that it is a directory. Applies resolve_data_path first.
std::vector<std::uint8_t> read_file_bytes(const std::string& path);

}  // namespace mhar::toy
