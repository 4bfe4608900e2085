// UTF-8 for the tokenizer and the string ops: reading code points of valid text, and turning
// arbitrary bytes into valid text the way Python's bytes.decode(errors="replace") and Rust's
// from_utf8_lossy do (which Hugging Face's byte-level decoder uses): each maximal prefix of a
// well-formed sequence that is cut short, and each byte that starts none, becomes one U+FFFD.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kiln::utf8 {

inline constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// How a sequence starting at bytes[0] is formed (Unicode's Table 3-7 of well-formed
// sequences): `length` bytes are needed, and the first `valid` of those present are right.
struct Sequence {
  size_t length = 1;
  size_t valid = 0;  // 0: the first byte starts no sequence
  bool complete() const { return valid == length; }
};

inline Sequence sequence_at(std::string_view bytes) {
  const auto b0 = static_cast<uint8_t>(bytes[0]);
  if (b0 < 0x80) return {1, 1};
  // The length, and the range of the second byte (tighter than 80..BF after E0, ED, F0, F4:
  // no overlong forms, no surrogates, nothing above U+10FFFF).
  size_t length = 0;
  uint8_t lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    length = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    length = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    length = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return {1, 0};
  }
  size_t valid = 1;
  while (valid < length && valid < bytes.size()) {
    const auto b = static_cast<uint8_t>(bytes[valid]);
    if (b < lo || b > hi) break;
    lo = 0x80, hi = 0xBF;
    ++valid;
  }
  return {length, valid};
}

// The code point of a complete sequence.
inline char32_t decode(std::string_view bytes, size_t length) {
  const auto b = [&](size_t i) { return static_cast<char32_t>(static_cast<uint8_t>(bytes[i])); };
  switch (length) {
    case 1:
      return b(0);
    case 2:
      return (b(0) & 0x1F) << 6 | (b(1) & 0x3F);
    case 3:
      return (b(0) & 0x0F) << 12 | (b(1) & 0x3F) << 6 | (b(2) & 0x3F);
    default:
      return (b(0) & 0x07) << 18 | (b(1) & 0x3F) << 12 | (b(2) & 0x3F) << 6 | (b(3) & 0x3F);
  }
}

inline void append(char32_t c, std::string& out) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

// The offset of the first byte that is not part of well-formed UTF-8, or npos.
inline size_t first_invalid(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    const Sequence s = sequence_at(text.substr(i));
    if (!s.complete()) return i;
    i += s.length;
  }
  return std::string_view::npos;
}

// Appends `bytes` to `out` as valid UTF-8, replacing what is ill-formed. With `hold_tail`, a
// well-formed start of a character at the very end is left undecoded, as more bytes may
// finish it. Returns the number of bytes decoded.
inline size_t append_replacing_invalid(std::string_view bytes, bool hold_tail, std::string& out) {
  size_t i = 0;
  while (i < bytes.size()) {
    const Sequence s = sequence_at(bytes.substr(i));
    if (s.complete()) {
      out.append(bytes.substr(i, s.length));
      i += s.length;
    } else if (hold_tail && s.valid > 0 && i + s.valid == bytes.size()) {
      break;
    } else {
      out.append(kReplacement);
      i += s.valid > 0 ? s.valid : 1;
    }
  }
  return i;
}

}  // namespace kiln::utf8
