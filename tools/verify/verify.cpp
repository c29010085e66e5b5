/**
 * @file verify.cpp
 * @brief verify.h: reading a candidate's results, the per-output comparison, the table.
 */
#include "verify.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>

#include "known_bugs.h"
#include "safetensors.h"

namespace mhar::verify {

namespace {

namespace fs = std::filesystem;

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (std::size_t k = 0; k < s.size(); ++k) out += (k ? ", " : "") + std::to_string(s[k]);
  return out + "]";
}

/// A row for `tensor`; a failure until graded otherwise.
VerifyRow make_row(std::string tensor, Verdict verdict = Verdict::Fail, std::string note = {}) {
  VerifyRow r;
  r.tensor = std::move(tensor);
  r.verdict = verdict;
  r.note = std::move(note);
  return r;
}

bool readable_dtype(const std::string& t) {
  return t == "F64" || t == "F32" || t == "BF16" || t == "F16";
}

/// Hints by tensor, for a case whose outputs failed (what the pattern of failures suggests).
std::vector<std::string> hints_for(const std::map<std::string, Verdict>& verdicts,
                                   const std::map<std::string, std::string>& where) {
  std::vector<std::string> h;
  const auto failed = [&](const char* n) {
    const auto it = verdicts.find(n);
    return it != verdicts.end() && it->second == Verdict::Fail;
  };
  const auto passed = [&](const char* n) {
    const auto it = verdicts.find(n);
    return it != verdicts.end() && it->second == Verdict::Pass;
  };
  for (const char* n : {"out", "alpha", "dsources", "dq", "dg", "dpartial", "dgate"}) {
    const auto it = where.find(std::string(n) + ":nan");
    if (it != where.end())
      h.push_back(std::string(n) + " holds " + it->second +
                  ": the grader fills every output with NaN before the kernel runs, so an element "
                  "the kernel never wrote stays NaN (check the grid, the bounds and the indexing); "
                  "otherwise look for 0/0, exp overflow or a negative sqrt");
  }
  if (!h.empty()) return h;
  const auto at = [&](const char* n) {
    const auto it = where.find(n);
    if (it == where.end() || it->second.empty()) return std::string();
    // The first column of a head (and not of the whole row): an off-by-one at head boundaries?
    const bool boundary = it->second.find("column 0 of") != std::string::npos &&
                          it->second.find("(head 0,") == std::string::npos;
    return " (worst at " + it->second + (boundary ? ", the first column of a head" : "") + ")";
  };
  if (failed("alpha"))
    h.push_back("alpha is wrong" + at("alpha") +
                ": check the logits: RMS over the full width d with eps, the logit scale, q·g "
                "summed over the head's own contiguous K columns, and the softmax over all N "
                "sources");
  if (passed("alpha") && failed("out"))
    h.push_back("alpha is right but out is wrong" + at("out") +
                ": check the mix: column c takes the weights of head c / K, and the values are "
                "the raw sources (and, for delta, out = partial + gate · mix)");
  if (!verdicts.count("alpha") && failed("out"))
    h.push_back("out is wrong" + at("out") + "; write alpha too, to tell the weights from the mix");
  if (passed("out") && failed("dsources"))
    h.push_back("the forward is right but dsources is wrong" + at("dsources") +
                ": the value path α·dout, the key path r·u and the RMS term −(r³/d)(Σ u·S)·S");
  if (passed("out") && (failed("dq") || failed("dg")))
    h.push_back(
        "the forward is right but dq/dg are wrong: they sum dz·r·S over positions and "
        "sources, times g (for dq) or q (for dg), and the logit scale");
  if (failed("dgate") || failed("dpartial"))
    h.push_back("delta: dpartial = dout and dgate = Σ dout · mix");
  return h;
}

}  // namespace

std::string describe_element(const Case& c, const std::string& name, long k) {
  if (k < 0) return {};
  const long P = c.in.P, d = c.in.d, H = c.spec.H, K = d / H;
  if (name == "out" || name == "dpartial") {
    const long p = k / d, col = k % d;
    return fmt::format("p {}, c {} (head {}, column {} of {})", p, col, col / K, col % K, K);
  }
  if (name == "dsources") {
    const long i = k / (P * d), p = (k / d) % P, col = k % d;
    return fmt::format("source {}, p {}, c {} (head {}, column {} of {})", i, p, col, col / K,
                       col % K, K);
  }
  if (name == "alpha") {
    const long i = k / (P * H), p = (k / H) % P, h = k % H;
    return fmt::format("source {}, p {}, head {}", i, p, h);
  }
  if (name == "dq" || name == "dg")
    return fmt::format("c {} (head {}, column {} of {})", k, k / K, k % K, K);
  return {};
}

