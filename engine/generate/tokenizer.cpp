// Byte-level BPE as Hugging Face `tokenizers` runs it (see kiln/tokenizer.h): added tokens are
// cut out of the text first, the rest is split into words by GPT-2's pattern, each word's
// bytes become one symbol each, and adjacent symbols merge by rank until no merge applies.
#include "kiln/tokenizer.h"

#include <algorithm>
#include <array>
#include <queue>
#include <unordered_map>
#include <utility>

#include "engine/generate/pretokenizer.h"
#include "engine/generate/tokenizer_files.h"
#include "engine/util/utf8.h"
#include "kiln/error.h"

namespace kiln {

namespace {

using tokenizer_files::AddedToken;
using tokenizer_files::TokenizerSpec;

// GPT-2's byte-to-character table: printable bytes stand for themselves, the others (controls,
// space, 0x7F-0xA0, 0xAD) for U+0100 onwards in byte order, so that every token of the
// vocabulary is visible text.
struct ByteChars {
  static constexpr size_t kChars = 0x144;  // characters used are below U+0144
  std::array<char32_t, 256> of_byte{};
  std::array<int16_t, kChars> byte_of{};  // -1: stands for no byte

  ByteChars() {
    byte_of.fill(-1);
    char32_t next = 0x100;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      of_byte[b] = printable ? static_cast<char32_t>(b) : next++;
      byte_of[of_byte[b]] = static_cast<int16_t>(b);
    }
  }
};

const ByteChars& byte_chars() {
  static const ByteChars table;
  return table;
}

// The bytes a token stands for. A token with a character outside the table (an added token
// such as " kiln") stands for its own UTF-8 bytes, as in HF's ByteLevel decoder.
std::string token_to_bytes(std::string_view token) {
  const ByteChars& table = byte_chars();
  std::string bytes;
  for (size_t i = 0; i < token.size();) {
    const size_t n = utf8::sequence_at(token.substr(i)).length;
    const char32_t c = utf8::decode(token.substr(i), n);
    if (c >= ByteChars::kChars || table.byte_of[c] < 0) return std::string(token);
    bytes += static_cast<char>(table.byte_of[c]);
    i += n;
  }
  return bytes;
}

std::string bytes_to_token(std::string_view bytes) {
  std::string token;
  for (const char b : bytes) utf8::append(byte_chars().of_byte[static_cast<uint8_t>(b)], token);
  return token;
}

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
template <class T>
using StringMap = std::unordered_map<std::string, T, StringHash, std::equal_to<>>;

// Added tokens in text: at the leftmost position where any matches, the longest (the
// leftmost-longest matching of HF's Aho-Corasick automaton), over a byte trie.
class AddedTokenTrie {
 public:
  void insert(std::string_view content, int32_t token) {
    int32_t node = 0;
    for (const char ch : content) {
      const auto b = static_cast<uint8_t>(ch);
      int32_t child = find_child(node, b);
      if (child < 0) {
        child = static_cast<int32_t>(nodes_.size());
        nodes_[static_cast<size_t>(node)].children.emplace_back(b, child);
        nodes_.emplace_back();
      }
      node = child;
    }
    nodes_[static_cast<size_t>(node)].token = token;
    first_bytes_[static_cast<uint8_t>(content[0])] = true;
  }

  bool empty() const { return nodes_.size() == 1; }

  // The longest token starting at text[pos]: {token, length}, token -1 when none.
  std::pair<int32_t, size_t> longest_at(std::string_view text, size_t pos) const {
    std::pair<int32_t, size_t> best{-1, 0};
    if (!first_bytes_[static_cast<uint8_t>(text[pos])]) return best;
    int32_t node = 0;
    for (size_t i = pos; i < text.size(); ++i) {
      node = find_child(node, static_cast<uint8_t>(text[i]));
      if (node < 0) break;
      if (const int32_t t = nodes_[static_cast<size_t>(node)].token; t >= 0)
        best = {t, i + 1 - pos};
    }
    return best;
  }

