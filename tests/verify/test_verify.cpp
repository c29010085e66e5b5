/**
 * @file test_verify.cpp
 * @brief The conformance cases and the grader (tools/verify/cases.h, verify.h): the quick set
 *        covers what it promises, case files round-trip and are validated, and the grader passes
 *        the truth, fails what is wrong, NaN or misshapen, and never counts a missing case or
 *        tensor as a pass. The planted mistakes are in tests/verify/CMakeLists.txt (Python).
 */
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <set>

#include "../io/temp_dir.h"
#include "cases.h"
#include "half.h"
#include "known_bugs.h"
#include "safetensors.h"
#include "verify.h"

using namespace mhar::verify;
namespace fs = std::filesystem;
using mhar::io::test::TempDir;

namespace {

/// Writes results for every case of `dir` into `out`: the truth itself (F64), or the float
/// reference rounded to `as` (F32 or BF16), optionally changed by `edit`.
void write_results(const std::string& dir, const std::string& out, const std::string& as,
                   const std::function<void(const Case&, mhar::io::SafeTensors&)>& edit = {}) {
  fs::create_directories(out);
  for (const ManifestEntry& e : load_manifest(dir).cases) {
    const Case c = load_case(dir + "/" + e.file);
    mhar::io::SafeTensors st;
    for (const std::string& name : all_outputs(c.conventions())) {
      const std::vector<double> t = c.truth_of(name);
      const std::vector<float> f(t.begin(), t.end());
      st.tensors.emplace_back(
          name, as == "F64"    ? mhar::io::Tensor::from_f64(c.shape_of(name), t.data())
                : as == "BF16" ? mhar::io::Tensor::from_bf16(c.shape_of(name), f.data())
                               : mhar::io::Tensor::from_f32(c.shape_of(name), f.data()));
    }
    if (edit) edit(c, st);
    mhar::io::save_safetensors(out + "/" + e.file, st);
  }
}

mhar::io::Tensor& tensor(mhar::io::SafeTensors& st, const std::string& name) {
  for (auto& [n, t] : st.tensors)
    if (n == name) return t;
  FAIL("no tensor " << name);
  throw;
}

const VerifyRow* row(const VerifyReport& r, const std::string& file_part, const std::string& t) {
  for (const auto& x : r.rows)
    if (x.file.find(file_part) != std::string::npos && x.tensor == t) return &x;
  return nullptr;
}

}  // namespace

TEST_CASE("cases: the quick set covers every convention and every awkward shape", "[verify]") {
  const std::vector<CaseSpec> q = case_set("quick");
  const auto any = [&](auto pred) { return std::any_of(q.begin(), q.end(), pred); };
  CHECK(any([](const CaseSpec& s) { return s.N == 1; }));
  CHECK(any([](const CaseSpec& s) { return s.H == 1 && s.N > 1; }));
  CHECK(any([](const CaseSpec& s) { return s.H == s.d; }));
  CHECK(any([](const CaseSpec& s) { return s.P == 1; }));
  CHECK(any([](const CaseSpec& s) { return s.d % 32 != 0; }));
  CHECK(any([](const CaseSpec& s) {
    const int K = s.d / s.H;
    return K > 2 && (K & (K - 1)) != 0;
  }));
  CHECK(any([](const CaseSpec& s) { return s.P % 2 == 1 && s.P > 32; }));
  CHECK(any([](const CaseSpec& s) { return s.scale != 1.0; }));
  CHECK(any([](const CaseSpec& s) { return !s.gain; }));
  CHECK(any([](const CaseSpec& s) { return s.delta; }));
  CHECK(any([](const CaseSpec& s) { return s.q_sd >= 3; }));
  CHECK(any([](const CaseSpec& s) { return s.tiny_source >= 0 && s.tiny_scale <= 1e-3; }));
  CHECK(any([](const CaseSpec& s) { return s.null_source >= 0; }));
  CHECK(any([](const CaseSpec& s) { return s.eps != 1e-6; }));
  std::set<std::string> ids;
  for (const auto& s : q) CHECK(ids.insert(s.id).second);
  CHECK_THROWS_WITH(case_set("huge"), Catch::Contains("allowed: quick, full, paper"));
}