std::string scope_name(Scope s) {
  return s == Scope::H1 ? "h1" : "all";
}

Scope parse_scope(const std::string& name) {
  if (name == "all") return Scope::All;
  if (name == "h1") return Scope::H1;
  throw std::invalid_argument("unknown scope '" + name + "' (allowed: all, h1)");
}

bool in_scope(Scope scope, const CaseSpec& s) {
  return scope == Scope::All || s.H == 1;
}

std::string decline_marker_name(const std::string& case_file) {
  const std::string ext = ".safetensors";
  const bool has_ext = case_file.size() > ext.size() &&
                       case_file.compare(case_file.size() - ext.size(), ext.size(), ext) == 0;
  return (has_ext ? case_file.substr(0, case_file.size() - ext.size()) : case_file) + ".declined";
}

namespace {

/// The candidate's values of the outputs it gave, by name (finite and of the right shape only).
using Given = std::map<std::string, std::vector<double>>;

double tolerance_of(const Case& c, const std::map<std::string, double>& yard,
                    const std::string& name) {
  return tolerance_for(c.dtype, yard.at(name));
}

/// One output of a case: its row, and its values in `given` when they can be compared.
VerifyRow grade_output(const VerifyOptions& o, const Case& c, const std::string& name,
                       const io::Tensor* t, const std::map<std::string, double>& yard,
                       Given& given) {
  VerifyRow row = make_row(name);
  const std::vector<int64_t> want = c.shape_of(name);
  const bool scalar_ok = t && want.empty() && t->numel() == 1 && t->shape.size() <= 1;
  if (!readable_dtype(t->dtype)) {
    row.note = "dtype " + t->dtype + " (allowed: F64, F32, BF16, F16)";
    return row;
  }
  if (t->shape != want && !scalar_ok) {
    row.note = "shape " + shape_str(t->shape) + ", the case needs " + shape_str(want);
    return row;
  }
  const std::vector<double> got = t->to_f64();
  for (std::size_t k = 0; k < got.size(); ++k)
    if (!std::isfinite(got[k])) {
      row.note = fmt::format("{} at element {}", got[k], k);
      const std::string w = describe_element(c, name, static_cast<long>(k));
      if (!w.empty()) row.note += " (" + w + ")";
      return row;
    }
  const std::vector<double> truth = c.truth_of(name);
  row.error = relative_error(got, truth);
  row.tolerance = tolerance_of(c, yard, name);
  row.ratio = row.error / row.tolerance;
  if (o.convention != Convention::Exact)
    row.ratio_exact = row.error / tolerance_of(c, c.yardstick, name);
  double worst = -1;
  for (std::size_t k = 0; k < got.size(); ++k)
    if (std::abs(got[k] - truth[k]) > worst) {
      worst = std::abs(got[k] - truth[k]);
      row.worst_index = static_cast<long>(k);
    }
  if (row.error <= row.tolerance) row.verdict = Verdict::Pass;
  given[name] = got;
  return row;
}

/// The eps a result fits instead of the case's, if one does: a hard-coded eps (float32's machine
/// epsilon, 0, or another common value) shows where eps matters (a near-zero source, eps 1e-2).
std::string eps_hint(const Case& c, const Given& given) {
  const std::vector<std::pair<double, std::string>> tries = {
      {std::numeric_limits<float>::epsilon(), " (float32's machine epsilon)"},
      {0.0, ""},
      {1e-5, ""},
      {1e-6, ""},
      {1e-8, ""}};
  for (const auto& [eps, what] : tries) {
    if (eps == c.spec.eps) continue;
    Case alt = c;
    alt.spec.eps = eps;
    alt.truth = general_routing(c.in, alt.conventions());
    bool fits = !given.empty();
    for (const auto& [name, got] : given)
      fits = fits && relative_error(got, alt.truth_of(name)) <= tolerance_of(c, c.yardstick, name);
    if (fits)
      return fmt::format(
          "eps: every output given matches the routing with eps = {:.3g}{} instead of the "
          "case's eps = {:.3g}: take eps from the case (metadata 'eps'), not a constant",
          eps, what, c.spec.eps);
  }
  return {};
}

/// The failing tensors of a case, comma-separated.
std::string failing(const std::map<std::string, Verdict>& verdicts) {
  std::string f;
  for (const char* n : {"out", "alpha", "dsources", "dq", "dg", "dpartial", "dgate"}) {
    const auto it = verdicts.find(n);
    if (it != verdicts.end() && it->second == Verdict::Fail) f += (f.empty() ? "" : ", ") + std::string(n);
  }
  return f;
}

/// Under exact, a bf16/f16 case whose failures all pass against a reference that rounds the
/// normalised key to the storage dtype before the gain: the hf-rmsnorm convention. Returns the
/// worst ratio under that convention (NaN when the pattern does not fit).
double hf_rmsnorm_fit(const Case& c, const Given& given,
                      const std::map<std::string, Verdict>& verdicts) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  if (c.dtype == DType::F32 || failing(verdicts).empty()) return nan;
  for (const auto& [name, v] : verdicts)
    if (v != Verdict::Pass && v != Verdict::Fail) return nan;  // a missing or unreadable tensor
  const std::map<std::string, double> yh = yardsticks(c, Convention::HfRmsnorm);
  double worst = 0;
  for (const auto& [name, v] : verdicts) {
    const auto it = given.find(name);
    if (it == given.end()) return nan;  // a NaN or a wrong shape is not a rounding convention
    worst =
        std::max(worst, relative_error(it->second, c.truth_of(name)) / tolerance_of(c, yh, name));
  }
  return worst <= 1 ? worst : nan;
}

