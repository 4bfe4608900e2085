// The byte-level BPE tokenizer against Hugging Face `tokenizers`: the references in
// test/data/tokenizer come from tools/export/make_tokenizer_refs.py (a small trained BPE in
// both file formats, committed; the real Whisper tiny.en tokenizer.json, made on demand in
// models/cache/tokenizers).
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <functional>

#include "engine/util/json_file.h"
#include "engine/util/utf8.h"
#include "kiln/error.h"
#include "kiln/tokenizer.h"
#include "test/unit/temp_dir.h"

using namespace kiln;
namespace fs = std::filesystem;

namespace {

const std::string kData = std::string(KILN_SOURCE_DIR) + "/test/data/tokenizer";
const std::string kWhisperDir =
    std::string(KILN_SOURCE_DIR) + "/models/cache/tokenizers/whisper-tiny.en";
const std::string kMakeRefs =
    "tools/export/make_tokenizer_refs.py (models/README.md: Benchmark models)";

std::vector<int64_t> ids_of(const json::Json& v) {
  return v.get<std::vector<int64_t>>();
}

// Every encode and decode reference of `refs` (a *-refs.json document) on `tok`.
void check_references(const Tokenizer& tok, const json::Json& refs) {
  CHECK(tok.vocab_size() == refs["vocab_size"].get<int64_t>());
  std::vector<int64_t> special;
  for (int64_t id = 0; id < tok.vocab_size(); ++id) {
    if (tok.is_special(id)) special.push_back(id);
  }
  CHECK(special == ids_of(refs["special_ids"]));
  for (const auto& r : refs["encode"]) {
    const std::string text = r["text"];
    INFO("text: " << text);
    const std::vector<int64_t> ids = tok.encode(text);
    CHECK(ids == ids_of(r["ids"]));
    CHECK(tok.decode(ids) == r["skip_special"].get<std::string>());
    CHECK(tok.decode(ids, false) == r["with_special"].get<std::string>());
  }
  for (const auto& r : refs["decode"]) {
    INFO("ids: " << r["ids"].dump());
    CHECK(tok.decode(ids_of(r["ids"])) == r["skip_special"].get<std::string>());
    CHECK(tok.decode(ids_of(r["ids"]), false) == r["with_special"].get<std::string>());
  }
}

// A copy of DIR in a temporary folder, for variants of its files.
fs::path copy_dir(const std::string& dir, const testing::TempDir& tmp, const std::string& name) {
  const fs::path out = tmp.path / name;
  fs::copy(dir, out, fs::copy_options::recursive);
  return out;
}

void write_json(const fs::path& path, const json::Json& doc) {
  std::ofstream(path, std::ios::binary) << doc.dump(1);
}

// The message of the kiln::Error `f` throws, or "" when it does not throw.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Pushes `ids` through a TextStream: every piece must be valid UTF-8; returns them joined.
std::string streamed(const Tokenizer& tok, const std::vector<int64_t>& ids, bool skip_special) {
  TextStream stream(tok, skip_special);
  std::string text;
  for (const int64_t id : ids) {
    const std::string piece = stream.push(id);
    CHECK(utf8::first_invalid(piece) == std::string_view::npos);
    text += piece;
  }
  const std::string tail = stream.finish();
  CHECK(utf8::first_invalid(tail) == std::string_view::npos);
  return text + tail;
}

void check_streaming(const Tokenizer& tok, const json::Json& refs) {
  std::vector<std::vector<int64_t>> cases;
  for (const auto& r : refs["encode"]) cases.push_back(ids_of(r["ids"]));
  for (const auto& r : refs["decode"]) cases.push_back(ids_of(r["ids"]));
  for (const auto& ids : cases) {
    INFO("ids: " << json::Json(ids).dump());
    CHECK(streamed(tok, ids, true) == tok.decode(ids, true));
    CHECK(streamed(tok, ids, false) == tok.decode(ids, false));
  }
}

// 64-bit FNV-1a of the ids written as decimal text joined by commas (as the script hashes).
std::string fnv1a64(const std::vector<int64_t>& ids) {
  uint64_t h = 0xCBF29CE484222325ull;
  std::string text;
  for (size_t i = 0; i < ids.size(); ++i) text += (i ? "," : "") + std::to_string(ids[i]);
  for (const char c : text) h = (h ^ static_cast<uint8_t>(c)) * 0x100000001B3ull;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return hex;
}

// The corpus joined by newlines, repeated to 100 kB (the script's long_text), encoded and
// compared by count and hash. (Its speed is a benchmark's question, not a test's.)
void check_long_text(const Tokenizer& tok, const json::Json& refs) {
  std::string unit;
  for (const auto& r : refs["encode"]) unit += r["text"].get<std::string>() + "\n";
  std::string text;
  for (int i = 0; i < refs["long_text"]["repeat"].get<int>(); ++i) text += unit;
  REQUIRE(text.size() == refs["long_text"]["bytes"].get<size_t>());
  const std::vector<int64_t> ids = tok.encode(text);
  CHECK(ids.size() == refs["long_text"]["count"].get<size_t>());
  CHECK(fnv1a64(ids) == refs["long_text"]["fnv1a64"].get<std::string>());
}

}  // namespace

