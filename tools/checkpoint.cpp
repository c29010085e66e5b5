/**
 * @file checkpoint.cpp
 * @brief Checkpoints as safetensors (see checkpoint.h and docs/checkpoint-format.md).
 */
#include "checkpoint.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>

#include "errors.h"
#include "json_types.h"
#include "memory.h"
#include "safetensors.h"
#include "strict_json.h"

namespace mhar::toy {

namespace fs = std::filesystem;

nlohmann::json config_to_json(const Config& c) {
  Config resolved = c;
  resolved.H = c.route_heads();  // the heads routing uses, not "0 = default"
  return resolved;
}

Config config_from_json(const nlohmann::json& j, const std::string& where) {
  const std::string w = where + ": bad model config";
  constexpr int64_t kInt = std::numeric_limits<int>::max();
  try {
    Config c;
    c.vocab = static_cast<int>(io::get_int(j, "vocab", 2, kInt, w));
    c.d = static_cast<int>(io::get_int(j, "d", 1, kInt, w));
    c.L = static_cast<int>(io::get_int(j, "L", 1, kInt, w));
    c.n_head = static_cast<int>(io::get_int(j, "n_head", 1, kInt, w));
    c.n_kv_head = static_cast<int>(io::get_int(j, "n_kv_head", 1, kInt, w));
    c.ffn = static_cast<int>(io::get_int(j, "ffn", 1, kInt, w));
    c.T = static_cast<int>(io::get_int(j, "T", 1, kInt, w));
    c.H = static_cast<int>(io::get_int(j, "H", 0, kInt, w));
    c.n_blocks = static_cast<int>(io::get_int(j, "n_blocks", 1, kInt, w));
    c.mode = parse_mode(io::get_string(j, "mode", w));
    c.validate();
    return c;
  } catch (const io::StrictJsonError& e) {
    throw UsageError(e.what());
  } catch (const ShapeError& e) {
    throw UsageError(w + ": " + e.what());
  }
}

long parse_step(const std::string& text, const std::string& where) {
  const bool digits =
      !text.empty() && text.size() <= 18 &&
      std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (!digits)
    throw UsageError(where + ": the step '" + io::printable_excerpt(text) +
                     "' in the metadata is not a decimal integer (digits only, at most 18)");
  return std::stol(text);
}

std::string resolve_checkpoint_path(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) return (fs::path(path) / "checkpoint.safetensors").string();
  return path;
}

namespace {

io::Tensor to_tensor(const Mat<float>& m) {
  return io::Tensor::from_f32({m.rows(), m.cols()}, m.data());
}

/// Copies tensor `name` of `st` into m (already shaped); throws UsageError on a mismatch, a
/// non-finite value, or (`non_negative`: AdamW's second moment) a negative one.
void fill(Mat<float>& m, const io::SafeTensors& st, const std::string& name,
          const std::string& path, bool non_negative = false) {
  const io::Tensor* t = st.find(name);
  if (!t)
    throw UsageError(path + ": tensor '" + name +
                     "' is missing (checkpoint of another mode or size?)");
  const bool shape_ok = t->shape.size() == 2 && t->shape[0] == m.rows() && t->shape[1] == m.cols();
  if (!shape_ok) {
    std::string got;
    for (auto s : t->shape) got += (got.empty() ? "" : "×") + std::to_string(s);
    throw UsageError(path + ": tensor '" + name + "' is " + got + ", the config expects " +
                     std::to_string(m.rows()) + "×" + std::to_string(m.cols()));
  }
  if (t->dtype != "F32" && t->dtype != "F64")
    throw UsageError(path + ": tensor '" + name + "' has dtype " + t->dtype +
                     " (a checkpoint holds F32 or F64)");
  const std::vector<float> v = t->to_f32();
  for (std::size_t i = 0; i < v.size(); ++i)
    if (!std::isfinite(v[i]) || (non_negative && v[i] < 0))
      throw UsageError(fmt::format(
          "{}: tensor '{}' holds {} value ({}) at element {} (row {}, column {}); refusing to "
          "load it",
          path, name, std::isfinite(v[i]) ? "a negative second-moment" : "a non-finite",
          shown(v[i]), i, i / m.cols(), i % m.cols()));
  std::copy(v.begin(), v.end(), m.data());
}

/// Compares the config with the file's header before anything of the config's size is allocated
/// or walked: the embedding's shape, a closed-form lower bound (vocab·d + 3·L·d·ffn scalars; a
/// config that claims L = 10⁷ or d = 10⁹ over a file of a few megabytes is refused here at once),
/// then the exact count and the number of tensors.
void check_config_against_header(const Config& cfg, const io::SafeTensorsHeader& h,
                                 const std::string& path) {
  const double in_file = static_cast<double>(h.total_numel());
  const double at_least =
      static_cast<double>(cfg.vocab) * cfg.d + 3.0 * cfg.L * static_cast<double>(cfg.d) * cfg.ffn;
  auto mismatch = [&](double expected) {
    return UsageError(fmt::format(
        "{}: the config (d = {}, L = {}, ffn = {}, mode {}) has {:.0f} parameters, the file's "
        "tensors hold {:.0f}",
        path, cfg.d, cfg.L, cfg.ffn, mode_name(cfg.mode), expected, in_file));
  };
  for (const io::HeaderEntry& e : h.entries) {
    const std::vector<int64_t> shape = h.shape(e);
    if (e.name == "embed" && (shape.size() != 2 || shape[0] != cfg.vocab || shape[1] != cfg.d)) {
      std::string got;
      for (auto s : shape) got += (got.empty() ? "" : "×") + std::to_string(s);
      throw UsageError(
          fmt::format("{}: the config says vocab × d = {}×{}, but tensor 'embed' is {}", path,
                      cfg.vocab, cfg.d, got));
    }
  }
  if (at_least > in_file) throw mismatch(at_least);
  const double expected = param_count(cfg);
  if (expected != in_file) throw mismatch(expected);
  std::size_t tensors = 0;
  for_each_shape(cfg, [&](const std::string&, int, int, bool) { ++tensors; });
  if (h.entries.size() != tensors)
    throw UsageError(path + ": holds " + std::to_string(h.entries.size()) + " tensors, a '" +
                     mode_name(cfg.mode) + "' model has " + std::to_string(tensors));
}

/// The metadata entry `key`, or a UsageError saying the file is not `what`.
const std::string& meta(const io::SafeTensorsHeader& h, const char* key, const std::string& path,
                        const char* what) {
  const auto it = h.metadata.find(key);
  if (it == h.metadata.end())
    throw UsageError(path + ": not " + what + " (metadata has no '" + key + "')");
  return it->second;
}

/// format, format_version and step of a checkpoint or an optimizer state.
long check_format(const io::SafeTensorsHeader& h, const std::string& path, const char* format,
                  const char* what) {
  if (meta(h, "format", path, what) != format)
    throw UsageError(path + ": not " + what + " (format '" +
                     io::printable_excerpt(meta(h, "format", path, what)) + "')");
  const std::string& version = meta(h, "format_version", path, what);
  if (version != std::to_string(kCheckpointVersion))
    throw UsageError(path + ": format version '" + io::printable_excerpt(version) +
                     "' is not supported (this build reads version " +
                     std::to_string(kCheckpointVersion) + ")");
  return parse_step(meta(h, "step", path, what), path);
}

io::SafeTensors load_or_usage_error(const std::string& path, const io::HeaderCheck& check,
                                    const char* what) {
  try {
    return io::load_safetensors(path, check);
  } catch (const io::FormatError& e) {
    throw UsageError(std::string("cannot load ") + what + ": " + e.what());
  }
}

}  // namespace

