// Byte-level BPE tokenizer (GPT-2, Whisper) as Hugging Face `tokenizers` runs it, read from
// what an Optimum or transformers export ships:
//
//   kiln::Tokenizer tok = kiln::Tokenizer::from_dir("models/whisper-tiny.en");
//   std::vector<int64_t> ids = tok.encode("Hello world");   // no special tokens added
//   std::string text = tok.decode(ids);                     // special tokens skipped
//
//   kiln::TextStream stream(tok);                           // text as tokens arrive
//   for (int64_t id : ids) std::cout << stream.push(id);
//   std::cout << stream.finish();
//
// encode() gives the ids of `tokenizers`' encode(text, add_special_tokens=False): added tokens
// written in the text become their ids, the rest is split by GPT-2's pattern, mapped byte by
// byte to characters and merged by rank. decode() maps tokens back to bytes; invalid UTF-8 is
// replaced by U+FFFD, one per maximal invalid subsequence (Python's errors="replace").
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kiln {

class Tokenizer {
 public:
  // DIR's tokenizer.json (model BPE, byte-level pre-tokenizer and decoder), or else its
  // vocab.json + merges.txt with added_tokens.json, special_tokens_map.json and
  // tokenizer_config.json when present. Throws kiln::Error naming the file when files are
  // missing, malformed, or ask for what this tokenizer does not do (a normalizer, dropout).
  static Tokenizer from_dir(const std::string& dir);
  // Whether DIR holds tokenizer files from_dir would read.
  static bool exists_in(const std::string& dir);

  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  // Throws kiln::Error for text that is not valid UTF-8.
  std::vector<int64_t> encode(std::string_view text) const;
  // Throws kiln::Error for an id that names no token.
  std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens = true) const;

  std::optional<int64_t> token_to_id(std::string_view token) const;
  std::optional<std::string> id_to_token(int64_t id) const;
  // Added tokens marked special (<|endoftext|>, <|startoftranscript|>, ...).
  bool is_special(int64_t id) const;
  // One past the largest id: the vocabulary and the added tokens.
  int64_t vocab_size() const;

  // The bytes token `id` stands for (not always whole characters); throws kiln::Error for an
  // id that names no token.
  const std::string& token_bytes(int64_t id) const;

  struct Impl;

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Decodes ids one at a time as a generator produces them. push() returns the text complete so
// far: a character whose UTF-8 bytes span two tokens is held back until its last byte comes,
// so every piece is valid UTF-8, and the pieces joined equal decode() of all the ids.
class TextStream {
 public:
  explicit TextStream(const Tokenizer& tokenizer, bool skip_special_tokens = true);

  std::string push(int64_t id);
  // The bytes still held, as decode() ends them (U+FFFD for an unfinished character).
  std::string finish();

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_;
  std::string pending_;  // the start of a character whose remaining bytes are to come
};

}  // namespace kiln
