/**
 * @file test_io.cpp
 * @brief mhar_io: safetensors round trips, the exact byte layout, every kind of corrupt file,
 *        atomic saves (including a write that fails half-way). The figures: test_figures.cpp.
 */
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cmath>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <system_error>
#include <vector>

#include "file_util.h"
#include "half.h"
#include "safetensors.h"
#include "temp_dir.h"

using namespace mhar::io;
using mhar::io::test::read_bytes;
using mhar::io::test::TempDir;
namespace fs = std::filesystem;

namespace {

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

/// A safetensors file built by hand from the spec: u64 LE length, header padded with spaces, data.
std::string make_file(std::string header, const std::string& data) {
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return out + header + data;
}

std::string float_bytes(std::initializer_list<float> v) {
  std::string s(v.size() * 4, '\0');
  std::memcpy(s.data(), std::data(v), s.size());
  return s;
}

/// The message of the FormatError that load_safetensors(path) throws ("" if it does not throw).
std::string load_error(const std::string& path) {
  try {
    load_safetensors(path);
  } catch (const FormatError& e) {
    return e.what();
  }
  return "";
}

SafeTensors sample_file() {
  SafeTensors st;
  st.metadata = {{"format", "mhar"}, {"config", R"({"d": 32, "H": 4})"}, {"note", "ünïcode ✓"}};
  const std::vector<float> w = {1.5f, -2.25f, 3.0f,
                                0.0f, -0.0f,  std::numeric_limits<float>::denorm_min()};
  const std::vector<double> q = {0.1, -1e300, 2.5};
  const std::vector<int64_t> ids = {0, -1, std::numeric_limits<int64_t>::max(), 42};
  const double scalar = 7.25;
  // Names deliberately not in alphabetical order: the file keeps insertion order.
  st.tensors.emplace_back("z.weight", Tensor::from_f32({2, 3}, w.data()));
  st.tensors.emplace_back("a.query", Tensor::from_f64({3}, q.data()));
  st.tensors.emplace_back("tokens", Tensor::from_i64({2, 2}, ids.data()));
  st.tensors.emplace_back("empty", Tensor::from_f32({0, 5}, nullptr));
  st.tensors.emplace_back("step", Tensor::from_f64({}, &scalar));
  return st;
}

}  // namespace

// =============================================================================================
// safetensors
// =============================================================================================

TEST_CASE("safetensors: F32, F64 and I64 tensors and metadata survive a round trip",
          "[safetensors]") {
  TempDir dir;
  const std::string path = dir.file("model.safetensors");
  const SafeTensors st = sample_file();
  save_safetensors(path, st);
  const SafeTensors back = load_safetensors(path);

  CHECK(back.metadata == st.metadata);
  REQUIRE(back.tensors.size() == st.tensors.size());
  for (std::size_t i = 0; i < st.tensors.size(); ++i) {
    CAPTURE(st.tensors[i].first);
    CHECK(back.tensors[i].first == st.tensors[i].first);  // insertion order, not alphabetical
    CHECK(back.tensors[i].second.dtype == st.tensors[i].second.dtype);
    CHECK(back.tensors[i].second.shape == st.tensors[i].second.shape);
    CHECK(back.tensors[i].second.bytes ==
          st.tensors[i].second.bytes);  // bit-exact, -0 and denormals too
  }
  CHECK(back.find("tokens")->to_i64() ==
        std::vector<int64_t>{0, -1, std::numeric_limits<int64_t>::max(), 42});
  CHECK(back.find("a.query")->to_f64() == std::vector<double>{0.1, -1e300, 2.5});
  CHECK(back.find("z.weight")->to_f64()[1] == -2.25);
  CHECK(back.find("step")->numel() == 1);
  CHECK(back.find("step")->to_f64() == std::vector<double>{7.25});
  CHECK(back.find("empty")->numel() == 0);
  CHECK(back.find("missing") == nullptr);
}

