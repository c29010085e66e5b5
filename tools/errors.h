/**
 * @file errors.h
 * @ingroup tools
 * @brief What mhar-toy's exit codes mean, and the exceptions that carry them.
 *
 *   0  success
 *   1  a runtime failure (a file could not be written, a device error, …)
 *   2  a usage error: a bad flag, a missing or unusable input file, a checkpoint that does not fit
 *   3  training diverged (a NaN or infinite loss); the last good checkpoint is kept
 *   4  unavailable here: the command needs a GPU (or a CUDA build, or a build with figures)
 *      that this machine lacks
 *   130 interrupted (Ctrl-C; train and sweep also on SIGTERM and SIGHUP); a checkpoint of the
 *       last finished step was written
 */
#pragma once

#include <fmt/format.h>

#include <cmath>
#include <stdexcept>
#include <string>

namespace mhar::toy {

enum ExitCode : int {
  kOk = 0,
  kFailure = 1,
  kUsage = 2,
  kDiverged = 3,
  kUnavailable = 4,
  kInterrupted = 130
};

/// The user asked for something that cannot be done as asked (exit 2).
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The loss became NaN or infinite (exit 3).
class DivergedError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The command needs a GPU (or a CUDA build, or figures) that is not here (exit 4).
class UnavailableError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A number as a message shows it: NaN as "NaN" whatever its sign bit (fmt writes the NaN that
/// 0 · inf gives as "-nan", which reads as a negative number), every other value as fmt does.
template <typename Real>
std::string shown(Real x) {
  return std::isnan(x) ? "NaN" : fmt::format("{}", x);
}

}  // namespace mhar::toy
