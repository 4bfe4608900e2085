// String ops: StringNormalizer (stopword removal and case change), StringConcat,
// StringSplit and RegexFullMatch. Strings are UTF-8; case changes go through the C++
// locale named by the node (its UTF-8 variant) without touching the global locale.
#include <algorithm>
#include <cctype>
#include <locale>
#include <regex>
#include <stdexcept>
#include <string>
#include <unordered_set>
#include <vector>

#include "engine/util/utf8.h"
#include "ops/core/common.h"
#include "ops/core/elementwise.h"

namespace kiln::ops {
namespace {

const std::string* strings_of(const OpContext& ctx, const Tensor& t) {
  if (t.dtype() != DataType::String) ctx.fail("expected a string tensor, got " + t.describe());
  return t.data<const std::string>();
}

// ---- case conversion ----

// Decodes one UTF-8 code point at s[i]; returns its byte length, 0 if the bytes are invalid.
size_t decode_utf8(const std::string& s, size_t i, char32_t& cp) {
  const std::string_view rest = std::string_view(s).substr(i);
  const utf8::Sequence q = utf8::sequence_at(rest);
  if (!q.complete()) return 0;
  cp = utf8::decode(rest, q.length);
  return q.length;
}

class CaseMapper {
 public:
  explicit CaseMapper(const std::string& name) : locale_(find_locale(name)) {
    ctype_ = &std::use_facet<std::ctype<wchar_t>>(locale_);
  }

  // Upper- or lower-cases every valid code point; invalid bytes are kept as they are.
  std::string convert(const std::string& s, bool upper) const {
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size();) {
      char32_t cp = 0;
      const size_t len = decode_utf8(s, i, cp);
      if (len == 0) {
        out += s[i++];
        continue;
      }
      const wchar_t w = static_cast<wchar_t>(cp);
      const wchar_t m = upper ? ctype_->toupper(w) : ctype_->tolower(w);
      utf8::append(static_cast<char32_t>(m), out);
      i += len;
    }
    return out;
  }

 private:
  static std::locale find_locale(const std::string& name) {
    for (const std::string& n : {name + ".UTF-8", name + ".utf8", std::string("C.UTF-8")}) {
      try {
        return std::locale(n);
      } catch (const std::exception&) {
      }
    }
    return std::locale::classic();  // ASCII case mapping only
  }
  std::locale locale_;
  const std::ctype<wchar_t>* ctype_;
};

// ---- StringNormalizer ----

class StringNormalizer final : public Kernel {
 public:
  explicit StringNormalizer(const NodeInfo& info)
      : case_sensitive_(info.attr_int("is_case_sensitive", 0) != 0),
        mapper_(info.attr_string("locale", "en_US")) {
    const std::string action = info.attr_string("case_change_action", "NONE");
    if (action == "LOWER") {
      action_ = Action::Lower;
    } else if (action == "UPPER") {
      action_ = Action::Upper;
    } else if (action != "NONE") {
      info.fail("case_change_action must be LOWER, UPPER or NONE, got '" + action + "'");
    }
    for (const std::string& w : info.attr_strings("stopwords")) {
      stopwords_.insert(case_sensitive_ ? w : mapper_.convert(w, false));
    }
  }

  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const bool two_d = x.rank() == 2;
    if (!(x.rank() == 1 || (two_d && x.dim(0) == 1))) {
      ctx.fail("input must be [C] or [1, C], got " + x.describe());
    }
    const std::string* in = strings_of(ctx, x);
    std::vector<std::string> kept;
    for (int64_t i = 0; i < x.numel(); ++i) {
      const std::string& s = in[i];
      if (!stopwords_.empty() &&
          stopwords_.count(case_sensitive_ ? s : mapper_.convert(s, false)) > 0) {
        continue;
      }
      kept.push_back(action_ == Action::None ? s : mapper_.convert(s, action_ == Action::Upper));
    }
    // Everything removed still gives one (empty) string, as onnxruntime does.
    if (kept.empty()) kept.emplace_back();
    const int64_t n = static_cast<int64_t>(kept.size());
    Tensor& y = ctx.output(0, DataType::String, two_d ? Shape{1, n} : Shape{n});
    std::string* out = y.data<std::string>();
    for (int64_t i = 0; i < n; ++i) out[i] = std::move(kept[static_cast<size_t>(i)]);
  }

