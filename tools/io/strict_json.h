/**
 * @file strict_json.h
 * @ingroup tools
 * @brief A strict JSON reader for the files mhar writes and reads back (a checkpoint's config, a
 *        run's config.json, a cases manifest): the rules of docs/checkpoint-format.md, in words
 *        of our own, in time linear in the text and without recursion.
 *
 * nlohmann's own `parse` accepts a duplicate key (the last one wins), turns 32.5 into 32 and true
 * into 1 on a `get<int>()`, formats its errors with "[json.exception…]" text, and a value nested
 * 100,000 deep overflows the stack when it is printed. Here the text goes through nlohmann's
 * SAX parser (iterative) into a document that refuses, with a StrictJsonError naming `where`:
 *   - text that is not JSON (the byte offset and what was found, in our words);
 *   - a byte-order mark or anything but whitespace after the value;
 *   - nesting deeper than `max_depth`;
 *   - a key that appears twice in one object;
 *   - a number that does not fit a double.
 * The typed getters below then refuse a number that is not an exact integer in range, and a
 * boolean, string or null where a number belongs.
 */
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <string_view>

#include "file_util.h"

namespace mhar::io {

/// A JSON text that breaks one of the rules above; the message starts with `where`.
class StrictJsonError : public InputError {
 public:
  using InputError::InputError;
};

/// The deepest nesting any file of mhar uses is 3 (config.json: object → object → value).
inline constexpr int kMaxJsonDepth = 16;

/// Parses `text` as one JSON value under the rules above.
nlohmann::json parse_json_strict(std::string_view text, const std::string& where,
                                 int max_depth = kMaxJsonDepth);

/// Reads a whole regular file (not a FIFO or a device; at most `max_bytes`) and parses it.
nlohmann::json read_json_file_strict(const std::string& path, std::size_t max_bytes = 1 << 20,
                                     int max_depth = kMaxJsonDepth);

/// j[key] as an exact integer in [lo, hi]; StrictJsonError("<where>: '<key>' …") when it is
/// missing, not a number, a boolean, a float such as 32.5 or 1e3, or out of range.
int64_t get_int(const nlohmann::json& j, const char* key, int64_t lo, int64_t hi,
                const std::string& where);
/// j[key] as a finite double (an integer is accepted and widened).
double get_number(const nlohmann::json& j, const char* key, const std::string& where);
/// j[key] as a string.
std::string get_string(const nlohmann::json& j, const char* key, const std::string& where);
/// j[key] as a boolean.
bool get_bool(const nlohmann::json& j, const char* key, const std::string& where);

/// A short, printable excerpt of `text` for a message: at most `max` characters, control and
/// non-ASCII bytes as \\xNN.
std::string printable_excerpt(std::string_view text, std::size_t max = 40);

}  // namespace mhar::io