 private:
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> children;
    int32_t token = -1;
  };
  int32_t find_child(int32_t node, uint8_t b) const {
    for (const auto& [byte, child] : nodes_[static_cast<size_t>(node)].children) {
      if (byte == b) return child;
    }
    return -1;
  }
  std::vector<Node> nodes_{1};
  std::array<bool, 256> first_bytes_{};
};

// A stretch of the text being encoded: an added token (its index) or text still to split.
struct Piece {
  size_t begin, end;
  int32_t added = -1;
};

struct MergeRule {
  uint32_t rank;
  int64_t merged;
};

uint64_t pair_key(int64_t left, int64_t right) {
  return static_cast<uint64_t>(left) << 32 | static_cast<uint64_t>(right);
}

}  // namespace

struct Tokenizer::Impl {
  std::string file;  // for messages
  StringMap<int64_t> model_vocab, added_vocab;
  std::vector<std::string> tokens;      // by id; "" where no token has the id
  std::vector<std::string> bytes;       // what each token decodes to
  std::vector<uint8_t> known, special;  // by id
  std::array<int64_t, 256> byte_ids{};  // the token of each byte's character, -1: none
  std::unordered_map<uint64_t, MergeRule> merges;
  std::vector<AddedToken> added;
  AddedTokenTrie raw_trie, normalized_trie;
  std::optional<int64_t> unk_id;
  bool fuse_unk = false, ignore_merges = false, add_prefix_space = false;

  explicit Impl(TokenizerSpec spec);
  void set_token(int64_t id, const std::string& token);
  std::vector<Piece> split_added(std::string_view text) const;
  void find_added(std::string_view text, const Piece& piece, const AddedTokenTrie& trie,
                  std::vector<Piece>& out) const;
  void encode_text(std::string_view text, StringMap<std::pair<size_t, size_t>>& cache,
                   std::vector<int64_t>& out) const;
  void bpe(std::string_view word, std::vector<int64_t>& out) const;
  [[noreturn]] void bad_id(int64_t id) const;
};

Tokenizer::Impl::Impl(TokenizerSpec spec)
    : file(std::move(spec.file)),
      unk_id(spec.unk_id),
      fuse_unk(spec.fuse_unk),
      ignore_merges(spec.ignore_merges),
      add_prefix_space(spec.add_prefix_space) {
  for (auto& [token, id] : spec.vocab) {
    set_token(id, token);
    model_vocab.emplace(std::move(token), id);
  }
  // An added token may also name a model token (<|endoftext|> in GPT-2's vocab.json); HF
  // ignores one with empty content.
  for (AddedToken& t : spec.added) {
    if (t.content.empty()) continue;
    set_token(t.id, t.content);
    added_vocab[t.content] = t.id;
    const auto index = static_cast<int32_t>(added.size());
    (t.normalized ? normalized_trie : raw_trie).insert(t.content, index);
    added.push_back(std::move(t));
  }
  // Special by content, as HF's decoder asks.
  for (const AddedToken& t : added) {
    if (!t.special) continue;
    special[static_cast<size_t>(t.id)] = 1;
    if (const auto it = model_vocab.find(t.content); it != model_vocab.end())
      special[static_cast<size_t>(it->second)] = 1;
  }
  for (int b = 0; b < 256; ++b) {
    const auto it = model_vocab.find(bytes_to_token(std::string(1, static_cast<char>(b))));
    byte_ids[static_cast<size_t>(b)] = it == model_vocab.end() ? -1 : it->second;
  }
  // A pair listed twice keeps its last rank, as HF's map does.
  for (size_t rank = 0; rank < spec.merges.size(); ++rank) {
    const auto& m = spec.merges[rank];
    merges[pair_key(m.left, m.right)] = {static_cast<uint32_t>(rank), m.merged};
  }
}

void Tokenizer::Impl::set_token(int64_t id, const std::string& token) {
  const auto i = static_cast<size_t>(id);
  if (i >= tokens.size()) {
    tokens.resize(i + 1);
    bytes.resize(i + 1);
    known.resize(i + 1);
    special.resize(i + 1);
  }
  tokens[i] = token;
  bytes[i] = token_to_bytes(token);
  known[i] = 1;
}