TEST_CASE("small BPE from tokenizer.json encodes and decodes as tokenizers does", "[tokenizer]") {
  const Tokenizer tok = Tokenizer::from_dir(kData + "/small-bpe");
  const json::Json refs = json::read_file(kData + "/small-bpe-refs.json");
  check_references(tok, refs);
  // 100 kB of mixed text: the same ids.
  check_long_text(tok, refs);
}

TEST_CASE("small BPE from vocab.json + merges.txt is the same tokenizer", "[tokenizer]") {
  const json::Json refs = json::read_file(kData + "/small-bpe-refs.json");
  const Tokenizer from_json = Tokenizer::from_dir(kData + "/small-bpe");
  const Tokenizer legacy = Tokenizer::from_dir(kData + "/small-bpe-legacy");
  check_references(legacy, refs);
  REQUIRE(legacy.vocab_size() == from_json.vocab_size());
  for (int64_t id = 0; id < legacy.vocab_size(); ++id) {
    INFO("id " << id);
    REQUIRE(legacy.id_to_token(id).has_value());
    CHECK(legacy.id_to_token(id) == from_json.id_to_token(id));
    CHECK(legacy.token_to_id(*legacy.id_to_token(id)) == id);
    CHECK(legacy.is_special(id) == from_json.is_special(id));
  }

  // Older transformers: no added_tokens_decoder, so added_tokens.json gives the ids and
  // special_tokens_map.json says which are special (and that <mask> strips on its left).
  testing::TempDir tmp;
  const fs::path old = copy_dir(kData + "/small-bpe-legacy", tmp, "old");
  json::Json config = json::read_file((old / "tokenizer_config.json").string());
  config.erase("added_tokens_decoder");
  write_json(old / "tokenizer_config.json", config);
  check_references(Tokenizer::from_dir(old.string()), refs);
}

TEST_CASE("tokenizer.json options: add_prefix_space, ignore_merges, unknown tokens",
          "[tokenizer]") {
  const json::Json refs = json::read_file(kData + "/small-bpe-refs.json");
  const json::Json doc = json::read_file(kData + "/small-bpe/tokenizer.json");
  testing::TempDir tmp;
  for (const std::string variant : {"add_prefix_space", "ignore_merges"}) {
    json::Json changed = doc;
    if (variant == "add_prefix_space") changed["pre_tokenizer"]["add_prefix_space"] = true;
    if (variant == "ignore_merges") changed["model"]["ignore_merges"] = true;
    fs::create_directories(tmp.path / variant);
    write_json(tmp.path / variant / "tokenizer.json", changed);
    const Tokenizer tok = Tokenizer::from_dir((tmp.path / variant).string());
    for (const auto& r : refs["variants"][variant]) {
      INFO(variant << ": " << r["text"].get<std::string>());
      CHECK(tok.encode(r["text"].get<std::string>()) == ids_of(r["ids"]));
    }
  }
  // Vocabularies missing characters: dropped without an unk_token, else unknown, fused or not.
  int n = 0;
  for (const auto& mini : refs["mini"]) {
    const fs::path dir = tmp.path / ("mini" + std::to_string(n++));
    fs::create_directories(dir);
    write_json(dir / "tokenizer.json", mini["tokenizer"]);
    const Tokenizer tok = Tokenizer::from_dir(dir.string());
    for (const auto& c : mini["cases"]) {
      INFO(dir.filename().string() << ": " << c["text"].get<std::string>());
      CHECK(tok.encode(c["text"].get<std::string>()) == ids_of(c["ids"]));
    }
  }
}

