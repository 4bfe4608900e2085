// The generate layer from Python: audio reading, the tokenizer, Whisper transcription and the
// causal-LM decode loop. Results come back as plain dicts and lists; the GIL is released while
// kiln decodes.
#include "generate.h"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/audio.h"
#include "kiln/generate.h"
#include "kiln/tokenizer.h"
#include "kiln/transcribe.h"
#include "kiln/vad.h"

namespace kiln::python {

namespace {

namespace py = pybind11;

// A float32 copy of `array` as a kiln tensor of the same shape.
Tensor float_tensor(const py::array& array) {
  const auto a = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(array);
  if (!a) throw Error(ErrorKind::InvalidArgument, "expected an array of numbers");
  Shape shape(a.shape(), a.shape() + a.ndim());
  Tensor t = Tensor::zeros(DataType::Float, shape);
  std::copy(a.data(), a.data() + a.size(), t.data<float>());
  return t;
}

std::vector<float> samples_of(const py::object& audio) {
  if (py::isinstance<py::str>(audio)) return read_audio(audio.cast<std::string>());
  const auto a = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(audio);
  if (!a || a.ndim() != 1)
    throw Error(ErrorKind::InvalidArgument,
                "audio must be a file path or a 1-D array of 16 kHz samples");
  return std::vector<float>(a.data(), a.data() + a.size());
}

GeneratorOptions generator_options(int threads) {
  GeneratorOptions o;
  o.environment = std::make_shared<Environment>(threads);
  return o;
}

// Speech regions as [{"start", "end"}] in samples.
py::list regions_list(const std::vector<SpeechRegion>& regions) {
  py::list out;
  for (const SpeechRegion& r : regions) {
    py::dict d;
    d["start"] = r.start;
    d["end"] = r.end;
    out.append(d);
  }
  return out;
}

py::dict transcript_dict(const Transcript& t) {
  py::list segments;
  for (const TranscriptSegment& s : t.segments) {
    py::dict d;
    d["start"] = s.start;
    d["end"] = s.end;
    d["text"] = s.text;
    d["tokens"] = s.tokens;
    d["token_logprobs"] = s.token_logprobs;
    d["temperature"] = s.temperature;
    d["avg_logprob"] = s.avg_logprob;
    d["compression_ratio"] = s.compression_ratio;
    d["no_speech_prob"] = s.no_speech_prob;
    segments.append(d);
  }
  py::dict d;
  d["text"] = t.text;
  d["language"] = t.language;
  d["speech_regions"] = regions_list(t.speech_regions);
  d["tokens"] = t.tokens;
  d["prompt"] = t.prompt;
  d["segments"] = segments;
  d["encoder_runs"] = t.encoder_runs;
  d["decoder_steps"] = t.decoder_steps;
  d["fallbacks"] = t.fallbacks;
  return d;
}

// faster-whisper's VadOptions keywords.
VadOptions vad_options(const py::dict& kw) {
  VadOptions o;
  for (const auto& [key, value] : kw) {
    const std::string k = key.cast<std::string>();
    if (value.is_none()) continue;
    if (k == "threshold") {
      o.threshold = value.cast<float>();
    } else if (k == "neg_threshold") {
      o.neg_threshold = value.cast<float>();
    } else if (k == "min_speech_duration_ms") {
      o.min_speech_duration_ms = value.cast<int64_t>();
    } else if (k == "max_speech_duration_s") {
      o.max_speech_duration_s = value.cast<double>();
    } else if (k == "min_silence_duration_ms") {
      o.min_silence_duration_ms = value.cast<int64_t>();
    } else if (k == "speech_pad_ms") {
      o.speech_pad_ms = value.cast<int64_t>();
    } else {
      throw Error(ErrorKind::InvalidArgument, "unknown VAD option '" + k + "'");
    }
  }
  return o;
}

class PyVad {
 public:
  PyVad(const std::string& path, int threads) {
    SessionOptions so;
    so.environment = std::make_shared<Environment>(threads);
    vad_ = std::make_shared<VoiceActivityDetector>(path, so);
  }

  py::array_t<float> probabilities(const py::object& audio) const {
    const std::vector<float> samples = samples_of(audio);
    std::vector<float> p;
    {
      py::gil_scoped_release release;
      p = vad_->probabilities(samples);
    }
    py::array_t<float> out(static_cast<py::ssize_t>(p.size()));
    std::copy(p.begin(), p.end(), out.mutable_data());
    return out;
  }

