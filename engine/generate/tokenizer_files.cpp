// tokenizer.json as Hugging Face `tokenizers` writes it, and the files transformers writes
// without it, read into one TokenizerSpec.
#include "engine/generate/tokenizer_files.h"

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <map>
#include <unordered_map>

#include "engine/util/json_file.h"
#include "kiln/error.h"

namespace kiln::tokenizer_files {

namespace fs = std::filesystem;
using json::Json;

namespace {

// Far above any real vocabulary; keeps a garbage id from sizing the id tables.
constexpr int64_t kMaxId = int64_t{1} << 24;

[[noreturn]] void bad(const std::string& file, const std::string& why) {
  throw Error(ErrorKind::InvalidModel, why).with_file(file);
}

[[noreturn]] void unsupported(const std::string& file, const std::string& why) {
  throw Error(ErrorKind::Unsupported, why).with_file(file);
}

// A JSON document and its path, with typed access whose failures name the file and the key.
struct Doc {
  Json json;
  std::string path;

  const Json* find(const Json& obj, const char* key) const {
    if (!obj.is_object()) return nullptr;
    const auto it = obj.find(key);
    return it == obj.end() || it->is_null() ? nullptr : &*it;
  }
  const Json& need(const Json& obj, const char* key) const {
    const Json* v = find(obj, key);
    if (!v) bad(path, std::string("no '") + key + "'");
    return *v;
  }
  const Json& need_object(const Json& obj, const char* key) const {
    const Json& v = need(obj, key);
    if (!v.is_object()) bad(path, std::string("'") + key + "' must be an object");
    return v;
  }
  const Json& need_array(const Json& obj, const char* key) const {
    const Json& v = need(obj, key);
    if (!v.is_array()) bad(path, std::string("'") + key + "' must be an array");
    return v;
  }
  bool flag(const Json& obj, const char* key, bool fallback) const {
    const Json* v = find(obj, key);
    if (!v) return fallback;
    if (!v->is_boolean()) bad(path, std::string("'") + key + "' must be true or false");
    return v->get<bool>();
  }
  std::string text(const Json& v, const std::string& what) const {
    if (!v.is_string()) bad(path, what + ": expected a string, got " + v.dump());
    return v.get<std::string>();
  }
  int64_t id(const Json& v, const std::string& what) const {
    const int64_t id = json::to_int(v, path, what);
    if (id < 0 || id >= kMaxId)
      bad(path, what + ": token id " + std::to_string(id) + " out of range");
    return id;
  }
};

Doc read_doc(const std::string& path) {
  Doc d{json::read_file(path), path};
  if (!d.json.is_object()) bad(path, "expected a JSON object");
  return d;
}

using Vocab = std::unordered_map<std::string, int64_t>;

// The model's vocabulary: token -> id, every id used once.
std::vector<std::pair<std::string, int64_t>> read_vocab(const Doc& d, const Json& obj) {
  std::vector<std::pair<std::string, int64_t>> vocab;
  std::unordered_map<int64_t, std::string> by_id;
  for (const auto& [token, value] : obj.items()) {
    const int64_t id = d.id(value, "vocabulary entry '" + token + "'");
    if (const auto [it, fresh] = by_id.emplace(id, token); !fresh) {
      bad(d.path, "token id " + std::to_string(id) + " is given to both '" + it->second +
                      "' and '" + token + "'");
    }
    vocab.emplace_back(token, id);
  }
  if (vocab.empty()) bad(d.path, "the vocabulary is empty");
  return vocab;
}

// One merge "a b": the ids of a, b and ab, or an error naming `where` and the missing token.
Merge resolve(const Vocab& vocab, const std::string& a, const std::string& b,
              const std::string& file, const std::string& where) {
  auto id = [&](const std::string& token, const char* role) {
    const auto it = vocab.find(token);
    if (it == vocab.end()) {
      bad(file, where + " ('" + a + "' '" + b + "'): " + role + " '" + token +
                    "' is not in the vocabulary");
    }
    return it->second;
  };
  return {id(a, "token"), id(b, "token"), id(a + b, "the merged token")};
}

Vocab vocab_map(const std::vector<std::pair<std::string, int64_t>>& vocab) {
  return Vocab(vocab.begin(), vocab.end());
}

// "a b" as the two tokens, or nothing when the line is not two tokens and one space.
std::optional<std::pair<std::string, std::string>> split_merge(std::string_view line) {
  const size_t space = line.find(' ');
  if (space == std::string_view::npos || line.find(' ', space + 1) != std::string_view::npos)
    return std::nullopt;
  return std::pair{std::string(line.substr(0, space)), std::string(line.substr(space + 1))};
}

AddedToken added_token(const Doc& d, const Json& t, int64_t id, bool special_default) {
  AddedToken a;
  a.id = id;
  a.content = d.text(d.need(t, "content"), "content");
  a.special = d.flag(t, "special", special_default);
  a.lstrip = d.flag(t, "lstrip", false);
  a.rstrip = d.flag(t, "rstrip", false);
  a.normalized = d.flag(t, "normalized", !a.special);
  if (d.flag(t, "single_word", false))
    unsupported(d.path, "added token '" + a.content + "': single_word is not supported");
  return a;
}

// --- tokenizer.json ---

void require_type(const Doc& d, const Json& doc, const char* key, const char* type) {
  const Json* v = d.find(doc, key);
  if (!v) unsupported(d.path, std::string("no ") + key + ": a byte-level BPE needs " + type);
  const Json* t = d.find(*v, "type");
  const std::string got = t && t->is_string() ? t->get<std::string>() : v->dump();
  if (got != type) {
    unsupported(d.path, std::string(key) + " '" + got + "' is not supported (only " + type + ")");
  }
}

TokenizerSpec read_tokenizer_json(const std::string& path) {
  const Doc d = read_doc(path);
  if (const Json* normalizer = d.find(d.json, "normalizer")) {
    const Json* type = d.find(*normalizer, "type");
    unsupported(path,
                "normalizer " + (type ? type->dump() : normalizer->dump()) + " is not supported");
  }
  require_type(d, d.json, "pre_tokenizer", "ByteLevel");
  require_type(d, d.json, "decoder", "ByteLevel");
  const Json& pre = d.need(d.json, "pre_tokenizer");
  if (!d.flag(pre, "use_regex", true))
    unsupported(path, "a ByteLevel pre_tokenizer without use_regex is not supported");

  const Json& model = d.need_object(d.json, "model");
  if (const Json* type = d.find(model, "type"); type && *type != "BPE")
    unsupported(path, "model type " + type->dump() + " is not supported (only BPE)");
  if (const Json* dropout = d.find(model, "dropout"); dropout && *dropout != 0)
    unsupported(path, "BPE dropout is not supported");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (const Json* v = d.find(model, key); v && *v != "")
      unsupported(path, std::string(key) + " is not supported");
  }
  if (d.flag(model, "byte_fallback", false)) unsupported(path, "byte_fallback is not supported");

