/**
 * @file test_io.cpp
 * @brief mhar_io: safetensors round trips, the exact byte layout, every kind of corrupt file,
 *        atomic saves (including a write that fails half-way), and the SVG/PNG figures, whose
 *        PNGs are decoded again with stb_image and checked pixel by pixel where it matters.
 */
#include <catch2/catch.hpp>

#define STB_IMAGE_IMPLEMENTATION
#include <stb_image.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
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

#include "figures.h"
#include "file_util.h"
#include "safetensors.h"

using namespace mhar::io;
namespace fs = std::filesystem;

namespace {

/// A fresh directory under the system temp dir, removed with everything in it at scope exit.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = fs::temp_directory_path() /
            ("mhar_io_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::permissions(path_, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  /// Names of the entries in the directory, sorted.
  std::vector<std::string> entries() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(path_))
      names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }

 private:
  fs::path path_;
};

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

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

// --- PNG helpers ------------------------------------------------------------------------------

struct Image {
  int w = 0, h = 0;
  std::vector<unsigned char> rgb;
  const unsigned char* at(int x, int y) const {
    return &rgb[(static_cast<std::size_t>(y) * w + x) * 3];
  }
};

Image decode_png(const std::string& path) {
  Image img;
  int comp = 0;
  unsigned char* data = stbi_load(path.c_str(), &img.w, &img.h, &comp, 3);
  REQUIRE(data != nullptr);
  img.rgb.assign(data, data + static_cast<std::size_t>(img.w) * img.h * 3);
  stbi_image_free(data);
  return img;
}

double colour_distance(const unsigned char* p, int r, int g, int b) {
  return std::sqrt((p[0] - r) * (p[0] - r) + (p[1] - g) * (p[1] - g) + (p[2] - b) * (p[2] - b));
}

struct Blob {
  std::size_t count = 0;
  double cx = 0, cy = 0;
};

/// Pixels within `tol` of (r, g, b): how many, and their centroid.
Blob find_colour(const Image& img, int r, int g, int b, double tol) {
  Blob blob;
  for (int y = 0; y < img.h; ++y)
    for (int x = 0; x < img.w; ++x)
      if (colour_distance(img.at(x, y), r, g, b) <= tol) ++blob.count, blob.cx += x, blob.cy += y;
  if (blob.count)
    blob.cx /= static_cast<double>(blob.count), blob.cy /= static_cast<double>(blob.count);
  return blob;
}

std::size_t distinct_colours(const Image& img) {
  std::vector<unsigned> c;
  for (std::size_t i = 0; i < img.rgb.size(); i += 3)
    c.push_back(img.rgb[i] << 16 | img.rgb[i + 1] << 8 | img.rgb[i + 2]);
  std::sort(c.begin(), c.end());
  return static_cast<std::size_t>(std::unique(c.begin(), c.end()) - c.begin());
}

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto pos = text.find(what); pos != std::string::npos;
       pos = text.find(what, pos + what.size()))
    ++n;
  return n;
}

Heatmap sample_heatmap(const std::string& title) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Heatmap h;
  h.title = title;
  h.row_labels = {"site 1", "site 2", "site 3"};
  h.col_labels = {"embedding", "block 1", "block 2", "block 3"};
  h.row_axis = "routing site";
  h.col_axis = "source";
  h.values = {0.9, 0.1, nan, nan, 0.2, 0.5, 0.3, nan, 0.0, 0.25, 0.25, 0.5};
  return h;
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

