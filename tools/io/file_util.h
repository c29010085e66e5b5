/**
 * @file file_util.h
 * @ingroup tools
 * @brief Files that are never half-written: the data goes to a temporary file in the same
 *        directory, which is renamed over the target only once it is complete and on disk.
 */
#pragma once

#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>

namespace mhar::io {

/// An input file that cannot be used as it is: missing, unreadable, not a regular file, too
/// large, or not in its format. The message starts with the path. mhar-toy exits 2 on it.
class InputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A regular file opened for reading. The path is checked with stat() before it is opened, so a
/// FIFO (which would block) or a device such as /dev/zero (which never ends) is refused without
/// reading a byte; the size is the one fstat() reports once it is open.
class InputFile {
 public:
  /// Throws InputError("<path>: …") when the file is missing, not a regular file, or unreadable.
  explicit InputFile(const std::string& path);
  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;
  std::uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  /// Reads exactly `n` bytes at `offset` into `dst`; InputError when the file ends first.
  void read_at(std::uint64_t offset, std::size_t n, void* dst) const;

 private:
  std::string path_;
  int fd_ = -1;
  std::uint64_t size_ = 0;
};

/// The whole content of a regular file (InputFile's checks), refused with InputError when it is
/// larger than `max_bytes` (`what` says what the file is, for the message).
std::string read_regular_file(const std::string& path, std::uint64_t max_bytes, const char* what);

/// Writes the concatenation of `pieces` to `path` so that `path` is never half-written: the data
/// goes to "<path>.tmp-<pid>" in the same directory, every write is checked, the file is
/// fsync'ed and closed, then renamed over `path`. On failure the temporary file is removed,
/// `path` is left as it was, and std::system_error("<path>: <what failed>: <OS error>") is thrown.
void write_file_atomic(const std::string& path, std::span<const std::string_view> pieces);

/// write_file_atomic with one piece: text, or any bytes held in a string (a PNG, a PDF).
void write_text_file_atomic(const std::string& path, std::string_view content);

}  // namespace mhar::io