TEST_CASE("safetensors: the bytes on disk follow the spec exactly", "[safetensors]") {
  TempDir dir;
  const std::string path = dir.file("tiny.safetensors");
  SafeTensors st;
  st.metadata = {{"format", "pt"}};
  const std::vector<float> b = {1.0f, -2.0f};
  const std::vector<double> a = {0.5, 0.25, -1.0};
  st.tensors.emplace_back("b", Tensor::from_f32({2}, b.data()));
  st.tensors.emplace_back("a", Tensor::from_f64({3, 1}, a.data()));
  save_safetensors(path, st);
  const std::string file = read_bytes(path);

  // 1. u64 little-endian header length, a multiple of 8 so that the data area is 8-aligned.
  REQUIRE(file.size() >= 8);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i)
    n |= static_cast<uint64_t>(static_cast<unsigned char>(file[i])) << (8 * i);
  CHECK(n % 8 == 0);
  // 2. Compact JSON, metadata first, tensors back to back in insertion order, padded with spaces.
  const std::string json = R"({"__metadata__":{"format":"pt"},)"
                           R"("b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                           R"("a":{"dtype":"F64","shape":[3,1],"data_offsets":[8,32]}})";
  REQUIRE(n >= json.size());
  CHECK(file.substr(8, json.size()) == json);
  CHECK(file.substr(8 + json.size(), n - json.size()) == std::string(n - json.size(), ' '));
  CHECK(n - json.size() < 8);
  // 3. Raw little-endian data: 1.0f = 00 00 80 3f, -2.0f = 00 00 00 c0, then the doubles.
  REQUIRE(file.size() == 8 + n + 8 + 24);
  CHECK(file.substr(8 + n, 8) == std::string("\x00\x00\x80\x3f\x00\x00\x00\xc0", 8));
  double first = 0;
  std::memcpy(&first, file.data() + 8 + n + 8, 8);
  CHECK(first == 0.5);
}

TEST_CASE("safetensors: a file laid out by another writer loads", "[safetensors]") {
  // Python's writer puts __metadata__ anywhere and orders tensors its own way; offsets decide.
  TempDir dir;
  const std::string path = dir.file("other.safetensors");
  write_bytes(path, make_file(R"({"y":{"dtype":"F32","shape":[1],"data_offsets":[8,12]},)"
                              R"("x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                              R"("__metadata__":{"format":"pt"}})",
                              float_bytes({1.0f, 2.0f, 3.0f})));
  const SafeTensors st = load_safetensors(path);
  REQUIRE(st.tensors.size() == 2);
  CHECK(st.tensors[0].first == "x");  // by offset
  CHECK(st.tensors[0].second.to_f32() == std::vector<float>{1.0f, 2.0f});
  CHECK(st.tensors[1].second.to_f32() == std::vector<float>{3.0f});
  CHECK(st.metadata.at("format") == "pt");
}

TEST_CASE("safetensors: a truncated file is reported as such at every cut point", "[safetensors]") {
  TempDir dir;
  const std::string good = dir.file("good.safetensors");
  save_safetensors(good, sample_file());
  const std::string file = read_bytes(good);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i)
    n |= static_cast<uint64_t>(static_cast<unsigned char>(file[i])) << (8 * i);
  const std::size_t data_size = file.size() - 8 - n;

  struct Cut {
    std::size_t keep;
    std::string message;
  };
  const Cut cut = GENERATE_COPY(
      Cut{0, "file is 0 bytes, too short for the 8-byte header length"},
      Cut{5, "file is 5 bytes, too short"},
      Cut{8, "header length " + std::to_string(n) + " runs past the end of the file (8 bytes)"},
      Cut{8 + n / 2, "runs past the end of the file"},
      Cut{8 + n,
          "truncated: expected " + std::to_string(data_size) + " bytes of tensor data, file has 0"},
      Cut{8 + n + 3,
          "truncated: expected " + std::to_string(data_size) + " bytes of tensor data, file has 3"},
      Cut{file.size() - 1, "truncated: expected " + std::to_string(data_size) +
                               " bytes of tensor data, file has " + std::to_string(data_size - 1)});
  CAPTURE(cut.keep);
  const std::string path = dir.file("cut.safetensors");
  write_bytes(path, file.substr(0, cut.keep));
  const std::string msg = load_error(path);
  CAPTURE(msg);
  CHECK(msg.rfind(path + ": ", 0) == 0);
  CHECK(msg.find(cut.message) != std::string::npos);
}

