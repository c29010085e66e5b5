/**
 * @file file_util.cpp
 * @brief The atomic file write (see file_util.h). POSIX calls (open/write/fsync/rename) so that
 *        each failure has an errno to report.
 */
#include "file_util.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

namespace mhar::io {

namespace {

[[noreturn]] void os_error(const std::string& path, const std::string& what, int err) {
  throw std::system_error(err, std::generic_category(), path + ": " + what);
}

}  // namespace

void write_file_atomic(const std::string& path, std::span<const std::string_view> pieces) {
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) os_error(path, "cannot create the temporary file " + tmp, errno);
  // Any failure from here on removes the temporary file before throwing.
  auto fail = [&](const std::string& what, int err, bool close_fd) {
    if (close_fd) ::close(fd);
    ::unlink(tmp.c_str());
    os_error(path, what, err);
  };
  for (std::string_view piece : pieces) {
    while (!piece.empty()) {
      const ssize_t w = ::write(fd, piece.data(), piece.size());
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) fail("cannot write " + tmp, errno, true);
      piece.remove_prefix(static_cast<std::size_t>(w));
    }
  }
  if (::fsync(fd) != 0) fail("cannot fsync " + tmp, errno, true);
  if (::close(fd) != 0) fail("cannot close " + tmp, errno, false);
  if (::rename(tmp.c_str(), path.c_str()) != 0)
    fail("cannot rename " + tmp + " over it", errno, false);
  // Make the rename itself durable; best effort, the new file is complete either way.
  const std::size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "."
                          : slash == 0               ? "/"
                                                     : path.substr(0, slash);
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

void write_text_file_atomic(const std::string& path, std::string_view content) {
  const std::string_view pieces[] = {content};
  write_file_atomic(path, pieces);
}

}  // namespace mhar::io