  py::list speech_regions(const py::object& audio, const py::kwargs& kw) const {
    const VadOptions o = vad_options(kw);
    const std::vector<float> samples = samples_of(audio);
    std::vector<SpeechRegion> regions;
    {
      py::gil_scoped_release release;
      regions = vad_->speech_regions(samples, o);
    }
    return regions_list(regions);
  }

  std::shared_ptr<const VoiceActivityDetector> detector() const { return vad_; }

 private:
  std::shared_ptr<VoiceActivityDetector> vad_;
};

// The keyword arguments of transformers' generate() that kiln's Whisper takes.
TranscribeOptions transcribe_options(const py::kwargs& kw) {
  TranscribeOptions o;
  for (const auto& [key, value] : kw) {
    const std::string k = key.cast<std::string>();
    if (value.is_none()) continue;
    if (k == "language") {
      o.language = value.cast<std::string>();
    } else if (k == "task") {
      o.task = value.cast<std::string>();
    } else if (k == "return_timestamps") {
      o.timestamps = value.cast<bool>();
    } else if (k == "num_beams") {
      o.num_beams = value.cast<int64_t>();
    } else if (k == "length_penalty") {
      o.length_penalty = value.cast<float>();
    } else if (k == "early_stopping") {
      o.early_stopping = value.cast<bool>();
    } else if (k == "temperature") {
      o.temperatures = py::isinstance<py::sequence>(value)
                           ? value.cast<std::vector<float>>()
                           : std::vector<float>{value.cast<float>()};
    } else if (k == "best_of") {
      o.best_of = value.cast<int64_t>();
    } else if (k == "compression_ratio_threshold") {
      o.compression_ratio_threshold = value.cast<double>();
    } else if (k == "logprob_threshold") {
      o.logprob_threshold = value.cast<double>();
    } else if (k == "no_speech_threshold") {
      o.no_speech_threshold = value.cast<double>();
    } else if (k == "condition_on_prev_tokens") {
      o.condition_on_prev_tokens = value.cast<bool>();
    } else if (k == "prompt") {
      o.prompt = value.cast<std::string>();
    } else if (k == "prompt_ids") {
      o.prompt_ids = value.cast<std::vector<int64_t>>();
    } else if (k == "max_new_tokens") {
      o.max_new_tokens = value.cast<int64_t>();
    } else if (k == "seed") {
      o.seed = value.cast<uint64_t>();
    } else if (k == "vad") {
      // A VoiceActivityDetector, or the path of a Silero VAD model.
      o.vad = py::isinstance<py::str>(value)
                  ? std::make_shared<const VoiceActivityDetector>(value.cast<std::string>())
                  : value.cast<const PyVad&>().detector();
    } else if (k == "vad_parameters") {
      o.vad_options = vad_options(value.cast<py::dict>());
    } else {
      throw Error(ErrorKind::InvalidArgument, "unknown transcription option '" + k + "'");
    }
  }
  return o;
}

class PyTranscriber {
 public:
  PyTranscriber(const std::string& dir, int threads) : w_(dir, generator_options(threads)) {}

  py::dict transcribe(const py::object& audio, const py::kwargs& kw) {
    const TranscribeOptions o = transcribe_options(kw);
    const std::vector<float> samples = samples_of(audio);
    Transcript t;
    {
      py::gil_scoped_release release;
      t = w_.transcribe(samples, o);
    }
    return transcript_dict(t);
  }

  py::dict transcribe_features(const py::array& features, const py::kwargs& kw) {
    const TranscribeOptions o = transcribe_options(kw);
    const Tensor f = float_tensor(features);
    Transcript t;
    {
      py::gil_scoped_release release;
      t = w_.transcribe_features(f, o);
    }
    return transcript_dict(t);
  }

  bool multilingual() const { return w_.multilingual(); }
  bool has_tokenizer() const { return w_.has_tokenizer(); }

 private:
  WhisperTranscriber w_;
};

class PyCausalLm {
 public:
  PyCausalLm(const std::string& dir, int threads) : g_(dir, generator_options(threads)) {
    if (Tokenizer::exists_in(dir)) tokenizer_ = Tokenizer::from_dir(dir);
  }

