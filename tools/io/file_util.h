/**
 * @file file_util.h
 * @ingroup tools
 * @brief Files that are never half-written: the data goes to a temporary file in the same
 *        directory, which is renamed over the target only once it is complete and on disk.
 */
#pragma once

#include <span>
#include <string>
#include <string_view>

namespace mhar::io {

/// Writes the concatenation of `pieces` to `path` so that `path` is never half-written: the data
/// goes to "<path>.tmp-<pid>" in the same directory, every write is checked, the file is
/// fsync'ed and closed, then renamed over `path`. On failure the temporary file is removed,
/// `path` is left as it was, and std::system_error("<path>: <what failed>: <OS error>") is thrown.
void write_file_atomic(const std::string& path, std::span<const std::string_view> pieces);

/// write_file_atomic with one piece: text, or any bytes held in a string (a PNG, a PDF).
void write_text_file_atomic(const std::string& path, std::string_view content);

}  // namespace mhar::io