TEST_CASE("cases: a near-zero source makes eps matter, and the peaked case is peaked", "[verify]") {
  for (const CaseSpec& s : case_set("quick")) {
    if (s.id == "tiny") {
      Case c = make_case(s, DType::F32, 5);
      CaseSpec no_eps = s;
      no_eps.eps = 0;
      const Case d = make_case(no_eps, DType::F32, 5);
      CHECK(relative_error(d.truth.alpha, c.truth.alpha) > 100 * c.yardstick["alpha"]);
    }
    if (s.id == "peaked") {
      const Case c = make_case(s, DType::F32, 5);
      CHECK(*std::max_element(c.truth.alpha.begin(), c.truth.alpha.end()) > 0.99);
    }
  }
}

TEST_CASE("cases: files round-trip, inputs are rounded to the dtype, yardsticks are earned",
          "[verify]") {
  TempDir dir;
  const Manifest m = write_cases(dir.file("."), "quick", {DType::F32, DType::BF16}, 3);
  CHECK(m.cases.size() == 2 * case_set("quick").size());
  CHECK(fs::exists(dir.file(".") + "/manifest.json"));
  const Manifest back = load_manifest(dir.file("."));
  REQUIRE(back.cases.size() == m.cases.size());
  for (const ManifestEntry& e : back.cases) {
    const Case c = load_case(dir.file(".") + "/" + e.file);
    CAPTURE(e.file);
    CHECK(c.dtype == e.dtype);
    for (double x : c.in.sources) CHECK(static_cast<double>(round_to(c.dtype, float(x))) == x);
    for (const std::string& name : all_outputs(c.conventions())) {
      CAPTURE(name);
      CHECK(c.yardstick.at(name) >= 0);
      CHECK(c.yardstick.at(name) < (c.dtype == DType::F32 ? 1e-5 : 2e-2));
    }
    // The file's own metadata and dtypes, as the protocol names them.
    const mhar::io::SafeTensors st = mhar::io::load_safetensors(dir.file(".") + "/" + e.file);
    CHECK(st.metadata.at("format") == "mhar.cases");
    CHECK(st.metadata.at("dtype") == dtype_name(c.dtype));
    CHECK(st.find("sources")->dtype == (c.dtype == DType::F32 ? "F32" : "BF16"));
    CHECK(st.find("truth.out")->dtype == "F64");
    CHECK((st.find("g") != nullptr) == c.spec.gain);
    CHECK((st.find("gate") != nullptr) == c.spec.delta);
  }
  // The bf16 yardstick of out is a bf16 one: hundreds of times the f32 one.
  const Case f = load_case(dir.file(".") + "/" + back.cases[2].file);
  const Case b = load_case(dir.file(".") + "/" + back.cases[3].file);
  REQUIRE(f.spec.id == b.spec.id);
  CHECK(b.yardstick.at("out") > 100 * f.yardstick.at("out"));
}

TEST_CASE("cases: a corrupt or foreign case file is refused by name", "[verify]") {
  TempDir dir;
  write_cases(dir.file("."), "quick", {DType::F32}, 0);
  const std::string first = dir.file(".") + "/" + load_manifest(dir.file(".")).cases[0].file;
  mhar::io::SafeTensors st = mhar::io::load_safetensors(first);
  st.metadata["format"] = "something.else";
  mhar::io::save_safetensors(first, st);
  CHECK_THROWS_WITH(load_case(first), Catch::Contains("not a case file"));
  st.metadata["format"] = "mhar.cases";
  st.metadata["H"] = "5";
  mhar::io::save_safetensors(first, st);
  CHECK_THROWS_WITH(load_case(first), Catch::Contains("does not divide d"));
  std::ofstream(first) << "garbage";
  CHECK_THROWS_AS(load_case(first), CaseError);
  CHECK_THROWS_WITH(load_manifest(dir.file(".") + "/nope"), Catch::Contains("no such directory"));
  std::ofstream(dir.file(".") + "/manifest.json") << "{";
  CHECK_THROWS_WITH(load_manifest(dir.file(".")), Catch::Contains("not valid JSON"));
}

