/**
 * @file safetensors.cpp
 * @brief The safetensors reader and writer (layout in safetensors.h).
 *
 * The reader opens only a regular file (InputFile, file_util.h), checks the 8-byte length field
 * and the header's size against the file, hands the header to parse_safetensors_header
 * (safetensors_header.cpp: every rule of docs/checkpoint-format.md), then to the caller's check,
 * and only then reads each tensor's bytes. Files are written through write_file_atomic.
 */
#include "safetensors.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string_view>

#include "file_util.h"
#include "half.h"

namespace mhar::io {

// Tensor bytes are copied to and from memory as they are: the format is little-endian.
static_assert(std::endian::native == std::endian::little,
              "mhar::io writes tensor bytes as they are in memory; safetensors is little-endian");

namespace {

using Json = nlohmann::ordered_json;

template <typename... Parts>
[[noreturn]] void format_error(const std::string& path, const Parts&... parts) {
  std::ostringstream os;
  os << path << ": ";
  (os << ... << parts);
  throw FormatError(os.str());
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

/// Product of the dims; −1 when one is negative or the product overflows int64.
int64_t checked_numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return -1;
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / d) return -1;
    n *= d;
  }
  return n;
}

template <typename T>
Tensor make_tensor(const char* dtype, std::vector<int64_t> shape, const T* data) {
  const int64_t n = checked_numel(shape);
  if (n < 0)
    throw std::invalid_argument("Tensor::from_*: shape " + shape_string(shape) +
                                " has a negative dimension or too many elements");
  Tensor t{dtype, std::move(shape),
           std::vector<unsigned char>(static_cast<std::size_t>(n) * sizeof(T))};
  if (n > 0) std::memcpy(t.bytes.data(), data, t.bytes.size());
  return t;
}

/// Reinterprets the bytes of `t` as `n` values of type T (after checking the byte count).
template <typename T>
std::vector<T> values_as(const Tensor& t) {
  const int64_t n = checked_numel(t.shape);
  if (n < 0 || t.bytes.size() != static_cast<std::size_t>(n) * sizeof(T))
    throw FormatError("tensor of shape " + shape_string(t.shape) + " and dtype " + t.dtype +
                      " has " + std::to_string(t.bytes.size()) + " bytes, expected numel × " +
                      std::to_string(sizeof(T)));
  std::vector<T> v(static_cast<std::size_t>(n));
  if (n > 0) std::memcpy(v.data(), t.bytes.data(), t.bytes.size());
  return v;
}

/// numel(shape) floats, each rounded to a 16-bit format by `to_bits` (half.h).
Tensor make_half(const char* dtype, std::vector<int64_t> shape, const float* data,
                 uint16_t (*to_bits)(float)) {
  const int64_t n = checked_numel(shape);
  if (n < 0)
    throw std::invalid_argument("Tensor::from_*: shape " + shape_string(shape) +
                                " has a negative dimension or too many elements");
  std::vector<uint16_t> bits(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < bits.size(); ++i) bits[i] = to_bits(data[i]);
  Tensor t{dtype, std::move(shape), std::vector<unsigned char>(bits.size() * 2)};
  if (n > 0) std::memcpy(t.bytes.data(), bits.data(), t.bytes.size());
  return t;
}

/// A BF16 or F16 tensor widened to float (exact).
std::vector<float> widen_half(const Tensor& t) {
  const std::vector<uint16_t> bits = values_as<uint16_t>(t);
  std::vector<float> v(bits.size());
  const bool bf16 = t.dtype == "BF16";
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = bf16 ? bf16_bits_to_float(bits[i]) : f16_bits_to_float(bits[i]);
  return v;
}

template <typename To, typename From>
std::vector<To> convert(const std::vector<From>& from) {
  return std::vector<To>(from.begin(), from.end());
}

}  // namespace

std::size_t dtype_size(const std::string& dtype) {
  if (dtype == "F32") return 4;
  if (dtype == "F64" || dtype == "I64") return 8;
  if (dtype == "BF16" || dtype == "F16") return 2;
  throw FormatError("unknown dtype '" + dtype + "' (supported: F32, F64, I64, BF16, F16)");
}

Tensor Tensor::from_f32(std::vector<int64_t> shape, const float* data) {
  return make_tensor("F32", std::move(shape), data);
}
Tensor Tensor::from_f64(std::vector<int64_t> shape, const double* data) {
  return make_tensor("F64", std::move(shape), data);
}
Tensor Tensor::from_bf16(std::vector<int64_t> shape, const float* data) {
  return make_half("BF16", std::move(shape), data, float_to_bf16_bits);
}
Tensor Tensor::from_f16(std::vector<int64_t> shape, const float* data) {
  return make_half("F16", std::move(shape), data, float_to_f16_bits);
}
Tensor Tensor::from_i64(std::vector<int64_t> shape, const int64_t* data) {
  return make_tensor("I64", std::move(shape), data);
}

std::vector<float> Tensor::to_f32() const {
  if (dtype == "F32") return values_as<float>(*this);
  if (dtype == "F64") return convert<float>(values_as<double>(*this));
  if (dtype == "BF16" || dtype == "F16") return widen_half(*this);
  throw FormatError("to_f32: tensor has dtype " + dtype +
                    "; only F32, F64, BF16 and F16 convert to float");
}

