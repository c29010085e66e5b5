/**
 * @file device_select.h
 * @brief Where a command runs: the one place that reads `--device auto | cpu | cuda` and asks
 *        whether this build and machine have a GPU (train, bench, check).
 */
#pragma once

#include <string>
#include <vector>

namespace mhar::toy {

/// The values --device accepts, in the order --help lists them (one_of, cli_common.h).
inline const std::vector<std::string> kDeviceChoices = {"auto", "cpu", "cuda"};

/// Why this mhar-toy cannot use a GPU here ("no CUDA device (…)", or a build without CUDA), or
/// "" when it can.
std::string cuda_unavailable();

/// The device a command runs on, "cpu" or "cuda", for a --device value: `auto` takes the GPU
/// when there is one. Throws UnavailableError (exit 4) for `cuda` without a GPU, naming why, and
/// UsageError for a value that is not one of kDeviceChoices.
std::string pick_device(const std::string& requested);

}  // namespace mhar::toy