void save_checkpoint(const std::string& path, const Config& cfg, const Params<float>& params,
                     long step, const std::map<std::string, std::string>& extra) {
  io::SafeTensors st;
  st.metadata = extra;
  st.metadata["format"] = kCheckpointFormat;
  st.metadata["format_version"] = std::to_string(kCheckpointVersion);
  st.metadata["config"] = config_to_json(cfg).dump();
  st.metadata["step"] = std::to_string(step);
  params.for_each([&](const std::string& name, const Mat<float>& m, bool) {
    st.tensors.emplace_back(name, to_tensor(m));
  });
  io::save_safetensors(path, st);
}

Checkpoint load_checkpoint(const std::string& path_or_dir) {
  const std::string path = resolve_checkpoint_path(path_or_dir);
  Checkpoint ck;
  // Everything the header says is checked before a tensor is read.
  const io::SafeTensors st = load_or_usage_error(
      path,
      [&](const io::SafeTensorsHeader& h) {
        ck.step = check_format(h, path, kCheckpointFormat, "an mhar checkpoint");
        const nlohmann::json cj =
            io::parse_json_strict(meta(h, "config", path, "an mhar checkpoint"),
                                  path + ": the config in the metadata", 2);
        ck.cfg = config_from_json(cj, path);
        check_config_against_header(ck.cfg, h, path);
        // T does not show in any tensor's shape: a config with an absurd T is caught here.
        require_memory(ck.cfg, 1, sizeof(float), Workload::Forward, path);
      },
      "checkpoint");
  ck.metadata = st.metadata;
  ck.params = zero_params<float>(ck.cfg);
  ck.params.for_each(
      [&](const std::string& name, Mat<float>& m, bool) { fill(m, st, name, path); });
  return ck;
}

void save_optimizer(const std::string& path, const Params<float>& m, const Params<float>& v,
                    long step) {
  io::SafeTensors st;
  st.metadata["format"] = "mhar.optimizer";
  st.metadata["format_version"] = std::to_string(kCheckpointVersion);
  st.metadata["step"] = std::to_string(step);
  m.for_each([&](const std::string& name, const Mat<float>& t, bool) {
    st.tensors.emplace_back("m." + name, to_tensor(t));
  });
  v.for_each([&](const std::string& name, const Mat<float>& t, bool) {
    st.tensors.emplace_back("v." + name, to_tensor(t));
  });
  io::save_safetensors(path, st);
}

long load_optimizer(const std::string& path, Params<float>& m, Params<float>& v) {
  long step = 0;
  std::size_t tensors = 0;
  m.for_each([&](const std::string&, Mat<float>&, bool) { tensors += 2; });
  const io::SafeTensors st = load_or_usage_error(
      path,
      [&](const io::SafeTensorsHeader& h) {
        step = check_format(h, path, "mhar.optimizer", "an mhar optimizer state");
        if (h.entries.size() != tensors)
          throw UsageError(
              fmt::format("{}: holds {} tensors, the model's optimizer state has {} "
                          "(m. and v. of each parameter)",
                          path, h.entries.size(), tensors));
      },
      "optimizer state");
  m.for_each([&](const std::string& name, Mat<float>& t, bool) { fill(t, st, "m." + name, path); });
  v.for_each(
      [&](const std::string& name, Mat<float>& t, bool) { fill(t, st, "v." + name, path, true); });
  return step;
}

}  // namespace mhar::toy
