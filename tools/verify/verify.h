/**
 * @file verify.h
 * @ingroup tools
 * @brief Grading a candidate's results against the cases (docs/verify.md): one row per case and
 *        output, with the worst error, the tolerance, their ratio and a verdict.
 *
 * For each case file F listed in CASES/manifest.json the candidate wrote RESULTS/F holding out
 * (and optionally alpha), dsources, dq, and dg (gain cases) or dpartial and dgate (delta cases), in
 * F64, F32, BF16 or F16. An output passes when
 *     relative_error(result, truth) ≤ kToleranceK · yardstick + floor(dtype)      (cases.h)
 * A case or output that is not there is "missing", never a pass; a case the candidate declined
 * (RESULTS/STEM.declined, decline_marker_name) is "declined", not missing and not a pass; a NaN
 * or infinity anywhere in a results file fails. Only the cases in the candidate's scope (--serves)
 * are graded; the verdict is a pass only when every row passes and every case in scope was graded
 * (COMPLETE within the scope). Under a rounding convention (--convention) the yardstick is the
 * convention's (cases.h yardsticks()), and each row also keeps its ratio under exact.
 */
#pragma once

#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cases.h"

namespace mhar::verify {

/// What a candidate serves (--serves): every case, or single-head ones only (H = 1).
enum class Scope { All, H1 };
/// "all", "h1".
std::string scope_name(Scope s);
/// The scope named "all" or "h1"; throws std::invalid_argument otherwise.
Scope parse_scope(const std::string& name);
/// True when a case with spec s is in scope.
bool in_scope(Scope scope, const CaseSpec& s);

/// The decline marker of a case file: `NN-ID.DTYPE.declined` beside the results (its content, one
/// line, says why). A candidate that does not serve a case writes it instead of a results file.
std::string decline_marker_name(const std::string& case_file);

struct VerifyOptions {
  std::string cases, results;
  std::string repeat;         ///< a second run's results: must hold the same bits
  bool forward_only = false;  ///< a forward-only candidate: the gradients are not checked
  Scope serves = Scope::All;  ///< the cases graded; the others are out of scope
  Convention convention = Convention::Exact;  ///< the rounding convention the yardstick follows
};

/// What one row of the table says about a tensor, a case or a file. A hint is a line of advice
/// under a failing case, not a grade.
enum class Verdict { Pass, Fail, Missing, Declined, NotChecked, Hint };
/// As the table prints it: "pass", "FAIL", "missing", "declined", "not checked", "hint".
const char* verdict_name(Verdict v);

/// One row of the table.
struct VerifyRow {
  std::string file;  ///< the case file name
  std::string why;
  std::string tensor;   ///< an output name, or "(case)", "(file)", "(repeat)", "(hint)"
  Verdict verdict = Verdict::Fail;
  double error = std::numeric_limits<double>::quiet_NaN();
  double tolerance = std::numeric_limits<double>::quiet_NaN();
  double ratio = std::numeric_limits<double>::quiet_NaN();
  double ratio_exact = std::numeric_limits<double>::quiet_NaN();  ///< under exact (a convention)
  std::string note;  ///< why it failed or is missing; where the worst element is
  long worst_index = -1;
};

/// The worst ratio over the graded rows, and where it is.
struct WorstRatio {
  double ratio = 0;
  std::string at;  ///< "case tensor"
};

struct VerifyReport {
  std::vector<VerifyRow> rows;
  int pass = 0, fail = 0, missing = 0, declined = 0, not_checked = 0;
  int declined_h1 = 0;  ///< declined cases with H = 1 (not explained by a single-head scope)
  bool forward_only = false, repeat = false;
  Scope serves = Scope::All;
  Convention convention = Convention::Exact;
  int cases_in_scope = 0, cases_out_of_scope = 0, cases_graded = 0;
  std::string inputs;  ///< what fed the bf16/f16 cases ("case", "float32", ...; empty: none graded)
  WorstRatio worst, worst_exact;   ///< under the convention, and under exact
  std::vector<std::string> notes;  ///< hints about the whole report (a convention's pattern)
  std::string rule;                ///< the tolerance rule, as printed once
  /// Every case in scope was graded and no tensor is missing.
  bool complete() const { return cases_graded == cases_in_scope && missing == 0; }
  bool ok() const { return fail == 0 && missing == 0 && declined == 0 && pass > 0 && complete(); }
};

/// Grades RESULTS against CASES. Throws CaseError for an unusable cases directory or case file
/// (the candidate's files never throw: each problem is a row).
VerifyReport verify_results(const VerifyOptions& o);

/// The table: the rule once, one line per row, hints for the failures, and the verdict line.
std::string format_report(const VerifyReport& r);
/// The same as JSON: {"rule", "scope", "convention", "forward_only", "rows": [...], "summary":
/// {...}, "complete", "pass": bool, ...}.
nlohmann::ordered_json report_json(const VerifyReport& r);

/// Where element k of output `name` of case c lies, e.g. "p 2, c 31 (head 0, column 31 of 32)".
std::string describe_element(const Case& c, const std::string& name, long k);

}  // namespace mhar::verify
