// Audio files to mono float samples: libsndfile decodes (WAV, FLAC, Ogg Vorbis/Opus, MP3
// through mpg123...), the channels are averaged block by block, and libsoxr resamples the
// mono stream as it arrives, so memory holds the output and one block, never the decoded
// file at its own rate, and nothing is allocated from what a header claims.
#include <sndfile.h>
#include <soxr.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <new>

#include "kiln/audio.h"
#include "kiln/error.h"

namespace kiln {
namespace {

constexpr int64_t kMaxSeconds = 24 * 3600;  // longer input is refused (see read_audio)
constexpr int kMinRate = 1000, kMaxRate = 768000;
constexpr int64_t kBlockSamples = 1 << 16;  // interleaved samples decoded per read

Error audio_error(const std::string& path, const std::string& why) {
  return std::move(Error(ErrorKind::InvalidArgument, why).with_file(path));
}

std::string seconds_text(int64_t frames, int rate) {  // "12.34 s"
  char text[32];
  std::snprintf(text, sizeof text, "%.2f s", static_cast<double>(frames) / rate);
  return text;
}

// An open libsndfile handle whose stream info has been checked.
class SoundFile {
 public:
  // `lenient`: a stream cut short (read_audio's `report`) ends where the decodable audio
  // ends, with a report, instead of failing.
  explicit SoundFile(const std::string& path, bool lenient = false)
      : path_(path), lenient_(lenient) {
    namespace fs = std::filesystem;
    std::error_code ec;
    const fs::file_status status = fs::status(path, ec);
    if (!fs::exists(status))
      throw Error(ErrorKind::Io, "cannot open: no such file").with_file(path);
    if (fs::is_directory(status))
      throw Error(ErrorKind::Io, "is a folder, not an audio file").with_file(path);
    file_.reset(sf_open(path.c_str(), SFM_READ, &info_));
    // sf_strerror(nullptr) is libsndfile's last open failure, process-wide: read at once.
    if (file_ == nullptr)
      throw audio_error(path, std::string("not a readable audio file: ") + sf_strerror(nullptr));
    check_info();
    header_frames_ = wav_header_frames();
  }

  const SF_INFO& info() const { return info_; }

  // Decodes the next block and appends its frames to `mono` as the mean of the channels.
  // Returns false at the end of the stream; throws on a decoding error or a stream too long.
  bool read_mono_block(std::vector<float>& mono) {
    if (ended_) return false;
    const int channels = info_.channels;
    interleaved_.resize(static_cast<size_t>(std::max<int64_t>(kBlockSamples, channels)));
    const sf_count_t frames = sf_readf_float(
        file_.get(), interleaved_.data(), static_cast<sf_count_t>(interleaved_.size()) / channels);
    if (sf_error(file_.get()) != SF_ERR_NO_ERROR) {
      // The frames decoded before the error count (a lenient read keeps them).
      const sf_count_t good = frames_read_ + std::max<sf_count_t>(frames, 0);
      const std::string why = "decoding failed after " + seconds_text(good, info_.samplerate) +
                              ": " + sf_strerror(file_.get());
      if (!lenient_ || good == 0) throw audio_error(path_, why);
      shortfall_ = why + " (the audio before it is read)";
      ended_ = true;
    }
    if (frames <= 0) return false;
    frames_read_ += frames;
    if (frames_read_ > kMaxSeconds * info_.samplerate)
      throw audio_error(path_, "longer than " + std::to_string(kMaxSeconds / 3600) + " hours");
    const size_t at = mono.size();
    mono.resize(at + static_cast<size_t>(frames));
    for (sf_count_t f = 0; f < frames; ++f) {
      // A double sum: the mean of two float channels rounds as numpy's float32 mean does.
      double sum = 0;
      for (int c = 0; c < channels; ++c) sum += interleaved_[static_cast<size_t>(f * channels + c)];
      mono[at + static_cast<size_t>(f)] = static_cast<float>(sum / channels);
    }
    return true;
  }

