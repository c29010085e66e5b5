/**
 * @file safetensors.h
 * @ingroup tools
 * @brief Reading and writing the safetensors format (checkpoints of mhar-toy), and the atomic
 *        file write every output of the tools goes through.
 *
 * The layout of a safetensors file (the standard one, readable by Python's `safetensors`):
 *
 *     offset 0       8-byte unsigned little-endian integer N: the length of the JSON header
 *     offset 8       N bytes of UTF-8 JSON, padded with spaces so that 8 + N is a multiple of 8:
 *                      {"__metadata__": {"key": "value", ...},            (optional, strings only)
 *                       "name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}, ...}
 *     offset 8 + N   the data area: raw little-endian tensor data, row-major (C order).
 *                    data_offsets = [begin, end) are byte offsets into the data area, and
 *                    end − begin = numel × itemsize (numel of shape [] is 1).
 *
 * The writer lays tensors out back to back in insertion order from offset 0. The reader holds
 * every file to the rules of docs/checkpoint-format.md ("What a reader refuses"): a regular file
 * (checked before it is opened), a header that is one JSON object of at most 100 MB with no
 * duplicate key, nothing nested deeper than the layout above, exact non-negative integers in
 * shape and data_offsets, a supported dtype, and tensors that tile the data area exactly (no
 * overlap, no gap, no byte after the last one). It reads the header first, in time linear in its
 * length, and each tensor's bytes only once the whole header has passed; every refusal is a
 * FormatError whose message starts with the path and states the rule.
 *
 * Only the dtypes this project uses are supported: F32, F64, I64, and BF16 and F16 (the verify
 * kit's storage dtypes; half.h rounds to them). No Eigen, no model: plain
 * byte buffers, so that the tools and the tests share one implementation.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "file_util.h"

namespace mhar::io {

/// A file that is not valid safetensors (or a tensor that cannot be what was asked of it).
/// The message starts with the file's path when there is one.
class FormatError : public InputError {
 public:
  using InputError::InputError;
};

/// Bytes per element of a dtype ("F32" → 4, "F64", "I64" → 8, "BF16", "F16" → 2); throws FormatError otherwise.
std::size_t dtype_size(const std::string& dtype);

/// One tensor: dtype, shape and its raw little-endian bytes (row-major).
struct Tensor {
  std::string dtype;           ///< "F32", "F64", "I64", "BF16" or "F16"
  std::vector<int64_t> shape;  ///< [] for a scalar
  std::vector<unsigned char> bytes;

  /// Copies numel(shape) floats from `data`. Throws std::invalid_argument on a negative dim.
  static Tensor from_f32(std::vector<int64_t> shape, const float* data);
  /// Copies numel(shape) doubles from `data`.
  static Tensor from_f64(std::vector<int64_t> shape, const double* data);
  /// numel(shape) floats from `data`, each rounded to BF16 (ties to even; half.h).
  static Tensor from_bf16(std::vector<int64_t> shape, const float* data);
  /// numel(shape) floats from `data`, each rounded to F16 (ties to even, overflow to inf).
  static Tensor from_f16(std::vector<int64_t> shape, const float* data);
  /// Copies numel(shape) 64-bit integers from `data`.
  static Tensor from_i64(std::vector<int64_t> shape, const int64_t* data);

  /// The values as float (F32 as is, F64 rounded, BF16 and F16 widened exactly); throws
  /// FormatError for I64.
  std::vector<float> to_f32() const;
  /// The values as double (F32, BF16, F16 widened, F64 as is); throws FormatError for I64.
  std::vector<double> to_f64() const;
  /// The values of an I64 tensor; throws FormatError for any other dtype.
  std::vector<int64_t> to_i64() const;
  /// Product of the shape (1 for a scalar).
  int64_t numel() const;
};

/// The content of one file: metadata and tensors, in the order they are written.
struct SafeTensors {
  std::map<std::string, std::string> metadata;
  std::vector<std::pair<std::string, Tensor>> tensors;

  /// The tensor called `name`, or nullptr.
  const Tensor* find(const std::string& name) const;
};

/// Writes `st` to `path` atomically (write_file_atomic, file_util.h). Throws FormatError (message
/// starts with the path) for an invalid tensor (unknown dtype, byte count ≠ numel × itemsize, empty
/// or duplicate name, the reserved name "__metadata__") and std::system_error when writing fails.
void save_safetensors(const std::string& path, const SafeTensors& st);

/// One tensor of a header, before its bytes are read (compact: a header may name a million).
struct HeaderEntry {
  std::string name;
  uint64_t begin = 0, end = 0;        ///< data_offsets, into the data area
  uint32_t dims_begin = 0, rank = 0;  ///< the shape: SafeTensorsHeader::dims[dims_begin, + rank)
  uint8_t dtype = 0;                  ///< index into kDtypeNames
};

/// The dtypes this project reads and writes.
inline constexpr const char* kDtypeNames[] = {"F32", "F64", "I64", "BF16", "F16"};

/// A checked header: every rule but the tensors' own contents.
struct SafeTensorsHeader {
  std::map<std::string, std::string> metadata;
  std::vector<HeaderEntry> entries;  ///< in the order of their data offsets
  std::vector<int64_t> dims;
  std::vector<int64_t> shape(const HeaderEntry& e) const;
  /// Scalars of all tensors together (saturates at INT64_MAX).
  int64_t total_numel() const;
};

/// The largest header accepted (the bound of the reference implementation, 100 MB).
inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;
/// The most entries __metadata__ may hold (mhar writes fewer than ten).
inline constexpr std::size_t kMaxMetadataEntries = 4096;
/// The most tensors a header may list. A checkpoint holds about ten per block (a gradient file
/// twice that), so this admits L in the thousands; a reader stops at the first entry past it
/// rather than parse, sort and check a header of millions of entries before refusing it.
inline constexpr std::size_t kMaxTensors = 65536;

/// Checks the JSON text of a header against a data area of `data_size` bytes (every rule of
/// docs/checkpoint-format.md); throws FormatError("<path>: <rule>"). Linear in the text (plus
/// one sort of the tensors), no recursion.
SafeTensorsHeader parse_safetensors_header(std::string_view json, uint64_t data_size,
                                           const std::string& path);

/// Reads and checks only the header of `path` (a regular file); throws FormatError.
SafeTensorsHeader read_safetensors_header(const std::string& path);

/// Called with the checked header before any tensor's bytes are read or allocated: a reader that
/// knows what it expects refuses there (throwing), whatever the file claims.
using HeaderCheck = std::function<void(const SafeTensorsHeader&)>;

/// Reads and validates `path`; tensors come back in the order of their data offsets (which is
/// the insertion order of the writer). Throws FormatError("<path>: ...") on any problem.
SafeTensors load_safetensors(const std::string& path, const HeaderCheck& check = {});

}  // namespace mhar::io