void Tokenizer::Impl::bad_id(int64_t id) const {
  const std::string what =
      id < 0 || id >= static_cast<int64_t>(tokens.size())
          ? " is outside the vocabulary (" + std::to_string(tokens.size()) + " ids)"
          : " names no token";
  throw Error(ErrorKind::InvalidArgument, "token id " + std::to_string(id) + what).with_file(file);
}

// Tokens that are not normalized are cut out first, then normalized ones from what is left
// (HF's two passes; with no normalizer only the order differs).
std::vector<Piece> Tokenizer::Impl::split_added(std::string_view text) const {
  std::vector<Piece> pieces{{0, text.size()}};
  for (const AddedTokenTrie* trie : {&raw_trie, &normalized_trie}) {
    if (trie->empty()) continue;
    std::vector<Piece> split;
    for (const Piece& p : pieces) {
      if (p.added >= 0) {
        split.push_back(p);
      } else {
        find_added(text, p, *trie, split);
      }
    }
    pieces = std::move(split);
  }
  return pieces;
}

void Tokenizer::Impl::find_added(std::string_view text, const Piece& piece,
                                 const AddedTokenTrie& trie, std::vector<Piece>& out) const {
  const std::string_view s = text.substr(piece.begin, piece.end - piece.begin);
  size_t done = 0;  // end of the last token taken, relative to the piece
  for (size_t pos = 0; pos < s.size();) {
    const auto [index, length] = trie.longest_at(s, pos);
    if (index < 0) {
      ++pos;
      continue;
    }
    const AddedToken& t = added[static_cast<size_t>(index)];
    size_t start = pos, stop = pos + length;
    if (t.lstrip) start = std::max(text::whitespace_before(s, start), done);
    if (t.rstrip) stop = text::whitespace_after(s, stop);
    if (done < start) out.push_back({piece.begin + done, piece.begin + start});
    out.push_back({piece.begin + start, piece.begin + stop, index});
    done = pos = stop;
  }
  if (done < s.size()) out.push_back({piece.begin + done, piece.end});
}

// Text between added tokens: GPT-2's words, each through BPE once per encode() call (the
// cache holds where its ids already are in `out`).
void Tokenizer::Impl::encode_text(std::string_view text,
                                  StringMap<std::pair<size_t, size_t>>& cache,
                                  std::vector<int64_t>& out) const {
  std::string prefixed;
  if (add_prefix_space && text.front() != ' ') {
    prefixed = " " + std::string(text);
    text = prefixed;
  }
  for (const std::string_view word : text::split_gpt2(text)) {
    if (const auto it = cache.find(word); it != cache.end()) {
      const auto [offset, count] = it->second;
      for (size_t i = 0; i < count; ++i) out.push_back(out[offset + i]);
      continue;
    }
    const size_t offset = out.size();
    bpe(word, out);
    cache.emplace(std::string(word), std::pair{offset, out.size() - offset});
  }
}