std::vector<double> Tensor::to_f64() const {
  if (dtype == "F64") return values_as<double>(*this);
  if (dtype == "F32") return convert<double>(values_as<float>(*this));
  if (dtype == "BF16" || dtype == "F16") return convert<double>(widen_half(*this));
  throw FormatError("to_f64: tensor has dtype " + dtype +
                    "; only F32, F64, BF16 and F16 convert to double");
}

std::vector<int64_t> Tensor::to_i64() const {
  if (dtype == "I64") return values_as<int64_t>(*this);
  throw FormatError("to_i64: tensor has dtype " + dtype + ", not I64");
}

int64_t Tensor::numel() const {
  return checked_numel(shape);
}

const Tensor* SafeTensors::find(const std::string& name) const {
  for (const auto& [n, t] : tensors)
    if (n == name) return &t;
  return nullptr;
}

void save_safetensors(const std::string& path, const SafeTensors& st) {
  // 1. The header: metadata first, then each tensor at the next offset of the data area.
  Json header = Json::object();
  if (!st.metadata.empty()) {
    Json meta = Json::object();
    for (const auto& [k, v] : st.metadata) meta[k] = v;
    header["__metadata__"] = std::move(meta);
  }
  std::set<std::string> seen;
  uint64_t offset = 0;
  for (const auto& [name, t] : st.tensors) {
    if (name.empty() || name == "__metadata__")
      format_error(path, "cannot save a tensor named '", name, "' (empty or reserved)");
    if (!seen.insert(name).second) format_error(path, "cannot save two tensors named '", name, "'");
    const int64_t numel = checked_numel(t.shape);
    if (numel < 0) format_error(path, "tensor '", name, "': invalid shape ", shape_string(t.shape));
    std::size_t itemsize = 0;
    try {
      itemsize = dtype_size(t.dtype);
    } catch (const FormatError& e) {
      format_error(path, "tensor '", name, "': ", e.what());
    }
    if (t.bytes.size() != static_cast<uint64_t>(numel) * itemsize)
      format_error(path, "tensor '", name, "': shape ", shape_string(t.shape), " of ", t.dtype,
                   " needs ", static_cast<uint64_t>(numel) * itemsize, " bytes, has ",
                   t.bytes.size());
    header[name] = {{"dtype", t.dtype},
                    {"shape", t.shape},
                    {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const Json::exception& e) {
    format_error(path, "cannot encode the header (names and metadata must be UTF-8): ", e.what());
  }
  // 2. Pad with spaces so that the data area starts at a multiple of 8.
  text.append((8 - text.size() % 8) % 8, ' ');

  // 3. Length field (u64 little-endian), header, data.
  char length[8];
  for (int i = 0; i < 8; ++i)
    length[i] = static_cast<char>((static_cast<uint64_t>(text.size()) >> (8 * i)) & 0xff);
  std::vector<std::string_view> pieces{std::string_view(length, 8), text};
  for (const auto& [name, t] : st.tensors)
    pieces.emplace_back(reinterpret_cast<const char*>(t.bytes.data()), t.bytes.size());
  write_file_atomic(path, pieces);
}

namespace {

/// The header of an open file (steps 1 and 2 of load_safetensors); `n` = its length.
SafeTensorsHeader read_header(const InputFile& file, uint64_t& n) {
  const std::string& path = file.path();
  const uint64_t size = file.size();
  // 1. The 8-byte little-endian header length N.
  if (size < 8)
    format_error(path, "file is ", size, " bytes, too short for the 8-byte header length");
  unsigned char length[8];
  file.read_at(0, 8, length);
  n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(length[i]) << (8 * i);
  if (n > kMaxHeaderBytes)
    format_error(path, "header length ", n, " is absurd (limit ", kMaxHeaderBytes,
                 "); not a safetensors file?");
  if (n > size - 8)
    format_error(path, "header length ", n, " runs past the end of the file (", size, " bytes)");
  // 2. The header: every rule checked before a tensor is read.
  std::string text(static_cast<std::size_t>(n), '\0');
  file.read_at(8, text.size(), text.data());
  return parse_safetensors_header(text, size - 8 - n, path);
}

}  // namespace

SafeTensorsHeader read_safetensors_header(const std::string& path) {
  try {
    const InputFile file(path);
    uint64_t n = 0;
    return read_header(file, n);
  } catch (const FormatError&) {
    throw;
  } catch (const InputError& e) {
    throw FormatError(e.what());
  }
}

SafeTensors load_safetensors(const std::string& path, const HeaderCheck& check) {
  try {
    const InputFile file(path);
    uint64_t n = 0;
    SafeTensorsHeader header = read_header(file, n);
    if (check) check(header);  // the caller's own rules, before anything is allocated

    // 3. Each tensor's bytes, straight from the file.
    SafeTensors st;
    st.metadata = std::move(header.metadata);
    st.tensors.reserve(header.entries.size());
    for (HeaderEntry& e : header.entries) {
      Tensor t{kDtypeNames[e.dtype], header.shape(e),
               std::vector<unsigned char>(static_cast<std::size_t>(e.end - e.begin))};
      file.read_at(8 + n + e.begin, t.bytes.size(), t.bytes.data());
      st.tensors.emplace_back(std::move(e.name), std::move(t));
    }
    return st;
  } catch (const FormatError&) {
    throw;
  } catch (const InputError& e) {
    throw FormatError(e.what());
  }
}

}  // namespace mhar::io
