/**
 * @file file_util.cpp
 * @brief The atomic file write (see file_util.h). POSIX calls (open/write/fsync/rename) so that
 *        each failure has an errno to report.
 */
#include "file_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <system_error>

namespace mhar::io {

namespace {

[[noreturn]] void os_error(const std::string& path, const std::string& what, int err) {
  throw std::system_error(err, std::generic_category(), path + ": " + what);
}

const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

[[noreturn]] void input_error(const std::string& path, const std::string& what) {
  throw InputError(path + ": " + what);
}

}  // namespace

InputFile::InputFile(const std::string& path) : path_(path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    input_error(path, std::string("cannot open: ") + std::strerror(errno));
  if (!S_ISREG(st.st_mode))
    input_error(path, std::string("is ") + file_kind(st.st_mode) + ", not a regular file");
  // O_NONBLOCK: should the path become a FIFO between stat and open, open does not wait.
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd_ < 0) input_error(path, std::string("cannot open: ") + std::strerror(errno));
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd_);
    input_error(path, "is not a regular file");
  }
  size_ = static_cast<std::uint64_t>(st.st_size);
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

void InputFile::read_at(std::uint64_t offset, std::size_t n, void* dst) const {
  auto* out = static_cast<unsigned char*>(dst);
  while (n > 0) {
    const ssize_t r = ::pread(fd_, out, n, static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) input_error(path_, std::string("cannot read: ") + std::strerror(errno));
    if (r == 0) input_error(path_, "ended early (was it truncated while being read?)");
    out += r, offset += static_cast<std::uint64_t>(r), n -= static_cast<std::size_t>(r);
  }
}

std::string read_regular_file(const std::string& path, std::uint64_t max_bytes, const char* what) {
  const InputFile f(path);
  if (f.size() > max_bytes)
    input_error(path, "is " + std::to_string(f.size()) + " bytes, more than a " + what +
                          " can be (" + std::to_string(max_bytes) + ")");
  std::string text(static_cast<std::size_t>(f.size()), '\0');
  f.read_at(0, text.size(), text.data());
  return text;
}

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