TEST_CASE("verify: the truth passes, and the float reference in the case's dtype passes",
          "[verify]") {
  TempDir dir;
  const std::string cases = dir.file(".") + "/cases";
  write_cases(cases, "quick", {DType::F32, DType::BF16}, 0);
  for (const char* as : {"F64", "F32"}) {
    write_results(cases, dir.file(".") + "/" + as, as);
    const VerifyReport r = verify_results({cases, dir.file(".") + "/" + as, "", false});
    CAPTURE(as, format_report(r));
    CHECK(r.ok());
    CHECK(r.fail == 0);
    CHECK(r.missing == 0);
    CHECK(r.pass > 100);
  }
}

TEST_CASE("verify: wrong, NaN, misshapen and missing results never pass", "[verify]") {
  TempDir dir;
  const std::string cases = dir.file(".") + "/cases", res = dir.file(".") + "/res";
  write_cases(cases, "quick", {DType::F32}, 0);
  const auto run = [&](const std::function<void(const Case&, mhar::io::SafeTensors&)>& edit,
                       bool forward_only = false) {
    fs::remove_all(res);
    write_results(cases, res, "F32", edit);
    return verify_results({cases, res, "", forward_only});
  };
  SECTION("one wrong element of dq in one case names that case and tensor") {
    const VerifyReport r = run([](const Case& c, mhar::io::SafeTensors& st) {
      if (c.spec.id == "oddp") reinterpret_cast<float*>(tensor(st, "dq").bytes.data())[5] *= 1.01f;
    });
    CHECK_FALSE(r.ok());
    CHECK(r.fail == 1);
    const VerifyRow* x = row(r, "oddp", "dq");
    REQUIRE(x);
    CHECK(x->verdict == Verdict::Fail);
    CHECK(x->note.find("c 5 (head 0, column 5 of 32)") != std::string::npos);
    CHECK(format_report(r).find("first failure: case 05-oddp.f32.safetensors tensor dq") !=
          std::string::npos);
  }
  SECTION("a NaN fails, even in an extra tensor") {
    const VerifyReport r = run([](const Case& c, mhar::io::SafeTensors& st) {
      if (c.spec.id == "h1") reinterpret_cast<float*>(tensor(st, "out").bytes.data())[0] = NAN;
      if (c.spec.id == "hd") {
        const float nan = NAN;
        st.tensors.emplace_back("scratch", mhar::io::Tensor::from_f32({1}, &nan));
      }
    });
    CHECK(r.fail == 2);
    CHECK(row(r, "h1", "out")->note.find("nan at element 0") != std::string::npos);
    CHECK(row(r, "hd", "scratch")->verdict == Verdict::Fail);
  }
  SECTION("a tensor of the wrong shape fails, naming both shapes") {
    const VerifyReport r = run([](const Case& c, mhar::io::SafeTensors& st) {
      if (c.spec.id == "k160") tensor(st, "dsources").shape = {c.in.P, c.in.N, c.in.d};
    });
    CHECK(r.fail == 1);
    CHECK(row(r, "k160", "dsources")->note == "shape [3, 4, 320], the case needs [4, 3, 320]");
  }
  SECTION("a missing tensor and a missing case are missing, not passes") {
    const VerifyReport r = run([](const Case& c, mhar::io::SafeTensors& st) {
      if (c.spec.id == "nogain")
        st.tensors.erase(st.tensors.begin() + 2);  // out, alpha, [dsources], dq
    });
    fs::remove(res + "/01-n1.f32.safetensors");
    const VerifyReport r2 = verify_results({cases, res, "", false});
    CHECK(r.fail == 0);
    CHECK(r.missing == 1);
    CHECK_FALSE(r.ok());
    CHECK(row(r, "nogain", "dsources")->verdict == Verdict::Missing);
    CHECK(r2.missing == 2);
    CHECK(row(r2, "01-n1", "(case)")->verdict == Verdict::Missing);
    CHECK(format_report(r2).find("missing is never a pass") != std::string::npos);
  }
  SECTION("--forward-only grades the forward and says the gradients are not checked") {
    const VerifyReport r = run(
        [](const Case&, mhar::io::SafeTensors& st) {
          std::erase_if(st.tensors, [](const auto& t) { return t.first != "out"; });
        },
        true);
    CHECK(r.ok());
    CHECK(r.not_checked > 0);
    CHECK(format_report(r).find("--forward-only: a forward-only candidate") != std::string::npos);
    const VerifyReport full = verify_results({cases, res, "", false});
    CHECK_FALSE(full.ok());
  }
  SECTION("an unreadable results file fails by name") {
    run({});
    std::ofstream(res + "/02-h1.f32.safetensors") << "not safetensors";
    const VerifyReport r = verify_results({cases, res, "", false});
    CHECK(row(r, "02-h1", "(file)")->verdict == Verdict::Fail);
  }
  SECTION("--repeat: identical bits pass, one flipped bit fails") {
    run({});
    const std::string res2 = dir.file(".") + "/res2";
    write_results(cases, res2, "F32");
    CHECK(verify_results({cases, res, res2, false}).ok());
    fs::remove_all(res2);
    write_results(cases, res2, "F32", [](const Case& c, mhar::io::SafeTensors& st) {
      if (c.spec.id == "delta") tensor(st, "dgate").bytes[0] ^= 1;
    });
    const VerifyReport r = verify_results({cases, res, res2, false});
    CHECK_FALSE(r.ok());
    CHECK(row(r, "delta", "(repeat)")->note.find("dgate differs (1 elements)") !=
          std::string::npos);
  }
}

