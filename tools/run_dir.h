/**
 * @file run_dir.h
 * @ingroup tools
 * @brief A run directory that a kill cannot break: one process at a time (a lock), the
 *        checkpoint and the optimizer state committed together, and the leftovers of a killed
 *        process cleared before anything else happens (docs/checkpoint-format.md, "A run
 *        directory after a kill").
 *
 * The commit of step s, in three renames, each atomic (write_file_atomic):
 *   1. optimizer.next.safetensors ← the moments of step s
 *   2. checkpoint.safetensors     ← the parameters of step s   (the commit point)
 *   3. optimizer.safetensors      ← optimizer.next.safetensors
 * A kill before 2 leaves the pair of step s' < s intact (and a next file that recover_state
 * discards); a kill between 2 and 3 leaves checkpoint s with optimizer.next of step s, which
 * recover_state renames into place. Every reader that takes the checkpoint alone (eval, sample,
 * sweep) sees a complete one at any moment.
 */
#pragma once

#include <filesystem>
#include <map>
#include <string>

#include "model.h"

namespace mhar::toy {

inline constexpr const char* kCheckpointFile = "checkpoint.safetensors";
inline constexpr const char* kOptimizerFile = "optimizer.safetensors";
inline constexpr const char* kOptimizerNextFile = "optimizer.next.safetensors";
inline constexpr const char* kLockFile = ".lock";

/// An exclusive lock on a directory (flock on DIR/.lock, which holds the holder's pid), released
/// when the object goes or the process dies, however it dies.
class DirLock {
 public:
  /// Locks `dir` (which must exist) for `what` ("train", "sweep"). Throws UsageError (exit 2)
  /// naming the holder's pid when another process holds it.
  DirLock(const std::filesystem::path& dir, const std::string& what);
  ~DirLock();
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;

 private:
  int fd_ = -1;
};

/// Removes the "<name>.tmp-<pid>" files a killed writer left in `dir` and below (call with the
/// lock held: no other writer can be at work there). Returns how many it removed.
int remove_stale_temporaries(const std::filesystem::path& dir);

/// Commits the checkpoint and the optimizer state of `step` together (the three renames above).
void commit_state(const std::filesystem::path& dir, const Config& cfg, const Params<float>& p,
                  const Params<float>& m, const Params<float>& v, long step,
                  const std::map<std::string, std::string>& extra);

/// Finishes or discards a commit that a kill interrupted (call with the lock held, before
/// loading): afterwards checkpoint.safetensors and optimizer.safetensors hold the same step, or
/// neither exists.
void recover_state(const std::filesystem::path& dir);

}  // namespace mhar::toy