 private:
  enum class Action { None, Lower, Upper };
  bool case_sensitive_;
  Action action_ = Action::None;
  CaseMapper mapper_;
  std::unordered_set<std::string> stopwords_;
};

// ---- StringConcat ----

class StringConcat final : public Kernel {
 public:
  explicit StringConcat(const NodeInfo&) {}
  void run(OpContext& ctx) override {
    const Tensor& a = ctx.input(0);
    const Tensor& b = ctx.input(1);
    strings_of(ctx, a);
    strings_of(ctx, b);
    Tensor& y = ctx.output(0, DataType::String, broadcast_shapes(a.shape(), b.shape()));
    binary_loop<std::string, std::string, std::string>(
        a, b, y, [](const std::string& x, const std::string& z) { return x + z; });
  }
};

// ---- StringSplit ----

bool is_space(char c) {
  return c == ' ' || (c >= '\t' && c <= '\r') || (c >= '\x1c' && c <= '\x1f');
}

// Python's str.split: on runs of whitespace (ignoring it at both ends) when `sep` is
// empty, else on every occurrence of `sep`; at most `maxsplit` splits when it is >= 0.
std::vector<std::string> split(const std::string& s, const std::string& sep, int64_t maxsplit) {
  std::vector<std::string> parts;
  size_t i = 0;
  const size_t n = s.size();
  if (sep.empty()) {
    while (i < n && is_space(s[i])) ++i;
    while (i < n) {
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
        parts.push_back(s.substr(i));  // the rest, trailing whitespace included
        break;
      }
      size_t j = i;
      while (j < n && !is_space(s[j])) ++j;
      parts.push_back(s.substr(i, j - i));
      i = j;
      while (i < n && is_space(s[i])) ++i;
    }
    return parts;
  }
  while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
    const size_t f = s.find(sep, i);
    if (f == std::string::npos) break;
    parts.push_back(s.substr(i, f - i));
    i = f + sep.size();
  }
  parts.push_back(s.substr(i));
  return parts;
}

class StringSplit final : public Kernel {
 public:
  explicit StringSplit(const NodeInfo& info)
      : delimiter_(info.attr_string("delimiter", "")), maxsplit_(info.attr_int("maxsplit", -1)) {}

  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const std::string* in = strings_of(ctx, x);
    const int64_t n = x.numel();
    std::vector<std::vector<std::string>> parts(static_cast<size_t>(n));
    int64_t width = 0;
    for (int64_t i = 0; i < n; ++i) {
      parts[static_cast<size_t>(i)] = split(in[i], delimiter_, maxsplit_);
      width = std::max(width, static_cast<int64_t>(parts[static_cast<size_t>(i)].size()));
    }
    Shape shape = x.shape();
    shape.push_back(width);
    Tensor& y = ctx.output(0, DataType::String, shape);
    std::string* out = y.data<std::string>();
    for (int64_t i = 0; i < n; ++i) {
      auto& p = parts[static_cast<size_t>(i)];
      for (size_t k = 0; k < p.size(); ++k)
        out[i * width + static_cast<int64_t>(k)] = std::move(p[k]);
    }
    if (ctx.has_output(1)) {
      Tensor& lengths = ctx.output(1, DataType::Int64, x.shape());
      int64_t* len = lengths.data<int64_t>();
      for (int64_t i = 0; i < n; ++i) {
        len[i] = static_cast<int64_t>(parts[static_cast<size_t>(i)].size());
      }
    }
  }

 private:
  std::string delimiter_;
  int64_t maxsplit_;
};

// ---- RegexFullMatch ----

// Any one UTF-8 encoded code point but a newline: RE2's '.' (std::regex's is one byte).
constexpr const char* kUtf8Dot =
    "(?:[\\x00-\\x09\\x0B-\\x7F]|[\\xC0-\\xDF][\\x80-\\xBF]|[\\xE0-\\xEF][\\x80-\\xBF]{2}|"
    "[\\xF0-\\xF7][\\x80-\\xBF]{3})";

