/**
 * @file strict_json.cpp
 * @brief The strict JSON reader of strict_json.h: nlohmann's SAX events into a document, with
 *        the depth, duplicate-key and number rules checked as each event arrives.
 */
#include "strict_json.h"

#include <cmath>
#include <limits>
#include <vector>

#include "file_util.h"

namespace mhar::io {

namespace {

using Json = nlohmann::json;

[[noreturn]] void fail(const std::string& where, const std::string& what) {
  throw StrictJsonError(where + ": " + what);
}

/// Builds a document from SAX events. Containers are entered through a stack of pointers (no
/// recursion); on the first broken rule it records a message and stops the parse.
class Builder : public nlohmann::json_sax<Json> {
 public:
  explicit Builder(int max_depth) : max_depth_(max_depth) {}

  bool null() override { return put(Json()); }
  bool boolean(bool v) override { return put(Json(v)); }
  bool number_integer(number_integer_t v) override { return put(Json(v)); }
  bool number_unsigned(number_unsigned_t v) override { return put(Json(v)); }
  bool number_float(number_float_t v, const string_t&) override { return put(Json(v)); }
  bool string(string_t& v) override { return put(Json(std::move(v))); }
  bool binary(binary_t&) override { return stop("binary values are not JSON"); }
  bool start_object(std::size_t) override { return open(Json::object()); }
  bool start_array(std::size_t) override { return open(Json::array()); }
  bool end_object() override { return close(); }
  bool end_array() override { return close(); }
  bool key(string_t& k) override {
    if (stack_.back()->contains(k))
      return stop("the key \"" + printable_excerpt(k) + "\" appears twice in one object");
    key_ = std::move(k);
    return true;
  }
  bool parse_error(std::size_t position, const std::string& last_token,
                   const nlohmann::detail::exception& ex) override {
    // Our words, not the library's: where, and what was read last.
    const std::string what = ex.id == 406 ? "a number that does not fit a double"
                             : last_token.empty() || last_token == "<end of input>"
                                 ? "the text ends inside a value"
                                 : "unexpected '" + printable_excerpt(last_token) + "'";
    return stop("not valid JSON at byte " + std::to_string(position) + ": " + what);
  }

  Json result;
  std::string error;

 private:
  bool stop(std::string msg) {
    if (error.empty()) error = std::move(msg);
    return false;
  }
  /// Places a value in the current container (or as the result).
  Json* place(Json&& v) {
    if (stack_.empty()) {
      result = std::move(v);
      return &result;
    }
    Json& top = *stack_.back();
    if (top.is_object()) return &(top[key_] = std::move(v));
    top.push_back(std::move(v));
    return &top.back();
  }
  bool put(Json&& v) {
    place(std::move(v));
    return true;
  }
  bool open(Json&& v) {
    if (static_cast<int>(stack_.size()) >= max_depth_)
      return stop("nested deeper than " + std::to_string(max_depth_) + " levels");
    stack_.push_back(place(std::move(v)));
    return true;
  }
  bool close() {
    stack_.pop_back();
    return true;
  }

  int max_depth_;
  std::vector<Json*> stack_;
  std::string key_;
};

/// j[key], or a StrictJsonError naming the missing key.
const Json& member(const Json& j, const char* key, const std::string& where) {
  if (!j.is_object()) fail(where, std::string("expected an object holding '") + key + "'");
  const auto it = j.find(key);
  if (it == j.end()) fail(where, std::string("'") + key + "' is missing");
  return *it;
}

/// A value's JSON text for a message: scalars in full, containers by kind (never recursive).
std::string describe(const Json& v) {
  if (v.is_object()) return "an object";
  if (v.is_array()) return "an array";
  if (v.is_string())
    return "the string \"" + printable_excerpt(v.get_ref<const std::string&>()) + "\"";
  return v.dump();
}

}  // namespace

std::string printable_excerpt(std::string_view text, std::size_t max) {
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (std::size_t i = 0; i < text.size() && out.size() < max; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  if (out.size() >= max && text.size() > max) out += "…";
  return out;
}

Json parse_json_strict(std::string_view text, const std::string& where, int max_depth) {
  if (text.size() >= 3 && text.substr(0, 3) == "\xEF\xBB\xBF")
    fail(where, "starts with a byte-order mark (JSON text must not)");
  // nlohmann's lexer takes a NUL byte for the end of the input; JSON text never holds one.
  if (const std::size_t nul = text.find('\0'); nul != std::string_view::npos)
    fail(where, "not valid JSON at byte " + std::to_string(nul + 1) + ": a NUL byte");
  Builder b(max_depth);
  const bool ok = Json::sax_parse(text.begin(), text.end(), &b);
  if (!ok || !b.error.empty()) fail(where, b.error.empty() ? "not valid JSON" : b.error);
  return std::move(b.result);
}

Json read_json_file_strict(const std::string& path, std::size_t max_bytes, int max_depth) {
  return parse_json_strict(read_regular_file(path, max_bytes, "JSON file"), path, max_depth);
}

int64_t get_int(const Json& j, const char* key, int64_t lo, int64_t hi, const std::string& where) {
  const Json& v = member(j, key, where);
  int64_t x = 0;
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      fail(where, std::string("'") + key + "' = " + v.dump() + " is out of range [" +
                      std::to_string(lo) + ", " + std::to_string(hi) + "]");
    x = static_cast<int64_t>(u);
  } else if (v.is_number_integer()) {
    x = v.get<int64_t>();
  } else {
    fail(where, std::string("'") + key +
                    "' must be an integer written without a fraction or "
                    "exponent, got " +
                    describe(v));
  }
  if (x < lo || x > hi)
    fail(where, std::string("'") + key + "' = " + std::to_string(x) + " is out of range [" +
                    std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return x;
}

double get_number(const Json& j, const char* key, const std::string& where) {
  const Json& v = member(j, key, where);
  if (!v.is_number())
    fail(where, std::string("'") + key + "' must be a number, got " + describe(v));
  const double x = v.get<double>();
  if (!std::isfinite(x)) fail(where, std::string("'") + key + "' must be finite");
  return x;
}

std::string get_string(const Json& j, const char* key, const std::string& where) {
  const Json& v = member(j, key, where);
  if (!v.is_string())
    fail(where, std::string("'") + key + "' must be a string, got " + describe(v));
  return v.get<std::string>();
}

bool get_bool(const Json& j, const char* key, const std::string& where) {
  const Json& v = member(j, key, where);
  if (!v.is_boolean())
    fail(where, std::string("'") + key + "' must be true or false, got " + describe(v));
  return v.get<bool>();
}

}  // namespace mhar::io