TEST_CASE("safetensors: each kind of corrupt header gives its own FormatError", "[safetensors]") {
  struct Case {
    const char* what;
    std::string file;
    std::string message;
  };
  const std::string data = float_bytes({1.0f, 2.0f});
  const auto header = [&](const std::string& entry) {
    return make_file("{\"w\":" + entry + "}", data);
  };
  const Case c = GENERATE_COPY(
      Case{"garbage length", std::string(8, '\xff') + "{}",
           "header length 18446744073709551615 is absurd"},
      Case{"length beyond the file", std::string("\x40\0\0\0\0\0\0\0", 8) + "{}      ",
           "header length 64 runs past the end of the file (16 bytes)"},
      Case{"bad JSON", make_file(R"({"w":{"dtype":"F32",)", data), "header is not valid JSON"},
      Case{"not an object", make_file("[1, 2]", data), "header must be a JSON object"},
      Case{"unknown dtype", header(R"({"dtype":"F8_E4M3","shape":[2],"data_offsets":[0,8]})"),
           "tensor 'w': unsupported dtype 'F8_E4M3' (supported: F32, F64, I64, BF16, F16)"},
      Case{"missing field", header(R"({"dtype":"F32","data_offsets":[0,8]})"),
           "tensor 'w': missing \"shape\""},
      Case{"negative dim", header(R"({"dtype":"F32","shape":[-2],"data_offsets":[0,8]})"),
           "tensor 'w': shape must hold exact non-negative integers, got -2"},
      Case{"fractional offset", header(R"({"dtype":"F32","shape":[2],"data_offsets":[0,8.5]})"),
           "tensor 'w': data_offsets must hold exact non-negative integers, got 8.5"},
      Case{"exponent", header(R"({"dtype":"F32","shape":[2e0],"data_offsets":[0,8]})"),
           "tensor 'w': shape must hold exact non-negative integers, got 2e0"},
      Case{"boolean", header(R"({"dtype":"F32","shape":[true],"data_offsets":[0,8]})"),
           "tensor 'w': shape must hold exact non-negative integers, got true"},
      Case{"beyond 2^64",
           header(R"({"dtype":"F32","shape":[18446744073709551618],)"
                  R"("data_offsets":[0,8]})"),
           "got 18446744073709551618"},
      Case{"beyond a double", header(R"({"dtype":"F32","shape":[1e999],"data_offsets":[0,8]})"),
           "a number that does not fit a double"},
      Case{"duplicate tensor",
           make_file(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                     R"("w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                     data),
           "the tensor name 'w' appears twice in the header"},
      Case{"duplicate metadata", make_file(R"({"__metadata__":{"a":"1"},"__metadata__":{}})", ""),
           "the key '__metadata__' appears twice"},
      Case{"duplicate metadata key", make_file(R"({"__metadata__":{"a":"1","a":"2"}})", ""),
           "__metadata__ key 'a' appears twice"},
      Case{"duplicate field",
           header(R"({"dtype":"F32","dtype":"F32","shape":[2],)"
                  R"("data_offsets":[0,8]})"),
           "tensor 'w': the field 'dtype' appears twice"},
      Case{"unknown field", header(R"({"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1})"),
           "tensor 'w': unknown field 'x'"},
      Case{"nested deep", make_file("{\"w\":" + std::string(100000, '[') + "}", data),
           "tensor 'w': entry must be a JSON object, got [...]"},
      Case{"byte-order mark", make_file("\xEF\xBB\xBF{}", ""),
           "the header must be a JSON object starting with '{', it starts with '\\xef\\xbb\\xbf{"},
      Case{"NUL padding", make_file(std::string("{}\0\0\0\0\0\0", 8), ""),
           "header is not valid JSON at byte 3"},
      Case{"overlap",
           make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                     R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                     data),
           "tensor 'b': data_offsets [4, 8] overlap tensor 'a'"},
      Case{"trailing bytes",
           make_file(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", data),
           "4 bytes follow the last tensor"},
      Case{"three offsets", header(R"({"dtype":"F32","shape":[2],"data_offsets":[0,4,8]})"),
           "tensor 'w': data_offsets must be [begin, end]"},
      Case{"reversed offsets", header(R"({"dtype":"F32","shape":[0],"data_offsets":[8,0]})"),
           "tensor 'w': data_offsets [8, 0] end before they begin"},
      Case{"shape and offsets disagree",
           header(R"({"dtype":"F32","shape":[3],"data_offsets":[0,8]})"),
           "tensor 'w': shape [3] of F32 needs 12 bytes but data_offsets [0, 8] span 8"},
      Case{"gap", header(R"({"dtype":"F32","shape":[2],"data_offsets":[1000,1008]})"),
           "tensor 'w': data_offsets [1000, 1008] leave a gap of 1000 bytes before it"},
      Case{"metadata not strings", make_file(R"({"__metadata__":{"step":3}})", ""),
           "__metadata__ value of 'step' must be a string, got 3"});
  CAPTURE(c.what);
  TempDir dir;
  const std::string path = dir.file("bad.safetensors");
  write_bytes(path, c.file);
  const std::string msg = load_error(path);
  CAPTURE(msg);
  CHECK(msg.rfind(path + ": ", 0) == 0);
  CHECK(msg.find(c.message) != std::string::npos);
}