  TokenizerSpec spec;
  spec.file = path;
  spec.vocab = read_vocab(d, d.need_object(model, "vocab"));
  const Vocab vocab = vocab_map(spec.vocab);
  const Json& merges = d.need_array(model, "merges");
  for (size_t i = 0; i < merges.size(); ++i) {
    const Json& m = merges[i];
    const std::string where = "merge " + std::to_string(i);
    std::optional<std::pair<std::string, std::string>> pair;
    if (m.is_string()) {
      pair = split_merge(m.get<std::string>());
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      pair = std::pair{m[0].get<std::string>(), m[1].get<std::string>()};
    }
    if (!pair) bad(path, where + ": expected \"a b\" or [\"a\", \"b\"], got " + m.dump());
    spec.merges.push_back(resolve(vocab, pair->first, pair->second, path, where));
  }
  if (const Json* unk = d.find(model, "unk_token")) {
    const std::string token = d.text(*unk, "unk_token");
    const auto it = vocab.find(token);
    if (it == vocab.end()) bad(path, "unk_token '" + token + "' is not in the vocabulary");
    spec.unk_id = it->second;
  }
  spec.fuse_unk = d.flag(model, "fuse_unk", false);
  spec.ignore_merges = d.flag(model, "ignore_merges", false);
  spec.add_prefix_space = d.flag(pre, "add_prefix_space", false);

  if (d.find(d.json, "added_tokens")) {
    for (const Json& t : d.need_array(d.json, "added_tokens")) {
      if (!t.is_object()) bad(path, "added_tokens: expected objects, got " + t.dump());
      spec.added.push_back(added_token(d, t, d.id(d.need(t, "id"), "added token id"), false));
    }
  }
  return spec;
}

// --- vocab.json + merges.txt and transformers' files beside them ---

std::vector<Merge> read_merges_txt(const std::string& path, const Vocab& vocab) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ErrorKind::Io, "cannot open").with_file(path);
  std::vector<Merge> merges;
  std::string line;
  for (int line_no = 1; std::getline(in, line); ++line_no) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line.rfind("#version", 0) == 0) continue;
    const std::string where = "line " + std::to_string(line_no);
    const auto pair = split_merge(line);
    if (!pair) bad(path, where + ": expected two tokens separated by one space");
    merges.push_back(resolve(vocab, pair->first, pair->second, path, where));
  }
  return merges;
}

