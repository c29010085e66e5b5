/**
 * @file checkpoint.cpp
 * @brief Checkpoints as safetensors (see checkpoint.h and docs/checkpoint-format.md).
 */
#include "checkpoint.h"

#include <fmt/format.h>

#include <cmath>
#include <filesystem>

#include "errors.h"
#include "json_types.h"
#include "memory.h"
#include "safetensors.h"

namespace mhar::toy {

namespace fs = std::filesystem;

nlohmann::json config_to_json(const Config& c) {
  Config resolved = c;
  resolved.H = c.route_heads();  // the heads routing uses, not "0 = default"
  return resolved;
}

Config config_from_json(const nlohmann::json& j, const std::string& where) {
  try {
    const Config c = j.get<Config>();
    c.validate();
    return c;
  } catch (const std::exception& e) {
    throw UsageError(where + ": bad model config: " + e.what());
  }
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

/// Copies tensor `name` of `st` into m (already shaped); throws UsageError on a mismatch.
void fill(Mat<float>& m, const io::SafeTensors& st, const std::string& name,
          const std::string& path) {
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
  const std::vector<float> v = t->to_f32();
  for (std::size_t i = 0; i < v.size(); ++i)
    if (!std::isfinite(v[i]))
      throw UsageError(
          fmt::format("{}: tensor '{}' holds a non-finite value ({}) at element {} "
                      "(row {}, column {}); refusing to load it",
                      path, name, v[i], i, i / m.cols(), i % m.cols()));
  std::copy(v.begin(), v.end(), m.data());
}

/// Compares the config with the file's tensors before anything of the config's size is
/// allocated: a config that claims d = 10⁹ over a file of a few megabytes is refused here.
void check_config_against_file(const Config& cfg, const io::SafeTensors& st,
                               const std::string& path) {
  double in_file = 0;
  for (const auto& [name, t] : st.tensors) {
    double n = 1;
    for (auto s : t.shape) n *= static_cast<double>(s);
    in_file += n;
  }
  const double expected = param_count(cfg);
  if (const io::Tensor* e = st.find("embed");
      e && (e->shape.size() != 2 || e->shape[0] != cfg.vocab || e->shape[1] != cfg.d)) {
    std::string got;
    for (auto s : e->shape) got += (got.empty() ? "" : "×") + std::to_string(s);
    throw UsageError(fmt::format("{}: the config says vocab × d = {}×{}, but tensor 'embed' is {}",
                                 path, cfg.vocab, cfg.d, got));
  }
  if (expected != in_file)
    throw UsageError(fmt::format(
        "{}: the config (d = {}, L = {}, ffn = {}, mode {}) has {:.0f} parameters, the file's "
        "tensors hold {:.0f}",
        path, cfg.d, cfg.L, cfg.ffn, mode_name(cfg.mode), expected, in_file));
}

io::SafeTensors load_or_usage_error(const std::string& path) {
  try {
    return io::load_safetensors(path);
  } catch (const io::FormatError& e) {
    throw UsageError(std::string("cannot load checkpoint: ") + e.what());
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
  const io::SafeTensors st = load_or_usage_error(path);
  auto meta = [&](const char* key) {
    auto it = st.metadata.find(key);
    if (it == st.metadata.end())
      throw UsageError(path + ": not an mhar checkpoint (metadata has no '" + key + "')");
    return it->second;
  };
  if (meta("format") != kCheckpointFormat)
    throw UsageError(path + ": not an mhar checkpoint (format '" + meta("format") + "')");
  if (meta("format_version") != std::to_string(kCheckpointVersion))
    throw UsageError(path + ": checkpoint format version " + meta("format_version") +
                     " is not supported (this build reads version " +
                     std::to_string(kCheckpointVersion) + ")");
  Checkpoint ck;
  nlohmann::json cj;
  try {
    cj = nlohmann::json::parse(meta("config"));
  } catch (const std::exception& e) {
    throw UsageError(path + ": the config in the metadata is not JSON: " + e.what());
  }
  ck.cfg = config_from_json(cj, path);
  try {
    ck.step = std::stol(meta("step"));
  } catch (const std::logic_error&) {
    throw UsageError(path + ": bad step '" + meta("step") + "' in the metadata");
  }
  ck.metadata = st.metadata;
  check_config_against_file(ck.cfg, st, path);
  // T does not show in any tensor's shape: a config with an absurd T is caught here.
  require_memory(ck.cfg, 1, sizeof(float), Workload::Forward, path);
  ck.params = zero_params<float>(ck.cfg);
  std::size_t expected = 0;
  ck.params.for_each([&](const std::string& name, Mat<float>& m, bool) {
    fill(m, st, name, path);
    ++expected;
  });
  if (st.tensors.size() != expected)
    throw UsageError(path + ": holds " + std::to_string(st.tensors.size()) + " tensors, a '" +
                     mode_name(ck.cfg.mode) + "' model has " + std::to_string(expected));
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
  const io::SafeTensors st = load_or_usage_error(path);
  auto it = st.metadata.find("step");
  if (st.metadata.count("format") == 0 || st.metadata.at("format") != "mhar.optimizer" ||
      it == st.metadata.end())
    throw UsageError(path + ": not an mhar optimizer state");
  m.for_each([&](const std::string& name, Mat<float>& t, bool) { fill(t, st, "m." + name, path); });
  v.for_each([&](const std::string& name, Mat<float>& t, bool) { fill(t, st, "v." + name, path); });
  try {
    return std::stol(it->second);
  } catch (const std::logic_error&) {
    throw UsageError(path + ": bad step in the metadata");
  }
}

}  // namespace mhar::toy
