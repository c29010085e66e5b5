/**
 * @file cases.cpp
 * @brief cases.h: the case sets, drawing and rounding a case, its truth and yardsticks, and the
 *        files on disk.
 */
#include "cases.h"

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>

#include "file_util.h"
#include "half.h"
#include "safetensors.h"
#include "strict_json.h"

namespace mhar::verify {

std::string dtype_name(DType t) {
  switch (t) {
    case DType::F32:
      return "f32";
    case DType::BF16:
      return "bf16";
    case DType::F16:
      return "f16";
  }
  return "?";
}

DType parse_dtype(const std::string& name) {
  if (name == "f32") return DType::F32;
  if (name == "bf16") return DType::BF16;
  if (name == "f16") return DType::F16;
  throw std::invalid_argument("unknown dtype '" + name + "' (allowed: f32, bf16, f16)");
}

double unit_roundoff(DType t) {
  switch (t) {
    case DType::F32:
      return std::ldexp(1.0, -24);
    case DType::BF16:
      return std::ldexp(1.0, -8);
    case DType::F16:
      return std::ldexp(1.0, -11);
  }
  return 0;
}

float round_to(DType t, float x) {
  switch (t) {
    case DType::F32:
      return x;
    case DType::BF16:
      return io::round_to_bf16(x);
    case DType::F16:
      return io::round_to_f16(x);
  }
  return x;
}

std::string convention_name(Convention c) {
  return c == Convention::HfRmsnorm ? "hf-rmsnorm" : "exact";
}

Convention parse_convention(const std::string& name) {
  if (name == "exact") return Convention::Exact;
  if (name == "hf-rmsnorm") return Convention::HfRmsnorm;
  throw std::invalid_argument("unknown convention '" + name + "' (allowed: exact, hf-rmsnorm)");
}

namespace {

CaseSpec spec(std::string id, std::string why, int N, int P, int d, int H) {
  CaseSpec s;
  s.id = std::move(id);
  s.why = std::move(why);
  s.N = N;
  s.P = P;
  s.d = d;
  s.H = H;
  return s;
}

/// The H = 1 twin of a case: the same conventions (eps, tiny or null source, scale, gain, delta,
/// gate) and N and P, with one head over d_twin columns, so that a single-head kernel
/// (Attention Residuals) is graded on every convention too. q's spread is scaled by
/// sqrt(K / d_twin) so that the logits are as peaked as the original's.
CaseSpec h1_twin(CaseSpec s, int d_twin = 0) {
  const int K = s.d / s.H;
  if (d_twin > 0) s.d = d_twin;
  s.q_sd *= std::sqrt(static_cast<double>(K) / s.d);
  s.H = 1;
  s.id += "-h1";
  s.why = "H = 1 twin: " + s.why;
  return s;
}

/// The H = 1 twins of every case of v with H > 1 but those named in `skip`; `d_of` gives a twin
/// another width (K160's twin keeps K = 160 by d = 160).
std::vector<CaseSpec> h1_twins(const std::vector<CaseSpec>& v, const std::set<std::string>& skip,
                               const std::map<std::string, int>& d_of = {}) {
  std::vector<CaseSpec> t;
  for (const CaseSpec& s : v) {
    if (s.H == 1 || skip.count(s.id)) continue;
    const auto it = d_of.find(s.id);
    t.push_back(h1_twin(s, it == d_of.end() ? 0 : it->second));
  }
  return t;
}

/// Every convention and every awkward shape, small enough to run in seconds.
std::vector<CaseSpec> quick_set() {
  std::vector<CaseSpec> v;
  v.push_back(spec("n1", "N = 1", 1, 3, 32, 4));
  v.push_back(spec("h1", "H = 1 (Attention Residuals)", 5, 4, 64, 1));
  v.push_back(spec("hd", "H = d = 12 (one column a head), one position", 3, 1, 12, 12));
  v.push_back(spec("k160", "K = 160 is not a power of two", 4, 3, 320, 2));
  v.push_back(spec("oddp", "odd P = 37", 6, 37, 128, 4));
  {
    CaseSpec s = spec("scale", "logit scale 0.5, not 1", 4, 5, 64, 4);
    s.scale = 0.5;
    v.push_back(s);
  }
  {
    CaseSpec s = spec("nogain", "no key gain", 4, 5, 64, 2);
    s.gain = false;
    v.push_back(s);
  }
  {
    CaseSpec s = spec("delta", "delta: partial + gate · mix, with a null source", 5, 5, 64, 4);
    s.delta = true;
    s.null_source = 0;
    v.push_back(s);
  }
  {
    CaseSpec s = spec("peaked", "peaked softmax", 6, 4, 64, 2);
    s.q_sd = 3.0;
    v.push_back(s);
  }
  {
    CaseSpec s = spec("tiny", "near-zero source where eps matters", 4, 4, 64, 4);
    s.tiny_source = 2;
    v.push_back(s);
  }
  {
    CaseSpec s = spec("eps", "eps = 1e-2, not 1e-6", 4, 3, 32, 2);
    s.eps = 1e-2;
    s.tiny_source = 1;
    s.tiny_scale = 0.1;
    v.push_back(s);
  }
  {
    CaseSpec s = spec("all", "H = 3, scale 2, no gain, delta, all at once", 7, 9, 96, 3);
    s.scale = 2.0;
    s.gain = false;
    s.delta = true;
    s.gate = -1.3;
    v.push_back(s);
  }
  return v;
}

/// More shapes and conventions, as other implementations use them.
std::vector<CaseSpec> more_set() {
  std::vector<CaseSpec> v;
  {
    CaseSpec s = spec("fla", "fla-like: scale 1/sqrt(d), eps 1e-6, H = 1", 9, 16, 256, 1);
    s.scale = 1.0 / 16.0;
    v.push_back(s);
  }
  v.push_back(spec("n2", "N = 2, H = 8", 2, 17, 256, 8));
  v.push_back(spec("k48", "K = 48, N = 33", 33, 5, 192, 4));
  v.push_back(spec("d1000", "d = 1000, H = 5 (K = 200)", 9, 7, 1000, 5));
  {
    CaseSpec s = spec("eps5", "eps = 1e-5, gain-free, H = 2", 6, 8, 128, 2);
    s.eps = 1e-5;
    s.gain = false;
    s.tiny_source = 3;
    s.tiny_scale = 3e-3;
    v.push_back(s);
  }
  {
    CaseSpec s = spec("bigp", "P = 257 positions, delta with gate 0", 5, 257, 64, 4);
    s.delta = true;
    s.gate = 0.0;
    v.push_back(s);
  }
  {
    CaseSpec s = spec("verypeaked", "very peaked softmax (q sd 10)", 12, 6, 128, 4);
    s.q_sd = 10.0;
    v.push_back(s);
  }
  return v;
}

/// The MHAR paper's shapes (d 512, 1024, 1280; H 4 and 8; N up to 73) at moderate P.
std::vector<CaseSpec> paper_set() {
  std::vector<CaseSpec> v;
  v.push_back(spec("p512", "paper 100M shape: d 512, H 4, N 25", 25, 16, 512, 4));
  v.push_back(spec("p1024", "paper shape: d 1024, H 8, N 49", 49, 8, 1024, 8));
  v.push_back(spec("p1280", "paper shape: d 1280, H 8, N 73", 73, 8, 1280, 8));
  {
    CaseSpec s =
        spec("p1280d", "paper shape, delta: d 1280, H 4, N 17, null source", 17, 8, 1280, 4);
    s.delta = true;
    s.null_source = 0;
    v.push_back(s);
  }
  return v;
}

/// splitmix64: a case's seed from the run's seed and the case's index.
std::uint64_t mix_seed(std::uint64_t seed, std::uint64_t k) {
  std::uint64_t z = seed + 0x9e3779b97f4a7c15ull * (k + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

std::string num(double x) {
  std::ostringstream os;
  os.precision(17);
  os << x;
  return os.str();
}

/// The quick set's cases, then their H = 1 twins (hd's twin would be d = 12, H = 1: nothing new).
std::vector<CaseSpec> quick_with_twins() {
  std::vector<CaseSpec> v = quick_set();
  for (const CaseSpec& s : h1_twins(v, {"hd"}, {{"k160", 160}})) v.push_back(s);
  return v;
}

}  // namespace

std::vector<CaseSpec> case_set(const std::string& set) {
  if (set == "quick") return quick_with_twins();
  if (set == "full") {
    std::vector<CaseSpec> v = quick_with_twins();
    const std::vector<CaseSpec> more = more_set();
    for (const CaseSpec& s : more) v.push_back(s);
    for (const CaseSpec& s : h1_twins(more, {})) v.push_back(s);
    return v;
  }
  if (set == "paper") return paper_set();
  throw std::invalid_argument("unknown set '" + set + "' (allowed: quick, full, paper)");
}

Conventions conventions_of(const CaseSpec& s) {
  Conventions c;
  c.H = s.H;
  c.eps = s.eps;
  c.scale = s.scale;
  c.gain = s.gain;
  c.delta = s.delta;
  return c;
}

std::vector<std::string> required_outputs(const Conventions& c) {
  std::vector<std::string> v = {"out", "dsources", "dq"};
  if (c.gain) v.push_back("dg");
  if (c.delta) {
    v.push_back("dpartial");
    v.push_back("dgate");
  }
  return v;
}

std::vector<std::string> all_outputs(const Conventions& c) {
  std::vector<std::string> v = required_outputs(c);
  v.insert(v.begin() + 1, "alpha");
  return v;
}

bool is_forward_output(const std::string& name) {
  return name == "out" || name == "alpha";
}

double relative_error(const std::vector<double>& got, const std::vector<double>& truth) {
  if (got.size() != truth.size()) return std::numeric_limits<double>::quiet_NaN();
  double worst = 0, big = 0;
  for (std::size_t k = 0; k < got.size(); ++k) {
    if (!std::isfinite(got[k])) return std::numeric_limits<double>::quiet_NaN();
    worst = std::max(worst, std::abs(got[k] - truth[k]));
    big = std::max(big, std::abs(truth[k]));
  }
  return big > 0 ? worst / big : worst;
}

std::vector<double> Case::truth_of(const std::string& name) const {
  if (name == "out") return truth.out;
  if (name == "alpha") return truth.alpha;
  if (name == "dsources") return truth.dsources;
  if (name == "dq") return truth.dq;
  if (name == "dg") return truth.dg;
  if (name == "dpartial") return truth.dpartial;
  if (name == "dgate") return {truth.dgate};
  throw std::invalid_argument("no output named '" + name + "'");
}

std::vector<int64_t> Case::shape_of(const std::string& name) const {
  const int64_t N = in.N, P = in.P, d = in.d, H = spec.H;
  if (name == "out" || name == "dpartial") return {P, d};
  if (name == "alpha") return {N, P, H};
  if (name == "dsources") return {N, P, d};
  if (name == "dq" || name == "dg") return {d};
  if (name == "dgate") return {};
  throw std::invalid_argument("no output named '" + name + "'");
}

Case make_case(const CaseSpec& s, DType dtype, std::uint64_t seed) {
  Case c;
  c.spec = s;
  c.dtype = dtype;
  c.seed = seed;
  const Conventions conv = conventions_of(s);
  std::mt19937_64 eng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  // Every value is drawn in double, rounded to float, then to the case's dtype: the inputs are
  // exactly what a kernel of that dtype reads.
  const auto draw = [&](double mean, double sd) {
    return static_cast<double>(round_to(dtype, static_cast<float>(mean + sd * normal(eng))));
  };
  RoutingInputs<double>& in = c.in;
  in.N = s.N;
  in.P = s.P;
  in.d = s.d;
  const std::size_t Pd = static_cast<std::size_t>(s.P) * s.d;
  in.sources.resize(Pd * s.N);
  for (int i = 0; i < s.N; ++i) {
    double sd = std::exp(0.5 * normal(eng));
    if (i == s.tiny_source) sd *= s.tiny_scale;
    for (std::size_t k = 0; k < Pd; ++k)
      in.sources[i * Pd + k] = i == s.null_source ? 0.0 : draw(0.0, sd);
  }
  in.q.resize(s.d);
  for (auto& x : in.q) x = draw(0.0, s.q_sd);
  if (s.gain) {
    in.g.resize(s.d);
    for (auto& x : in.g) x = draw(1.0, 0.2);
  }
  in.dout.resize(Pd);
  for (auto& x : in.dout) x = draw(0.0, 1.0);
  if (s.delta) {
    in.partial.resize(Pd);
    for (auto& x : in.partial) x = draw(0.0, 1.0);
    in.gate = static_cast<double>(round_to(dtype, static_cast<float>(s.gate)));
  }
  c.truth = general_routing(in, conv);
  c.yardstick = yardsticks(c, Convention::Exact);
  return c;
}

std::map<std::string, double> yardsticks(const Case& c, Convention convention) {
  // The same loops in float from the same inputs, each output rounded to the case's dtype (what a
  // kernel that stores in that dtype must at least lose).
  Conventions conv = c.conventions();
  const DType dtype = c.dtype;
  if (convention == Convention::HfRmsnorm && dtype == DType::BF16)
    conv.round_key = io::round_to_bf16;
  if (convention == Convention::HfRmsnorm && dtype == DType::F16) conv.round_key = io::round_to_f16;
  const RoutingOutputs<float> ref = general_routing(to_float(c.in), conv);
  const auto widen = [&](const std::vector<float>& v) {
    std::vector<double> w(v.size());
    for (std::size_t k = 0; k < v.size(); ++k) w[k] = round_to(dtype, v[k]);
    return w;
  };
  const std::map<std::string, std::vector<double>> got = {
      {"out", widen(ref.out)},      {"alpha", widen(ref.alpha)}, {"dsources", widen(ref.dsources)},
      {"dq", widen(ref.dq)},        {"dg", widen(ref.dg)},       {"dpartial", widen(ref.dpartial)},
      {"dgate", widen({ref.dgate})}};
  std::map<std::string, double> y;
  for (const std::string& name : all_outputs(conv))
    y[name] = relative_error(got.at(name), c.truth_of(name));
  return y;
}

std::string case_file_name(int index, const CaseSpec& spec, DType dtype) {
  char prefix[16];
  std::snprintf(prefix, sizeof prefix, "%02d-", index + 1);
  return prefix + spec.id + "." + dtype_name(dtype) + ".safetensors";
}

namespace {

io::Tensor stored(DType t, std::vector<int64_t> shape, const std::vector<double>& v) {
  const std::vector<float> f(v.begin(), v.end());
  switch (t) {
    case DType::BF16:
      return io::Tensor::from_bf16(std::move(shape), f.data());
    case DType::F16:
      return io::Tensor::from_f16(std::move(shape), f.data());
    case DType::F32:
      break;
  }
  return io::Tensor::from_f32(std::move(shape), f.data());
}

}  // namespace

void save_case(const std::string& path, const Case& c) {
  const CaseSpec& s = c.spec;
  const Conventions conv = c.conventions();
  io::SafeTensors st;
  st.metadata = {{"format", kCasesFormat},
                 {"format_version", std::to_string(kCasesFormatVersion)},
                 {"id", s.id},
                 {"why", s.why},
                 {"N", std::to_string(s.N)},
                 {"P", std::to_string(s.P)},
                 {"d", std::to_string(s.d)},
                 {"H", std::to_string(s.H)},
                 {"eps", num(s.eps)},
                 {"scale", num(s.scale)},
                 {"gain", s.gain ? "1" : "0"},
                 {"delta", s.delta ? "1" : "0"},
                 {"dtype", dtype_name(c.dtype)},
                 {"seed", std::to_string(c.seed)}};
  const int64_t N = s.N, P = s.P, d = s.d;
  st.tensors.emplace_back("sources", stored(c.dtype, {N, P, d}, c.in.sources));
  st.tensors.emplace_back("q", stored(c.dtype, {d}, c.in.q));
  if (s.gain) st.tensors.emplace_back("g", stored(c.dtype, {d}, c.in.g));
  st.tensors.emplace_back("dout", stored(c.dtype, {P, d}, c.in.dout));
  if (s.delta) {
    st.tensors.emplace_back("partial", stored(c.dtype, {P, d}, c.in.partial));
    st.tensors.emplace_back("gate", stored(c.dtype, {}, {c.in.gate}));
  }
  for (const std::string& name : all_outputs(conv)) {
    const std::vector<double> t = c.truth_of(name);
    st.tensors.emplace_back("truth." + name, io::Tensor::from_f64(c.shape_of(name), t.data()));
  }
  for (const std::string& name : all_outputs(conv)) {
    const double y = c.yardstick.at(name);
    st.tensors.emplace_back("yardstick." + name, io::Tensor::from_f64({}, &y));
  }
  io::save_safetensors(path, st);
}

namespace {

[[noreturn]] void case_error(const std::string& path, const std::string& what) {
  throw CaseError(path + ": " + what);
}

const std::string& meta(const std::string& path, const io::SafeTensors& st, const char* key) {
  const auto it = st.metadata.find(key);
  if (it == st.metadata.end()) case_error(path, std::string("missing metadata '") + key + "'");
  return it->second;
}

long meta_int(const std::string& path, const io::SafeTensors& st, const char* key, long lo) {
  const std::string& v = meta(path, st, key);
  try {
    std::size_t used = 0;
    const long x = std::stol(v, &used);
    if (used == v.size() && x >= lo) return x;
  } catch (const std::exception&) {
  }
  case_error(path, std::string("metadata '") + key + "' = '" + v + "' is not an integer ≥ " +
                       std::to_string(lo));
}

double meta_double(const std::string& path, const io::SafeTensors& st, const char* key) {
  const std::string& v = meta(path, st, key);
  try {
    std::size_t used = 0;
    const double x = std::stod(v, &used);
    if (used == v.size() && std::isfinite(x)) return x;
  } catch (const std::exception&) {
  }
  case_error(path, std::string("metadata '") + key + "' = '" + v + "' is not a finite number");
}

bool meta_bool(const std::string& path, const io::SafeTensors& st, const char* key) {
  const std::string& v = meta(path, st, key);
  if (v != "0" && v != "1")
    case_error(path, std::string("metadata '") + key + "' = '" + v + "' must be \"0\" or \"1\"");
  return v == "1";
}

std::vector<double> tensor_values(const std::string& path, const io::SafeTensors& st,
                                  const std::string& name, const std::vector<int64_t>& shape) {
  const io::Tensor* t = st.find(name);
  if (!t) case_error(path, "missing tensor '" + name + "'");
  if (t->shape != shape) {
    std::string want = "[", got = "[";
    for (std::size_t k = 0; k < shape.size(); ++k)
      want += (k ? ", " : "") + std::to_string(shape[k]);
    for (std::size_t k = 0; k < t->shape.size(); ++k)
      got += (k ? ", " : "") + std::to_string(t->shape[k]);
    case_error(path,
               "tensor '" + name + "' has shape " + got + "], the metadata says " + want + "]");
  }
  std::vector<double> v;
  try {
    v = t->to_f64();
  } catch (const io::FormatError& e) {
    case_error(path, "tensor '" + name + "': " + e.what());
  }
  for (std::size_t k = 0; k < v.size(); ++k)
    if (!std::isfinite(v[k]))
      case_error(path, "tensor '" + name + "' holds " + std::to_string(v[k]) + " at element " +
                           std::to_string(k));
  return v;
}

}  // namespace

Case load_case(const std::string& path) {
  io::SafeTensors st;
  try {
    st = io::load_safetensors(path);
  } catch (const io::FormatError& e) {
    throw CaseError(e.what());
  }
  if (meta(path, st, "format") != kCasesFormat)
    case_error(path, "metadata format = '" + meta(path, st, "format") + "', not '" + kCasesFormat +
                         "': not a case file");
  const long version = meta_int(path, st, "format_version", 1);
  if (version != kCasesFormatVersion)
    case_error(path, "format_version " + std::to_string(version) +
                         " is not supported (this build "
                         "reads version " +
                         std::to_string(kCasesFormatVersion) + ")");
  Case c;
  CaseSpec& s = c.spec;
  s.id = meta(path, st, "id");
  s.why = meta(path, st, "why");
  s.N = static_cast<int>(meta_int(path, st, "N", 1));
  s.P = static_cast<int>(meta_int(path, st, "P", 1));
  s.d = static_cast<int>(meta_int(path, st, "d", 1));
  s.H = static_cast<int>(meta_int(path, st, "H", 1));
  if (s.d % s.H != 0) case_error(path, "H = " + std::to_string(s.H) + " does not divide d");
  s.eps = meta_double(path, st, "eps");
  s.scale = meta_double(path, st, "scale");
  s.gain = meta_bool(path, st, "gain");
  s.delta = meta_bool(path, st, "delta");
  try {
    c.dtype = parse_dtype(meta(path, st, "dtype"));
  } catch (const std::invalid_argument& e) {
    case_error(path, std::string("metadata dtype: ") + e.what());
  }
  c.seed = static_cast<std::uint64_t>(meta_int(path, st, "seed", 0));
  const int64_t N = s.N, P = s.P, d = s.d;
  c.in.N = s.N;
  c.in.P = s.P;
  c.in.d = s.d;
  c.in.sources = tensor_values(path, st, "sources", {N, P, d});
  c.in.q = tensor_values(path, st, "q", {d});
  if (s.gain) c.in.g = tensor_values(path, st, "g", {d});
  c.in.dout = tensor_values(path, st, "dout", {P, d});
  if (s.delta) {
    c.in.partial = tensor_values(path, st, "partial", {P, d});
    c.in.gate = tensor_values(path, st, "gate", {})[0];
  }
  const Conventions conv = c.conventions();
  for (const std::string& name : all_outputs(conv)) {
    std::vector<double> t = tensor_values(path, st, "truth." + name, c.shape_of(name));
    if (name == "out")
      c.truth.out = std::move(t);
    else if (name == "alpha")
      c.truth.alpha = std::move(t);
    else if (name == "dsources")
      c.truth.dsources = std::move(t);
    else if (name == "dq")
      c.truth.dq = std::move(t);
    else if (name == "dg")
      c.truth.dg = std::move(t);
    else if (name == "dpartial")
      c.truth.dpartial = std::move(t);
    else if (name == "dgate")
      c.truth.dgate = t[0];
    c.yardstick[name] = tensor_values(path, st, "yardstick." + name, {})[0];
    if (c.yardstick[name] < 0) case_error(path, "yardstick." + name + " is negative");
  }
  return c;
}

Manifest write_cases(const std::string& dir, const std::string& set,
                     const std::vector<DType>& dtypes, std::uint64_t seed) {
  const std::vector<CaseSpec> specs = case_set(set);
  std::filesystem::create_directories(dir);
  Manifest m;
  m.set = set;
  m.seed = seed;
  nlohmann::ordered_json j;
  j["format"] = kCasesFormat;
  j["format_version"] = kCasesFormatVersion;
  j["set"] = set;
  j["seed"] = seed;
  j["tolerance"] = {{"rule", "relative_error <= k * yardstick + floor"},
                    {"k", kToleranceK},
                    {"floor_ulps", kFloorUlps}};
  j["cases"] = nlohmann::ordered_json::array();
  for (std::size_t k = 0; k < specs.size(); ++k) {
    const std::uint64_t case_seed = mix_seed(seed, k) >> 1;  // fits the metadata's signed parse
    for (DType t : dtypes) {
      const Case c = make_case(specs[k], t, case_seed);
      const std::string file = case_file_name(static_cast<int>(k), specs[k], t);
      save_case((std::filesystem::path(dir) / file).string(), c);
      m.cases.push_back({file, specs[k].id, specs[k].why, t});
      const CaseSpec& s = specs[k];
      j["cases"].push_back({{"file", file},
                            {"id", s.id},
                            {"why", s.why},
                            {"dtype", dtype_name(t)},
                            {"N", s.N},
                            {"P", s.P},
                            {"d", s.d},
                            {"H", s.H},
                            {"eps", s.eps},
                            {"scale", s.scale},
                            {"gain", s.gain},
                            {"delta", s.delta}});
    }
  }
  io::write_text_file_atomic((std::filesystem::path(dir) / "manifest.json").string(),
                             j.dump(2) + "\n");
  return m;
}

namespace {

/// One entry of the manifest's "cases" list (the strict getters name the key that is wrong).
ManifestEntry manifest_entry(const nlohmann::json& e, const std::string& path) {
  ManifestEntry me;
  me.file = io::get_string(e, "file", path);
  if (me.file.empty() || me.file.find('/') != std::string::npos || me.file[0] == '.')
    throw CaseError(path + ": case file name '" + me.file + "' is not a plain file name");
  me.id = io::get_string(e, "id", path);
  me.why = io::get_string(e, "why", path);
  me.dtype = parse_dtype(io::get_string(e, "dtype", path));
  return me;
}

}  // namespace

Manifest load_manifest(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "manifest.json").string();
  if (!std::filesystem::is_directory(dir))
    throw CaseError(dir + ": no such directory (make one with `mhar-toy cases --out " + dir + "`)");
  if (!std::filesystem::exists(path))
    throw CaseError(path + ": cannot open (is " + dir + " a cases directory?)");
  Manifest m;
  try {
    const nlohmann::json j = io::read_json_file_strict(path);
    if (io::get_string(j, "format", path) != kCasesFormat)
      throw CaseError(path + ": format is not '" + std::string(kCasesFormat) + "'");
    if (const int64_t v = io::get_int(j, "format_version", 0, INT32_MAX, path);
        v != kCasesFormatVersion)
      throw CaseError(path + ": format_version " + std::to_string(v) +
                      " is not supported (this build reads " + std::to_string(kCasesFormatVersion) +
                      ")");
    m.set = io::get_string(j, "set", path);
    // Any 64-bit seed (`cases --seed`); get_int's range stops at INT64_MAX, and names the fault.
    const auto seed = j.find("seed");
    m.seed = seed != j.end() && seed->is_number_unsigned()
                 ? seed->get<std::uint64_t>()
                 : static_cast<std::uint64_t>(io::get_int(j, "seed", 0, INT64_MAX, path));
    const auto cases = j.find("cases");
    if (cases == j.end() || !cases->is_array())
      throw CaseError(path + ": 'cases' must be a list of the case files");
    for (const auto& e : *cases) m.cases.push_back(manifest_entry(e, path));
  } catch (const io::InputError& e) {  // the strict reader's refusals, in our words
    throw CaseError(e.what());
  } catch (const std::invalid_argument& e) {
    throw CaseError(path + ": " + e.what());
  }
  if (m.cases.empty()) throw CaseError(path + ": lists no cases");
  return m;
}

}  // namespace mhar::verify