TEST_CASE("TextStream gives valid UTF-8 pieces that join to decode()", "[tokenizer]") {
  const Tokenizer tok = Tokenizer::from_dir(kData + "/small-bpe");
  const json::Json refs = json::read_file(kData + "/small-bpe-refs.json");
  check_streaming(tok, refs);

  // The euro sign one byte a token (the first decode case): nothing until its last byte.
  const std::vector<int64_t> euro = ids_of(refs["decode"][0]["ids"]);
  REQUIRE(tok.decode(euro) == "\xE2\x82\xAC");
  TextStream stream(tok);
  CHECK(stream.push(euro[0]).empty());
  CHECK(stream.push(euro[1]).empty());
  CHECK(stream.push(euro[2]) == "\xE2\x82\xAC");
  // Cut short: replaced when the next byte cannot continue it, or at finish().
  CHECK(stream.push(euro[0]).empty());
  CHECK(stream.push(*tok.token_to_id("x")) == "\xEF\xBF\xBDx");
  CHECK(stream.push(euro[0]).empty());
  CHECK(stream.push(euro[1]).empty());
  CHECK(stream.finish() == "\xEF\xBF\xBD");
  CHECK(stream.finish().empty());
}

TEST_CASE("Whisper tiny.en's tokenizer.json encodes and decodes as tokenizers does",
          "[tokenizer][whisper]") {
  if (!Tokenizer::exists_in(kWhisperDir)) {
    WARN("KILN-SKIP: no " << kWhisperDir << "/tokenizer.json; make it with " << kMakeRefs);
    return;
  }
  const json::Json refs = json::read_file(kData + "/whisper-tiny.en-refs.json");
  const Tokenizer tok = Tokenizer::from_dir(kWhisperDir);
  check_references(tok, refs);
  check_streaming(tok, refs);
  check_long_text(tok, refs);
  CHECK(tok.token_to_id("<|notimestamps|>") == 50362);
  CHECK(tok.id_to_token(50256) == "<|endoftext|>");

  // The file lists no timestamp tokens: HF's decode drops their ids silently, kiln says so.
  const int64_t first_timestamp = refs["timestamps"]["first_id"];
  CHECK(first_timestamp == tok.vocab_size());
  CHECK_THAT(error_of([&] {
               tok.decode({50257, first_timestamp});
             }),
             Catch::Contains("tokenizer.json: token id 50363 is outside the vocabulary"));

  // With Whisper's 1501 timestamp tokens added (not special: skip_special keeps them).
  const std::string stamped_dir = kWhisperDir + "-timestamps";
  REQUIRE(Tokenizer::exists_in(stamped_dir));
  const Tokenizer stamped = Tokenizer::from_dir(stamped_dir);
  CHECK(stamped.id_to_token(first_timestamp) == "<|0.00|>");
  CHECK(stamped.id_to_token(first_timestamp + 1500) == "<|30.00|>");
  for (const auto& r : refs["timestamps"]["decode"]) {
    INFO("ids: " << r["ids"].dump());
    CHECK(stamped.decode(ids_of(r["ids"])) == r["skip_special"].get<std::string>());
    CHECK(stamped.decode(ids_of(r["ids"]), false) == r["with_special"].get<std::string>());
    CHECK(streamed(stamped, ids_of(r["ids"]), true) == r["skip_special"].get<std::string>());
  }
}