TEST_CASE("verify: a bf16 result is held to a bf16 standard", "[verify]") {
  TempDir dir;
  const std::string cases = dir.file(".") + "/cases";
  write_cases(cases, "quick", {DType::F32, DType::BF16}, 0);
  // The truth stored as BF16: fine for the bf16 cases, far outside the f32 cases' tolerance.
  write_results(cases, dir.file(".") + "/b", "BF16");
  const VerifyReport r = verify_results({cases, dir.file(".") + "/b", "", false});
  int f32_fail = 0, bf16_fail = 0;
  for (const auto& x : r.rows) {
    if (x.verdict != Verdict::Fail) continue;
    (x.file.find(".bf16.") != std::string::npos ? bf16_fail : f32_fail)++;
  }
  CHECK(bf16_fail == 0);
  CHECK(f32_fail > 20);
}

TEST_CASE("cases: every convention case has an H = 1 twin, in the quick and the full set",
          "[verify]") {
  for (const char* set : {"quick", "full"}) {
    CAPTURE(set);
    const std::vector<CaseSpec> v = case_set(set);
    for (const CaseSpec& s : v) {
      if (s.H == 1 || s.id == "hd") continue;  // hd's twin would be d = 12, H = 1: nothing new
      CAPTURE(s.id);
      const auto twin =
          std::find_if(v.begin(), v.end(), [&](const CaseSpec& t) { return t.id == s.id + "-h1"; });
      REQUIRE(twin != v.end());
      CHECK(twin->H == 1);
      CHECK((twin->N == s.N && twin->P == s.P && twin->eps == s.eps && twin->scale == s.scale));
      CHECK((twin->gain == s.gain && twin->delta == s.delta && twin->gate == s.gate));
      CHECK((twin->tiny_source == s.tiny_source && twin->null_source == s.null_source));
    }
  }
  // The twins of K = 160 and of the peaked cases keep what makes them awkward.
  for (const CaseSpec& s : case_set("full")) {
    if (s.id == "k160-h1") CHECK(s.d == 160);
    if (s.id == "peaked-h1" || s.id == "verypeaked-h1") {
      const Case c = make_case(s, DType::F32, 5);
      CHECK(*std::max_element(c.truth.alpha.begin(), c.truth.alpha.end()) > 0.99);
    }
  }
}

