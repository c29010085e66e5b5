/**
 * @file cases.h
 * @ingroup tools
 * @brief The verify kit's conformance cases (docs/verify.md): which cases each set holds, how a
 *        case's inputs are drawn and rounded to its storage dtype, its double-precision truth and
 *        the yardstick of each output, and the case files and manifest on disk.
 *
 * A case file (safetensors, one per case) holds
 *   inputs   sources [N,P,d], q [d], g [d] (gain cases), dout [P,d], and for delta cases
 *            partial [P,d] and gate [] — all in the case's dtype (F32, BF16 or F16);
 *   truth    truth.out [P,d], truth.alpha [N,P,H], truth.dsources [N,P,d], truth.dq [d],
 *            truth.dg [d] (gain), truth.dpartial [P,d] and truth.dgate [] (delta) — F64, computed
 *            in double from the rounded inputs (general_routing.h);
 *   yardsticks  `yardstick.NAME` [] F64 for each output NAME: relative_error() of the reference
 * computed in float from the same inputs, its outputs rounded to the case's dtype; metadata format
 * = "mhar.cases", format_version, id, why, N, P, d, H, eps, scale, gain ("1"/"0"), delta ("1"/"0"),
 * dtype ("f32", "bf16", "f16"), seed.
 */
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "general_routing.h"
#include "tolerance.h"

