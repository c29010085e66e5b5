/**
 * @file mhar_toy.cpp
 * @brief mhar-toy: train tiny depth-routing models, look at where each head routes, compare.
 *
 * Exit codes: see errors.h (0 ok, 1 failure, 2 usage, 3 diverged, 4 unavailable, 130 interrupted).
 */
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <malloc.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <new>
#include <string>
#include <system_error>
#include <vector>

#include "cli_common.h"
#include "errors.h"
#include "file_util.h"
#include "tensor.h"

namespace {

using namespace mhar::toy;

/// A file or folder the user named that cannot be read or written (missing, no permission,
/// read-only) is unusable input (exit 2); anything else, a full disk included, is a failure (1).
int exit_code_of(const std::error_code& ec) {
  static const std::errc usage[] = {std::errc::permission_denied,
                                    std::errc::operation_not_permitted,
                                    std::errc::read_only_file_system,
                                    std::errc::no_such_file_or_directory,
                                    std::errc::not_a_directory,
                                    std::errc::is_a_directory,
                                    std::errc::file_exists};
  for (std::errc e : usage)
    if (ec == e) return mhar::toy::kUsage;
  return mhar::toy::kFailure;
}

/// The subcommand given on the command line, down to the last one named ("bench", then "step"
/// if bench had subcommands), or the app itself when none was.
const CLI::App& deepest(const CLI::App& app) {
  const CLI::App* a = &app;
  while (!a->get_subcommands().empty()) a = a->get_subcommands().front();
  return *a;
}

/// "mhar-toy" and the subcommand given on the command line, if any: "mhar-toy train".
std::string command_name(const CLI::App& app) {
  std::string path;
  for (const CLI::App* a = &deepest(app); a != &app; a = a->get_parent())
    path = " " + a->get_name() + path;
  return "mhar-toy" + path;
}

/// A usage error in our words, naming the subcommand and where its flags are listed (exit 2):
/// "mhar-toy: error: mhar-toy train: --heads needs a value (every flag: mhar-toy train --help)".
int refuse(const CLI::App& app, const std::string& words) {
  const std::string cmd = command_name(app);
  if (&deepest(app) == &app)
    fmt::print(stderr, "mhar-toy: error: {} (mhar-toy --help)\n", words);
  else
    fmt::print(stderr, "mhar-toy: error: {}: {} (every flag: {} --help)\n", cmd, words, cmd);
  return mhar::toy::kUsage;
}

/// No command given, or a first word that is not one (nor --help or --version): name the commands.
int refuse_command(const CLI::App& app, int argc, char** argv) {
  std::vector<std::string> names;
  for (const CLI::App* s : app.get_subcommands([](const CLI::App*) { return true; }))
    names.push_back(s->get_name());
  const std::string list = fmt::format("{}", fmt::join(names, ", "));
  if (argc > 1)
    return refuse(app, fmt::format("'{}' is not a command; the commands: {}", argv[1], list));
  return refuse(app, fmt::format("a command is required: {}", list));
}

/// Why a write to standard output failed, when fmt::print threw for it.
std::error_code stdout_error;

/// Runs the parsed subcommand; every exception becomes its message and exit code (errors.h).
int run_parsed(const std::vector<Subcommand>& subs) {
  try {
    for (const auto& s : subs)
      if (s.cmd->parsed()) return s.run();
  } catch (const UsageError& e) {
    fmt::print(stderr, "mhar-toy: error: {}\n", e.what());
    return kUsage;
  } catch (const mhar::ShapeError& e) {
    fmt::print(stderr, "mhar-toy: error: {}\n", e.what());
    return kUsage;
  } catch (const UnavailableError& e) {
    fmt::print(stderr, "mhar-toy: unavailable: {}\n", e.what());
    return kUnavailable;
  } catch (const DivergedError& e) {
    fmt::print(stderr, "\nmhar-toy: diverged: {}\n", e.what());
    return kDiverged;
  } catch (const mhar::io::InputError& e) {  // an input file that cannot be used as it is
    fmt::print(stderr, "mhar-toy: error: {}\n", e.what());
    return kUsage;
  } catch (const std::filesystem::filesystem_error& e) {  // in our words, not the library's
    fmt::print(stderr, "mhar-toy: error: {}: {}\n", e.path1().string(), e.code().message());
    return exit_code_of(e.code());
  } catch (const std::system_error& e) {  // write_file_atomic: "<path>: <what>: <OS error>"
    if (std::ferror(stdout)) {  // fmt::print's "cannot write to file": said in our words below
      stdout_error = e.code();
      return kFailure;
    }
    fmt::print(stderr, "mhar-toy: error: {}\n", e.what());
    return exit_code_of(e.code());
  } catch (const std::bad_alloc&) {
    fmt::print(stderr,
               "\nmhar-toy: failed: out of memory (a buffer could not be allocated); try a "
               "smaller model, batch or sequence length\n");
    return kFailure;
  } catch (const std::exception& e) {
    fmt::print(stderr, "\nmhar-toy: failed: {}\n", e.what());
    return kFailure;
  }
  return kUsage;
}

/// `code`, once standard output is flushed. A write there that failed (a full disk, a file
/// size limit) lost what the command printed: that must not read as success (exit 1 at least).
int with_stdout_written(int code) {
  errno = 0;
  if (std::fflush(stdout) == 0 && !std::ferror(stdout)) return code;
  const std::error_code why =
      stdout_error ? stdout_error : std::error_code(errno, std::generic_category());
  fmt::print(stderr,
             "mhar-toy: error: writing the output (standard output) failed{}; it is incomplete\n",
             why ? ": " + why.message() : std::string());
  return code == kOk ? kFailure : code;
}

}  // namespace

int main(int argc, char** argv) {
  // Keep freed activation buffers in the heap: each training step allocates the same large
  // matrices again, and returning them to the kernel costs a page fault per 4 KiB every step.
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  CLI::App app{
      "mhar-toy: tiny transformers with depth routing (residual, attnres, mhar, block, delta).\n"
      "Exit codes: 0 ok, 1 failure, 2 usage error, 3 diverged, 4 unavailable here (no GPU, or no "
      "figures in this build), 130 interrupted."};
  app.option_defaults()->always_capture_default();
  // A flag given twice takes its last value (so scripts can override a default set of flags).
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.require_subcommand(1);
  app.set_version_flag("--version", "mhar-toy 0.1.0");
  const std::vector<Subcommand> subs = {
      register_train(app),   register_sample(app),  register_eval(app),  register_grad(app),
      register_heatmap(app), register_convert(app), register_plot(app),  register_check(app),
      register_bench(app),   register_stream(app),  register_probe(app), register_sweep(app),
      register_cases(app),   register_verify(app)};
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return with_stdout_written(app.exit(e));
  } catch (const CLI::CallForAllHelp& e) {
    return with_stdout_written(app.exit(e));
  } catch (const CLI::CallForVersion& e) {
    return with_stdout_written(app.exit(e));
  } catch (const CLI::ExtrasError&) {  // CLI11 names them back to front: in the order typed
    return refuse(app, unexpected_arguments(app, std::vector<std::string>(argv + 1, argv + argc)));
  } catch (const CLI::RequiredError& e) {
    if (&deepest(app) == &app) return refuse_command(app, argc, argv);
    return refuse(app, parse_error_words(deepest(app), e));
  } catch (const CLI::ParseError& e) {  // in our words, never CLI11's "Run with --help …"
    return refuse(app, parse_error_words(deepest(app), e));
  }
  return with_stdout_written(run_parsed(subs));
}
