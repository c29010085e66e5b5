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
#include <map>

#include "safetensors.h"

namespace mhar::verify {

namespace {

namespace fs = std::filesystem;

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (std::size_t k = 0; k < s.size(); ++k) out += (k ? ", " : "") + std::to_string(s[k]);
  return out + "]";
}

VerifyRow make_row(std::string tensor, std::string verdict = {}, std::string note = {}) {
  VerifyRow r;
  r.tensor = std::move(tensor);
  r.verdict = std::move(verdict);
  r.note = std::move(note);
  return r;
}

bool readable_dtype(const std::string& t) {
  return t == "F64" || t == "F32" || t == "BF16" || t == "F16";
}

/// Hints by tensor, for a case whose outputs failed (what the pattern of failures suggests).
std::vector<std::string> hints_for(const std::map<std::string, std::string>& verdicts,
                                   const std::map<std::string, std::string>& where) {
  std::vector<std::string> h;
  const auto failed = [&](const char* n) {
    const auto it = verdicts.find(n);
    return it != verdicts.end() && it->second == "FAIL";
  };
  const auto passed = [&](const char* n) {
    const auto it = verdicts.find(n);
    return it != verdicts.end() && it->second == "pass";
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

VerifyReport verify_results(const VerifyOptions& o) {
  const Manifest m = load_manifest(o.cases);
  VerifyReport rep;
  rep.forward_only = o.forward_only;
  rep.repeat = !o.repeat.empty();
  rep.rule = fmt::format(
      "error = max |result - truth| / max |truth| over a tensor; it passes when error <= {} x "
      "yardstick + floor, yardstick = that error for the reference computed in the case's dtype "
      "with float accumulation, floor = {} x unit roundoff (f32 {:.1e}, bf16 {:.1e}, f16 {:.1e})",
      kToleranceK, kFloorUlps, tolerance_floor(DType::F32), tolerance_floor(DType::BF16),
      tolerance_floor(DType::F16));
  if (!fs::is_directory(o.results)) throw CaseError(o.results + ": no such results directory");
  if (rep.repeat && !fs::is_directory(o.repeat))
    throw CaseError(o.repeat + ": no such results directory (--repeat)");

  for (const ManifestEntry& e : m.cases) {
    const Case c = load_case((fs::path(o.cases) / e.file).string());
    const Conventions conv = c.conventions();
    const auto add = [&](VerifyRow row) {
      row.file = e.file;
      row.why = c.spec.why;
      if (row.verdict == "hint") {
      } else if (row.verdict == "pass")
        ++rep.pass;
      else if (row.verdict == "FAIL")
        ++rep.fail;
      else if (row.verdict == "missing")
        ++rep.missing;
      else
        ++rep.not_checked;
      rep.rows.push_back(std::move(row));
    };
    const std::string rpath = (fs::path(o.results) / e.file).string();
    if (!fs::exists(rpath)) {
      add(make_row("(case)", "missing", "no " + rpath));
      continue;
    }
    io::SafeTensors res;
    try {
      res = io::load_safetensors(rpath);
    } catch (const io::FormatError& err) {
      add(make_row("(file)", "FAIL", err.what()));
      continue;
    }
    std::map<std::string, std::string> verdicts, where;
    for (const std::string& name : all_outputs(conv)) {
      const io::Tensor* t = res.find(name);
      VerifyRow row = make_row(name);
      if (o.forward_only && !is_forward_output(name)) {
        row.verdict = "not checked";
        row.note = "--forward-only";
        if (t) row.note += " (given, not graded)";
        add(row);
        continue;
      }
      if (!t) {
        if (name == "alpha") continue;  // optional
        row.verdict = "missing";
        row.note = "no tensor '" + name + "' in " + rpath;
        add(row);
        verdicts[name] = "missing";
        continue;
      }
      const std::vector<int64_t> want = c.shape_of(name);
      const bool scalar_ok = want.empty() && t->numel() == 1 && t->shape.size() <= 1;
      row.verdict = "FAIL";
      if (!readable_dtype(t->dtype)) {
        row.note = "dtype " + t->dtype + " (allowed: F64, F32, BF16, F16)";
      } else if (t->shape != want && !scalar_ok) {
        row.note = "shape " + shape_str(t->shape) + ", the case needs " + shape_str(want);
      } else {
        const std::vector<double> got = t->to_f64();
        long bad = -1;
        for (std::size_t k = 0; k < got.size() && bad < 0; ++k)
          if (!std::isfinite(got[k])) bad = static_cast<long>(k);
        if (bad >= 0) {
          row.note = fmt::format("{} at element {}", got[bad], bad);
          const std::string w = describe_element(c, name, bad);
          if (!w.empty()) row.note += " (" + w + ")";
          where[name + ":nan"] = row.note;
        } else {
          const std::vector<double> truth = c.truth_of(name);
          row.error = relative_error(got, truth);
          row.tolerance = kToleranceK * c.yardstick.at(name) + tolerance_floor(c.dtype);
          row.ratio = row.error / row.tolerance;
          double worst = -1;
          for (std::size_t k = 0; k < got.size(); ++k)
            if (std::abs(got[k] - truth[k]) > worst) {
              worst = std::abs(got[k] - truth[k]);
              row.worst_index = static_cast<long>(k);
            }
          where[name] = describe_element(c, name, row.worst_index);
          if (row.error <= row.tolerance)
            row.verdict = "pass";
          else
            row.note = "worst at " + where[name];
        }
      }
      verdicts[name] = row.verdict;
      add(row);
    }
    // A NaN anywhere fails: also in tensors the case does not grade.
    for (const auto& [name, t] : res.tensors) {
      const auto outs = all_outputs(conv);
      if (std::find(outs.begin(), outs.end(), name) != outs.end() || !readable_dtype(t.dtype))
        continue;
      const std::vector<double> v = t.to_f64();
      for (std::size_t k = 0; k < v.size(); ++k)
        if (!std::isfinite(v[k])) {
          add(make_row(
              name, "FAIL",
              fmt::format("{} at element {} (an extra tensor; a NaN anywhere fails)", v[k], k)));
          break;
        }
    }
    for (const std::string& hint : hints_for(verdicts, where))
      add(make_row("(hint)", "hint", hint));
    if (rep.repeat) {
      const std::string r2 = (fs::path(o.repeat) / e.file).string();
      VerifyRow row = make_row("(repeat)");
      if (!fs::exists(r2)) {
        row.verdict = "missing";
        row.note = "no " + r2;
        add(row);
        continue;
      }
      io::SafeTensors res2;
      try {
        res2 = io::load_safetensors(r2);
      } catch (const io::FormatError& err) {
        row.verdict = "FAIL";
        row.note = err.what();
        add(row);
        continue;
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
      row.verdict = differ.empty() ? "pass" : "FAIL";
      row.note = differ.empty() ? fmt::format("{} tensors, identical bits", same) : differ;
      add(row);
    }
  }
  return rep;
}

namespace {

std::string num_or_dash(double x) {
  return std::isnan(x) ? "-" : fmt::format("{:.2e}", x);
}

}  // namespace

std::string format_report(const VerifyReport& r) {
  std::string s = "tolerance: " + r.rule + "\n";
  if (r.forward_only)
    s += "--forward-only: a forward-only candidate; out and alpha are graded, the gradients are "
         "not checked\n";
  std::size_t wf = 4, ww = 3;
  for (const auto& row : r.rows) {
    wf = std::max(wf, row.file.size());
    ww = std::max(ww, row.why.size());
  }
  ww = std::min<std::size_t>(ww, 48);
  s += fmt::format("{:<{}}  {:<{}}  {:<12} {:>9} {:>9} {:>8}  {}\n", "case", wf, "why", ww,
                   "tensor", "error", "tolerance", "ratio", "verdict");
  for (const auto& row : r.rows) {
    if (row.verdict == "not checked" && r.forward_only) continue;  // said once, above
    if (row.verdict == "hint") {
      s += fmt::format("{:<{}}  hint: {}\n", row.file, wf, row.note);
      continue;
    }
    std::string why = row.why.size() > ww ? row.why.substr(0, ww - 3) + "..." : row.why;
    s += fmt::format("{:<{}}  {:<{}}  {:<12} {:>9} {:>9} {:>8}  {}{}\n", row.file, wf, why, ww,
                     row.tensor, num_or_dash(row.error), num_or_dash(row.tolerance),
                     std::isnan(row.ratio) ? "-" : fmt::format("{:.3f}", row.ratio), row.verdict,
                     row.note.empty() ? "" : ": " + row.note);
  }
  s += fmt::format("{}: {} pass, {} fail, {} missing, {} not checked{}\n",
                   r.ok() ? "PASS" : (r.fail == 0 && r.missing > 0 ? "INCOMPLETE" : "FAIL"), r.pass,
                   r.fail, r.missing, r.not_checked,
                   r.ok() ? "" : (r.missing && !r.fail ? " (missing is never a pass)" : ""));
  for (const auto& row : r.rows)
    if (row.verdict == "FAIL") {
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
  j["forward_only"] = r.forward_only;
  j["repeat"] = r.repeat;
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
                         {"verdict", row.verdict},
                         {"note", row.note}});
  j["summary"] = {
      {"pass", r.pass}, {"fail", r.fail}, {"missing", r.missing}, {"not_checked", r.not_checked}};
  j["pass"] = r.ok();
  return j;
}

}  // namespace mhar::verify