namespace mhar::verify {

inline constexpr const char* kCasesFormat = "mhar.cases";
inline constexpr int kCasesFormatVersion = 1;

/// The tolerance rule: a tensor passes when relative_error ≤ kToleranceK · yardstick + floor,
/// floor = kFloorUlps · unit roundoff of the case's dtype (docs/verify.md, "The tolerance rule";
/// the formula is the project's one, mhar::earned_tolerance in reference/tolerance.h).
/// How the two numbers were chosen (docs/style.md §7): k = 10 leaves a legitimate kernel room
/// for another summation order (on the quick set the project's three kernels reach ratio 0.34 at
/// most, the NumPy reference 0.27: ≥ 2.9× margin), while the planted mistakes' worst rows are
/// 10⁵ or more over; the floor of 2 roundoffs only matters where the yardstick is ~0 (N = 1 gives
/// out = S_0 exactly) and keeps such a case from demanding bit-exactness.
inline constexpr double kToleranceK = 10.0;
inline constexpr double kFloorUlps = 2.0;

/// A case (or a results file) that cannot be read as the protocol says: the message names the
/// file and what is wrong.
class CaseError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class DType { F32, BF16, F16 };
/// "f32", "bf16", "f16".
std::string dtype_name(DType t);
/// The dtype named "f32", "bf16" or "f16"; throws std::invalid_argument otherwise.
DType parse_dtype(const std::string& name);
/// Unit roundoff: 2^-24 (F32), 2^-8 (BF16), 2^-11 (F16).
double unit_roundoff(DType t);
/// x rounded to the nearest value of t (ties to even; half.h).
float round_to(DType t, float x);
/// The floor of the tolerance rule for dtype t.
inline double tolerance_floor(DType t) {
  return kFloorUlps * unit_roundoff(t);
}
/// The tolerance of an output of dtype t whose yardstick is `yardstick`:
/// kToleranceK · yardstick + tolerance_floor(t).
inline double tolerance_for(DType t, double yardstick) {
  return earned_tolerance(yardstick, kToleranceK, tolerance_floor(t));
}

/// A named rounding convention (docs/verify.md): `exact`, the intermediates of the conventions as
/// written; `hf-rmsnorm`, the normalised key rounded to the storage dtype before the gain (Hugging
/// Face's RMSNorm). Under a convention the yardstick comes from a float reference that rounds the
/// same way; the truth stays the exact one.
enum class Convention { Exact, HfRmsnorm };
/// "exact", "hf-rmsnorm".
std::string convention_name(Convention c);
/// The convention named "exact" or "hf-rmsnorm"; throws std::invalid_argument otherwise.
Convention parse_convention(const std::string& name);

/// How a case is drawn. Sources are N(0, σ_i²) with σ_i = exp(N(0, 0.5²)); q is N(0, q_sd²);
/// g is 1 + N(0, 0.2²); dout and partial N(0, 1).
struct CaseSpec {
  std::string id, why;
  int N = 1, P = 1, d = 1, H = 1;
  double eps = 1e-6, scale = 1.0;
  bool gain = true, delta = false;
  double gate = 0.7;     ///< delta cases
  double q_sd = 0.5;     ///< larger: a more peaked softmax
  int tiny_source = -1;  ///< this source is scaled by tiny_scale (eps then matters)
  double tiny_scale = 1e-3;
  int null_source = -1;  ///< this source is all zeros
};

/// The cases of a set: "quick", "full" (quick and more) or "paper" (the paper's shapes).
/// Throws std::invalid_argument naming the sets for any other name.
std::vector<CaseSpec> case_set(const std::string& set);

Conventions conventions_of(const CaseSpec& s);

/// The outputs a candidate must give for a case: out, dsources, dq, then dg (gain) or dpartial
/// and dgate (delta). alpha is optional and checked when given.
std::vector<std::string> required_outputs(const Conventions& c);
/// Every output a case has a truth for: required_outputs plus "alpha".
std::vector<std::string> all_outputs(const Conventions& c);
/// True for the outputs of the forward (out, alpha).
bool is_forward_output(const std::string& name);

/// The measure every comparison uses: max_k |got_k − truth_k| / max_k |truth_k| (the absolute
/// error when the truth is all zero). NaN when got holds a NaN or an infinity, or the sizes differ.
double relative_error(const std::vector<double>& got, const std::vector<double>& truth);

/// One case in memory.
struct Case {
  CaseSpec spec;
  DType dtype = DType::F32;
  std::uint64_t seed = 0;
  RoutingInputs<double> in;  ///< the rounded inputs, widened
  RoutingOutputs<double> truth;
  std::map<std::string, double> yardstick;  ///< per output name
  Conventions conventions() const { return conventions_of(spec); }
  /// The truth of output `name` as a flat vector (dgate: one value).
  std::vector<double> truth_of(const std::string& name) const;
  /// The shape of output `name` ([] for dgate).
  std::vector<int64_t> shape_of(const std::string& name) const;
};

/// Draws, rounds and solves a case (seed: the case's own seed).
Case make_case(const CaseSpec& spec, DType dtype, std::uint64_t seed);

/// The yardstick of every output of c under a convention: relative_error() of the reference
/// computed in float from c's inputs (rounding its normalised key as `conv` says), each output
/// rounded to c's dtype, against c's truth. make_case stores yardsticks(c, Convention::Exact).
std::map<std::string, double> yardsticks(const Case& c, Convention conv);

/// The file name of a case: `NN-ID.DTYPE.safetensors`, e.g. `01-n1.f32.safetensors`.
std::string case_file_name(int index, const CaseSpec& spec, DType dtype);

/// Writes a case file (atomically). Throws std::system_error on a write failure.
void save_case(const std::string& path, const Case& c);
/// Reads and validates a case file; throws CaseError("<path>: ...") on anything wrong.
Case load_case(const std::string& path);

/// What `cases` wrote: DIR/manifest.json's content.
struct ManifestEntry {
  std::string file, id, why;
  DType dtype = DType::F32;
};
struct Manifest {
  std::string set;
  std::uint64_t seed = 0;
  std::vector<ManifestEntry> cases;
};

/// Writes every case of `set` in each of `dtypes` into `dir` (created if needed) and
/// dir/manifest.json. The case with index k gets seed mix(seed, k), the same in every dtype.
Manifest write_cases(const std::string& dir, const std::string& set,
                     const std::vector<DType>& dtypes, std::uint64_t seed);
/// Reads dir/manifest.json; throws CaseError naming the path when it is missing or malformed.
Manifest load_manifest(const std::string& dir);

}  // namespace mhar::verify