TEST_CASE("safetensors: a header lists at most kMaxTensors tensors", "[safetensors]") {
  const auto zero_tensors = [](std::size_t n) {  // n tensors of zero size: a valid tiling
    std::string json = "{";
    for (std::size_t i = 0; i < n; ++i)
      json += (i ? ",\"t" : "\"t") + std::to_string(i) +
              R"(":{"dtype":"F32","shape":[0],"data_offsets":[0,0]})";
    return make_file(json + "}", "");
  };
  TempDir dir;
  const std::string path = dir.file("many.safetensors");
  write_bytes(path, zero_tensors(kMaxTensors));
  CHECK(load_safetensors(path).tensors.size() == kMaxTensors);
  write_bytes(path, zero_tensors(kMaxTensors + 1));
  CHECK(load_error(path) == path + ": the header lists more than 65536 tensors");
}

TEST_CASE("safetensors: a missing or unreadable file names the path and the OS error",
          "[safetensors]") {
  TempDir dir;
  const std::string missing = dir.file("nope.safetensors");
  CHECK(load_error(missing) == missing + ": cannot open: No such file or directory");
  const std::string folder = dir.file("folder.safetensors");
  fs::create_directory(folder);
  CHECK(load_error(folder) == folder + ": is a directory, not a regular file");
  const std::string fifo = dir.file("fifo.safetensors");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK(load_error(fifo) == fifo + ": is a FIFO (named pipe), not a regular file");
  CHECK(load_error("/dev/zero") == "/dev/zero: is a character device, not a regular file");
}

TEST_CASE("safetensors: invalid tensors are refused before anything is written", "[safetensors]") {
  TempDir dir;
  const std::string path = dir.file("refused.safetensors");
  const float v[2] = {1, 2};
  struct Case {
    const char* what;
    std::string name;
    Tensor tensor;
    std::string message;
  };
  Tensor short_bytes = Tensor::from_f32({2}, v);
  short_bytes.shape = {3};
  Tensor f8 = Tensor::from_f32({2}, v);
  f8.dtype = "F8_E4M3";
  const Case c = GENERATE_COPY(
      Case{"byte count", "w", short_bytes, "tensor 'w': shape [3] of F32 needs 12 bytes, has 8"},
      Case{"dtype", "w", f8, "tensor 'w': unknown dtype 'F8_E4M3'"},
      Case{"reserved name", "__metadata__", Tensor::from_f32({2}, v), "(empty or reserved)"},
      Case{"empty name", "", Tensor::from_f32({2}, v), "(empty or reserved)"});
  CAPTURE(c.what);
  SafeTensors st;
  st.tensors.emplace_back(c.name, c.tensor);
  try {
    save_safetensors(path, st);
    FAIL("no exception");
  } catch (const FormatError& e) {
    CHECK(std::string(e.what()).rfind(path + ": ", 0) == 0);
    CHECK(std::string(e.what()).find(c.message) != std::string::npos);
  }
  CHECK(dir.entries().empty());
}

TEST_CASE("safetensors: duplicate names are refused", "[safetensors]") {
  TempDir dir;
  const float v[1] = {1};
  SafeTensors st;
  st.tensors.emplace_back("w", Tensor::from_f32({1}, v));
  st.tensors.emplace_back("w", Tensor::from_f32({1}, v));
  CHECK_THROWS_WITH(save_safetensors(dir.file("dup.safetensors"), st),
                    Catch::Contains("two tensors named 'w'"));
}

TEST_CASE("safetensors: tensor helpers check dtype and shape", "[safetensors]") {
  const int64_t ids[2] = {1, 2};
  const Tensor t = Tensor::from_i64({2}, ids);
  CHECK_THROWS_AS(t.to_f32(), FormatError);
  CHECK_THROWS_WITH(t.to_f64(), Catch::Contains("dtype I64"));
  const float v[2] = {1, 2};
  CHECK_THROWS_WITH(Tensor::from_f32({2}, v).to_i64(), Catch::Contains("not I64"));
  CHECK_THROWS_AS(Tensor::from_f32({-1, 2}, v), std::invalid_argument);
  Tensor bad = Tensor::from_f32({2}, v);
  bad.bytes.pop_back();
  CHECK_THROWS_WITH(bad.to_f32(), Catch::Contains("has 7 bytes"));
  CHECK(Tensor::from_f32({2, 0, 3}, nullptr).numel() == 0);
  CHECK(dtype_size("F32") == 4);
  CHECK_THROWS_AS(dtype_size("U8"), FormatError);
}