/// What the harness fed the candidate for a bf16/f16 case: results metadata "inputs".
void note_inputs(VerifyReport& rep, const Case& c, const io::SafeTensors& res) {
  if (c.dtype == DType::F32) return;
  const auto it = res.metadata.find("inputs");
  const std::string v = it == res.metadata.end() ? "not stated" : it->second;
  if (rep.inputs.empty())
    rep.inputs = v;
  else if (rep.inputs != v)
    rep.inputs = "mixed";
}

/// The repeat check of one case: every tensor of the second run has the same bits.
VerifyRow repeat_row(const std::string& r2, const io::SafeTensors& res) {
  VerifyRow row = make_row("(repeat)");
  if (!fs::exists(r2)) {
    row.verdict = Verdict::Missing;
    row.note = "no " + r2;
    return row;
  }
  io::SafeTensors res2;
  try {
    res2 = io::load_safetensors(r2);
  } catch (const io::FormatError& err) {
    row.verdict = Verdict::Fail;
    row.note = err.what();
    return row;
  }
  int same = 0;
  std::string differ;
  for (const auto& [name, t] : res.tensors) {
    const io::Tensor* t2 = res2.find(name);
    if (!t2) {
      differ += (differ.empty() ? "" : "; ") + name + " missing in " + r2;
      continue;
    }
    if (t2->dtype != t.dtype || t2->shape != t.shape || t2->bytes != t.bytes) {
      long n = 0;
      if (t2->bytes.size() == t.bytes.size())
        for (std::size_t k = 0; k < t.bytes.size(); k += io::dtype_size(t.dtype))
          n += std::memcmp(&t.bytes[k], &t2->bytes[k], io::dtype_size(t.dtype)) != 0;
      differ += (differ.empty() ? "" : "; ") + name + fmt::format(" differs ({} elements)", n);
    } else {
      ++same;
    }
  }
  row.verdict = differ.empty() ? Verdict::Pass : Verdict::Fail;
  row.note = differ.empty() ? fmt::format("{} tensors, identical bits", same) : differ;
  return row;
}

/// A case whose failures fit hf-rmsnorm, for the report's note.
struct HfFit {
  std::string why, dtype, failing;
  bool out_passes = false;
};

/// Grades one case's results: its rows, its hints, the report's counts.
class CaseGrader {
 public:
  CaseGrader(const VerifyOptions& o, VerifyReport& rep, const ManifestEntry& e, const Case& c)
      : o_(o), rep_(rep), e_(e), c_(c) {}

