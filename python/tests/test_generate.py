"""The generate layer from Python: Whisper transcription as transformers' generate() (the
committed references), the causal-LM loop, the tokenizer and audio reading."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

import kiln
from conftest import GPT2, REPO, WHISPER, gpt2_expected

REFS = json.loads((WHISPER / "expected_transcripts.json").read_text())


def case(name: str) -> dict:
    return next(c for c in REFS["cases"] if c["name"] == name)


@pytest.mark.parametrize("name", ["greedy_en_transcribe", "greedy_detect_language",
                                  "greedy_timestamps", "beam3", "greedy_prompt"])
def test_whisper_matches_transformers(name: str) -> None:
    c = case(name)
    kwargs = dict(c["generate_kwargs"])
    if "prompt_ids" in kwargs:  # the reference's prompt is text given to get_prompt_ids
        kwargs["prompt"] = kwargs.pop("prompt_ids")
    whisper = kiln.WhisperTranscriber(str(WHISPER))
    audio = kiln.read_audio(str(WHISPER / c["input"]))
    t = whisper.transcribe(audio, **kwargs)
    assert t["prompt"] == c["decoder_prompt"]
    assert t["tokens"] == c["sequence"]
    assert t["text"] == c["text"]
    if "segments" in c:
        times = [x for s in t["segments"] for x in (s["start"], s["end"])]
        assert times == pytest.approx([x for s in c["segments"] for x in (s["start"], s["end"])])
    # A path works as well as samples.
    assert whisper.transcribe(str(WHISPER / c["input"]), **kwargs)["tokens"] == c["sequence"]


def test_whisper_errors() -> None:
    whisper = kiln.WhisperTranscriber(str(WHISPER))
    with pytest.raises(kiln.InvalidArgumentError, match="unknown language 'xx'"):
        whisper.transcribe(np.zeros(16000, np.float32), language="xx")
    with pytest.raises(kiln.InvalidArgumentError, match="unknown transcription option"):
        whisper.transcribe(np.zeros(16000, np.float32), beams=3)
    with pytest.raises(kiln.FileError, match="nothing.wav"):
        whisper.transcribe(str(WHISPER / "nothing.wav"))


def test_causal_lm_and_tokenizer() -> None:
    expected = gpt2_expected()
    g = kiln.CausalLmGenerator(str(GPT2))
    r = g.generate(expected["prompt"], max_new_tokens=len(expected["tokens"]))
    assert r["tokens"] == expected["tokens"]
    tok = kiln.Tokenizer(str(WHISPER))
    ids = tok.encode(" some words")
    assert tok.decode(ids) == " some words"
    assert ids == case("greedy_prompt")["prompt_ids"][1:]


def test_read_audio_reports_a_cut_file(tmp_path) -> None:
    # A WAV cut at half: a UserWarning naming the file, and the samples that decode (the
    # whole file's first ones); strict=True makes it an error naming the file.
    source = REPO / "test" / "data" / "audio" / "pcm16_16k_mono.wav"
    data = source.read_bytes()
    cut = tmp_path / "cut.wav"
    cut.write_bytes(data[: len(data) // 2])
    whole = kiln.read_audio(str(source))
    with pytest.warns(UserWarning, match=r"cut\.wav: truncated"):
        part = kiln.read_audio(str(cut))
    assert 0 < len(part) < len(whole)
    np.testing.assert_array_equal(part, whole[: len(part)])
    with pytest.raises(kiln.InvalidArgumentError, match=r"cut\.wav: truncated"):
        kiln.read_audio(str(cut), strict=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a whole file warns nothing
        kiln.read_audio(str(source))


VAD = REPO / "models" / "vad-energy" / "model.onnx"


def tone(seconds: float, spans: list[tuple[float, float]]) -> np.ndarray:
    """A 440 Hz tone of amplitude 0.5 over the spans of `seconds` of silence (16 kHz)."""
    audio = np.zeros(int(seconds * 16000), np.float32)
    for a, b in spans:
        i = np.arange(int(a * 16000), int(b * 16000))
        audio[i] = 0.5 * np.sin(2 * np.pi * 440.0 * i / 16000)
    return audio


def test_vad_regions_and_filtered_transcription() -> None:
    vad = kiln.VoiceActivityDetector(str(VAD))
    audio = tone(6.0, [(1.0, 3.0)])
    probs = vad.probabilities(audio)
    assert probs.shape == (96000 // 512 + 1,)
    assert probs[40] > 0.99 and probs[10] < 0.01
    assert vad.speech_regions(audio) == [{"start": 31 * 512 - 6400, "end": 94 * 512 + 6400}]
    assert vad.speech_regions(audio, speech_pad_ms=0) == [{"start": 31 * 512, "end": 94 * 512}]
    with pytest.raises(kiln.KilnError, match="unknown VAD option 'pad'"):
        vad.speech_regions(audio, pad=3)
    whisper = kiln.WhisperTranscriber(str(WHISPER))
    silent = whisper.transcribe(np.zeros(16000 * 40, np.float32), vad=vad, language="en")
    assert silent["segments"] == [] and silent["text"] == "" and silent["speech_regions"] == []
    # Two tones 26 s apart: the regions laid end to end, times mapped back past the gap.
    two = tone(40.0, [(2.0, 4.0), (30.0, 32.0)])
    t = whisper.transcribe(two, vad=str(VAD), vad_parameters={"min_silence_duration_ms": 2000},
                           language="en", return_timestamps=True, max_new_tokens=8)
    assert [r["start"] for r in t["speech_regions"]][0] == 62 * 512 - 6400
    assert t["speech_regions"][1]["start"] > 29 * 16000
    assert t["segments"] and t["segments"][0]["start"] >= 1.6


def test_extra_outputs_return_inner_values() -> None:
    so = kiln.SessionOptions()
    so.extra_outputs = ["b1", "logits"]
    sess = kiln.InferenceSession(str(REPO / "models" / "tiny-cnn" / "model.onnx"), so)
    assert [o.name for o in sess.get_outputs()] == ["probs", "b1", "logits"]
    image = np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32)
    probs, b1, logits = sess.run(None, {"image": image})
    assert b1.shape == (2, 16, 32, 32)
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    np.testing.assert_allclose(probs, e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-6)
    so.extra_outputs = ["nothing"]
    with pytest.raises(kiln.KilnError, match="extra output 'nothing'"):
        kiln.InferenceSession(str(REPO / "models" / "tiny-cnn" / "model.onnx"), so)