// --- atomic saves -----------------------------------------------------------------------------

TEST_CASE("atomic save: a missing directory throws and leaves nothing", "[atomic]") {
  TempDir dir;
  const std::string path = dir.file("no/such/dir/model.safetensors");
  try {
    save_safetensors(path, sample_file());
    FAIL("no exception");
  } catch (const std::system_error& e) {
    CHECK(std::string(e.what()).rfind(path + ": cannot create the temporary file", 0) == 0);
    CHECK(std::string(e.what()).find("No such file or directory") != std::string::npos);
  }
  CHECK(dir.entries().empty());
}

TEST_CASE("atomic save: a complete new file replaces the old one and no temporary is left",
          "[atomic]") {
  TempDir dir;
  const std::string path = dir.file("model.safetensors");
  write_bytes(path, "old content");
  save_safetensors(path, sample_file());
  CHECK(load_safetensors(path).tensors.size() == sample_file().tensors.size());
  CHECK(dir.entries() == std::vector<std::string>{"model.safetensors"});
}

TEST_CASE("atomic save: when the temporary file cannot be created the old file is intact",
          "[atomic]") {
  TempDir dir;
  const std::string path = dir.file("model.safetensors");
  write_bytes(path, "old content");
  // Occupy the temporary name with a directory: open() fails as it would in a read-only
  // directory (which root, running these tests, could still write to).
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  fs::create_directory(tmp);
  CHECK_THROWS_AS(save_safetensors(path, sample_file()), std::system_error);
  CHECK(read_bytes(path) == "old content");
  CHECK(fs::is_directory(tmp));  // not ours: left alone
}

TEST_CASE("atomic save: a write that fails half-way leaves the old file and no temporary",
          "[atomic]") {
  // A file-size limit makes write() fail with EFBIG after 4 KiB, as a full disk fails with ENOSPC;
  // it binds root too. SIGXFSZ would kill the process, so it is ignored for the duration.
  TempDir dir;
  const std::string path = dir.file("model.safetensors");
  write_bytes(path, "old content");
  std::vector<float> big(64 * 1024, 1.0f);
  SafeTensors st;
  st.tensors.emplace_back("big", Tensor::from_f32({static_cast<int64_t>(big.size())}, big.data()));

  rlimit old_limit{};
  REQUIRE(::getrlimit(RLIMIT_FSIZE, &old_limit) == 0);
  const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit small = old_limit;
  small.rlim_cur = 4096;
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
  std::string message;
  try {
    save_safetensors(path, st);
  } catch (const std::system_error& e) {
    message = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &old_limit);
  std::signal(SIGXFSZ, old_handler);

  CAPTURE(message);
  CHECK(message.rfind(path + ": cannot write ", 0) == 0);
  CHECK(message.find("File too large") != std::string::npos);
  CHECK(read_bytes(path) == "old content");
  CHECK(dir.entries() == std::vector<std::string>{"model.safetensors"});
}

TEST_CASE("atomic save: text files are written whole, and failures name the path", "[atomic]") {
  TempDir dir;
  const std::string path = dir.file("curve.csv");
  write_text_file_atomic(path, "step,loss\n0,4.2\n");
  write_text_file_atomic(path, "step,loss\n0,4.1\n");
  CHECK(read_bytes(path) == "step,loss\n0,4.1\n");
  CHECK(dir.entries() == std::vector<std::string>{"curve.csv"});
  const std::string bad = dir.file("missing/curve.csv");
  CHECK_THROWS_WITH(write_text_file_atomic(bad, "x"), Catch::StartsWith(bad + ": "));
}

// ---- BF16 and F16 (half.h): rounding to nearest, ties to even, against every 16-bit value ----