  /// Returns the case's hf-rmsnorm fit under exact, if its failures have that pattern.
  std::optional<HfFit> run() {
    const std::string rpath = (fs::path(o_.results) / e_.file).string();
    const std::string dpath = (fs::path(o_.results) / decline_marker_name(e_.file)).string();
    const bool declined = fs::exists(dpath);
    if (declined && fs::exists(rpath)) {
      add(make_row("(case)", Verdict::Fail, "both " + rpath + " and the decline marker " + dpath));
      return std::nullopt;
    }
    if (declined) {
      add(make_row("(case)", Verdict::Declined, "declined by the candidate: " + first_line(dpath)));
      rep_.declined_h1 += c_.spec.H == 1;
      return std::nullopt;
    }
    if (!fs::exists(rpath)) {
      add(make_row("(case)", Verdict::Missing, "no " + rpath));
      return std::nullopt;
    }
    io::SafeTensors res;
    try {
      res = io::load_safetensors(rpath);
    } catch (const io::FormatError& err) {
      add(make_row("(file)", Verdict::Fail, err.what()));
      return std::nullopt;
    }
    ++rep_.cases_graded;
    note_inputs(rep_, c_, res);
    grade_outputs(res, rpath);
    std::optional<HfFit> fit = add_hints();
    if (rep_.repeat) {
      const VerifyRow repeat = repeat_row((fs::path(o_.repeat) / e_.file).string(), res);
      add(repeat);
      if (repeat.note.find(" differs (") != std::string::npos)
        add(make_row("(hint)", Verdict::Hint, race_hint(repeat.note)));
    }
    return fit;
  }

 private:
  void add(VerifyRow row) {
    row.file = e_.file;
    row.why = c_.spec.why;
    switch (row.verdict) {  // every verdict named: a new one does not compile unnoticed (-Wswitch)
      case Verdict::Pass: ++rep_.pass; break;
      case Verdict::Fail: ++rep_.fail; break;
      case Verdict::Missing: ++rep_.missing; break;
      case Verdict::Declined: ++rep_.declined; break;
      case Verdict::NotChecked: ++rep_.not_checked; break;
      case Verdict::Hint: break;  // advice, not a grade
    }
    rep_.rows.push_back(std::move(row));
  }

  static std::string first_line(const std::string& path) {
    std::ifstream in(path);
    std::string line;
    std::getline(in, line);
    return line.empty() ? "no reason given" : line;
  }

  void track_worst(const VerifyRow& row) {
    const std::string at = e_.file + " " + row.tensor;
    if (!std::isnan(row.ratio) && row.ratio > rep_.worst.ratio) rep_.worst = {row.ratio, at};
    const double ex = o_.convention == Convention::Exact ? row.ratio : row.ratio_exact;
    if (!std::isnan(ex) && ex > rep_.worst_exact.ratio) rep_.worst_exact = {ex, at};
  }

  void grade_outputs(const io::SafeTensors& res, const std::string& rpath) {
    const Conventions conv = c_.conventions();
    const std::map<std::string, double> yard =
        o_.convention == Convention::Exact ? c_.yardstick : yardsticks(c_, o_.convention);
    const std::vector<std::string> outs = all_outputs(conv);
    for (const std::string& name : outs) {
      const io::Tensor* t = res.find(name);
      if (o_.forward_only && !is_forward_output(name)) {
        add(make_row(name, Verdict::NotChecked,
                     t ? "--forward-only (given, not graded)" : "--forward-only"));
        continue;
      }
      if (!t) {
        if (name == "alpha") continue;  // optional
        add(make_row(name, Verdict::Missing, "no tensor '" + name + "' in " + rpath));
        verdicts_[name] = Verdict::Missing;
        continue;
      }
      VerifyRow row = grade_output(o_, c_, name, t, yard, given_);
      if (row.worst_index >= 0) where_[name] = describe_element(c_, name, row.worst_index);
      if (row.verdict == Verdict::Fail && row.worst_index >= 0) row.note = "worst at " + where_[name];
      if (row.verdict == Verdict::Fail && row.worst_index < 0 &&
          row.note.find(" at element ") != std::string::npos)
        where_[name + ":nan"] = row.note;
      verdicts_[name] = row.verdict;
      track_worst(row);
      add(row);
    }
    // A NaN anywhere fails: also in tensors the case does not grade.
    for (const auto& [name, t] : res.tensors) {
      if (std::find(outs.begin(), outs.end(), name) != outs.end() || !readable_dtype(t.dtype))
        continue;
      const std::vector<double> v = t.to_f64();
      for (std::size_t k = 0; k < v.size(); ++k)
        if (!std::isfinite(v[k])) {
          add(make_row(
              name, Verdict::Fail,
              fmt::format("{} at element {} (an extra tensor; a NaN anywhere fails)", v[k], k)));
          break;
        }
    }
  }

