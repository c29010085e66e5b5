/**
 * @file test_fuzz.cpp
 * @brief A seeded mutation test of the three readers a user's file reaches: the checkpoint
 *        (load_checkpoint), the optimizer state (load_optimizer) and a verify result set
 *        (verify_results). A few thousand mutants of valid files (bit flips, cuts, inserted
 *        bytes, and mutations aimed at the header's JSON: numbers that are not exact integers,
 *        duplicate keys, deep nesting, shifted offsets, another dtype, step or version, config
 *        values out of range) go through each reader in process. Every outcome must be a clean
 *        refusal (our exception, naming the file, no library text) or a harmless acceptance
 *        (finite values of the right shapes, the step a decimal integer); the counts by outcome
 *        are printed. MHAR_FUZZ_DUMP=DIR also writes every mutant there, to run old binaries
 *        on (tests/tools/fuzz_cli.sh).
 */
#include <fmt/format.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "checkpoint.h"
#include "errors.h"
#include "safetensors.h"
#include "verify.h"

namespace fs = std::filesystem;

namespace {

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_bytes(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

/// A file split into its header text and its data area.
struct Parts {
  std::string header, data;
};

Parts split(const std::string& file) {
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i)
    n |= static_cast<uint64_t>(static_cast<unsigned char>(file[i])) << (8 * i);
  return {file.substr(8, n), file.substr(8 + n)};
}

std::string join(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return out + header + data;
}

/// The mutants of one valid file, drawn from `rng`.
class Mutator {
 public:
  Mutator(std::string file, uint64_t seed) : file_(std::move(file)), rng_(seed) {
    parts_ = split(file_);
    header_ = nlohmann::ordered_json::parse(parts_.header);
  }

  std::string next() {
    switch (pick(12)) {
      case 0:
        return flip_bits();
      case 1:
        return cut();
      case 2:
        return splice_bytes();
      case 3:
        return replace_number();
      case 4:
        return json_edit([&](nlohmann::ordered_json& h) { shift_offsets(h); });
      case 5:
        return json_edit([&](nlohmann::ordered_json& h) { change_dtype(h); });
      case 6:
        return json_edit([&](nlohmann::ordered_json& h) { change_metadata(h); });
      case 7:
        return json_edit([&](nlohmann::ordered_json& h) { change_config(h); });
      case 8:
        return duplicate_key();
      case 9:
        return nest_deep();
      case 10:
        return join(parts_.header, parts_.data + std::string(1 + pick(16), '\0'));
      default:
        return flip_data();
    }
  }

 private:
  std::size_t pick(std::size_t n) {
    return std::uniform_int_distribution<std::size_t>(0, n - 1)(rng_);
  }