  py::dict generate(const py::object& prompt, int64_t max_new_tokens, bool do_sample,
                    float temperature, int64_t top_k, float top_p, uint64_t seed) {
    std::vector<int64_t> ids;
    if (py::isinstance<py::str>(prompt)) {
      if (!tokenizer_)
        throw Error(ErrorKind::InvalidArgument, "a text prompt needs the model's tokenizer");
      ids = tokenizer_->encode(prompt.cast<std::string>());
    } else {
      ids = prompt.cast<std::vector<int64_t>>();
    }
    GenerationOptions o;
    o.max_new_tokens = max_new_tokens;
    o.do_sample = do_sample;
    o.temperature = temperature;
    o.top_k = top_k;
    o.top_p = top_p;
    o.seed = seed;
    GenerationResult r;
    {
      py::gil_scoped_release release;
      r = g_.generate(ids, o);
    }
    py::dict d;
    d["tokens"] = r.tokens;
    d["prompt"] = r.prompt;
    d["text"] = tokenizer_ ? py::object(py::str(tokenizer_->decode(r.tokens))) : py::none();
    return d;
  }

 private:
  CausalLmGenerator g_;
  std::optional<Tokenizer> tokenizer_;
};

}  // namespace

void bind_generate(py::module_& m) {
  m.def(
      "read_audio",
      [](const std::string& path, int sample_rate, bool strict) {
        std::vector<float> s;
        std::string truncated;
        {
          py::gil_scoped_release release;
          s = read_audio(path, sample_rate, strict ? nullptr : &truncated);
        }
        // -1: the warnings filter made it an exception, which is then pending.
        if (!truncated.empty() && PyErr_WarnEx(PyExc_UserWarning, truncated.c_str(), 1) != 0)
          throw py::error_already_set();
        return py::array_t<float>(static_cast<py::ssize_t>(s.size()), s.data());
      },
      py::arg("path"), py::arg("sample_rate") = 16000, py::arg("strict") = false,
      "Any audio file (WAV, FLAC, Ogg, MP3) as mono float32 samples at sample_rate. A file cut "
      "short is read as far as it decodes with a UserWarning naming it (strict=True: an "
      "InvalidArgumentError).");

  py::class_<Tokenizer>(m, "Tokenizer", "Byte-level BPE as Hugging Face tokenizers runs it.")
      .def(py::init([](const std::string& dir) { return Tokenizer::from_dir(dir); }),
           py::arg("model_dir"))
      .def("encode", &Tokenizer::encode, py::arg("text"))
      .def("decode", &Tokenizer::decode, py::arg("ids"), py::arg("skip_special_tokens") = true)
      .def("token_to_id", &Tokenizer::token_to_id)
      .def("id_to_token", &Tokenizer::id_to_token)
      .def_property_readonly("vocab_size", &Tokenizer::vocab_size);

  py::class_<PyVad>(m, "VoiceActivityDetector",
                    "A Silero VAD model run as faster-whisper runs it (its vad_filter).")
      .def(py::init<const std::string&, int>(), py::arg("model_path"), py::arg("threads") = 1)
      .def("probabilities", &PyVad::probabilities, py::arg("audio"),
           "The speech probability of each 512-sample window of 16 kHz audio.")
      .def("speech_regions", &PyVad::speech_regions, py::arg("audio"),
           "Speech regions [{start, end}] in samples; keywords as faster-whisper's VadOptions.");

  py::class_<PyTranscriber>(m, "WhisperTranscriber",
                            "Whisper transcription as transformers' generate() does it.")
      .def(py::init<const std::string&, int>(), py::arg("model_dir"), py::arg("threads") = 0)
      .def("transcribe", &PyTranscriber::transcribe, py::arg("audio"))
      .def("transcribe_features", &PyTranscriber::transcribe_features, py::arg("features"))
      .def_property_readonly("multilingual", &PyTranscriber::multilingual)
      .def_property_readonly("has_tokenizer", &PyTranscriber::has_tokenizer);

  py::class_<PyCausalLm>(m, "CausalLmGenerator", "The decode loop of a decoder-only export.")
      .def(py::init<const std::string&, int>(), py::arg("model_dir"), py::arg("threads") = 0)
      .def("generate", &PyCausalLm::generate, py::arg("prompt"), py::arg("max_new_tokens") = -1,
           py::arg("do_sample") = false, py::arg("temperature") = 1.0f, py::arg("top_k") = 0,
           py::arg("top_p") = 1.0f, py::arg("seed") = 0);
}

}  // namespace kiln::python
