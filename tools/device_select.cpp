/**
 * @file device_select.cpp
 * @brief device_select.h: --device, and whether there is a GPU.
 */
#include "device_select.h"

#include <algorithm>

#include "errors.h"

#ifdef MHAR_WITH_CUDA
#include "cuda/device.h"
#endif

namespace mhar::toy {

std::string cuda_unavailable() {
#ifdef MHAR_WITH_CUDA
  std::string why;
  if (mhar::cuda::device_count(&why) == 0) return "no CUDA device (" + why + ")";
  return "";
#else
  return "this mhar-toy was built without CUDA (no nvcc at configure time)";
#endif
}

std::string pick_device(const std::string& requested) {
  if (std::find(kDeviceChoices.begin(), kDeviceChoices.end(), requested) == kDeviceChoices.end())
    throw UsageError("--device must be auto, cpu or cuda, got '" + requested + "'");
  if (requested == "cpu") return "cpu";
  const std::string why = cuda_unavailable();
  if (why.empty()) return "cuda";
  if (requested == "cuda")
    throw UnavailableError("--device cuda: " + why + ". Use --device cpu (or auto).");
  return "cpu";
}

}  // namespace mhar::toy
