/**
 * @file safetensors.cpp
 * @brief The safetensors reader and writer (layout in safetensors.h).
 *
 * The reader loads the whole file into memory (checkpoints of the toy model are small), then
 * checks, in order: the 8-byte length field, the header's size against the file, the JSON, every
 * entry (dtype, shape, offsets, shape × itemsize = offsets span), and last that every tensor lies
 * inside the data area. POSIX calls (open/read) so that each failure has an errno; files are
 * written through write_file_atomic (file_util.h).
 */
#include "safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
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

/// The largest header accepted; the same bound as the reference implementation (100 MB).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

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

/// Reads the whole file; FormatError naming the path and the OS error on failure.
std::vector<unsigned char> read_all(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) format_error(path, "cannot open: ", std::strerror(errno));
  std::vector<unsigned char> data;
  unsigned char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      format_error(path, "cannot read: ", std::strerror(err));
    }
    if (n == 0) break;
    data.insert(data.end(), buf, buf + n);
  }
  ::close(fd);
  return data;
}

/// A non-negative JSON integer, or a FormatError naming the tensor and field.
uint64_t json_unsigned(const std::string& path, const std::string& name, const char* field,
                       const Json& j) {
  if (!j.is_number_unsigned())
    format_error(path, "tensor '", name, "': ", field, " must hold non-negative integers, got ",
                 j.dump());
  return j.get<uint64_t>();
}

struct Entry {
  std::string name;
  Tensor tensor;
  uint64_t begin = 0, end = 0;
};

/// One header entry → dtype, shape and offsets, checked against each other.
Entry parse_entry(const std::string& path, const std::string& name, const Json& j) {
  if (!j.is_object())
    format_error(path, "tensor '", name, "': entry must be a JSON object, got ", j.dump());
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!j.contains(key)) format_error(path, "tensor '", name, "': missing \"", key, "\"");
  Entry e;
  e.name = name;
  const Json& dtype = j["dtype"];
  if (!dtype.is_string())
    format_error(path, "tensor '", name, "': dtype must be a string, got ", dtype.dump());
  e.tensor.dtype = dtype.get<std::string>();
  if (e.tensor.dtype != "F32" && e.tensor.dtype != "F64" && e.tensor.dtype != "I64" &&
      e.tensor.dtype != "BF16" && e.tensor.dtype != "F16")
    format_error(path, "tensor '", name, "': unknown dtype '", e.tensor.dtype,
                 "' (supported: F32, F64, I64, BF16, F16)");

  const Json& shape = j["shape"];
  if (!shape.is_array())
    format_error(path, "tensor '", name, "': shape must be an array, got ", shape.dump());
  for (const Json& d : shape) {
    const uint64_t v = json_unsigned(path, name, "shape", d);
    if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      format_error(path, "tensor '", name, "': dimension ", v, " is too large");
    e.tensor.shape.push_back(static_cast<int64_t>(v));
  }

  const Json& offsets = j["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2)
    format_error(path, "tensor '", name, "': data_offsets must be [begin, end], got ",
                 offsets.dump());
  e.begin = json_unsigned(path, name, "data_offsets", offsets[0]);
  e.end = json_unsigned(path, name, "data_offsets", offsets[1]);
  if (e.end < e.begin)
    format_error(path, "tensor '", name, "': data_offsets [", e.begin, ", ", e.end,
                 "] end before they begin");

  // end − begin = numel × itemsize
  const int64_t numel = checked_numel(e.tensor.shape);
  const uint64_t itemsize = dtype_size(e.tensor.dtype);
  if (numel < 0 || static_cast<uint64_t>(numel) > std::numeric_limits<uint64_t>::max() / itemsize)
    format_error(path, "tensor '", name, "': shape ", shape_string(e.tensor.shape),
                 " has too many elements");
  const uint64_t need = static_cast<uint64_t>(numel) * itemsize;
  if (e.end - e.begin != need)
    format_error(path, "tensor '", name, "': shape ", shape_string(e.tensor.shape), " of ",
                 e.tensor.dtype, " needs ", need, " bytes but data_offsets [", e.begin, ", ", e.end,
                 "] span ", e.end - e.begin);
  return e;
}

/// Every tensor must lie inside the data area. When the tensors tile [0, max end) without gaps
/// or overlaps (as every writer lays them out), a short data area means the file was cut:
/// report it as truncated; otherwise name the offending tensor.
void check_ranges(const std::string& path, std::vector<Entry>& entries, uint64_t data_size) {
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin
           : a.end != b.end   ? a.end < b.end
                              : a.name < b.name;
  });
  uint64_t max_end = 0, cursor = 0;
  bool tiled = true;
  for (const Entry& e : entries) {
    tiled = tiled && e.begin == cursor;
    cursor = e.end;
    max_end = std::max(max_end, e.end);
  }
  if (max_end <= data_size) return;
  if (tiled)
    format_error(path, "truncated: expected ", max_end, " bytes of tensor data, file has ",
                 data_size);
  for (const Entry& e : entries)
    if (e.end > data_size)
      format_error(path, "tensor '", e.name, "': data_offsets [", e.begin, ", ", e.end,
                   "] lie outside the data area (", data_size, " bytes)");
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

SafeTensors load_safetensors(const std::string& path) {
  const std::vector<unsigned char> file = read_all(path);
  const uint64_t size = file.size();

  // 1. The 8-byte little-endian header length N.
  if (size < 8)
    format_error(path, "file is ", size, " bytes, too short for the 8-byte header length");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(file[i]) << (8 * i);
  if (n > kMaxHeaderBytes)
    format_error(path, "header length ", n, " is absurd (limit ", kMaxHeaderBytes,
                 "); not a safetensors file?");
  if (n > size - 8)
    format_error(path, "header length ", n, " runs past the end of the file (", size, " bytes)");

  // 2. The JSON header.
  Json header;
  try {
    header = Json::parse(file.begin() + 8, file.begin() + 8 + static_cast<std::ptrdiff_t>(n));
  } catch (const Json::parse_error& e) {
    format_error(path, "header is not valid JSON: ", e.what());
  }
  if (!header.is_object())
    format_error(path, "header must be a JSON object, got ", header.type_name());

  // 3. Each entry, then the ranges.
  SafeTensors st;
  std::vector<Entry> entries;
  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) format_error(path, "__metadata__ must be an object of strings");
      for (const auto& [k, v] : value.items()) {
        if (!v.is_string())
          format_error(path, "__metadata__ value of '", k, "' must be a string, got ", v.dump());
        st.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    entries.push_back(parse_entry(path, key, value));
  }
  const uint64_t data_size = size - 8 - n;
  check_ranges(path, entries, data_size);

  // 4. Copy each tensor's bytes out of the data area.
  const unsigned char* data = file.data() + 8 + n;
  for (Entry& e : entries) {
    e.tensor.bytes.assign(data + e.begin, data + e.end);
    st.tensors.emplace_back(std::move(e.name), std::move(e.tensor));
  }
  return st;
}

}  // namespace mhar::io