  /// 1 to 4 random bits anywhere in the length field or the header.
  std::string flip_bits() {
    std::string f = file_;
    for (std::size_t k = 0, n = 1 + pick(4); k < n; ++k)
      f[pick(8 + parts_.header.size())] ^= static_cast<char>(1 << pick(8));
    return f;
  }
  std::string flip_data() {
    std::string f = file_;
    if (!parts_.data.empty())
      f[8 + parts_.header.size() + pick(parts_.data.size())] ^= static_cast<char>(0xff);
    return f;
  }
  std::string cut() { return file_.substr(0, pick(file_.size())); }
  /// Random bytes inserted into or deleted from the header, the length field kept or fixed.
  std::string splice_bytes() {
    std::string h = parts_.header;
    const std::size_t at = pick(h.size());
    if (pick(2)) {
      std::string junk(1 + pick(8), '\0');
      for (char& c : junk) c = static_cast<char>(pick(256));
      h.insert(at, junk);
    } else {
      h.erase(at, 1 + pick(8));
    }
    return pick(2) ? join(h, parts_.data) : file_.substr(0, 8) + h + parts_.data;
  }
  /// A number of the header replaced by something that is not an exact integer in range.
  std::string replace_number() {
    static const char* bad[] = {"32.5",
                                "true",
                                "-1",
                                "1e3",
                                "1e999",
                                "18446744073709551616",
                                "9223372036854775808",
                                "null",
                                "\"8\"",
                                "[]",
                                "{}",
                                "0",
                                "4294967328"};
    std::string h = parts_.header;
    std::vector<std::size_t> starts;
    for (std::size_t i = 0; i < h.size(); ++i)
      if (std::isdigit(static_cast<unsigned char>(h[i])) &&
          (i == 0 || (!std::isalnum(static_cast<unsigned char>(h[i - 1])) && h[i - 1] != '"')))
        starts.push_back(i);
    if (starts.empty()) return file_;
    const std::size_t at = starts[pick(starts.size())];
    std::size_t end = at;
    while (end < h.size() && std::isdigit(static_cast<unsigned char>(h[end]))) ++end;
    h.replace(at, end - at, bad[pick(std::size(bad))]);
    return join(h, parts_.data);
  }
  template <typename Edit>
  std::string json_edit(Edit edit) {
    nlohmann::ordered_json h = header_;
    edit(h);
    return join(h.dump(), parts_.data);
  }
  std::vector<std::string> tensor_names(const nlohmann::ordered_json& h) {
    std::vector<std::string> names;
    for (const auto& [k, v] : h.items())
      if (k != "__metadata__") names.push_back(k);
    return names;
  }
  void shift_offsets(nlohmann::ordered_json& h) {
    const auto names = tensor_names(h);
    auto& off = h[names[pick(names.size())]]["data_offsets"];
    const int64_t delta = static_cast<int64_t>(pick(9)) - 4;
    const int which = static_cast<int>(pick(3));
    if (which != 1) off[0] = std::max<int64_t>(0, off[0].get<int64_t>() + delta);
    if (which != 0) off[1] = std::max<int64_t>(0, off[1].get<int64_t>() + delta);
  }
  void change_dtype(nlohmann::ordered_json& h) {
    static const char* dtypes[] = {"F64", "I64", "BF16", "F16", "U8", "F8_E4M3", ""};
    const auto names = tensor_names(h);
    h[names[pick(names.size())]]["dtype"] = dtypes[pick(std::size(dtypes))];
  }
  void change_metadata(nlohmann::ordered_json& h) {
    static const char* steps[] = {"20abc", "1e3", "-1", " 5", "", "99999999999999999999",
                                  "+3",    "7"};
    static const char* versions[] = {"2", "0", "1.0", " 1", ""};
    auto& m = h["__metadata__"];
    switch (pick(4)) {
      case 0:
        m["step"] = steps[pick(std::size(steps))];
        break;
      case 1:
        m["format_version"] = versions[pick(std::size(versions))];
        break;
      case 2:
        m["format"] = "mhar.other";
        break;
      default:
        m.erase(m.begin().key());
    }
  }
  void change_config(nlohmann::ordered_json& h) {
    auto& m = h["__metadata__"];
    if (!m.contains("config")) return change_metadata(h);
    nlohmann::ordered_json c = nlohmann::ordered_json::parse(m["config"].get<std::string>());
    static const char* fields[] = {"d", "L", "n_head",   "n_kv_head", "ffn",
                                   "T", "H", "n_blocks", "vocab"};
    const nlohmann::ordered_json values[] = {
        32.5, true, -1, 0, 4294967328LL, 10000000, 2147483644, 9223372036854775807LL, "8", nullptr};
    const char* field = fields[pick(std::size(fields))];
    if (pick(5) == 0)
      c.erase(field);
    else
      c[field] = values[pick(std::size(values))];
    m["config"] = c.dump();
  }
  /// A key given twice: a tensor entry, __metadata__, or a metadata key.
  std::string duplicate_key() {
    std::string h = parts_.header;
    const std::size_t close = h.rfind('}');
    const auto names = tensor_names(header_);
    const std::string name = names[pick(names.size())];
    const std::string again = pick(2) ? ",\"" + name + "\":" + header_[name].dump()
                                      : ",\"__metadata__\":{\"step\":\"1\"}";
    h.insert(close, again);
    return join(h, parts_.data);
  }
  /// A value nested 100,000 deep in place of an entry, or in the metadata.
  std::string nest_deep() {
    const std::size_t depth = 100000;
    const std::string deep = std::string(depth, '[') + std::string(depth, ']');
    std::string h = parts_.header;
    h.insert(h.rfind('}'), ",\"deep\":" + deep);
    return join(h, parts_.data);
  }

