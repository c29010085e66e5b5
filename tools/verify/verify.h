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
 * A case or output that is not there is "missing", never a pass; a NaN or infinity anywhere in a
 * results file fails; the verdict is a pass only when every row passes.
 */
#pragma once

#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cases.h"

namespace mhar::verify {

struct VerifyOptions {
  std::string cases, results;
  std::string repeat;         ///< a second run's results: must hold the same bits
  bool forward_only = false;  ///< a forward-only candidate: the gradients are not checked
};

/// One row of the table.
struct VerifyRow {
  std::string file;  ///< the case file name
  std::string why;
  std::string tensor;   ///< an output name, or "(case)", "(file)", "(repeat)", "(hint)"
  std::string verdict;  ///< "pass", "FAIL", "missing" or "not checked"
  double error = std::numeric_limits<double>::quiet_NaN();
  double tolerance = std::numeric_limits<double>::quiet_NaN();
  double ratio = std::numeric_limits<double>::quiet_NaN();
  std::string note;  ///< why it failed or is missing; where the worst element is
  long worst_index = -1;
};

struct VerifyReport {
  std::vector<VerifyRow> rows;
  int pass = 0, fail = 0, missing = 0, not_checked = 0;
  bool forward_only = false, repeat = false;
  std::string rule;  ///< the tolerance rule, as printed once
  bool ok() const { return fail == 0 && missing == 0 && pass > 0; }
};

/// Grades RESULTS against CASES. Throws CaseError for an unusable cases directory or case file
/// (the candidate's files never throw: each problem is a row).
VerifyReport verify_results(const VerifyOptions& o);

/// The table: the rule once, one line per row, hints for the failures, and the verdict line.
std::string format_report(const VerifyReport& r);
/// The same as JSON: {"rule", "forward_only", "rows": [...], "summary": {...}, "pass": bool}.
nlohmann::ordered_json report_json(const VerifyReport& r);

/// Where element k of output `name` of case c lies, e.g. "p 2, c 31 (head 0, column 31 of 32)".
std::string describe_element(const Case& c, const std::string& name, long k);

}  // namespace mhar::verify