  /// A specific diagnosis (another eps, the hf-rmsnorm rounding) replaces the hints by tensor.
  std::optional<HfFit> add_hints() {
    if (failing(verdicts_).empty()) {
      for (const std::string& hint : hints_for(verdicts_, where_))
        add(make_row("(hint)", Verdict::Hint, hint));
      return std::nullopt;
    }
    if (o_.convention == Convention::Exact) {
      const double ratio = hf_rmsnorm_fit(c_, given_, verdicts_);
      if (!std::isnan(ratio)) {
        const auto out = verdicts_.find("out");
        HfFit fit{c_.spec.why, dtype_name(c_.dtype), failing(verdicts_),
                  out != verdicts_.end() && out->second == Verdict::Pass};
        add(make_row("(hint)", Verdict::Hint,
                     fmt::format("{} fail{}, yet every output is within tolerance of a reference "
                                 "that rounds the normalised key to {} before the gain (worst "
                                 "ratio {:.3f} there): consistent with hf-rmsnorm; rerun with "
                                 "--convention hf-rmsnorm to grade it under that convention",
                                 fit.failing, fit.out_passes ? " while out passes" : "",
                                 dtype_name(c_.dtype), ratio)));
        return fit;
      }
    }
    // Before eps: a kernel that never rescales can also fit some other eps (delta, null source).
    if (const auto out = given_.find("out"); out != given_.end() && where_.count("out"))
      if (const std::string h = missing_rescale_hint(c_, out->second); !h.empty()) {
        add(make_row("(hint)", Verdict::Hint, h));  // known_bugs.h: the pattern names the bug
        return std::nullopt;
      }
    if (const std::string h = eps_hint(c_, given_); !h.empty()) {
      add(make_row("(hint)", Verdict::Hint, h));
      return std::nullopt;
    }
    for (const std::string& hint : hints_for(verdicts_, where_))
      add(make_row("(hint)", Verdict::Hint, hint));
    return std::nullopt;
  }

  const VerifyOptions& o_;
  VerifyReport& rep_;
  const ManifestEntry& e_;
  const Case& c_;
  Given given_;
  std::map<std::string, Verdict> verdicts_;
  std::map<std::string, std::string> where_;
};

/// The report's note when every failure fits hf-rmsnorm (bf16/f16 cases only, f32 all passing).
void note_hf_rmsnorm(VerifyReport& rep, const std::vector<HfFit>& fits, int fails_in_fits) {
  if (fits.empty() || fails_in_fits != rep.fail) return;
  std::set<std::string> whys, dtypes;
  std::string all_failing, t, w;
  bool out_passes = true;
  for (const HfFit& f : fits) {
    out_passes = out_passes && f.out_passes;
    whys.insert(f.why);
    dtypes.insert(f.dtype);
    all_failing += f.failing + ", ";
  }
  std::vector<std::string> names;
  for (const char* n : {"out", "alpha", "dsources", "dq", "dg", "dpartial", "dgate"})
    if (all_failing.find(std::string(n) + ",") != std::string::npos) names.emplace_back(n);
  for (std::size_t k = 0; k < names.size(); ++k)
    t += (k == 0 ? "" : k + 1 == names.size() ? " and " : ", ") + names[k];
  for (const auto& x : whys) w += (w.empty() ? "" : "; ") + x;
  rep.notes.push_back(fmt::format(
      "{} fail only in {} {} case{} ({}){}, and every f32 row passes: consistent with rounding "
      "the normalised key to {} before the gain (hf-rmsnorm); rerun with --convention hf-rmsnorm "
      "to grade it under that convention",
      t, fits.size(), dtypes.size() == 1 ? *dtypes.begin() : "bf16/f16",
      fits.size() == 1 ? "" : "s", w, out_passes ? ", while out passes" : "",
      dtypes.size() == 1 ? *dtypes.begin() : "the storage dtype"));
}

}  // namespace