namespace {

/// The quick cases in f32 and bf16, and the truth as every case's results.
struct QuickRun {
  TempDir dir;
  std::string cases = dir.file(".") + "/cases", res = dir.file(".") + "/res";
  QuickRun() {
    write_cases(cases, "quick", {DType::F32, DType::BF16}, 0);
    write_results(cases, res, "F64");
  }
  VerifyReport verify(Scope serves, Convention conv = Convention::Exact) const {
    VerifyOptions o{cases, res, "", false};
    o.serves = serves;
    o.convention = conv;
    return verify_results(o);
  }
};

}  // namespace

TEST_CASE("verify: --serves h1 grades every H = 1 case and no other, COMPLETE within it",
          "[verify]") {
  QuickRun run;
  int h1 = 0, all = 0;
  std::vector<std::string> others;
  for (const ManifestEntry& e : load_manifest(run.cases).cases) {
    ++all;
    if (load_case(run.cases + "/" + e.file).spec.H == 1)
      ++h1;
    else
      others.push_back(e.file);
  }
  REQUIRE(h1 >= 20);  // h1 and the ten twins, in f32 and bf16
  for (const std::string& f : others) fs::remove(run.res + "/" + f);
  const VerifyReport r = run.verify(Scope::H1);
  CAPTURE(format_report(r));
  CHECK(r.ok());
  CHECK(r.complete());
  CHECK(r.cases_in_scope == h1);
  CHECK(r.cases_graded == h1);
  CHECK(r.cases_out_of_scope == all - h1);
  const std::string text = format_report(r);
  CHECK(text.rfind("scope: h1 (single-head, --serves h1)", 0) == 0);
  CHECK(text.find("COMPLETE within scope h1 (" + std::to_string(h1) + " of " +
                  std::to_string(h1)) != std::string::npos);
  // The same results, graded as a candidate of every case: the H > 1 cases are missing.
  const VerifyReport r_all = run.verify(Scope::All);
  CHECK_FALSE(r_all.ok());
  CHECK(r_all.missing == all - h1);
  // A missing H = 1 file is missing within the scope too.
  fs::remove(run.res + "/02-h1.f32.safetensors");
  const VerifyReport r2 = run.verify(Scope::H1);
  CHECK_FALSE(r2.ok());
  CHECK(row(r2, "02-h1.f32", "(case)")->verdict == Verdict::Missing);
  CHECK(format_report(r2).find("INCOMPLETE within scope h1") != std::string::npos);
}

TEST_CASE("verify: a declined case is declined, not missing, and not a pass", "[verify]") {
  QuickRun run;
  fs::remove(run.res + "/03-hd.f32.safetensors");
  std::ofstream(run.res + "/03-hd.f32.declined") << "H = d = 12: not served\n";
  const VerifyReport r = run.verify(Scope::All);
  CHECK(r.declined == 1);
  CHECK(r.missing == 0);
  CHECK(r.fail == 0);
  CHECK_FALSE(r.ok());
  CHECK(row(r, "03-hd.f32", "(case)")->verdict == Verdict::Declined);
  CHECK(row(r, "03-hd.f32", "(case)")->note == "declined by the candidate: H = d = 12: not served");
  CHECK(format_report(r).find("1 declined") != std::string::npos);
  // A decline marker beside a results file is a contradiction: it fails.
  write_results(run.cases, run.res, "F64");
  const VerifyReport r2 = run.verify(Scope::All);
  CHECK(r2.fail == 1);
  CHECK(row(r2, "03-hd.f32", "(case)")->note.find("decline marker") != std::string::npos);
  CHECK(decline_marker_name("03-hd.f32.safetensors") == "03-hd.f32.declined");
}