namespace {

/// Checks the rounding of one 16-bit format exhaustively: every finite value widens and rounds
/// back to itself; between each pair of neighbours a < b, the midpoint (exact in float) goes to
/// the one with the even bit pattern, and the floats just either side of it to the nearer one.
void check_half_rounding(uint16_t (*to_bits)(float), float (*to_float)(uint16_t), float max_finite,
                         const char* name) {
  CAPTURE(name);
  long checked = 0;
  for (uint32_t b = 0; b < 0x10000u; ++b) {
    const float a = to_float(static_cast<uint16_t>(b));
    if (std::isnan(a)) {
      REQUIRE(std::isnan(to_float(to_bits(a))));
      continue;
    }
    REQUIRE(to_bits(a) == static_cast<uint16_t>(b));
    if (!std::isfinite(a) || std::signbit(a) || a == max_finite) continue;
    const uint16_t nb = static_cast<uint16_t>(b + 1);
    const float next = to_float(nb);
    const float mid = a + (next - a) / 2;  // exact: a and next differ in one bit of a 16-bit format
    REQUIRE(mid > a);
    REQUIRE(mid < next);
    const uint16_t even = (b & 1u) ? nb : static_cast<uint16_t>(b);
    REQUIRE(to_bits(mid) == even);
    REQUIRE(to_bits(-mid) == static_cast<uint16_t>(even | 0x8000u));
    REQUIRE(to_bits(std::nextafter(mid, 0.0f)) == static_cast<uint16_t>(b));
    REQUIRE(to_bits(std::nextafter(mid, INFINITY)) == nb);
    ++checked;
  }
  CHECK(checked > 30000);
}

}  // namespace

TEST_CASE("half: BF16 and F16 round to nearest, ties to even, for every 16-bit value", "[half]") {
  check_half_rounding(float_to_bf16_bits, bf16_bits_to_float, bf16_bits_to_float(0x7f7fu), "BF16");
  check_half_rounding(float_to_f16_bits, f16_bits_to_float, 65504.0f, "F16");
  // The edges: overflow, subnormals, signed zero, infinities, NaN.
  CHECK(float_to_f16_bits(65519.0f) == 0x7bffu);  // below the halfway point: 65504
  CHECK(float_to_f16_bits(65520.0f) == 0x7c00u);  // halfway to the next binade: inf (even)
  CHECK(float_to_f16_bits(1e10f) == 0x7c00u);
  CHECK(float_to_f16_bits(-1e10f) == 0xfc00u);
  CHECK(f16_bits_to_float(0x0001u) == std::ldexp(1.0f, -24));  // smallest subnormal
  CHECK(float_to_f16_bits(std::ldexp(1.0f, -25)) == 0x0000u);  // half of it: a tie, to even 0
  CHECK(float_to_f16_bits(std::ldexp(1.5f, -25)) == 0x0001u);
  CHECK(float_to_f16_bits(-0.0f) == 0x8000u);
  CHECK(float_to_bf16_bits(-0.0f) == 0x8000u);
  CHECK(float_to_bf16_bits(INFINITY) == 0x7f80u);
  CHECK(float_to_bf16_bits(std::numeric_limits<float>::max()) == 0x7f80u);  // rounds up to inf
  CHECK(std::isnan(round_to_bf16(NAN)));
  CHECK(std::isnan(round_to_f16(NAN)));
  CHECK(round_to_bf16(1.0f + std::ldexp(1.0f, -8)) == 1.0f);  // the tie at 1 goes to even
  CHECK(round_to_bf16(1.0f + std::ldexp(3.0f, -8)) == 1.0f + std::ldexp(1.0f, -6));
}

TEST_CASE("safetensors: BF16 and F16 tensors round on the way in and widen exactly on the way out",
          "[safetensors][half]") {
  TempDir dir;
  const std::string path = dir.file("half.safetensors");
  const float v[4] = {1.0f, 1.0f / 3.0f, -70000.0f, 1e-6f};
  SafeTensors st;
  st.tensors.emplace_back("b", Tensor::from_bf16({2, 2}, v));
  st.tensors.emplace_back("h", Tensor::from_f16({4}, v));
  save_safetensors(path, st);
  const SafeTensors back = load_safetensors(path);
  const Tensor* b = back.find("b");
  const Tensor* h = back.find("h");
  REQUIRE(b != nullptr);
  REQUIRE(h != nullptr);
  CHECK(b->dtype == "BF16");
  CHECK(h->dtype == "F16");
  CHECK(b->bytes.size() == 8);
  const auto bf = b->to_f32();
  const auto hf = h->to_f64();
  for (int i = 0; i < 4; ++i) {
    CHECK(bf[i] == round_to_bf16(v[i]));
    CHECK(hf[i] == static_cast<double>(round_to_f16(v[i])));
  }
  CHECK(bf[1] != v[1]);
  CHECK(std::isinf(hf[2]));  // -70000 is beyond F16's range
  // The byte layout is the little-endian bit pattern (what Python's safetensors reads).
  CHECK(b->bytes[0] == 0x80);
  CHECK(b->bytes[1] == 0x3f);
}