VerifyReport verify_results(const VerifyOptions& o) {
  const Manifest m = load_manifest(o.cases);
  VerifyReport rep;
  rep.forward_only = o.forward_only;
  rep.repeat = !o.repeat.empty();
  rep.serves = o.serves;
  rep.convention = o.convention;
  rep.rule = fmt::format(
      "error = max |result - truth| / max |truth| over a tensor; it passes when error <= {} x "
      "yardstick + floor, yardstick = that error for the reference computed in the case's dtype "
      "with float accumulation{}, floor = {} x unit roundoff (f32 {:.1e}, bf16 {:.1e}, f16 {:.1e})",
      kToleranceK,
      o.convention == Convention::HfRmsnorm
          ? " (hf-rmsnorm: its normalised key rounded to the case's dtype before the gain)"
          : "",
      kFloorUlps, tolerance_floor(DType::F32), tolerance_floor(DType::BF16),
      tolerance_floor(DType::F16));
  if (!fs::is_directory(o.results)) throw CaseError(o.results + ": no such results directory");
  if (rep.repeat && !fs::is_directory(o.repeat))
    throw CaseError(o.repeat + ": no such results directory (--repeat)");

  std::vector<HfFit> fits;
  int fails_in_fits = 0;
  for (const ManifestEntry& e : m.cases) {
    const Case c = load_case((fs::path(o.cases) / e.file).string());
    if (!in_scope(o.serves, c.spec)) {
      ++rep.cases_out_of_scope;
      continue;
    }
    ++rep.cases_in_scope;
    const int fails_before = rep.fail;
    if (std::optional<HfFit> fit = CaseGrader(o, rep, e, c).run()) {
      fits.push_back(*fit);
      fails_in_fits += rep.fail - fails_before;
    }
  }
  note_hf_rmsnorm(rep, fits, fails_in_fits);
  return rep;
}

namespace {

std::string num_or_dash(double x) {
  return std::isnan(x) ? "-" : fmt::format("{:.2e}", x);
}

/// The first line: the scope and the convention the verdict is for.
std::string scope_line(const VerifyReport& r) {
  const int n = r.cases_in_scope + r.cases_out_of_scope;
  std::string s = r.serves == Scope::H1
                      ? fmt::format(
                            "scope: h1 (single-head, --serves h1): the {} case files of {} "
                            "with H = 1 are graded, the {} with H > 1 are out of scope",
                            r.cases_in_scope, n, r.cases_out_of_scope)
                      : fmt::format(
                            "scope: all (every case; --serves h1 for a single-head "
                            "kernel): {} case files",
                            n);
  return s + "; convention: " + convention_name(r.convention) + "\n";
}

/// What fed the bf16/f16 cases, for the verdict line.
std::string inputs_clause(const std::string& inputs) {
  if (inputs.empty()) return {};
  if (inputs == "case") return "; bf16/f16 inputs: in the case's dtype";
  if (inputs == "float32")
    return "; bf16/f16 inputs: upcast to float32 (the bf16/f16 rows then test how the outputs "
           "are stored, not bf16 arithmetic)";
  return "; bf16/f16 inputs: " + inputs;
}

std::string verdict_line(const VerifyReport& r) {
  const std::string word = r.ok() ? "PASS" : (r.fail == 0 ? "INCOMPLETE" : "FAIL");
  std::string s = fmt::format(
      "{}: {} pass, {} fail, {} missing, {} declined, {} not checked; {} within scope {} ({} of {} "
      "cases graded){}",
      word, r.pass, r.fail, r.missing, r.declined, r.not_checked,
      r.complete() ? "COMPLETE" : "INCOMPLETE", scope_name(r.serves), r.cases_graded,
      r.cases_in_scope, inputs_clause(r.inputs));
  if (r.missing) s += " (missing is never a pass)";
  if (r.declined)
    s += r.serves == Scope::All && r.declined_h1 == 0
             ? " (declined is not a pass; a single-head candidate declares --serves h1)"
             : " (declined is not a pass)";
  return s + "\n";
}

std::string row_line(const VerifyReport& r, const VerifyRow& row, std::size_t wf, std::size_t ww) {
  const auto ratio = [](double x) {
    return std::isnan(x) ? std::string("-") : fmt::format("{:.3f}", x);
  };
  const std::string why = row.why.size() > ww ? row.why.substr(0, ww - 3) + "..." : row.why;
  const std::string exact =
      r.convention == Convention::Exact ? "" : fmt::format(" {:>8}", ratio(row.ratio_exact));
  return fmt::format("{:<{}}  {:<{}}  {:<12} {:>9} {:>9} {:>8}{}  {}{}\n", row.file, wf, why, ww,
                     row.tensor, num_or_dash(row.error), num_or_dash(row.tolerance),
                     ratio(row.ratio), exact, verdict_name(row.verdict), row.note.empty() ? "" : ": " + row.note);
}

}  // namespace

