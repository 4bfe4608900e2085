// Whisper's configuration (engine/generate/whisper.cpp): what config.json and
// generation_config.json say about decoding, and the language table.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace kiln::detail::whisper {

inline constexpr int64_t kInputStride = 2;  // log-mel frames per encoder position

// Whisper's languages (openai-whisper's tokenizer), code and name.
inline constexpr std::pair<const char*, const char*> kLanguages[] = {
    {"en", "english"},
    {"zh", "chinese"},
    {"de", "german"},
    {"es", "spanish"},
    {"ru", "russian"},
    {"ko", "korean"},
    {"fr", "french"},
    {"ja", "japanese"},
    {"pt", "portuguese"},
    {"tr", "turkish"},
    {"pl", "polish"},
    {"ca", "catalan"},
    {"nl", "dutch"},
    {"ar", "arabic"},
    {"sv", "swedish"},
    {"it", "italian"},
    {"id", "indonesian"},
    {"hi", "hindi"},
    {"fi", "finnish"},
    {"vi", "vietnamese"},
    {"he", "hebrew"},
    {"uk", "ukrainian"},
    {"el", "greek"},
    {"ms", "malay"},
    {"cs", "czech"},
    {"ro", "romanian"},
    {"da", "danish"},
    {"hu", "hungarian"},
    {"ta", "tamil"},
    {"no", "norwegian"},
    {"th", "thai"},
    {"ur", "urdu"},
    {"hr", "croatian"},
    {"bg", "bulgarian"},
    {"lt", "lithuanian"},
    {"la", "latin"},
    {"mi", "maori"},
    {"ml", "malayalam"},
    {"cy", "welsh"},
    {"sk", "slovak"},
    {"te", "telugu"},
    {"fa", "persian"},
    {"lv", "latvian"},
    {"bn", "bengali"},
    {"sr", "serbian"},
    {"az", "azerbaijani"},
    {"sl", "slovenian"},
    {"kn", "kannada"},
    {"et", "estonian"},
    {"mk", "macedonian"},
    {"br", "breton"},
    {"eu", "basque"},
    {"is", "icelandic"},
    {"hy", "armenian"},
    {"ne", "nepali"},
    {"mn", "mongolian"},
    {"bs", "bosnian"},
    {"kk", "kazakh"},
    {"sq", "albanian"},
    {"sw", "swahili"},
    {"gl", "galician"},
    {"mr", "marathi"},
    {"pa", "punjabi"},
    {"si", "sinhala"},
    {"km", "khmer"},
    {"sn", "shona"},
    {"yo", "yoruba"},
    {"so", "somali"},
    {"af", "afrikaans"},
    {"oc", "occitan"},
    {"ka", "georgian"},
    {"be", "belarusian"},
    {"tg", "tajik"},
    {"sd", "sindhi"},
    {"gu", "gujarati"},
    {"am", "amharic"},
    {"yi", "yiddish"},
    {"lo", "lao"},
    {"uz", "uzbek"},
    {"fo", "faroese"},
    {"ht", "haitian creole"},
    {"ps", "pashto"},
    {"tk", "turkmen"},
    {"nn", "nynorsk"},
    {"mt", "maltese"},
    {"sa", "sanskrit"},
    {"lb", "luxembourgish"},
    {"my", "myanmar"},
    {"bo", "tibetan"},
    {"tl", "tagalog"},
    {"mg", "malagasy"},
    {"as", "assamese"},
    {"tt", "tatar"},
    {"haw", "hawaiian"},
    {"ln", "lingala"},
    {"ha", "hausa"},
    {"ba", "bashkir"},
    {"jw", "javanese"},
    {"su", "sundanese"},
    {"yue", "cantonese"},
    // Other names transformers accepts.
    {"my", "burmese"},
    {"ca", "valencian"},
    {"nl", "flemish"},
    {"ht", "haitian"},
    {"lb", "letzeburgesch"},
    {"ps", "pushto"},
    {"pa", "panjabi"},
    {"ro", "moldavian"},
    {"ro", "moldovan"},
    {"si", "sinhalese"},
    {"es", "castilian"},
    {"zh", "mandarin"},
};

// What config.json and generation_config.json say about Whisper decoding.
struct WhisperConfig {
  int64_t start = -1, eos = -1;
  int64_t vocab = 0, max_target_positions = 448, num_segment_frames = 3000;
  int64_t max_length = 448;
  int64_t no_timestamps = -1, timestamp_begin = 0;
  int64_t prev_sot = -1;
  std::optional<int64_t> max_initial_timestamp_index;
  std::map<std::string, int64_t> lang_to_id, task_to_id;
  std::optional<bool> is_multilingual;
  std::vector<std::optional<int64_t>> forced;  // forced_decoder_ids from position 1
  std::vector<int64_t> suppress, begin_suppress;
  bool return_timestamps = false;
  std::string gen_path;

  bool multilingual() const { return is_multilingual.value_or(!lang_to_id.empty()); }
};

WhisperConfig read_whisper_config(const std::filesystem::path& dir);

}  // namespace kiln::detail::whisper