TEST_CASE("verify: results computed with another eps fail, and the hint names eps", "[verify]") {
  QuickRun run;
  write_results(run.cases, run.res, "F64", [](const Case& c, mhar::io::SafeTensors& st) {
    Conventions conv = c.conventions();
    conv.eps = std::numeric_limits<float>::epsilon();
    Case alt = c;
    alt.truth = general_routing(c.in, conv);
    for (auto& [name, t] : st.tensors) {
      const std::vector<double> v = alt.truth_of(name);
      t = mhar::io::Tensor::from_f64(c.shape_of(name), v.data());
    }
  });
  const VerifyReport r = run.verify(Scope::All);
  CHECK_FALSE(r.ok());
  const VerifyRow* hint = row(r, "11-eps.f32", "(hint)");
  REQUIRE(hint);
  CHECK(hint->note.find("eps = 1.19e-07 (float32's machine epsilon) instead of the case's eps = "
                        "0.01") != std::string::npos);
  CHECK(row(r, "11-eps.f32", "alpha")->ratio > 100);
}

TEST_CASE("verify: under --convention hf-rmsnorm the yardstick rounds the key like hf-rmsnorm",
          "[verify]") {
  QuickRun run;
  // Results: the float reference with the normalised key rounded to bf16, outputs in bf16.
  write_results(run.cases, run.res, "F64", [](const Case& c, mhar::io::SafeTensors& st) {
    if (c.dtype != DType::BF16) return;
    Conventions conv = c.conventions();
    conv.round_key = mhar::io::round_to_bf16;
    const RoutingOutputs<float> f = general_routing(to_float(c.in), conv);
    Case got = c;
    const auto wide = [](const std::vector<float>& v) {
      return std::vector<double>(v.begin(), v.end());
    };
    got.truth = {wide(f.out), wide(f.alpha),    wide(f.dsources), wide(f.dq),
                 wide(f.dg),  wide(f.dpartial), f.dgate};
    for (auto& [name, t] : st.tensors) {
      const std::vector<double> v = got.truth_of(name);
      const std::vector<float> fv(v.begin(), v.end());
      t = mhar::io::Tensor::from_bf16(c.shape_of(name), fv.data());
    }
  });
  const VerifyReport hf = run.verify(Scope::All, Convention::HfRmsnorm);
  CAPTURE(format_report(hf));
  CHECK(hf.ok());
  // Its own rounding is its yardstick: each bf16 row sits at a ratio of about 1/k.
  CHECK(hf.worst.ratio < 0.2);
  CHECK(hf.worst_exact.ratio > hf.worst.ratio);
  for (const VerifyRow& x : hf.rows)
    if (x.verdict == Verdict::Pass) CHECK(!std::isnan(x.ratio_exact));
  CHECK(format_report(hf).find("precision cost of hf-rmsnorm: worst ratio") != std::string::npos);
  const Case peaked = load_case(run.cases + "/09-peaked.bf16.safetensors");
  CHECK(yardsticks(peaked, Convention::HfRmsnorm).at("dq") > peaked.yardstick.at("dq"));
  CHECK(yardsticks(peaked, Convention::Exact) == peaked.yardstick);
}