// One symbol per byte, then the lowest-ranked adjacent pair merges, the leftmost among equal
// ranks, until none is in the merge list (HF's Word::merge_all, with its stale-entry check).
void Tokenizer::Impl::bpe(std::string_view word, std::vector<int64_t>& out) const {
  if (ignore_merges) {
    if (const auto it = model_vocab.find(bytes_to_token(word)); it != model_vocab.end()) {
      out.push_back(it->second);
      return;
    }
  }
  struct Symbol {
    int64_t id;
    int32_t prev, next;
    bool alive;
  };
  std::vector<Symbol> symbols;
  bool last_unknown = false;
  for (const char b : word) {
    int64_t id = byte_ids[static_cast<uint8_t>(b)];
    // A byte without a token is dropped, or becomes the unknown token (one for a run when
    // fuse_unk), as in HF.
    const bool unknown = id < 0;
    if (unknown && (!unk_id || (fuse_unk && last_unknown))) continue;
    if (unknown) id = *unk_id;
    last_unknown = unknown;
    const auto n = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, n - 1, -1, true});
    if (n > 0) symbols[static_cast<size_t>(n - 1)].next = n;
  }

  struct Candidate {
    uint32_t rank;
    int32_t pos;
    int64_t merged;
    bool operator<(const Candidate& o) const {  // the queue's top: lowest rank, then position
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate> queue;
  auto consider = [&](int32_t pos) {
    const Symbol& s = symbols[static_cast<size_t>(pos)];
    if (s.next < 0) return;
    const auto it = merges.find(pair_key(s.id, symbols[static_cast<size_t>(s.next)].id));
    if (it != merges.end()) queue.push({it->second.rank, pos, it->second.merged});
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(symbols.size()); ++i) consider(i);
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[static_cast<size_t>(top.pos)];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = symbols[static_cast<size_t>(left.next)];
    const auto it = merges.find(pair_key(left.id, right.id));
    if (it == merges.end() || it->second.merged != top.merged) continue;  // stale
    left.id = top.merged;
    left.next = right.next;
    right.alive = false;
    if (right.next >= 0) symbols[static_cast<size_t>(right.next)].prev = top.pos;
    if (left.prev >= 0) consider(left.prev);
    consider(top.pos);
  }
  for (int32_t i = symbols.empty() ? -1 : 0; i >= 0; i = symbols[static_cast<size_t>(i)].next)
    out.push_back(symbols[static_cast<size_t>(i)].id);
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

Tokenizer Tokenizer::from_dir(const std::string& dir) {
  return Tokenizer(std::make_unique<Impl>(tokenizer_files::read_dir(dir)));
}

bool Tokenizer::exists_in(const std::string& dir) {
  return tokenizer_files::exists_in(dir);
}

std::vector<int64_t> Tokenizer::encode(std::string_view text) const {
  if (const size_t bad = utf8::first_invalid(text); bad != std::string_view::npos) {
    throw Error(ErrorKind::InvalidArgument,
                "the text is not valid UTF-8 (at byte " + std::to_string(bad) + ")");
  }
  std::vector<int64_t> ids;
  StringMap<std::pair<size_t, size_t>> cache;
  for (const Piece& p : impl_->split_added(text)) {
    if (p.added >= 0) {
      ids.push_back(impl_->added[static_cast<size_t>(p.added)].id);
    } else if (p.end > p.begin) {
      impl_->encode_text(text.substr(p.begin, p.end - p.begin), cache, ids);
    }
  }
  return ids;
}

const std::string& Tokenizer::token_bytes(int64_t id) const {
  if (id < 0 || id >= vocab_size() || !impl_->known[static_cast<size_t>(id)]) impl_->bad_id(id);
  return impl_->bytes[static_cast<size_t>(id)];
}

std::string Tokenizer::decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const {
  std::string bytes;
  for (const int64_t id : ids) {
    const std::string& b = token_bytes(id);
    if (!(skip_special_tokens && is_special(id))) bytes += b;
  }
  std::string text;
  utf8::append_replacing_invalid(bytes, false, text);
  return text;
}

std::optional<int64_t> Tokenizer::token_to_id(std::string_view token) const {
  if (const auto it = impl_->added_vocab.find(token); it != impl_->added_vocab.end())
    return it->second;
  if (const auto it = impl_->model_vocab.find(token); it != impl_->model_vocab.end())
    return it->second;
  return std::nullopt;
}

std::optional<std::string> Tokenizer::id_to_token(int64_t id) const {
  if (id < 0 || id >= vocab_size() || !impl_->known[static_cast<size_t>(id)]) return std::nullopt;
  return impl_->tokens[static_cast<size_t>(id)];
}

bool Tokenizer::is_special(int64_t id) const {
  return id >= 0 && id < vocab_size() && impl_->special[static_cast<size_t>(id)];
}

int64_t Tokenizer::vocab_size() const {
  return static_cast<int64_t>(impl_->tokens.size());
}

TextStream::TextStream(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(&tokenizer), skip_special_(skip_special_tokens) {}

std::string TextStream::push(int64_t id) {
  const std::string& bytes = tokenizer_->token_bytes(id);
  if (skip_special_ && tokenizer_->is_special(id)) return {};
  pending_ += bytes;
  std::string text;
  pending_.erase(0, utf8::append_replacing_invalid(pending_, true, text));
  return text;
}

std::string TextStream::finish() {
  std::string text;
  utf8::append_replacing_invalid(pending_, false, text);
  pending_.clear();
  return text;
}

}  // namespace kiln
