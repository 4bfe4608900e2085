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