const char* verdict_name(Verdict v) {
  switch (v) {
    case Verdict::Pass: return "pass";
    case Verdict::Fail: return "FAIL";
    case Verdict::Missing: return "missing";
    case Verdict::Declined: return "declined";
    case Verdict::NotChecked: return "not checked";
    case Verdict::Hint: return "hint";
  }
  return "?";
}

std::string format_report(const VerifyReport& r) {
  std::string s = scope_line(r) + "tolerance: " + r.rule + "\n";
  if (r.forward_only)
    s += "--forward-only: a forward-only candidate; out and alpha are graded, the gradients are "
         "not checked\n";
  std::size_t wf = 4, ww = 3;
  for (const auto& row : r.rows) {
    wf = std::max(wf, row.file.size());
    ww = std::max(ww, row.why.size());
  }
  ww = std::min<std::size_t>(ww, 48);
  s += fmt::format("{:<{}}  {:<{}}  {:<12} {:>9} {:>9} {:>8}{}  {}\n", "case", wf, "why", ww,
                   "tensor", "error", "tolerance", "ratio",
                   r.convention == Convention::Exact ? "" : fmt::format(" {:>8}", "exact"),
                   "verdict");
  for (const auto& row : r.rows) {
    if (row.verdict == Verdict::NotChecked && r.forward_only) continue;  // said once, above
    if (row.verdict == Verdict::Hint)
      s += fmt::format("{:<{}}  hint: {}\n", row.file, wf, row.note);
    else
      s += row_line(r, row, wf, ww);
  }
  for (const std::string& n : r.notes) s += "hint: " + n + "\n";
  s += verdict_line(r);
  if (r.convention != Convention::Exact)
    s += fmt::format(
        "precision cost of {}: worst ratio {:.3f} under exact ({}), {:.3f} under {} ({})\n",
        convention_name(r.convention), r.worst_exact.ratio, r.worst_exact.at, r.worst.ratio,
        convention_name(r.convention), r.worst.at);
  for (const auto& row : r.rows)
    if (row.verdict == Verdict::Fail) {
      std::string what =
          std::isnan(row.error)
              ? row.note
              : fmt::format("error {:.3e} > tolerance {:.3e} ({:.1f}x){}", row.error, row.tolerance,
                            row.ratio, row.note.empty() ? "" : ", " + row.note);
      s += fmt::format("first failure: case {} tensor {}: {}\n", row.file, row.tensor, what);
      break;
    }
  return s;
}

nlohmann::ordered_json report_json(const VerifyReport& r) {
  nlohmann::ordered_json j;
  j["rule"] = r.rule;
  j["k"] = kToleranceK;
  j["floor_ulps"] = kFloorUlps;
  j["scope"] = scope_name(r.serves);
  j["convention"] = convention_name(r.convention);
  j["forward_only"] = r.forward_only;
  j["repeat"] = r.repeat;
  j["inputs"] = r.inputs;
  j["rows"] = nlohmann::ordered_json::array();
  const auto num = [](double x) -> nlohmann::ordered_json {
    return std::isnan(x) ? nlohmann::ordered_json() : nlohmann::ordered_json(x);
  };
  for (const auto& row : r.rows)
    j["rows"].push_back({{"case", row.file},
                         {"why", row.why},
                         {"tensor", row.tensor},
                         {"error", num(row.error)},
                         {"tolerance", num(row.tolerance)},
                         {"ratio", num(row.ratio)},
                         {"ratio_exact", num(row.ratio_exact)},
                         {"verdict", verdict_name(row.verdict)},
                         {"note", row.note}});
  j["notes"] = r.notes;
  j["summary"] = {{"pass", r.pass},
                  {"fail", r.fail},
                  {"missing", r.missing},
                  {"declined", r.declined},
                  {"not_checked", r.not_checked},
                  {"cases_in_scope", r.cases_in_scope},
                  {"cases_out_of_scope", r.cases_out_of_scope},
                  {"cases_graded", r.cases_graded}};
  j["worst_ratio"] = {{"ratio", r.worst.ratio}, {"at", r.worst.at}};
  j["worst_ratio_exact"] = {{"ratio", r.worst_exact.ratio}, {"at", r.worst_exact.at}};
  j["complete"] = r.complete();
  j["pass"] = r.ok();
  return j;
}

}  // namespace mhar::verify