TEST_CASE("bad tokenizer files and inputs give one clear error", "[tokenizer]") {
  testing::TempDir tmp;
  const std::string dir = tmp.path.string();
  auto load_error = [&](const std::string& sub) {
    return error_of([&] { Tokenizer::from_dir(dir + "/" + sub); });
  };
  CHECK_THAT(load_error("nope"), Catch::Contains("nope: not a folder"));
  fs::create_directories(tmp.path / "empty");
  CHECK_FALSE(Tokenizer::exists_in(dir + "/empty"));
  CHECK_THAT(load_error("empty"),
             Catch::Contains("empty: no tokenizer: neither tokenizer.json nor vocab.json"));

  const json::Json good = json::read_file(kData + "/small-bpe/tokenizer.json");
  auto json_error = [&](const std::string& name, const std::string& text) {
    tmp.file(name + "/tokenizer.json", text);
    return load_error(name);
  };
  auto changed_error = [&](const std::string& name, const std::function<void(json::Json&)>& f) {
    json::Json doc = good;
    f(doc);
    return json_error(name, doc.dump());
  };
  CHECK_THAT(json_error("garbage", "\x89PNG not json"),
             Catch::Contains("garbage/tokenizer.json: invalid JSON"));
  CHECK_THAT(json_error("array", "[1, 2]"),
             Catch::Contains("array/tokenizer.json: expected a JSON object"));
  CHECK_THAT(changed_error("nomodel", [](json::Json& d) { d.erase("model"); }),
             Catch::Contains("nomodel/tokenizer.json: no 'model'"));
  CHECK_THAT(changed_error("wordpiece", [](json::Json& d) { d["model"]["type"] = "WordPiece"; }),
             Catch::Contains("model type \"WordPiece\" is not supported (only BPE)"));
  CHECK_THAT(changed_error("normalizer",
                           [](json::Json& d) {
                             d["normalizer"] = {{"type", "NFC"}};
                           }),
             Catch::Contains("normalizer \"NFC\" is not supported"));
  CHECK_THAT(changed_error("metaspace",
                           [](json::Json& d) {
                             d["pre_tokenizer"] = {{"type", "Metaspace"}};
                           }),
             Catch::Contains("pre_tokenizer 'Metaspace' is not supported (only ByteLevel)"));
  CHECK_THAT(changed_error("unknown-merge",
                           [](json::Json& d) {
                             d["model"]["merges"][3] = {"Ġ", "zzz"};
                           }),
             Catch::Contains("unknown-merge/tokenizer.json: merge 3 ('Ġ' 'zzz'): token 'zzz' "
                             "is not in the vocabulary"));
  CHECK_THAT(changed_error("bad-merge", [](json::Json& d) { d["model"]["merges"][0] = "a b c"; }),
             Catch::Contains("merge 0: expected \"a b\" or [\"a\", \"b\"]"));
  CHECK_THAT(changed_error("vocab-type", [](json::Json& d) { d["model"]["vocab"]["a"] = "x"; }),
             Catch::Contains("vocabulary entry 'a': expected an integer, got a string"));
  CHECK_THAT(changed_error("negative", [](json::Json& d) { d["model"]["vocab"]["a"] = -4; }),
             Catch::Contains("vocabulary entry 'a': token id -4 out of range"));
  CHECK_THAT(changed_error("sparse", [](json::Json& d) { d["model"]["vocab"]["zz"] = 9999999; }),
             Catch::Contains("token ids go up to 9999999 for 1493 tokens: too sparse"));
  CHECK_THAT(changed_error("shared", [](json::Json& d) { d["model"]["vocab"]["a"] = 66; }),
             Catch::Contains("token id 66 is given to both"));
  CHECK_THAT(changed_error("dropout", [](json::Json& d) { d["model"]["dropout"] = 0.1; }),
             Catch::Contains("BPE dropout is not supported"));
  CHECK_THAT(changed_error("single-word",
                           [](json::Json& d) { d["added_tokens"][0]["single_word"] = true; }),
             Catch::Contains("added token '<|endoftext|>': single_word is not supported"));

  // vocab.json + merges.txt: a merge of unknown tokens, a line that is not a merge.
  const fs::path legacy = copy_dir(kData + "/small-bpe-legacy", tmp, "legacy");
  std::ofstream(legacy / "merges.txt", std::ios::app) << "Ġ qqq\n";
  CHECK_THAT(load_error("legacy"),
             Catch::Contains("legacy/merges.txt: line ") && Catch::Contains(" ('Ġ' 'qqq'): "
                                                                            "token 'qqq' is not "
                                                                            "in the vocabulary"));
  std::ofstream(legacy / "merges.txt") << "#version: 0.2\nab\n";
  CHECK_THAT(load_error("legacy"),
             Catch::Contains("merges.txt: line 2: expected two tokens separated by one space"));
  // A special token with no id: neither in vocab.json nor in added_tokens.json.
  const fs::path special = copy_dir(kData + "/small-bpe-legacy", tmp, "special");
  fs::remove(special / "tokenizer_config.json");
  json::Json map = json::read_file((special / "special_tokens_map.json").string());
  map["pad_token"] = "<pad>";
  write_json(special / "special_tokens_map.json", map);
  CHECK_THAT(load_error("special"),
             Catch::Contains("special/special_tokens_map.json: special token '<pad>' is neither "
                             "in vocab.json nor in added_tokens.json"));

  // Ids that name no token, text that is not UTF-8.
  const Tokenizer tok = Tokenizer::from_dir(kData + "/small-bpe");
  CHECK_THAT(error_of([&] {
               tok.decode({1, 2, tok.vocab_size()});
             }),
             Catch::Contains("small-bpe/tokenizer.json: token id 1492 is outside the vocabulary "
                             "(1492 ids)"));
  CHECK_THAT(error_of([&] { tok.decode({-1}); }), Catch::Contains("token id -1 is outside"));
  TextStream stream(tok);
  CHECK_THAT(error_of([&] { stream.push(1 << 20); }), Catch::Contains("token id 1048576"));
  CHECK_FALSE(tok.id_to_token(-3).has_value());
  CHECK_FALSE(tok.token_to_id("no such token").has_value());
  CHECK_THAT(error_of([&] { tok.encode("ok \xC3("); }),
             Catch::Contains("the text is not valid UTF-8 (at byte 3)"));
}
