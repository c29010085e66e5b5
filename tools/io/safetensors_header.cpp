/**
 * @file safetensors_header.cpp
 * @brief The strict safetensors header reader (safetensors.h, parse_safetensors_header): nlohmann's
 *        SAX events go through a small state machine that knows the header's one layout,
 *
 *            { "__metadata__": {"k": "v", …},  "name": {"dtype": "F32", "shape": [2, 3],
 *                                                        "data_offsets": [0, 24]}, … }
 *
 *        so nothing deeper than three levels is ever entered, no document is built, and each
 *        entry is checked as it closes. Duplicate names are found by one sort; the tiling of
 *        the data area by another. The rules are listed in docs/checkpoint-format.md.
 */
#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "safetensors.h"
#include "strict_json.h"

namespace mhar::io {

namespace {

using Json = nlohmann::json;

template <typename... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return os.str();
}

/// Product of the dims; −1 when it overflows int64.
int64_t numel_of(const int64_t* dims, uint32_t rank) {
  int64_t n = 1;
  for (uint32_t i = 0; i < rank; ++i) {
    if (dims[i] != 0 && n > std::numeric_limits<int64_t>::max() / dims[i]) return -1;
    n *= dims[i];
  }
  return n;
}

/// The state machine. Each event either moves it on or records the broken rule and stops.
class HeaderSax : public nlohmann::json_sax<Json> {
 public:
  explicit HeaderSax(std::size_t header_bytes) {
    // The shortest entry, "":{"dtype":"F32","shape":[],"data_offsets":[0,0]}, is 48 bytes: the
    // capacity never has to grow (growing would hold two copies at once). Pages never written
    // are never resident.
    h.entries.reserve(std::min<std::size_t>(header_bytes / 48 + 1, kMaxTensors));
  }

  bool null() override { return scalar("null"); }
  bool boolean(bool v) override { return scalar(v ? "true" : "false"); }
  bool number_integer(number_integer_t v) override { return scalar(std::to_string(v)); }
  bool number_float(number_float_t, const string_t& text) override { return scalar(text); }
  bool number_unsigned(number_unsigned_t v) override {
    if (state_ != State::Shape && state_ != State::Offsets) return scalar(std::to_string(v));
    if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      return stop(in_entry(), field_, " value ", v, " is out of range (at most 2^63 - 1)");
    if (state_ == State::Shape) {
      h.dims.push_back(static_cast<int64_t>(v));
      ++entry_.rank;
      return true;
    }
    if (offsets_seen_ == 2) return stop(in_entry(), "data_offsets must be [begin, end], got more");
    (offsets_seen_++ == 0 ? entry_.begin : entry_.end) = v;
    return true;
  }
  bool string(string_t& v) override;
  bool binary(binary_t&) override { return stop("binary values are not JSON"); }
  bool start_object(std::size_t) override;
  bool end_object() override;
  bool start_array(std::size_t) override;
  bool end_array() override;
  bool key(string_t& k) override;
  bool parse_error(std::size_t position, const std::string& last_token,
                   const nlohmann::detail::exception& ex) override {
    return stop("header is not valid JSON at byte ", position, ": ",
                ex.id == 406 ? std::string("a number that does not fit a double")
                             : "unexpected '" + printable_excerpt(last_token) + "'");
  }

  SafeTensorsHeader h;
  std::string error;

 private:
  enum class State {
    Start,
    Top,
    TopValue,
    Meta,
    MetaValue,
    Entry,
    EntryValue,
    Shape,
    Offsets,
    End
  };
  enum Field : unsigned { kDtype = 1, kShape = 2, kOffsets = 4 };

  template <typename... Parts>
  bool stop(const Parts&... parts) {
    if (error.empty()) error = concat(parts...);
    return false;
  }
  std::string shape_text() const {
    std::string t = "[";
    for (uint32_t i = 0; i < entry_.rank; ++i)
      t += (i ? ", " : "") + std::to_string(h.dims[entry_.dims_begin + i]);
    return t + "]";
  }
  std::string in_entry() const { return "tensor '" + printable_excerpt(entry_.name) + "': "; }
  /// A scalar where the layout has none, or of the wrong kind.
  bool scalar(const std::string& text) {
    const std::string got = printable_excerpt(text);
    switch (state_) {
      case State::Shape:
      case State::Offsets:
        return stop(in_entry(), field_, " must hold exact non-negative integers, got ", got);
      case State::MetaValue:
        return stop("__metadata__ value of '", printable_excerpt(meta_key_),
                    "' must be a string, got ", got);
      case State::EntryValue:
        return stop(in_entry(), field_, " must be ", field_ == "dtype" ? "a string" : "an array",
                    ", got ", got);
      case State::TopValue:
        if (field_ == "__metadata__")
          return stop("__metadata__ must be an object of strings, got ", got);
        return stop(in_entry(), "entry must be a JSON object, got ", got);
      default:
        return stop("header must be a JSON object, got ", got);
    }
  }
  bool close_entry();

