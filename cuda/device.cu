/**
 * @file device.cu
 * @brief device.h: device queries and the RAII float buffer, every CUDA call checked.
 */
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <utility>

#include "cuda_check.cuh"
#include "device.h"
#include "device_info.h"

namespace mhar::cuda {

using detail::check;

int device_count(std::string* why) {
  // Where no GPU is present cudaGetDeviceCount returns an error and leaves `count` untouched.
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();  // clear the (non-sticky) error so later calls start clean
    if (why) *why = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(status);
    return 0;
  }
  if (why) *why = count > 0 ? "" : "cudaGetDeviceCount found 0 devices";
  return count > 0 ? count : 0;
}

std::string device_name(int device) {
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  return std::string(prop.name) + " (sm_" + std::to_string(prop.major) +
         std::to_string(prop.minor) + ", " + std::to_string(prop.multiProcessorCount) + " SMs)";
}

DeviceInfo device_info(int device) {
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  DeviceInfo info;
  info.name = prop.name;
  info.cc_major = prop.major;
  info.cc_minor = prop.minor;
  info.sms = prop.multiProcessorCount;
  check(cudaDriverGetVersion(&info.driver_version), "cudaDriverGetVersion");
  check(cudaRuntimeGetVersion(&info.runtime_version), "cudaRuntimeGetVersion");
  return info;
}

void memory_info(std::size_t* free_bytes, std::size_t* total_bytes) {
  std::size_t f = 0, t = 0;
  check(cudaMemGetInfo(&f, &t), "cudaMemGetInfo");
  if (free_bytes) *free_bytes = f;
  if (total_bytes) *total_bytes = t;
}

void synchronize() {
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

namespace {
/// -1 until the environment was read, then 0 or 1.
std::atomic<int> sync_state{-1};
}  // namespace

void set_sync_launches(bool on) {
  sync_state = on ? 1 : 0;
}

bool sync_launches() {
  int state = sync_state.load();
  if (state < 0) {
    const char* v = std::getenv("MHAR_CUDA_SYNC");
    const int from_env = v && std::strcmp(v, "1") == 0 ? 1 : 0;
    // A set_sync_launches that ran meanwhile wins over the environment.
    sync_state.compare_exchange_strong(state, from_env);
    state = sync_state.load();
  }
  return state == 1;
}

DeviceBuffer::DeviceBuffer(std::size_t count) : count_(count) {
  if (count == 0) return;
  const std::size_t bytes = count * sizeof(float);
  void* p = nullptr;
  const cudaError_t status = cudaMalloc(&p, bytes);
  if (status != cudaSuccess) {
    cudaGetLastError();
    count_ = 0;
    throw std::runtime_error("DeviceBuffer: cudaMalloc of " + std::to_string(bytes) +
                             " bytes failed: " + cudaGetErrorString(status));
  }
  ptr_ = static_cast<float*>(p);
}

DeviceBuffer::DeviceBuffer(const std::vector<float>& host) : DeviceBuffer(host.size()) {
  upload(host);
}

DeviceBuffer::~DeviceBuffer() {
  // A destructor must not throw; a failing cudaFree here means an earlier kernel failed, which
  // the caller's next checked call reports.
  if (ptr_) cudaFree(ptr_);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : ptr_(std::exchange(other.ptr_, nullptr)), count_(std::exchange(other.count_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (ptr_) cudaFree(ptr_);
    ptr_ = std::exchange(other.ptr_, nullptr);
    count_ = std::exchange(other.count_, 0);
  }
  return *this;
}

void DeviceBuffer::upload(const std::vector<float>& host) {
  if (host.size() != count_)
    throw std::invalid_argument("DeviceBuffer::upload: host has " + std::to_string(host.size()) +
                                " floats, buffer holds " + std::to_string(count_));
  if (count_ == 0) return;
  check(cudaMemcpy(ptr_, host.data(), count_ * sizeof(float), cudaMemcpyHostToDevice),
        "DeviceBuffer::upload (cudaMemcpy host to device)");
}

std::vector<float> DeviceBuffer::download() const {
  std::vector<float> host(count_);
  if (count_ == 0) return host;
  check(cudaMemcpy(host.data(), ptr_, count_ * sizeof(float), cudaMemcpyDeviceToHost),
        "DeviceBuffer::download (cudaMemcpy device to host)");
  return host;
}

void DeviceBuffer::fill_bytes(unsigned char byte) {
  if (count_ == 0) return;
  check(cudaMemset(ptr_, byte, count_ * sizeof(float)), "DeviceBuffer::fill_bytes (cudaMemset)");
}

namespace {
std::vector<float> int_bits(const std::vector<int>& host) {
  static_assert(sizeof(int) == sizeof(float), "tokens travel in a float buffer");
  std::vector<float> bits(host.size());
  if (!host.empty()) std::memcpy(bits.data(), host.data(), host.size() * sizeof(int));
  return bits;
}
}  // namespace

DeviceBuffer upload_ints(const std::vector<int>& host) {
  return DeviceBuffer(int_bits(host));
}

void upload_ints(DeviceBuffer& buffer, const std::vector<int>& host) {
  buffer.upload(int_bits(host));
}

const int* device_ints(const DeviceBuffer& buffer) {
  return reinterpret_cast<const int*>(buffer.data());
}

}  // namespace mhar::cuda
