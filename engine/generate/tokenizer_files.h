// Reading a byte-level BPE tokenizer from the files an Optimum or transformers export ships:
// tokenizer.json, or the older vocab.json + merges.txt with added_tokens.json,
// special_tokens_map.json and tokenizer_config.json. Both give one TokenizerSpec, checked:
// merges name tokens of the vocabulary, ids are not negative and not shared. What is wrong
// or not supported is a kiln::Error naming the file.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace kiln::tokenizer_files {

struct AddedToken {
  int64_t id = 0;
  std::string content;
  bool special = false;
  bool lstrip = false;      // takes the whitespace before it
  bool rstrip = false;      // takes the whitespace after it
  bool normalized = false;  // matched after the tokens that are not (HF's second pass)
};

struct Merge {
  int64_t left = 0, right = 0, merged = 0;  // token ids; the index in the list is the rank
};

struct TokenizerSpec {
  std::string file;  // the file that defines the model, for messages
  std::vector<std::pair<std::string, int64_t>> vocab;
  std::vector<Merge> merges;
  std::vector<AddedToken> added;
  std::optional<int64_t> unk_id;  // a character missing from the vocabulary becomes this
  bool fuse_unk = false;          // one unknown token for a run of missing characters
  bool ignore_merges = false;     // a word in the vocabulary is one token, merges unused
  bool add_prefix_space = false;  // a space before each piece of text not starting with one
};

// DIR/tokenizer.json when it exists, else DIR/vocab.json and DIR/merges.txt.
TokenizerSpec read_dir(const std::string& dir);
bool exists_in(const std::string& dir);

}  // namespace kiln::tokenizer_files