  std::string file_;
  Parts parts_;
  nlohmann::ordered_json header_;
  std::mt19937_64 rng_;
};

/// How one reader answered one mutant.
enum class Outcome { Refused, AcceptedSame, AcceptedChanged, Unclean };

const char* outcome_name(Outcome o) {
  switch (o) {
    case Outcome::Refused:
      return "clean refusal";
    case Outcome::AcceptedSame:
      return "accepted, same content";
    case Outcome::AcceptedChanged:
      return "accepted, other finite values";
    default:
      return "UNCLEAN (wrong exception or message)";
  }
}

/// A refusal is clean when it is our exception, names the file and carries no library text.
Outcome refusal(const std::string& msg, const std::string& path, bool ours) {
  const bool clean = ours && msg.find(path) != std::string::npos &&
                     msg.find("json.exception") == std::string::npos &&
                     msg.find("basic_string") == std::string::npos;
  if (!clean) WARN("unclean refusal of " << path << ": " << msg);
  return clean ? Outcome::Refused : Outcome::Unclean;
}

template <typename Read>
Outcome attempt(const std::string& path, Read read) {
  try {
    return read();
  } catch (const mhar::toy::UsageError& e) {
    return refusal(e.what(), path, true);
  } catch (const mhar::io::FormatError& e) {
    return refusal(e.what(), path, true);
  } catch (const std::exception& e) {
    return refusal(e.what(), path, false);
  }
}

bool all_finite(const mhar::Params<float>& p) {
  bool ok = true;
  p.for_each(
      [&](const std::string&, const mhar::Mat<float>& m, bool) { ok = ok && m.allFinite(); });
  return ok;
}

bool same(const mhar::Params<float>& a, const mhar::Params<float>& b) {
  std::vector<const mhar::Mat<float>*> bs;
  b.for_each([&](const std::string&, const mhar::Mat<float>& m, bool) { bs.push_back(&m); });
  bool eq = true;
  std::size_t k = 0;
  a.for_each(
      [&](const std::string&, const mhar::Mat<float>& m, bool) { eq = eq && m == *bs[k++]; });
  return eq;
}

/// Counts by outcome, printed and returned.
using Counts = std::map<Outcome, int>;

/// The counts are seeded, so docs/checkpoint-format.md quotes them: the quoted line must be the
/// one printed here (a changed reader or mutator updates the page).
void report(const char* reader, const Counts& counts) {
  std::string line = fmt::format("fuzz {:<12}", reader);
  int total = 0;
  for (const auto& [o, n] : counts) line += fmt::format("  {}: {}", outcome_name(o), n), total += n;
  line += fmt::format(" (of {})", total);
  fmt::print("{}\n", line);
  const std::string page = read_bytes(MHAR_CHECKPOINT_FORMAT_MD);
  INFO("docs/checkpoint-format.md must quote this line: " << line);
  CHECK(page.find("  " + line + "\n") != std::string::npos);
}

/// Writes mutant k of `kind` into MHAR_FUZZ_DUMP when it is set.
void dump(const std::string& kind, int k, const std::string& bytes) {
  const char* dir = std::getenv("MHAR_FUZZ_DUMP");
  if (!dir) return;
  fs::create_directories(fs::path(dir) / kind);
  write_bytes(fs::path(dir) / kind / fmt::format("{:05}.safetensors", k), bytes);
}

struct Scratch {
  fs::path dir = fs::temp_directory_path() / fmt::format("mhar-fuzz-{}", ::getpid());
  Scratch() {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~Scratch() { fs::remove_all(dir); }
};

mhar::Config tiny_config() {
  mhar::Config c;
  c.d = 8, c.L = 1, c.n_head = 2, c.n_kv_head = 1, c.ffn = 8, c.T = 8;
  c.mode = mhar::Mode::Mhar;
  return c;
}

constexpr int kMutants = 1200;  // per reader: a few seconds in all, well under a minute under ASan

}  // namespace

TEST_CASE("fuzz: mutated checkpoints are refused cleanly or read harmlessly", "[fuzz]") {
  Scratch s;
  const mhar::Config cfg = tiny_config();
  mhar::Rng rng(1);
  const auto params = mhar::init_params<float>(cfg, rng);
  const fs::path good = s.dir / "good.safetensors";
  mhar::toy::save_checkpoint(good.string(), cfg, params, 7, {{"seed", "1"}});
  Mutator mut(read_bytes(good), 36);
  Counts counts;
  const fs::path path = s.dir / "mutant.safetensors";
  for (int k = 0; k < kMutants; ++k) {
    const std::string bytes = mut.next();
    dump("checkpoint", k, bytes);
    write_bytes(path, bytes);
    ++counts[attempt(path.string(), [&] {
      const mhar::toy::Checkpoint ck = mhar::toy::load_checkpoint(path.string());
      REQUIRE(all_finite(ck.params));
      REQUIRE(ck.step >= 0);
      const bool unchanged = ck.step == 7 && same(ck.params, params) &&
                             mhar::toy::config_to_json(ck.cfg) == mhar::toy::config_to_json(cfg);
      return unchanged ? Outcome::AcceptedSame : Outcome::AcceptedChanged;
    })];
  }
  report("checkpoint", counts);
  CHECK(counts[Outcome::Unclean] == 0);
  CHECK(counts[Outcome::Refused] > kMutants / 2);  // the mutations reach the rules
}

TEST_CASE("fuzz: mutated optimizer states are refused cleanly or read harmlessly", "[fuzz]") {
  Scratch s;
  const mhar::Config cfg = tiny_config();
  mhar::Rng rng(2);
  const auto m = mhar::init_params<float>(cfg, rng);
  auto v = mhar::init_params<float>(cfg, rng);
  v.for_each([](const std::string&, mhar::Mat<float>& t, bool) { t = t.cwiseAbs(); });
  const fs::path good = s.dir / "good.safetensors";
  mhar::toy::save_optimizer(good.string(), m, v, 7);
  Mutator mut(read_bytes(good), 37);
  Counts counts;
  const fs::path path = s.dir / "mutant.safetensors";
  for (int k = 0; k < kMutants; ++k) {
    const std::string bytes = mut.next();
    dump("optimizer", k, bytes);
    write_bytes(path, bytes);
    ++counts[attempt(path.string(), [&] {
      auto m2 = mhar::zero_params<float>(cfg), v2 = mhar::zero_params<float>(cfg);
      const long step = mhar::toy::load_optimizer(path.string(), m2, v2);
      REQUIRE(all_finite(m2));
      REQUIRE(all_finite(v2));
      bool v_ok = true;
      v2.for_each([&](const std::string&, const mhar::Mat<float>& t, bool) {
        v_ok = v_ok && t.minCoeff() >= 0;
      });
      REQUIRE(v_ok);
      return step == 7 && same(m2, m) && same(v2, v) ? Outcome::AcceptedSame
                                                     : Outcome::AcceptedChanged;
    })];
  }
  report("optimizer", counts);
  CHECK(counts[Outcome::Unclean] == 0);
  CHECK(counts[Outcome::Refused] > kMutants / 2);
}

TEST_CASE("fuzz: mutated verify results are refused per file or graded, never abort", "[fuzz]") {
  Scratch s;
  const fs::path cases = s.dir / "cases", results = s.dir / "results";
  const auto manifest =
      mhar::verify::write_cases(cases.string(), "quick", {mhar::verify::DType::F32}, 1);
  // The candidate: the truth of the first case, as F64.
  const auto& entry = manifest.cases.front();
  const mhar::verify::Case c = mhar::verify::load_case((cases / entry.file).string());
  mhar::io::SafeTensors st;
  for (const std::string& name : mhar::verify::required_outputs(c.conventions())) {
    const std::vector<double> t = c.truth_of(name);
    st.tensors.emplace_back(name, mhar::io::Tensor::from_f64(c.shape_of(name), t.data()));
  }
  fs::create_directories(results);
  const fs::path good = s.dir / "good.safetensors";
  mhar::io::save_safetensors(good.string(), st);
  // One case in the manifest keeps each verify short.
  nlohmann::json mj = nlohmann::json::parse(read_bytes(cases / "manifest.json"));
  mj["cases"] = nlohmann::json::array({mj["cases"][0]});
  write_bytes(cases / "manifest.json", mj.dump());
  st.metadata["note"] = "x";  // a metadata map for the metadata mutations to work on
  mhar::io::save_safetensors(good.string(), st);

  Mutator mut(read_bytes(good), 38);
  Counts counts;
  const fs::path path = results / entry.file;
  mhar::verify::VerifyOptions o;
  o.cases = cases.string(), o.results = results.string();
  for (int k = 0; k < kMutants; ++k) {
    const std::string bytes = mut.next();
    dump("verify", k, bytes);
    write_bytes(path, bytes);
    // verify never throws for a candidate's file: each problem is a row of the report.
    const auto grade = [&] {
      try {
        const mhar::verify::VerifyReport r = mhar::verify::verify_results(o);
        for (const auto& row : r.rows)
          if (row.tensor == "(file)") return refusal(row.note, path.string(), true);
        return r.ok() ? Outcome::AcceptedSame : Outcome::AcceptedChanged;
      } catch (const std::exception& e) {
        return refusal(e.what(), path.string(), false);
      }
    };
    ++counts[grade()];
  }
  report("verify", counts);
  CHECK(counts[Outcome::Unclean] == 0);
  CHECK(counts[Outcome::Refused] > kMutants / 4);
}
