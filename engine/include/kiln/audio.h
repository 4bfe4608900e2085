// Audio input for speech models: an audio file as mono float samples at the model's rate, and
// Whisper's log-mel features, for one 30-s window or for a whole long recording.
//
//   std::vector<float> samples = kiln::read_audio("talk.mp3");   // 16 kHz mono
//   kiln::Tensor features = kiln::whisper_log_mel(samples);      // [1, 80, 3000]
//
// Long-form transcription computes the features of the whole recording once and cuts
// 3000-frame windows from them, as transformers' Whisper generate() does:
//
//   kiln::Tensor all = kiln::whisper_log_mel_long(samples);      // [1, 80, samples / 160]
//   kiln::Tensor window = kiln::whisper_log_mel_window(all, seek);  // [1, 80, 3000]
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kiln/tensor.h"

namespace kiln {

// Reads an audio file with libsndfile: WAV (PCM, float, A-law, mu-law...), FLAC, Ogg
// Vorbis, Ogg Opus, MP3 and the other formats libsndfile knows, at any sample rate and
// channel count. Returns samples in [-1, 1] at `sample_rate` Hz, mixed to mono as the mean of
// the channels (what librosa and transformers' pipeline do for a multi-channel array) and
// resampled by libsoxr at its high quality (SOXR_HQ, python-soxr's default), not at all when
// the file's rate is already `sample_rate`. Throws kiln::Error naming the file for a missing
// file, a folder, a file that is not audio or is truncated, and audio without samples or
// longer than 24 hours.
//
// A truncated file is one whose stream ends before the length its header gives (a WAV data
// chunk, an MP3's frame count) or stops decoding part way (a cut FLAC). With `report`, such a
// file is read as far as it decodes and *report says so, naming the file and the seconds its
// header gives and it holds (kiln-transcribe prints it as a warning; --strict-audio makes it
// an error); *report is empty after a complete file. Without `report` it throws: a file is
// never read short in silence.
std::vector<float> read_audio(const std::string& path, int sample_rate = 16000,
                              std::string* report = nullptr);

// Reads a 16 kHz mono 16-bit PCM WAV file as samples in [-1, 1). Throws kiln::Error naming
// the file for anything else (other rates, stereo, not a WAV); read_audio takes any file.
std::vector<float> read_wav_16k_mono(const std::string& path);

// Whisper's front end: log-mel features (n_fft 400, hop 160, Slaney mel filters up to 8 kHz,
// log10, floor at max - 8, (x + 4) / 4) of 16 kHz mono audio padded or cut to 30 s:
// float32[1, n_mels, 3000], as transformers' WhisperFeatureExtractor computes them.
Tensor whisper_log_mel(const std::vector<float>& samples, int64_t n_mels = 80);

// The same features over the whole signal, neither padded nor cut: float32[1, n_mels,
// samples.size() / 160], with the max - 8 floor taken over the whole signal. This is what
// WhisperFeatureExtractor returns with truncation=False, padding="longest", the input of
// long-form generate(). Needs more than 200 samples (the reflected border of a frame).
Tensor whisper_log_mel_long(const std::vector<float>& samples, int64_t n_mels = 80);

// Frames [start, start + frames) of features float32[batch, n_mels, total] (from
// whisper_log_mel_long), zero-padded past the end as long-form generate() pads its last
// window: float32[batch, n_mels, frames]. `start` is a frame index (sample offset / 160) in
// [0, total).
Tensor whisper_log_mel_window(const Tensor& features, int64_t start, int64_t frames = 3000);

}  // namespace kiln
