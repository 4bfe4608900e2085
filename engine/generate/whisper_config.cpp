#include "engine/generate/whisper_config.h"

#include <algorithm>

#include "engine/generate/decoding.h"
#include "kiln/error.h"

namespace kiln::detail::whisper {
namespace {

namespace fs = std::filesystem;

std::map<std::string, int64_t> token_map(const JsonFile& f, const char* key) {
  std::map<std::string, int64_t> out;
  const json::Json* v = f.find(key);
  if (!v || !v->is_object()) return out;
  for (auto it = v->begin(); it != v->end(); ++it)
    out[it.key()] = json::to_int(it.value(), f.path, key);
  return out;
}

}  // namespace

WhisperConfig read_whisper_config(const fs::path& dir) {
  const JsonFile config = read_json(dir / "config.json", true);
  const JsonFile gen = read_json(dir / "generation_config.json", false);
  WhisperConfig c;
  c.gen_path = gen.path;
  c.start = int_or(gen, "decoder_start_token_id", int_or(config, "decoder_start_token_id", -1));
  if (c.start < 0) bad_model(config.path, "no decoder_start_token_id");
  std::vector<int64_t> eos = ints_of(gen, "eos_token_id");
  if (eos.empty()) eos = ints_of(config, "eos_token_id");
  if (eos.empty()) bad_model(config.path, "no eos_token_id");
  c.eos = eos[0];
  c.vocab = int_or(config, "vocab_size", 0);
  if (c.vocab <= 0) bad_model(config.path, "no vocab_size");
  c.max_target_positions = int_or(config, "max_target_positions", 448);
  c.num_segment_frames = kInputStride * int_or(config, "max_source_positions", 1500);
  c.max_length =
      std::min(int_or(gen, "max_length", int_or(config, "max_length", 20)), c.max_target_positions);
  c.no_timestamps = int_or(gen, "no_timestamps_token_id", -1);
  c.timestamp_begin = c.no_timestamps >= 0 ? c.no_timestamps + 1 : c.vocab + 1;
  c.suppress = ints_of(gen, "suppress_tokens");
  c.begin_suppress = ints_of(gen, "begin_suppress_tokens");
  c.prev_sot = int_or(gen, "prev_sot_token_id", -1);
  if (c.prev_sot < 0 && c.suppress.size() >= 2) c.prev_sot = c.suppress[c.suppress.size() - 2];
  if (const json::Json* v = gen.find("max_initial_timestamp_index"); v && v->is_number())
    c.max_initial_timestamp_index = json::to_int(*v, gen.path, "max_initial_timestamp_index");
  c.lang_to_id = token_map(gen, "lang_to_id");
  c.task_to_id = token_map(gen, "task_to_id");
  if (const json::Json* v = gen.find("is_multilingual"); v && v->is_boolean())
    c.is_multilingual = v->get<bool>();
  if (const json::Json* v = gen.find("return_timestamps"); v && v->is_boolean())
    c.return_timestamps = v->get<bool>();
  const json::Json* forced = gen.find("forced_decoder_ids");
  if (!forced || forced->is_null()) forced = config.find("forced_decoder_ids");
  if (forced && forced->is_array()) {
    int64_t pos = 1;
    for (const auto& p : *forced) {
      if (!p.is_array() || p.size() != 2 ||
          json::to_int(p[0], gen.path, "forced_decoder_ids") != pos)
        throw Error(ErrorKind::Unsupported,
                    "forced_decoder_ids must force consecutive positions from 1")
            .with_file(gen.path);
      c.forced.push_back(p[1].is_null() ? std::nullopt
                                        : std::optional(json::to_int(p[1], gen.path, "forced")));
      ++pos;
    }
  }
  return c;
}

}  // namespace kiln::detail::whisper