// special_tokens_map.json: every token it names (bos_token, additional_special_tokens, ...),
// as written (a string or an object with "content" and flags).
std::vector<Json> special_tokens(const Doc& d) {
  std::vector<Json> out;
  auto take = [&](const Json& v) {
    if (v.is_string()) {
      out.push_back(Json{{"content", v}, {"special", true}});
    } else if (v.is_object() && v.contains("content") && v["content"].is_string()) {
      Json t = v;
      t["special"] = true;
      out.push_back(std::move(t));
    } else if (!v.is_null()) {
      bad(d.path, "expected a token (a string or an object with \"content\"), got " + v.dump());
    }
  };
  for (const auto& [key, value] : d.json.items()) {
    if (value.is_array()) {
      for (const Json& v : value) take(v);
    } else {
      take(value);
    }
  }
  return out;
}

TokenizerSpec read_legacy(const fs::path& dir) {
  TokenizerSpec spec;
  spec.file = (dir / "vocab.json").string();
  const Doc vocab_doc = read_doc(spec.file);
  spec.vocab = read_vocab(vocab_doc, vocab_doc.json);
  const Vocab vocab = vocab_map(spec.vocab);
  spec.merges = read_merges_txt((dir / "merges.txt").string(), vocab);

  std::map<std::string, size_t> added_index;  // content -> position in spec.added
  auto add = [&](AddedToken t) {
    if (added_index.emplace(t.content, spec.added.size()).second)
      spec.added.push_back(std::move(t));
  };
  auto optional_doc = [&](const char* name) {
    const fs::path p = dir / name;
    return fs::exists(p) ? std::optional<Doc>(read_doc(p.string())) : std::nullopt;
  };
  // tokenizer_config.json's added_tokens_decoder states every added token with its flags.
  if (const auto config = optional_doc("tokenizer_config.json")) {
    spec.add_prefix_space = config->flag(config->json, "add_prefix_space", false);
    if (const Json* decoder = config->find(config->json, "added_tokens_decoder")) {
      for (const auto& [key, t] : decoder->items()) {
        int64_t id = -1;
        const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
        if (ec != std::errc() || end != key.data() + key.size() || id < 0 || id >= kMaxId)
          bad(config->path, "added_tokens_decoder: '" + key + "' is not a token id");
        add(added_token(*config, t, id, false));
      }
    }
  }
  // Older exports: added_tokens.json gives ids, special_tokens_map.json says which are special.
  std::vector<Json> specials;
  const auto special_map = optional_doc("special_tokens_map.json");
  if (special_map) specials = special_tokens(*special_map);
  auto special_entry = [&](const std::string& content) -> const Json* {
    for (const Json& s : specials) {
      if (s["content"] == content) return &s;
    }
    return nullptr;
  };
  if (const auto added = optional_doc("added_tokens.json")) {
    for (const auto& [content, value] : added->json.items()) {
      const int64_t id = added->id(value, "added token '" + content + "'");
      const Json* s = special_entry(content);
      add(s ? added_token(*special_map, *s, id, true)
            : AddedToken{id, content, false, false, false, true});
    }
  }
  for (const Json& s : specials) {
    const std::string content = s["content"].get<std::string>();
    if (added_index.count(content)) continue;
    const auto it = vocab.find(content);
    if (it == vocab.end()) {
      bad(special_map->path,
          "special token '" + content + "' is neither in vocab.json nor in added_tokens.json");
    }
    add(added_token(*special_map, s, it->second, true));
  }
  return spec;
}

// Ids index tables, so they must not leave most of their range unused.
TokenizerSpec checked(TokenizerSpec spec) {
  int64_t largest = 0;
  for (const auto& [token, id] : spec.vocab) largest = std::max(largest, id);
  for (const AddedToken& t : spec.added) largest = std::max(largest, t.id);
  const auto count = static_cast<int64_t>(spec.vocab.size() + spec.added.size());
  if (largest >= 2 * count + 1024) {
    bad(spec.file, "token ids go up to " + std::to_string(largest) + " for " +
                       std::to_string(count) + " tokens: too sparse");
  }
  return spec;
}

}  // namespace

bool exists_in(const std::string& dir) {
  const fs::path d(dir);
  return fs::exists(d / "tokenizer.json") ||
         (fs::exists(d / "vocab.json") && fs::exists(d / "merges.txt"));
}

TokenizerSpec read_dir(const std::string& dir) {
  const fs::path d(dir);
  if (!fs::is_directory(d)) throw Error(ErrorKind::Io, "not a folder").with_file(dir);
  if (fs::exists(d / "tokenizer.json"))
    return checked(read_tokenizer_json((d / "tokenizer.json").string()));
  if (fs::exists(d / "vocab.json") && fs::exists(d / "merges.txt")) return checked(read_legacy(d));
  throw Error(ErrorKind::Io, "no tokenizer: neither tokenizer.json nor vocab.json and merges.txt")
      .with_file(dir);
}

}  // namespace kiln::tokenizer_files