  State state_ = State::Start;
  HeaderEntry entry_;
  unsigned fields_ = 0;
  std::string field_, meta_key_;
  int offsets_seen_ = 0;
  bool metadata_seen_ = false;
};

bool HeaderSax::string(string_t& v) {
  if (state_ == State::MetaValue) {
    if (!h.metadata.emplace(meta_key_, std::move(v)).second)
      return stop("__metadata__ key '", printable_excerpt(meta_key_), "' appears twice");
    state_ = State::Meta;
    return true;
  }
  if (state_ == State::EntryValue && field_ == "dtype") {
    const auto* it = std::find(std::begin(kDtypeNames), std::end(kDtypeNames), v);
    if (it == std::end(kDtypeNames))
      return stop(in_entry(), "unsupported dtype '", printable_excerpt(v),
                  "' (supported: F32, F64, I64, BF16, F16)");
    entry_.dtype = static_cast<uint8_t>(it - std::begin(kDtypeNames));
    state_ = State::Entry;
    return true;
  }
  return scalar("\"" + v + "\"");
}

bool HeaderSax::key(string_t& k) {
  switch (state_) {
    case State::Top:
      if (k == "__metadata__") {
        if (metadata_seen_) return stop("the key '__metadata__' appears twice");
        metadata_seen_ = true;
        state_ = State::TopValue;
        field_ = k;
        return true;
      }
      if (h.entries.size() >= kMaxTensors)
        return stop("the header lists more than ", kMaxTensors, " tensors");
      entry_ = HeaderEntry{};
      entry_.name = std::move(k);
      entry_.dims_begin = static_cast<uint32_t>(h.dims.size());
      field_.clear();
      state_ = State::TopValue;
      return true;
    case State::Meta:
      if (h.metadata.size() >= kMaxMetadataEntries)
        return stop("__metadata__ holds more than ", kMaxMetadataEntries, " entries");
      meta_key_ = std::move(k);
      state_ = State::MetaValue;
      return true;
    default: {  // State::Entry
      unsigned bit = 0;
      if (k == "dtype") bit = kDtype;
      if (k == "shape") bit = kShape;
      if (k == "data_offsets") bit = kOffsets;
      if (bit == 0)
        return stop(in_entry(), "unknown field '", printable_excerpt(k),
                    "' (an entry holds dtype, shape and data_offsets)");
      if (fields_ & bit) return stop(in_entry(), "the field '", k, "' appears twice");
      fields_ |= bit;
      field_ = std::move(k);
      state_ = State::EntryValue;
      return true;
    }
  }
}

bool HeaderSax::start_object(std::size_t) {
  switch (state_) {
    case State::Start:
      state_ = State::Top;
      return true;
    case State::TopValue:
      if (field_ == "__metadata__") {
        state_ = State::Meta;
        return true;
      }
      fields_ = 0;
      state_ = State::Entry;
      return true;
    default:
      return scalar("{...}");
  }
}

bool HeaderSax::end_object() {
  switch (state_) {
    case State::Top:
      state_ = State::End;
      return true;
    case State::Meta:
      state_ = State::Top;
      return true;
    default:  // State::Entry (an object closes only where one was opened)
      return close_entry();
  }
}

bool HeaderSax::start_array(std::size_t) {
  if (state_ != State::EntryValue || field_ == "dtype") {
    if (state_ == State::TopValue && field_ == "__metadata__")
      return stop("__metadata__ must be an object of strings, got an array");
    return scalar("[...]");
  }
  state_ = field_ == "shape" ? State::Shape : State::Offsets;
  offsets_seen_ = 0;
  return true;
}

bool HeaderSax::end_array() {
  if (state_ == State::Offsets && offsets_seen_ != 2)
    return stop(in_entry(), "data_offsets must be [begin, end], got ", offsets_seen_, " numbers");
  state_ = State::Entry;
  return true;
}

bool HeaderSax::close_entry() {
  if (fields_ != (kDtype | kShape | kOffsets))
    return stop(in_entry(), "missing \"",
                !(fields_ & kDtype)   ? "dtype"
                : !(fields_ & kShape) ? "shape"
                                      : "data_offsets",
                "\"");
  if (entry_.end < entry_.begin)
    return stop(in_entry(), "data_offsets [", entry_.begin, ", ", entry_.end,
                "] end before they begin");
  // end − begin = numel × itemsize
  const int64_t numel = numel_of(h.dims.data() + entry_.dims_begin, entry_.rank);
  const uint64_t itemsize = dtype_size(kDtypeNames[entry_.dtype]);
  if (numel < 0 || static_cast<uint64_t>(numel) > std::numeric_limits<uint64_t>::max() / itemsize)
    return stop(in_entry(), "shape ", shape_text(), " has too many elements");
  const uint64_t need = static_cast<uint64_t>(numel) * itemsize;
  if (entry_.end - entry_.begin != need)
    return stop(in_entry(), "shape ", shape_text(), " of ", kDtypeNames[entry_.dtype], " needs ",
                need, " bytes but data_offsets [", entry_.begin, ", ", entry_.end, "] span ",
                entry_.end - entry_.begin);
  h.entries.push_back(std::move(entry_));
  state_ = State::Top;
  return true;
}

[[noreturn]] void refuse(const std::string& path, const std::string& rule) {
  throw FormatError(path + ": " + rule);
}

/// No two tensors share a name.
void check_names(const std::string& path, const SafeTensorsHeader& h) {
  std::vector<uint32_t> order(h.entries.size());
  for (uint32_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](uint32_t a, uint32_t b) { return h.entries[a].name < h.entries[b].name; });
  for (std::size_t i = 1; i < order.size(); ++i)
    if (h.entries[order[i]].name == h.entries[order[i - 1]].name)
      refuse(path, "the tensor name '" + printable_excerpt(h.entries[order[i]].name) +
                       "' appears twice in the header");
}