// Rewrites the RE2 syntax that ECMAScript spells differently or lacks: a leading (?i)
// flag group, named groups (?P<name>...), \A, \z, \Q...\E, \x{HH} and '.' on UTF-8
// input. Throws std::invalid_argument for RE2 features that cannot be expressed.
std::string re2_to_ecmascript(const std::string& p, bool& icase) {
  std::string out;
  size_t i = 0;
  icase = false;
  if (p.rfind("(?i)", 0) == 0) {
    icase = true;
    i = 4;
  }
  bool in_class = false;
  int depth = 0;
  const auto is_hex = [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; };
  while (i < p.size()) {
    const char c = p[i];
    if (c == '\\') {
      if (i + 1 >= p.size()) throw std::invalid_argument("trailing backslash");
      const char e = p[i + 1];
      if (e == 'A' && !in_class) {
        out += '^';
      } else if (e == 'z' && !in_class) {
        out += '$';
      } else if (e == 'Q') {
        size_t end = p.find("\\E", i + 2);
        if (end == std::string::npos) end = p.size();
        for (size_t k = i + 2; k < end; ++k) {
          if (std::string("\\^$.|?*+()[]{}/-").find(p[k]) != std::string::npos) out += '\\';
          out += p[k];
        }
        i = end == p.size() ? end : end + 2;
        continue;
      } else if (e == 'x' && i + 2 < p.size() && p[i + 2] == '{') {
        const size_t end = p.find('}', i + 3);
        if (end == std::string::npos || end == i + 3 || end - i - 3 > 6 ||
            !std::all_of(p.begin() + static_cast<long>(i + 3), p.begin() + static_cast<long>(end),
                         is_hex)) {
          throw std::invalid_argument("bad \\x{...} escape");
        }
        const unsigned long v = std::stoul(p.substr(i + 3, end - i - 3), nullptr, 16);
        if (v > 0x7f) throw std::invalid_argument("non-ASCII \\x{...} escape");
        static const char* hex = "0123456789ABCDEF";
        out += "\\x";
        out += hex[v >> 4];
        out += hex[v & 15];
        i = end + 1;
        continue;
      } else if (e == 'p' || e == 'P' || e == 'C' || e == 'Z' || e == 'G') {
        throw std::invalid_argument(std::string("\\") + e + " is not supported");
      } else if (e >= '1' && e <= '9') {
        throw std::invalid_argument("back-references are not RE2 syntax");
      } else {
        out += c;
        out += e;
      }
      i += 2;
      continue;
    }
    if (in_class) {
      if (c == ']') in_class = false;
      if (c == '[' && i + 1 < p.size() && p[i + 1] == ':') {
        const size_t end = p.find(":]", i + 2);
        if (end == std::string::npos) throw std::invalid_argument("unterminated [:class:]");
        out.append(p, i, end + 2 - i);
        i = end + 2;
        continue;
      }
      out += c;
      ++i;
      continue;
    }
    if (c == '[') {
      in_class = true;
      out += c;
      ++i;
      if (i < p.size() && p[i] == '^') out += p[i++];
      if (i < p.size() && p[i] == ']') out += p[i++];  // a leading ']' is literal
      continue;
    }
    if (c == '(') {
      if (++depth > 200) throw std::invalid_argument("groups nested too deeply");
      if (p.compare(i, 4, "(?P<") == 0 ||
          (p.compare(i, 3, "(?<") == 0 && i + 3 < p.size() && p[i + 3] != '=' && p[i + 3] != '!')) {
        const size_t end = p.find('>', i);
        if (end == std::string::npos) throw std::invalid_argument("unterminated group name");
        out += '(';
        i = end + 1;
        continue;
      }
      if (p.compare(i, 2, "(?") == 0 && p.compare(i, 3, "(?:") != 0 &&
          p.compare(i, 3, "(?=") != 0 && p.compare(i, 3, "(?!") != 0) {
        throw std::invalid_argument("inline flags are only supported as a leading (?i)");
      }
    } else if (c == ')') {
      --depth;
    } else if (c == '.') {
      out += kUtf8Dot;
      ++i;
      continue;
    } else if (c == '{') {
      // RE2 refuses repeat counts above 1000; so does this, which bounds the automaton.
      size_t k = i + 1;
      int64_t value = 0;
      while (k < p.size() && (std::isdigit(static_cast<unsigned char>(p[k])) || p[k] == ',')) {
        if (p[k] == ',') {
          value = 0;
        } else {
          value = std::min<int64_t>(value * 10 + (p[k] - '0'), 100000);
          if (value > 1000) throw std::invalid_argument("repeat count above 1000");
        }
        ++k;
      }
    }
    out += c;
    ++i;
  }
  return out;
}