  // After the last block: a stream that ended before the frame count its header gives was
  // cut short (libsndfile stops a cut FLAC with an error, a cut MP3 just ends early, and a cut
  // WAV's frame count is already the file's). Throws, or when lenient returns the report
  // ("" for a complete stream).
  std::string check_complete() {
    if (frames_read_ == 0) throw audio_error(path_, "no audio samples");
    if (shortfall_.empty() && header_frames_ != SF_COUNT_MAX) {  // else of unknown length
      // mpg123 estimates an MP3's length from the file size when it has no Xing/Info frame
      // count, which tags can throw off a little: such a shortfall is not a cut file.
      const bool estimate = (info_.format & SF_FORMAT_TYPEMASK) == SF_FORMAT_MPEG;
      const sf_count_t slack = estimate ? header_frames_ / 100 : 0;
      if (frames_read_ + slack < header_frames_) {
        shortfall_ = "truncated: the header gives " +
                     seconds_text(header_frames_, info_.samplerate) + " of audio, the file holds " +
                     seconds_text(frames_read_, info_.samplerate);
      }
    }
    if (!shortfall_.empty() && !lenient_) throw audio_error(path_, shortfall_);
    return shortfall_;
  }

 private:
  void check_info() const {
    if (info_.channels <= 0)
      throw audio_error(path_, std::to_string(info_.channels) + " audio channels");
    if (info_.samplerate < kMinRate || info_.samplerate > kMaxRate) {
      throw audio_error(path_, "sample rate " + std::to_string(info_.samplerate) + " Hz outside " +
                                   std::to_string(kMinRate) + " to " + std::to_string(kMaxRate) +
                                   " Hz");
    }
    if (info_.frames == 0) throw audio_error(path_, "no audio samples");
    if (info_.frames != SF_COUNT_MAX && info_.frames / info_.samplerate > kMaxSeconds)
      throw audio_error(path_, "header gives " + seconds_text(info_.frames, info_.samplerate) +
                                   ": longer than " + std::to_string(kMaxSeconds / 3600) +
                                   " hours");
  }

  // The frames a WAV header's data chunk gives. libsndfile bounds the chunk by the file's
  // size (and says so in its log: "data : 52920 (should be 26438)"), so info_.frames is what
  // the file holds; a size a recorder leaves while streaming (0 or 0xFFFFFFFF) gives no
  // length. Other formats: info_.frames.
  sf_count_t wav_header_frames() const {
    const int type = info_.format & SF_FORMAT_TYPEMASK;
    if (type != SF_FORMAT_WAV && type != SF_FORMAT_WAVEX) return info_.frames;
    std::string log(1 << 14, '\0');
    sf_command(file_.get(), SFC_GET_LOG_INFO, log.data(), static_cast<int>(log.size()));
    unsigned long long claimed = 0, holds = 0, align = 0;
    const size_t data = log.find("\ndata : ");
    const size_t block = log.find("Block Align");
    if (data == std::string::npos || block == std::string::npos ||
        std::sscanf(log.c_str() + data, "\ndata : %llu (should be %llu)", &claimed, &holds) != 2 ||
        std::sscanf(log.c_str() + block, "Block Align : %llu", &align) != 1) {
      return info_.frames;
    }
    if (claimed == 0 || claimed >= 0xffffffffULL) return SF_COUNT_MAX;  // a streaming size
    if (align == 0 || claimed <= holds) return info_.frames;
    return static_cast<sf_count_t>(claimed / align);
  }

  std::string path_;
  bool lenient_ = false;
  sf_count_t header_frames_ = 0;
  std::string shortfall_;  // why a lenient read ended early
  bool ended_ = false;     // a lenient read met a decoding error: nothing more is read
  SF_INFO info_{};
  // Owned from sf_open on, so that a check failing in the constructor closes the file too.
  std::unique_ptr<SNDFILE, decltype(&sf_close)> file_{nullptr, &sf_close};
  std::vector<float> interleaved_;
  int64_t frames_read_ = 0;
};

// A streaming mono float resampler (libsoxr at SOXR_HQ, as python-soxr's default).
class Resampler {
 public:
  Resampler(int in_rate, int out_rate) : ratio_(static_cast<double>(out_rate) / in_rate) {
    const soxr_io_spec_t io = soxr_io_spec(SOXR_FLOAT32_I, SOXR_FLOAT32_I);
    const soxr_quality_spec_t quality = soxr_quality_spec(SOXR_HQ, 0);
    soxr_error_t error = nullptr;
    soxr_ = soxr_create(in_rate, out_rate, 1, &error, &io, &quality, nullptr);
    if (error != nullptr)
      throw Error(ErrorKind::Runtime, std::string("cannot make the resampler: ") + error);
  }
  ~Resampler() { soxr_delete(soxr_); }
  Resampler(const Resampler&) = delete;
  Resampler& operator=(const Resampler&) = delete;