/// The tensors, in offset order, tile [0, data_size) exactly.
void check_tiling(const std::string& path, SafeTensorsHeader& h, uint64_t data_size) {
  std::sort(h.entries.begin(), h.entries.end(), [](const HeaderEntry& a, const HeaderEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t cursor = 0;
  const HeaderEntry* prev = nullptr;
  for (const HeaderEntry& e : h.entries) {
    const std::string range = concat("data_offsets [", e.begin, ", ", e.end, "]");
    if (e.begin < cursor)
      refuse(path, "tensor '" + printable_excerpt(e.name) + "': " + range + " overlap tensor '" +
                       printable_excerpt(prev->name) + "' (tensors may not share bytes)");
    if (e.begin > cursor)
      refuse(path, concat("tensor '", printable_excerpt(e.name), "': ", range, " leave a gap of ",
                          e.begin - cursor,
                          " bytes before it (the data area must be fully "
                          "indexed, without holes)"));
    cursor = e.end;
    prev = &e;
  }
  if (cursor > data_size)
    refuse(path,
           concat("truncated: expected ", cursor, " bytes of tensor data, file has ", data_size));
  if (cursor < data_size)
    refuse(path, concat(data_size - cursor,
                        " bytes follow the last tensor (the data area must "
                        "be fully indexed, with nothing after it)"));
}

}  // namespace

std::vector<int64_t> SafeTensorsHeader::shape(const HeaderEntry& e) const {
  return {dims.begin() + e.dims_begin, dims.begin() + e.dims_begin + e.rank};
}

int64_t SafeTensorsHeader::total_numel() const {
  int64_t total = 0;
  for (const HeaderEntry& e : entries) {
    const int64_t n = numel_of(dims.data() + e.dims_begin, e.rank);
    if (n < 0 || total > std::numeric_limits<int64_t>::max() - n)
      return std::numeric_limits<int64_t>::max();
    total += n;
  }
  return total;
}

SafeTensorsHeader parse_safetensors_header(std::string_view json, uint64_t data_size,
                                           const std::string& path) {
  if (json.empty() || json.front() != '{')
    refuse(path, "the header must be a JSON object starting with '{', it starts with '" +
                     printable_excerpt(json.substr(0, 8)) + "'");
  // nlohmann's lexer takes a NUL byte for the end of the input; JSON text never holds one.
  if (const std::size_t nul = json.find('\0'); nul != std::string_view::npos)
    refuse(path, "header is not valid JSON at byte " + std::to_string(nul + 1) +
                     ": a NUL byte (padding must be spaces)");
  HeaderSax sax(json.size());
  const bool ok = Json::sax_parse(json.begin(), json.end(), &sax);
  if (!ok || !sax.error.empty())
    refuse(path, sax.error.empty() ? "header is not valid JSON" : sax.error);
  check_names(path, sax.h);
  check_tiling(path, sax.h, data_size);
  return std::move(sax.h);
}

}  // namespace mhar::io
