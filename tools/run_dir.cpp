/**
 * @file run_dir.cpp
 * @brief The lock, the cleanup and the paired commit of a run directory (see run_dir.h).
 */
#include "run_dir.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "checkpoint.h"
#include "errors.h"
#include "safetensors.h"

namespace mhar::toy {

namespace fs = std::filesystem;

namespace {

/// The pid written in a lock file, "" while its holder has not written it yet.
std::string holder_of(int fd) {
  for (int attempt = 0; attempt < 50; ++attempt) {
    char buf[64] = {};
    const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
    if (n > 0) return std::string(buf, static_cast<std::size_t>(n));
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return "";
}

/// The step in a file's metadata, or −1 when the file is unreadable (a kill cannot make one, but
/// a hand can).
long step_of(const fs::path& file) {
  try {
    const io::SafeTensorsHeader h = io::read_safetensors_header(file.string());
    const auto it = h.metadata.find("step");
    return it == h.metadata.end() ? -1 : parse_step(it->second, file.string());
  } catch (const std::exception&) {
    return -1;
  }
}

void fsync_dir(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

DirLock::DirLock(const fs::path& dir, const std::string& what) {
  const fs::path path = dir / kLockFile;
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0)
    throw UsageError(fmt::format("cannot lock '{}': cannot open {}: {}", dir.string(),
                                 path.string(), std::strerror(errno)));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    std::string holder = err == EWOULDBLOCK ? holder_of(fd_) : std::string();
    ::close(fd_);
    fd_ = -1;
    if (err != EWOULDBLOCK)
      throw UsageError(fmt::format("cannot lock '{}': {}", dir.string(), std::strerror(err)));
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
    throw UsageError(fmt::format(
        "'{}' is in use by another process ({}); one process at a time may write a run "
        "directory: wait for it to finish or stop it (nothing was changed here)",
        dir.string(), holder.empty() ? std::string("pid unknown") : holder));
  }
  const std::string me = fmt::format("pid {}, {}\n", ::getpid(), what);
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, me.data(), me.size(), 0) < 0) {
    // The lock holds without the note; only the message of a second process is poorer.
  }
}

DirLock::~DirLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the last descriptor releases the flock
}

int remove_stale_temporaries(const fs::path& dir) {
  // write_file_atomic's temporaries: "<name>.tmp-<pid>".
  const auto stale = [](const std::string& name) {
    const std::size_t at = name.rfind(".tmp-");
    return at != std::string::npos && at + 5 < name.size() &&
           name.find_first_not_of("0123456789", at + 5) == std::string::npos;
  };
  int removed = 0;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (!it->is_regular_file(ec)) continue;
    if (stale(it->path().filename().string()) && fs::remove(it->path(), ec)) ++removed;
  }
  return removed;
}

void commit_state(const fs::path& dir, const Config& cfg, const Params<float>& p,
                  const Params<float>& m, const Params<float>& v, long step,
                  const std::map<std::string, std::string>& extra) {
  save_optimizer((dir / kOptimizerNextFile).string(), m, v, step);         // 1
  save_checkpoint((dir / kCheckpointFile).string(), cfg, p, step, extra);  // 2: the commit
  std::error_code ec;
  fs::rename(dir / kOptimizerNextFile, dir / kOptimizerFile, ec);  // 3
  if (ec)
    throw std::runtime_error(fmt::format("{}: cannot rename {} over {}: {}", dir.string(),
                                         kOptimizerNextFile, kOptimizerFile, ec.message()));
  fsync_dir(dir);
}

void recover_state(const fs::path& dir) {
  const fs::path next = dir / kOptimizerNextFile;
  std::error_code ec;
  if (!fs::exists(next, ec)) return;
  const fs::path ckpt = dir / kCheckpointFile;
  const long ck_step = fs::exists(ckpt, ec) ? step_of(ckpt) : -1;
  if (ck_step >= 0 && step_of(next) == ck_step) {
    fs::rename(next, dir / kOptimizerFile, ec);  // a kill came between renames 2 and 3
    if (ec)
      throw std::runtime_error(
          fmt::format("{}: cannot finish the interrupted commit: {}", dir.string(), ec.message()));
  } else {
    fs::remove(next, ec);  // a kill came before rename 2: the older pair stands
  }
  fsync_dir(dir);
}

}  // namespace mhar::toy