namespace {

/// The online softmax of a fused forward with the running sum's rescale left out, run as a
/// kernel would run it: logits from the inputs, then one pass over the sources.
std::vector<double> buggy_online_forward(const Case& c) {
  const int N = c.in.N, P = c.in.P, d = c.in.d, H = c.spec.H, K = d / H;
  std::vector<double> out(static_cast<std::size_t>(P) * d);
  for (int p = 0; p < P; ++p)
    for (int h = 0; h < H; ++h) {
      double m = -INFINITY, l = 0;
      std::vector<double> acc(K, 0.0);
      for (int i = 0; i < N; ++i) {
        const double* S = &c.in.sources[(static_cast<std::size_t>(i) * P + p) * d];
        double ss = 0, z = 0;
        for (int col = 0; col < d; ++col) ss += S[col] * S[col];
        for (int col = h * K; col < (h + 1) * K; ++col)
          z += c.in.q[col] * (c.spec.gain ? c.in.g[col] : 1.0) * S[col];
        z *= c.spec.scale / std::sqrt(ss / d + c.spec.eps);
        const double mn = std::max(m, z);
        l = l * std::exp(m - mn) + std::exp(z - mn);
        for (int k = 0; k < K; ++k) acc[k] += std::exp(z - mn) * S[h * K + k];  // no rescale
        m = mn;
      }
      for (int k = 0; k < K; ++k) {
        const std::size_t at = static_cast<std::size_t>(p) * d + h * K + k;
        out[at] = acc[k] / l;
        if (c.spec.delta) out[at] = c.in.partial[at] + c.in.gate * out[at];
      }
    }
  return out;
}

bool has_hint(const VerifyReport& r, const std::string& file_part, const std::string& words) {
  for (const auto& x : r.rows)
    if (x.file.find(file_part) != std::string::npos && x.tensor == "(hint)" &&
        x.note.find(words) != std::string::npos)
      return true;
  return false;
}

}  // namespace

TEST_CASE("verify: a running sum never rescaled and a race get hints of their own", "[verify]") {
  TempDir dir;
  const std::string cases = dir.file(".") + "/cases", res = dir.file(".") + "/res";
  write_cases(cases, "quick", {DType::F32}, 0);
  // The model the hint compares with is the buggy kernel's output, computed independently.
  for (const ManifestEntry& e : load_manifest(cases).cases) {
    const Case c = load_case(cases + "/" + e.file);
    CAPTURE(e.file);
    const std::vector<double> model = out_without_rescale(c), run = buggy_online_forward(c);
    CHECK(relative_error(model, run) < 1e-12);
  }
  write_results(cases, res, "F32", [](const Case& c, mhar::io::SafeTensors& st) {
    const std::vector<double> bad = out_without_rescale(c);
    const std::vector<float> f(bad.begin(), bad.end());
    tensor(st, "out") = mhar::io::Tensor::from_f32(c.shape_of("out"), f.data());
  });
  const VerifyReport r = verify_results({cases, res, "", true});
  int failed = 0;
  for (const auto& x : r.rows)
    if (x.tensor == "out" && x.verdict == Verdict::Fail) {
      ++failed;
      CAPTURE(x.file);
      CHECK(has_hint(r, x.file, "not rescaled when the running max moves"));
      CHECK_FALSE(has_hint(r, x.file, "check the mix"));
    }
  CHECK(failed >= 3);                                // the bug shows wherever the max moved
  CHECK(row(r, "01-n1", "out")->verdict == Verdict::Pass);  // one source: nothing to rescale
  // An out that is wrong in another way keeps the tensor-by-tensor hint.
  const std::string other = dir.file(".") + "/other";
  write_results(cases, other, "F32", [](const Case& c, mhar::io::SafeTensors& st) {
    if (c.spec.id == "oddp") reinterpret_cast<float*>(tensor(st, "out").bytes.data())[7] += 1.0f;
  });
  const VerifyReport r2 = verify_results({cases, other, "", true});
  CHECK(has_hint(r2, "oddp", "check the mix"));
  CHECK_FALSE(has_hint(r2, "oddp", "not rescaled"));
  // Two runs that differ: a race, with where to look for the missing barrier.
  const std::string again = dir.file(".") + "/again";
  write_results(cases, again, "F32", [](const Case& c, mhar::io::SafeTensors& st) {
    if (c.spec.id == "oddp") reinterpret_cast<float*>(tensor(st, "out").bytes.data())[7] += 1.0f;
  });
  fs::remove_all(res);
  write_results(cases, res, "F32");
  const VerifyReport r3 = verify_results({cases, res, again, true});
  CHECK(has_hint(r3, "oddp", "a race"));
  CHECK(has_hint(r3, "oddp", "__syncthreads()"));
  CHECK_FALSE(has_hint(r3, "h1", "a race"));
}
