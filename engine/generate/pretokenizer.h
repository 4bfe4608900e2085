// GPT-2's pre-tokenization: text split into the words BPE then merges within, by the pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// matched by hand over code points (the classes from unicode_classes.h), with the results of
// the Oniguruma engine that Hugging Face `tokenizers` runs it on.
#pragma once

#include <string_view>
#include <vector>

namespace kiln::text {

// The matches in order; they cover `text`, which must be valid UTF-8.
std::vector<std::string_view> split_gpt2(std::string_view text);

// Offsets of the whitespace run that ends at `end` / starts at `begin` of valid UTF-8 `text`:
// the start of the run before `end`, the end of the run from `begin` (Unicode White_Space).
size_t whitespace_before(std::string_view text, size_t end);
size_t whitespace_after(std::string_view text, size_t begin);

}  // namespace kiln::text
