#include "engine/generate/pretokenizer.h"

#include <cstdint>

#include "engine/generate/unicode_classes.h"
#include "engine/util/utf8.h"

namespace kiln::text {

namespace {

struct CodePoint {
  char32_t c;
  CharClass cls;
  uint32_t offset;  // of its first byte in the text
};

std::vector<CodePoint> code_points(std::string_view text) {
  std::vector<CodePoint> out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const size_t n = utf8::sequence_at(text.substr(i)).length;
    const char32_t c = utf8::decode(text.substr(i), n);
    out.push_back({c, char_class(c), static_cast<uint32_t>(i)});
    i += n;
  }
  return out;
}

// The length of a contraction ('s 't 're 've 'm 'll 'd, lower case only) starting at cps[i].
size_t contraction_at(const std::vector<CodePoint>& cps, size_t i) {
  if (cps[i].c != U'\'' || i + 1 >= cps.size()) return 0;
  const char32_t a = cps[i + 1].c, b = i + 2 < cps.size() ? cps[i + 2].c : 0;
  if (a == U's' || a == U't' || a == U'm' || a == U'd') return 2;
  if ((a == U'r' && b == U'e') || (a == U'v' && b == U'e') || (a == U'l' && b == U'l')) return 3;
  return 0;
}

// The end of the match starting at cps[i] (in code points).
size_t match_end(const std::vector<CodePoint>& cps, size_t i) {
  const size_t n = cps.size();
  if (const size_t len = contraction_at(cps, i)) return i + len;
  // " ?\p{L}+", " ?\p{N}+", " ?[^\s\p{L}\p{N}]+": an optional space (U+0020 only), then a run
  // of one class other than whitespace.
  size_t k = i;
  if (cps[i].c == U' ' && i + 1 < n && cps[i + 1].cls != CharClass::Space) k = i + 1;
  if (cps[k].cls != CharClass::Space) {
    const CharClass cls = cps[k].cls;
    while (k < n && cps[k].cls == cls) ++k;
    return k;
  }
  // "\s+(?!\S)": a whitespace run, less its last character when a non-space follows (that
  // one then joins the next word as its leading space); "\s+" when that leaves nothing.
  size_t j = i;
  while (j < n && cps[j].cls == CharClass::Space) ++j;
  return j < n && j - 1 > i ? j - 1 : j;
}

}  // namespace

std::vector<std::string_view> split_gpt2(std::string_view text) {
  const std::vector<CodePoint> cps = code_points(text);
  std::vector<std::string_view> words;
  for (size_t i = 0; i < cps.size();) {
    const size_t j = match_end(cps, i);
    const size_t end = j < cps.size() ? cps[j].offset : text.size();
    words.push_back(text.substr(cps[i].offset, end - cps[i].offset));
    i = j;
  }
  return words;
}

size_t whitespace_before(std::string_view text, size_t end) {
  while (end > 0) {
    size_t start = end - 1;  // back to the first byte of the previous character
    while (start > 0 && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) --start;
    const std::string_view rest = text.substr(start);
    if (char_class(utf8::decode(rest, utf8::sequence_at(rest).length)) != CharClass::Space) break;
    end = start;
  }
  return end;
}

size_t whitespace_after(std::string_view text, size_t begin) {
  while (begin < text.size()) {
    const std::string_view rest = text.substr(begin);
    const size_t n = utf8::sequence_at(rest).length;
    if (char_class(utf8::decode(rest, n)) != CharClass::Space) break;
    begin += n;
  }
  return begin;
}

}  // namespace kiln::text
