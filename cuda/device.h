/**
 * @file device.h
 * @ingroup cuda
 * @brief The GPU as the rest of the project sees it: is there one, what is it called, and a
 *        float buffer in its memory that owns itself (RAII) and copies to and from the host.
 *
 * A plain C++ header: no CUDA types, no Eigen, so g++-compiled code (tests, mhar-toy) includes
 * it freely; the implementation is cuda/device.cu. Every CUDA call is checked: a failure throws
 * std::runtime_error carrying CUDA's own error string.
 *
 * Kernel launches are asynchronous. An error inside a kernel surfaces at the next synchronising
 * call: DeviceBuffer::download() or synchronize(), or at the next launch; sync_launches() (or
 * MHAR_CUDA_SYNC=1) makes it surface at the launch of the kernel that faulted.
 */
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace mhar::cuda {

/**
 * @brief Number of usable CUDA devices; 0 on any error (no driver, no device).
 *
 * Never throws. Where no GPU is present CUDA reports an error rather than a count of 0 (35,
 * "insufficient driver", on a machine without a driver; 100, "no device", with a driver but no
 * GPU); `why`, when given, receives that reason, or "" when a device was found.
 */
int device_count(std::string* why = nullptr);

/// "NVIDIA H100 80GB HBM3 (sm_90, 132 SMs)"; throws std::runtime_error if `device` is not valid.
std::string device_name(int device = 0);

/// Free and total bytes of the current device's memory (cudaMemGetInfo); throws
/// std::runtime_error when CUDA fails.
void memory_info(std::size_t* free_bytes, std::size_t* total_bytes);

/// Waits for every launched kernel; throws std::runtime_error if one of them failed.
void synchronize();

/**
 * @brief The debug switch that names a faulting kernel: while it is on, every kernel launch is
 *        followed by cudaDeviceSynchronize and a check, so that a fault inside a kernel is
 *        reported under that kernel's name (without it, the fault surfaces at a later call,
 *        under that call's name).
 *
 * On when the environment has MHAR_CUDA_SYNC=1 (read at the first launch), or after
 * set_sync_launches(true) (`mhar-toy train|check|bench --cuda-sync`). It serialises the host
 * and the GPU: for finding a fault, not for timing.
 */
void set_sync_launches(bool on);
/// Whether every launch is synchronised and checked (set_sync_launches, MHAR_CUDA_SYNC=1).
bool sync_launches();

/**
 * @brief `count` floats in device memory, freed when the buffer goes out of scope.
 *
 * Move-only. Allocation failures throw std::runtime_error naming the bytes requested. The
 * contents start undefined: upload() or fill_bytes() before reading.
 */
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  /// count floats, uninitialised.
  explicit DeviceBuffer(std::size_t count);
  /// A device copy of `host`.
  explicit DeviceBuffer(const std::vector<float>& host);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  float* data() { return ptr_; }
  const float* data() const { return ptr_; }
  std::size_t size() const { return count_; }

  /// Copies host → device; host.size() must equal size() (else std::invalid_argument).
  void upload(const std::vector<float>& host);
  /// Copies device → host (waits for the kernels that write this buffer).
  std::vector<float> download() const;
  /// Sets every byte to `byte`: 0xFF makes every float a NaN (poison before a kernel writes).
  void fill_bytes(unsigned char byte);

 private:
  float* ptr_ = nullptr;
  std::size_t count_ = 0;
};

/// Ints on the device: DeviceBuffer holds floats, an int is as wide as a float and cudaMemcpy
/// copies bytes, so a token list travels bit for bit. Pass device_ints(buffer) to the kernels.
DeviceBuffer upload_ints(const std::vector<int>& host);
/// Copies host ints into an existing buffer of host.size() elements (no allocation).
void upload_ints(DeviceBuffer& buffer, const std::vector<int>& host);
/// The device ints of a buffer filled by upload_ints.
const int* device_ints(const DeviceBuffer& buffer);

}  // namespace mhar::cuda
