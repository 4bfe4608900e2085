"""Writes the audio test files of kiln::read_audio and whisper_log_mel_long with references.

    HF_HUB_OFFLINE=1 /work/venv/bin/python tools/export/make_audio_refs.py test/data/audio

Audio files: 0.3 s of a 440 Hz sine (a 660 Hz tone on the right channel of stereo files),
written by python-soundfile in each format kiln reads (WAV 16-bit and float, FLAC, Ogg
Vorbis, Ogg Opus, MP3). Each `<file>.npy` next to it is what a Python Whisper pipeline
feeds the feature extractor: the file decoded by python-soundfile as float32, mixed to
mono as the mean of its channels (librosa.to_mono, transformers' pipeline for a
multi-channel array), resampled to 16 kHz by python-soxr at its default quality, HQ.

Long-form features: transformers' WhisperFeatureExtractor on a 70-s synthetic signal
(long_signal(); kiln's test builds the same from the same formula) called as long-form
generate() expects it, with truncation=False, padding="longest": `long_features.npy` holds
every 37th frame of its [1, 80, 7000] features, `long_window_<seek>.npy` every 37th frame of
the 3000-frame window that generate()'s _get_input_segment cuts at frame <seek> (the last
one padded with zeros).
"""
import os
import sys

import numpy as np
import soundfile as sf
import soxr
import torch
from transformers import WhisperFeatureExtractor
from transformers.models.whisper.generation_whisper import WhisperGenerationMixin

TARGET_RATE = 16000
SECONDS = 0.3
# name, sample rate, channels, container, encoding
FILES = [
    ("pcm16_16k_mono.wav", 16000, 1, "WAV", "PCM_16"),
    ("pcm16_44k_stereo.wav", 44100, 2, "WAV", "PCM_16"),
    ("float_48k_mono.wav", 48000, 1, "WAV", "FLOAT"),
    ("flac_22k_mono.flac", 22050, 1, "FLAC", "PCM_16"),
    ("vorbis_48k_stereo.ogg", 48000, 2, "OGG", "VORBIS"),
    ("opus_48k_mono.opus", 48000, 1, "OGG", "OPUS"),
    ("mp3_44k_stereo.mp3", 44100, 2, "MP3", "MPEG_LAYER_III"),
]
EVERY = 37  # the frame stride of the committed long-form references
SEEKS = [2345, 6000]  # window starts (frames); 6000 is the last, padded window of 7000 frames


def tones(rate: int, channels: int) -> np.ndarray:
    t = np.arange(round(SECONDS * rate)) / rate
    columns = [0.5 * np.sin(2 * np.pi * 440 * t), 0.3 * np.sin(2 * np.pi * 660 * t)]
    return np.stack(columns[:channels], axis=1).astype(np.float32)


def reference(path: str) -> np.ndarray:
    data, rate = sf.read(path, dtype="float32", always_2d=True)
    mono = data.mean(axis=1)
    if rate != TARGET_RATE:
        mono = soxr.resample(mono, rate, TARGET_RATE, quality="HQ")
    return mono.astype(np.float32)


def long_signal() -> np.ndarray:
    """70 s at 16 kHz: quiet tones, digital silence, a chirp, a loud tone after the first 30 s
    (so the whole-signal max - 8 floor differs from a per-window one), then a soft tone.
    test/unit/test_audio.cpp computes the same samples (double, then float32)."""
    n = np.arange(70 * TARGET_RATE, dtype=np.float64)
    t = n / TARGET_RATE
    x = np.where(t < 20, 0.01 * np.sin(2 * np.pi * 300 * t), 0.0)
    x = np.where((t >= 25) & (t < 45), 0.05 * np.sin(2 * np.pi * (200 + 20 * (t - 25)) * (t - 25)), x)
    x = np.where((t >= 45) & (t < 50), 0.9 * np.sin(2 * np.pi * 1000 * t), x)
    x = np.where(t >= 50, 0.02 * np.sin(2 * np.pi * 150 * t) + 0.01 * np.sin(2 * np.pi * 2500 * t), x)
    return x.astype(np.float32)


def write_long_references(out: str) -> None:
    fe = WhisperFeatureExtractor(feature_size=80)
    got = fe(long_signal(), sampling_rate=TARGET_RATE, truncation=False, padding="longest",
             return_attention_mask=True, return_tensors="pt")
    features = got["input_features"]
    frames = int(got["attention_mask"].sum())
    assert features.shape == (1, 80, frames), features.shape
    np.save(os.path.join(out, "long_features.npy"), features[:, :, ::EVERY].numpy().astype(np.float32))
    for seek in SEEKS:
        seek_t = torch.tensor([seek])
        window = WhisperGenerationMixin._get_input_segment(
            features, seek_t, (torch.tensor([frames]) - seek_t).clamp(max=3000), 3000, 1, [0])
        assert window.shape == (1, 80, 3000)
        np.save(os.path.join(out, f"long_window_{seek}.npy"), window[:, :, ::EVERY].numpy().astype(np.float32))


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for name, rate, channels, container, encoding in FILES:
        path = os.path.join(out, name)
        sf.write(path, tones(rate, channels), rate, format=container, subtype=encoding)
        ref = reference(path)
        np.save(path + ".npy", ref)
        print(f"{name}: {os.path.getsize(path)} bytes, reference {ref.shape[0]} samples")
    write_long_references(out)


if __name__ == "__main__":
    main()