class RegexFullMatch final : public Kernel {
 public:
  explicit RegexFullMatch(const NodeInfo& info) {
    const std::string pattern = info.attr_string("pattern");
    try {
      bool icase = false;
      const std::string ecma = re2_to_ecmascript(pattern, icase);
      // std::regex compiles recursively, about 100 bytes of stack per pattern character.
      if (ecma.size() > 8192) throw std::invalid_argument("pattern is too long");
      // Polynomial (breadth-first) matching: the stack depth does not grow with the input.
      auto flags = std::regex::ECMAScript | std::regex_constants::__polynomial;
      if (icase) flags |= std::regex::icase;
      regex_ = std::regex(ecma, flags);
    } catch (const std::exception& e) {
      info.fail("pattern '" + pattern + "' is not supported: " + e.what(), ErrorKind::Unsupported);
    }
  }

  void run(OpContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const std::string* in = strings_of(ctx, x);
    Tensor& y = ctx.output(0, DataType::Bool, x.shape());
    bool* out = y.data<bool>();
    parallel_for(x.numel(), 64, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) out[i] = std::regex_match(in[i], regex_);
    });
  }

 private:
  std::regex regex_;
};

// ---- Shape rules ----

// Without stopwords every string is kept (none still gives one empty string); which ones a
// stopword removes is only known when run.
void string_normalizer_shape(ShapeContext& c) {
  const Shape& x = c.shape(0);
  if (c.dtype(0) != DataType::String || !(x.size() == 1 || (x.size() == 2 && x[0] == 1))) {
    unknown("input must be string [C] or [1, C]");
  }
  const ir::Attribute* stopwords = c.node().attr("stopwords");
  if (stopwords && !stopwords->strings.empty()) {
    unknown("the strings a stopword removes are only known when run");
  }
  const int64_t n = std::max<int64_t>(x.back(), 1);
  c.set(0, DataType::String, x.size() == 2 ? Shape{1, n} : Shape{n});
}

void string_concat_shape(ShapeContext& c) {
  if (c.dtype(0) != DataType::String || c.dtype(1) != DataType::String) unknown("not strings");
  broadcast_shape(c, DataType::String, 0, nullptr);
}

// The widest split of the strings sizes the last dimension.
void string_split_shape(ShapeContext&) {
  unknown("the number of substrings is only known when run");
}

void regex_full_match_shape(ShapeContext& c) {
  if (c.dtype(0) != DataType::String) unknown("not strings");
  c.set(0, DataType::Bool, c.shape(0));
}

}  // namespace

KILN_REGISTER_OP({.op = "StringNormalizer",
                  .since = 10,
                  .min_inputs = 1,
                  .max_inputs = 1,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .types = "string",
                  .shape = string_normalizer_shape,
                  .create = make<StringNormalizer>});
KILN_REGISTER_OP({.op = "StringConcat",
                  .since = 20,
                  .min_inputs = 2,
                  .max_inputs = 2,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .strided_inputs = true,
                  .types = "string",
                  .shape = string_concat_shape,
                  .create = make<StringConcat>});
KILN_REGISTER_OP({.op = "StringSplit",
                  .since = 20,
                  .min_inputs = 1,
                  .max_inputs = 1,
                  .min_outputs = 1,
                  .max_outputs = 2,
                  .types = "string",
                  .shape = string_split_shape,
                  .create = make<StringSplit>});
KILN_REGISTER_OP({.op = "RegexFullMatch",
                  .since = 20,
                  .min_inputs = 1,
                  .max_inputs = 1,
                  .min_outputs = 1,
                  .max_outputs = 1,
                  .types = "string",
                  .shape = regex_full_match_shape,
                  .create = make<RegexFullMatch>});

}  // namespace kiln::ops
