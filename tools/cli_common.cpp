/**
 * @file cli_common.cpp
 * @brief cli_common.h: the flag validators, the model-shape flags, --format, --cuda-sync and
 *        the messages for unexpected arguments and other parse errors.
 */
#include "cli_common.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "errors.h"
#include "thread_governor.h"

#ifdef MHAR_WITH_CUDA
#include "cuda/device.h"
#endif

namespace mhar::toy {

namespace {

/// A validator that parses the value as a double and accepts it when ok(value).
CLI::Validator number_where(std::function<bool(double)> ok, const std::string& name,
                            const std::string& need) {
  return CLI::Validator(
      [ok, need](std::string& input) -> std::string {
        double v = 0;
        std::size_t used = 0;
        try {
          v = std::stod(input, &used);
        } catch (const std::out_of_range&) {  // 1e999, 1e-999: beyond a double
          return "'" + input + "' is beyond the range of a double";
        } catch (const std::exception&) {
          return "'" + input + "' is not a number";
        }
        if (used != input.size()) return "'" + input + "' is not a number";
        return ok(v) ? std::string() : need + ", got " + input;
      },
      name);
}

}  // namespace

const CLI::Validator& positive() {
  static const CLI::Validator v =
      number_where([](double x) { return x > 0; }, "POSITIVE", "must be positive");
  return v;
}

const CLI::Validator& non_negative() {
  static const CLI::Validator v =
      number_where([](double x) { return x >= 0; }, "NONNEGATIVE", "must be 0 or positive");
  return v;
}

const CLI::Validator& thread_count() {
  static const CLI::Validator v = in_range(0, kMaxThreads, "INT");
  return v;
}

CLI::Validator in_range(double lo, double hi, const std::string& type) {
  return number_where([lo, hi](double x) { return x >= lo && x <= hi; },
                      fmt::format("{} in [{} - {}]", type, lo, hi),
                      fmt::format("must be from {} to {}", lo, hi));
}

CLI::Validator one_of(const std::vector<std::string>& names) {
  std::string allowed;  // "a, b or c"
  for (std::size_t n = 0; n < names.size(); ++n)
    allowed += (n == 0 ? "" : n + 1 == names.size() ? " or " : ", ") + names[n];
  return CLI::Validator(
      [names, allowed](std::string& input) -> std::string {
        if (std::find(names.begin(), names.end(), input) != names.end()) return std::string();
        return "must be " + allowed + ", got '" + input + "'";
      },
      fmt::format("{{{}}}", fmt::join(names, ",")));
}

void add_cuda_sync_flag(CLI::App& cmd, bool& on) {
  cmd.add_flag("--cuda-sync", on,
               "debug: synchronise and check after every CUDA launch, so a fault names its "
               "kernel (slow; same as MHAR_CUDA_SYNC=1)");
}

void apply_cuda_sync(bool on) {
#ifdef MHAR_WITH_CUDA
  if (on) mhar::cuda::set_sync_launches(true);
#else
  (void)on;
#endif
}

void add_model_flags(CLI::App& cmd, Config& cfg, std::string& mode) {
  cmd.add_option("--mode", mode, "residual mode")->check(one_of(mode_names()));
  cmd.add_option("--heads,-H", cfg.H,
                 "routing heads H (must divide d; 0 = n_kv_head; attnres uses 1)")
      ->check(non_negative());
  cmd.add_option("--d", cfg.d, "model width d")->check(positive());
  cmd.add_option("--layers,-L", cfg.L, "transformer blocks L")->check(positive());
  cmd.add_option("--n-head", cfg.n_head, "attention query heads")->check(positive());
  cmd.add_option("--n-kv-head", cfg.n_kv_head, "attention key/value heads (grouped-query)")
      ->check(positive());
  cmd.add_option("--ffn", cfg.ffn, "SwiGLU hidden width")->check(positive());
  cmd.add_option("--seq-len,-T", cfg.T, "tokens (bytes) per sequence T")->check(positive());
  cmd.add_option("--blocks", cfg.n_blocks, "blocks for the block and delta modes")
      ->check(positive());
}

Config model_config(Config cfg, const std::string& mode) {
  try {
    cfg.mode = parse_mode(mode);
    cfg.validate();
  } catch (const ShapeError& e) {
    throw UsageError(e.what());
  }
  return cfg;
}

std::vector<io::Format> parse_format_flag(const std::string& list) {
  try {
    return io::parse_formats(list);
  } catch (const std::invalid_argument& e) {
    throw UsageError(std::string("--format: ") + e.what());
  }
}

std::string unexpected_arguments(const CLI::App& app, const std::vector<std::string>& typed) {
  std::vector<std::string> left = app.remaining(true);
  std::vector<std::string> in_order;
  for (const std::string& arg : typed) {
    const auto it = std::find(left.begin(), left.end(), arg);
    if (it == left.end()) continue;
    in_order.push_back(arg);
    left.erase(it);
  }
  in_order.insert(in_order.end(), left.begin(), left.end());  // none expected; never drop one
  return fmt::format("unexpected {} {}", in_order.size() == 1 ? "argument" : "arguments",
                     fmt::join(in_order, " "));
}

std::string parse_error_words(const CLI::App& cmd, const CLI::ParseError& e) {
  const std::string what = e.what();
  if (dynamic_cast<const CLI::ArgumentMismatch*>(&e) != nullptr) {
    // CLI11 2.1 says "<flag>: <n> required <TYPE> missing" when a flag ends the line
    const std::size_t colon = what.find(": ");
    if (colon != std::string::npos && what.ends_with(" missing"))
      return what.substr(0, colon) + " needs a value";
  } else if (dynamic_cast<const CLI::ConversionError*>(&e) != nullptr) {
    // CLI11 2.1: "Could not convert: <flag> = <value>", a value its type cannot hold ("2.5" or
    // "1e20" for an int)
    const std::string head = "Could not convert: ";
    const std::size_t eq = what.find(" = ");
    if (what.starts_with(head) && eq != std::string::npos) {
      const std::string name = what.substr(head.size(), eq - head.size());
      const CLI::Option* o = cmd.get_option_no_throw(name);
      const bool whole = o != nullptr && o->get_type_name().find("INT") != std::string::npos;
      return fmt::format("{}: '{}' is not {}", name, what.substr(eq + 3),
                         whole ? "a whole number in range" : "a number");
    }
  } else if (dynamic_cast<const CLI::RequiredError*>(&e) != nullptr) {
    for (const CLI::Option* o : cmd.get_options()) {  // CLI11: "<name> is required"
      if (what != o->get_name() + " is required") continue;
      if (o->get_positional())
        return fmt::format("missing the {} argument: {}", o->get_name(), o->get_description());
      return fmt::format("missing {}, which this command needs: {}", o->get_name(),
                         o->get_description());
    }
  }
  return what;
}

}  // namespace mhar::toy
