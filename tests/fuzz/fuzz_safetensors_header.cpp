/**
 * @file fuzz_safetensors_header.cpp
 * @brief libFuzzer target for the safetensors header parser (parse_safetensors_header,
 *        tools/io/safetensors_header.cpp), built and run by scripts/fuzz.sh with clang's
 *        -fsanitize=fuzzer,address,undefined.
 *
 * Input: two bytes give the size of the data area (little-endian, 0–65535), the rest is the
 * header's JSON text. Every input must end in one of two ways:
 *   - a FormatError whose message starts with the path (a clean refusal), or
 *   - an accepted header that keeps the promises of docs/checkpoint-format.md: at most kMaxTensors
 *     entries, no two names alike, each entry's bytes = numel × itemsize, and the entries, in the
 *     order returned, tiling [0, data size) exactly.
 * Any other exception, a crash, a leak or undefined behaviour is a finding; a broken promise
 * aborts, which libFuzzer reports as one.
 */
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <string_view>

#include "safetensors.h"

namespace {

void require(bool ok, const char* promise) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_safetensors_header: an accepted header breaks: %s\n", promise);
    std::abort();
  }
}

void check_accepted(const mhar::io::SafeTensorsHeader& h, uint64_t data_size) {
  require(h.entries.size() <= mhar::io::kMaxTensors, "at most kMaxTensors entries");
  std::set<std::string> names;
  uint64_t cursor = 0;
  for (const mhar::io::HeaderEntry& e : h.entries) {
    require(names.insert(e.name).second, "no two names alike");
    require(e.begin == cursor, "each tensor begins where the previous one ends");
    int64_t numel = 1;
    for (int64_t dim : h.shape(e)) numel *= dim;  // no overflow: the parser checked it
    const uint64_t itemsize = mhar::io::dtype_size(mhar::io::kDtypeNames[e.dtype]);
    require(e.end - e.begin == static_cast<uint64_t>(numel) * itemsize, "bytes = numel × itemsize");
    cursor = e.end;
  }
  require(cursor == data_size, "the tensors end where the data area ends");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  const uint64_t data_size = data[0] | (static_cast<uint64_t>(data[1]) << 8);
  const std::string_view json(reinterpret_cast<const char*>(data) + 2, size - 2);
  const std::string path = "fuzz.safetensors";
  try {
    check_accepted(mhar::io::parse_safetensors_header(json, data_size, path), data_size);
  } catch (const mhar::io::FormatError& e) {
    require(std::string_view(e.what()).substr(0, path.size() + 2) == path + ": ",
            "a refusal names the file");
  }
  return 0;  // any other exception escapes, and libFuzzer reports it
}