TEST_CASE("safetensors: gaps and shared data ranges are accepted", "[safetensors]") {
  TempDir dir;
  const std::string path = dir.file("lenient.safetensors");
  write_bytes(path, make_file(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[4,8]},)"
                              R"("alias":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                              float_bytes({9.0f, 4.0f})));
  const SafeTensors st = load_safetensors(path);
  CHECK(st.find("x")->to_f32() == std::vector<float>{4.0f});
  CHECK(st.find("alias")->to_f32() == std::vector<float>{4.0f});
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
      Case{"not an object", make_file("[1, 2]", data), "header must be a JSON object, got array"},
      Case{"unknown dtype", header(R"({"dtype":"BF16","shape":[2],"data_offsets":[0,8]})"),
           "tensor 'w': unknown dtype 'BF16' (supported: F32, F64, I64)"},
      Case{"missing field", header(R"({"dtype":"F32","data_offsets":[0,8]})"),
           "tensor 'w': missing \"shape\""},
      Case{"negative dim", header(R"({"dtype":"F32","shape":[-2],"data_offsets":[0,8]})"),
           "tensor 'w': shape must hold non-negative integers, got -2"},
      Case{"fractional offset", header(R"({"dtype":"F32","shape":[2],"data_offsets":[0,8.5]})"),
           "tensor 'w': data_offsets must hold non-negative integers, got 8.5"},
      Case{"three offsets", header(R"({"dtype":"F32","shape":[2],"data_offsets":[0,4,8]})"),
           "tensor 'w': data_offsets must be [begin, end]"},
      Case{"reversed offsets", header(R"({"dtype":"F32","shape":[0],"data_offsets":[8,0]})"),
           "tensor 'w': data_offsets [8, 0] end before they begin"},
      Case{"shape and offsets disagree",
           header(R"({"dtype":"F32","shape":[3],"data_offsets":[0,8]})"),
           "tensor 'w': shape [3] of F32 needs 12 bytes but data_offsets [0, 8] span 8"},
      Case{"offsets out of range",
           header(R"({"dtype":"F32","shape":[2],"data_offsets":[1000,1008]})"),
           "tensor 'w': data_offsets [1000, 1008] lie outside the data area (8 bytes)"},
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

TEST_CASE("safetensors: a missing or unreadable file names the path and the OS error",
          "[safetensors]") {
  TempDir dir;
  const std::string missing = dir.file("nope.safetensors");
  CHECK(load_error(missing) == missing + ": cannot open: No such file or directory");
  const std::string folder = dir.file("folder.safetensors");
  fs::create_directory(folder);
  CHECK(load_error(folder) == folder + ": cannot read: Is a directory");
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
  Tensor bf16 = Tensor::from_f32({2}, v);
  bf16.dtype = "BF16";
  const Case c = GENERATE_COPY(
      Case{"byte count", "w", short_bytes, "tensor 'w': shape [3] of F32 needs 12 bytes, has 8"},
      Case{"dtype", "w", bf16, "tensor 'w': unknown dtype 'BF16'"},
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
  CHECK_THROWS_WITH(write_heatmap_png(dir.file("missing/h.png"), {sample_heatmap("h")}, "t"),
                    Catch::StartsWith(dir.file("missing/h.png") + ": "));
}

// =============================================================================================
// figures
// =============================================================================================

TEST_CASE("figures: nice_ticks steps by 1, 2 or 5 × 10^k within the range", "[figures]") {
  struct Case {
    double lo, hi;
    int max_ticks;
  };
  const Case c =
      GENERATE(Case{0, 1, 6}, Case{0, 0.37, 6}, Case{-3.2, 17.9, 5}, Case{0.11, 0.19, 4},
               Case{1e-7, 3e-6, 8}, Case{0, 12345, 7}, Case{-1, 1, 3}, Case{0.9, 1.1, 2});
  CAPTURE(c.lo, c.hi, c.max_ticks);
  const std::vector<double> t = nice_ticks(c.lo, c.hi, c.max_ticks);
  REQUIRE(!t.empty());
  CHECK(static_cast<int>(t.size()) <= c.max_ticks);
  const double tol = 1e-9 * (c.hi - c.lo);
  CHECK(t.front() >= c.lo - tol);
  CHECK(t.back() <= c.hi + tol);
  if (t.size() >= 2) {
    const double step = t[1] - t[0];
    const double mantissa = step / std::pow(10.0, std::floor(std::log10(step) + 1e-9));
    CAPTURE(step, mantissa);
    CHECK((std::abs(mantissa - 1) < 1e-6 || std::abs(mantissa - 2) < 1e-6 ||
           std::abs(mantissa - 5) < 1e-6));
    for (std::size_t i = 1; i < t.size(); ++i) CHECK(t[i] - t[i - 1] == Approx(step));
    CHECK(std::abs(std::remainder(t[0], step)) < 1e-6 * step);  // ticks are multiples of the step
  }
}

TEST_CASE("figures: nice_ticks gives the finest step that fits", "[figures]") {
  const std::vector<double> t = nice_ticks(0, 1, 6);
  REQUIRE(t.size() == 6);
  for (int i = 0; i < 6; ++i) CHECK(t[i] == Approx(0.2 * i).margin(1e-12));
  CHECK(nice_ticks(0, 0.37, 6).size() == 4);  // 0, 0.1, 0.2, 0.3
  CHECK(nice_ticks(2, 2, 6) == std::vector<double>{2});
  CHECK_THROWS_AS(nice_ticks(1, 0, 6), std::invalid_argument);
}

TEST_CASE("figures: heatmap SVG has every label and one rect per cell", "[figures]") {
  Heatmap h0 = sample_heatmap("head 0"), h1 = sample_heatmap("head 1");
  h1.col_labels[3] = "a<b & c";
  const std::string svg = heatmap_svg({h0, h1}, "Routing weights, step 100");
  CHECK(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0) == 0);
  CHECK(svg.size() > 6);
  CHECK(svg.substr(svg.size() - 7) == "</svg>\n");
  CHECK(count(svg, "<text") == count(svg, "</text>"));
  CHECK(svg.find("Routing weights, step 100") != std::string::npos);
  for (const auto& s :
       {"head 0", "head 1", "routing site", "source", "embedding", "block 3", "site 3"})
    CHECK(svg.find(std::string(">") + s + "<") != std::string::npos);
  CHECK(svg.find(">a&lt;b &amp; c<") != std::string::npos);
  CHECK(count(svg, "class=\"cell\"") == 2 * 12);
  CHECK(count(svg, "class=\"cell\" x=") == 2 * 12);
  CHECK(count(svg, "fill=\"url(#na)\"") >= 2 * 3);  // 3 NaN cells per panel (+ the legend swatch)
  CHECK(svg.find(">0.90<") != std::string::npos);   // annotations
  h0.annotate = h1.annotate = false;
  CHECK(heatmap_svg({h0, h1}, "").find(">0.90<") == std::string::npos);
}

TEST_CASE("figures: heatmaps with inconsistent input are refused", "[figures]") {
  Heatmap h = sample_heatmap("head 0");
  h.values.pop_back();
  CHECK_THROWS_WITH(heatmap_svg({h}, ""),
                    Catch::Contains("values has 11 entries, expected rows × cols = 3 × 4 = 12"));
  h = sample_heatmap("head 0");
  h.vmin = h.vmax = 1;
  CHECK_THROWS_WITH(heatmap_svg({h}, ""), Catch::Contains("needs vmin < vmax"));
  CHECK_THROWS_AS(heatmap_svg({}, ""), std::invalid_argument);
}

TEST_CASE("figures: heatmap PNG cells take viridis colours in the order of the values",
          "[figures]") {
  // One row 0 | 0.5 | 1, one row of NaN: the low cell must be viridis' dark purple and left of the
  // high cell's yellow, the cell between them viridis(0.5) teal, and the NaN row grey below.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Heatmap h;
  h.title = "ordering";
  h.row_labels = {"r0", "r1"};
  h.col_labels = {"lo", "mid", "hi"};
  h.values = {0.0, 0.5, 1.0, nan, nan, nan};
  h.annotate = false;
  TempDir dir;
  const std::string path = dir.file("order.png");
  write_heatmap_png(path, {h}, "Heatmap ordering");
  const Image img = decode_png(path);
  REQUIRE(img.w > 100);
  REQUIRE(img.h > 100);

  const Blob lo = find_colour(img, 68, 1, 84, 12), hi = find_colour(img, 253, 231, 37, 12);
  CAPTURE(lo.count, hi.count, lo.cx, hi.cx);
  REQUIRE(lo.count >= 28 * 28);  // a whole cell, not a few pixels of the colour bar
  REQUIRE(hi.count >= 28 * 28);
  CHECK(lo.cx < hi.cx);
  CHECK(std::abs(lo.cy - hi.cy) < 10);
  const unsigned char* mid =
      img.at(static_cast<int>((lo.cx + hi.cx) / 2), static_cast<int>((lo.cy + hi.cy) / 2));
  CAPTURE(int(mid[0]), int(mid[1]), int(mid[2]));
  CHECK(colour_distance(mid, 33, 145, 140) < 20);
  const Blob grey = find_colour(img, 232, 232, 232, 4);
  CHECK(grey.count >= 3 * 28 * 14);  // three hatched cells (about half their pixels light grey)
  CHECK(grey.cy > lo.cy + 20);
}

TEST_CASE("figures: heatmap PNG with labels and annotations decodes", "[figures]") {
  TempDir dir;
  const std::string path = dir.file("heat.png");
  Heatmap h = sample_heatmap("head α");  // non-ASCII prints as '?' in PNGs
  write_heatmap_png(path, {sample_heatmap("head 0"), h}, "Routing weights");
  const Image img = decode_png(path);
  CHECK(img.w > 300);
  CHECK(img.h > 150);
  CHECK(distinct_colours(img) > 20);
  CHECK(find_colour(img, 25, 25, 25, 1).count > 500);  // text
}

TEST_CASE("figures: line plot SVG has the labels, a legend and one polyline per series",
          "[figures]") {
  LinePlot p;
  p.title = "Training loss";
  p.x_label = "step";
  p.y_label = "loss";
  p.series.push_back({"train", {0, 1, 2, 3}, {4, 3, 2.5, 2.2}, false});
  p.series.push_back({"validation", {0, 1, 2, 3}, {4.2, 3.3, 2.9, 2.8}, true});
  const std::string svg = lineplot_svg(p);
  CHECK(svg.rfind("<svg", 0) == 0);
  for (const auto& s : {"Training loss", "step", "loss", "train", "validation"})
    CHECK(svg.find(std::string(">") + s + "<") != std::string::npos);
  CHECK(count(svg, "stroke=\"#1f77b4\"") == 2);  // the line and its legend sample
  CHECK(count(svg, "stroke=\"#ff7f0e\"") == 2);
  CHECK(count(svg, "stroke-dasharray") == 2);     // the dashed series and its legend sample
  CHECK(svg.find(">2.5<") != std::string::npos);  // a 1-2-5 y tick

  p.log_y = true;
  p.series[0].y = {1, 0.1, 0.01, -1};  // a non-positive value is left out on a log axis
  const std::string log_svg = lineplot_svg(p);
  CHECK(log_svg.find(">0.01<") != std::string::npos);
  CHECK(log_svg.find(">1<") != std::string::npos);

  p.series[0].y.pop_back();
  CHECK_THROWS_WITH(lineplot_svg(p),
                    Catch::Contains("series 'train' has 4 x values and 3 y values"));
}

TEST_CASE("figures: line plot PNG shows each series in its colour", "[figures]") {
  LinePlot p;
  p.title = "Loss";
  p.x_label = "step";
  p.y_label = "loss";
  Series a{"train", {}, {}, false}, b{"val", {}, {}, true};
  for (int i = 0; i < 100; ++i) {
    a.x.push_back(i), a.y.push_back(std::exp(-i / 30.0));
    b.x.push_back(i), b.y.push_back(std::exp(-i / 40.0) + 0.1);
  }
  b.y[50] = std::numeric_limits<double>::quiet_NaN();  // breaks the line
  p.series = {a, b};
  TempDir dir;
  const std::string path = dir.file("loss.png");
  write_lineplot_png(path, p);
  const Image img = decode_png(path);
  CHECK(img.w == 900);
  CHECK(img.h == 600);
  const Blob blue = find_colour(img, 31, 119, 180, 10), orange = find_colour(img, 255, 127, 14, 10);
  CHECK(blue.count > 500);
  CHECK(orange.count > 300);
  CHECK(orange.count < blue.count);  // dashed
}

TEST_CASE("figures: bar chart has one bar per value", "[figures]") {
  BarChart c;
  c.title = "Head disagreement";
  c.x_label = "site";
  c.y_label = "JS divergence";
  c.labels = {"s1", "s2", "s3", "s4"};
  c.values = {0.1, 0.4, -0.05, std::numeric_limits<double>::quiet_NaN()};
  const std::string svg = barchart_svg(c);
  CHECK(count(svg, "class=\"bar\"") == 3);
  for (const auto& s : {"Head disagreement", "site", "JS divergence", "s1", "s4", "n/a"})
    CHECK(svg.find(std::string(">") + s + "<") != std::string::npos);
  TempDir dir;
  write_barchart_png(dir.file("bars.png"), c);
  const Image img = decode_png(dir.file("bars.png"));
  CHECK(find_colour(img, 31, 119, 180, 1).count > 3 * 20 * 10);
  c.values.pop_back();
  CHECK_THROWS_WITH(barchart_svg(c), Catch::Contains("4 labels but 3 values"));
}
