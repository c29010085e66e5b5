/**
 * @file device_info.h
 * @ingroup cuda
 * @brief What identifies a GPU and the CUDA it runs under: the GPU self-check's cache key
 *        (tools/gpu_selfcheck.h) and the header of `mhar-toy check --report`.
 *
 * A plain C++ header, like device.h; implemented in cuda/device.cu.
 */
#pragma once

#include <string>

namespace mhar::cuda {

struct DeviceInfo {
  std::string name;         ///< "NVIDIA H100 80GB HBM3" (cudaDeviceProp::name)
  int cc_major = 0;         ///< compute capability 9.0: 9 …
  int cc_minor = 0;         ///< … and 0
  int sms = 0;              ///< streaming multiprocessors
  int driver_version = 0;   ///< cudaDriverGetVersion: 13000 = 13.0 (the newest CUDA it supports)
  int runtime_version = 0;  ///< cudaRuntimeGetVersion: the CUDA runtime linked in
};

/// The device's DeviceInfo; throws std::runtime_error if `device` is not valid.
DeviceInfo device_info(int device = 0);

}  // namespace mhar::cuda