  // Feeds `in` (all of it) and appends what comes out to `out`; `in` empty flushes the end.
  void process(const std::vector<float>& in, std::vector<float>& out) {
    const bool flush = in.empty();
    size_t consumed = 0;
    for (;;) {
      const size_t room =
          static_cast<size_t>(static_cast<double>(in.size() - consumed) * ratio_) + 1024;
      const size_t at = out.size();
      out.resize(at + room);
      size_t used = 0, produced = 0;
      const soxr_error_t error =
          soxr_process(soxr_, flush ? nullptr : in.data() + consumed, in.size() - consumed, &used,
                       out.data() + at, room, &produced);
      out.resize(at + produced);
      if (error != nullptr)
        throw Error(ErrorKind::Runtime, std::string("resampling failed: ") + error);
      consumed += used;
      // Input is taken whole unless the output was full; the flush ends when nothing comes.
      if (flush ? produced == 0 : consumed == in.size() && produced < room) return;
    }
  }

 private:
  double ratio_;
  soxr_t soxr_ = nullptr;
};

}  // namespace

std::vector<float> read_audio(const std::string& path, int sample_rate, std::string* report) {
  if (report) report->clear();
  if (sample_rate < kMinRate || sample_rate > kMaxRate) {
    throw Error(ErrorKind::InvalidArgument, "output sample rate " + std::to_string(sample_rate) +
                                                " Hz outside " + std::to_string(kMinRate) + " to " +
                                                std::to_string(kMaxRate) + " Hz");
  }
  SoundFile file(path, report != nullptr);
  std::vector<float> out, block;
  try {
    // The output is reserved from the header's length only where the file holds at least a
    // byte per sample of it (uncompressed audio, whose length libsndfile bounds by the file's
    // size): a growing vector would otherwise peak near twice the output (a 1-hour 44.1 kHz
    // WAV read to 16 kHz: 381 MiB for 220 MiB of samples). A compressed stream's length is
    // not trusted that way.
    const SF_INFO& info = file.info();
    std::error_code ec;
    const uintmax_t bytes = std::filesystem::file_size(path, ec);
    if (!ec && info.frames != SF_COUNT_MAX &&
        static_cast<uintmax_t>(info.frames) <= bytes / static_cast<uintmax_t>(info.channels)) {
      const double ratio = static_cast<double>(sample_rate) / info.samplerate;
      out.reserve(static_cast<size_t>(static_cast<double>(info.frames) * ratio) + 1024);
    }
    if (info.samplerate == sample_rate) {
      while (file.read_mono_block(out)) {
      }
    } else {
      Resampler resampler(info.samplerate, sample_rate);
      while (file.read_mono_block(block)) {
        resampler.process(block, out);
        block.clear();
      }
      resampler.process({}, out);
    }
  } catch (const std::bad_alloc&) {
    throw Error(ErrorKind::Memory,
                "out of memory after " + std::to_string(out.size()) + " samples of audio")
        .with_file(path);
  } catch (Error& e) {
    throw std::move(e.with_file(path));
  }
  const std::string shortfall = file.check_complete();
  if (report && !shortfall.empty()) *report = path + ": " + shortfall;
  return out;
}

std::vector<float> read_wav_16k_mono(const std::string& path) {
  SoundFile file(path);
  const SF_INFO& info = file.info();
  auto bad = [&](const std::string& why) { return audio_error(path, why); };
  if ((info.format & SF_FORMAT_TYPEMASK) != SF_FORMAT_WAV) throw bad("not a WAV file");
  const int encoding = info.format & SF_FORMAT_SUBMASK;
  if (encoding == SF_FORMAT_PCM_U8 || encoding == SF_FORMAT_PCM_S8)
    throw bad("8 bits per sample: expected 16");
  if (encoding == SF_FORMAT_PCM_24) throw bad("24 bits per sample: expected 16");
  if (encoding == SF_FORMAT_PCM_32) throw bad("32 bits per sample: expected 16");
  if (encoding != SF_FORMAT_PCM_16) throw bad("not 16-bit PCM");
  if (info.channels != 1) throw bad(std::to_string(info.channels) + " channels: expected mono");
  if (info.samplerate != 16000)
    throw bad("sample rate " + std::to_string(info.samplerate) + " Hz: expected 16000 Hz");
  std::vector<float> samples;
  while (file.read_mono_block(samples)) {
  }
  file.check_complete();
  return samples;
}

}  // namespace kiln
