"""Builds a Whisper with random weights and exports it with Optimum, the way users get
Whisper models: encoder_model.onnx, decoder_model.onnx, decoder_with_past_model.onnx and
decoder_model_merged.onnx, plus config/generation config, a sample clip and references.

    python3 -m venv .venv && .venv/bin/pip install -r tools/export/requirements-export.txt
    HF_HUB_OFFLINE=1 .venv/bin/python tools/export/make_whisper.py tiny models/whisper-tiny-random
    HF_HUB_OFFLINE=1 .venv/bin/python tools/export/make_whisper.py whisper-tiny models/cache/whisper-tiny-random

`tiny`: small dimensions (d_model 64, 2+2 layers, 4 heads, vocab 1000) with Whisper's real
sequence limits (80 mel bins, 3000 frames, 448 target positions); exported at opset 18
(the exporter's default) into OUT and at opset 14 into OUT/opset14. `whisper-tiny`: the
real whisper-tiny dimensions (d_model 384, 4+4 layers, 6 heads, vocab 51865), opset 18 only,
for benchmarks (too big to commit).
"""
import json
import os
import shutil
import sys
import wave

import numpy as np
import onnxruntime as ort
import torch
from optimum.exporters.onnx import main_export
from transformers import GenerationConfig, WhisperConfig, WhisperFeatureExtractor, WhisperForConditionalGeneration

SAMPLE_RATE = 16000
MAX_NEW_TOKENS = 40


def config(kind: str) -> WhisperConfig:
    if kind == "tiny":
        vocab, d, layers, heads, ffn = 1000, 64, 2, 4, 128
    elif kind == "whisper-tiny":
        vocab, d, layers, heads, ffn = 51865, 384, 4, 6, 1536
    else:
        raise SystemExit(f"unknown kind {kind}")
    # Special tokens at the top of the vocabulary, as in Whisper.
    eos, bos, sot, lang, task = vocab - 1, vocab - 2, vocab - 3, vocab - 4, vocab - 5
    return WhisperConfig(
        vocab_size=vocab, d_model=d, encoder_layers=layers, decoder_layers=layers,
        encoder_attention_heads=heads, decoder_attention_heads=heads,
        encoder_ffn_dim=ffn, decoder_ffn_dim=ffn, num_mel_bins=80,
        max_source_positions=1500, max_target_positions=448,
        pad_token_id=eos, bos_token_id=bos, eos_token_id=eos, decoder_start_token_id=sot,
        # A wide init makes a random model produce varied tokens instead of one repeated
        # token, so token-exact tests catch position and cache mistakes.
        init_std=0.3), [sot, lang, task]


def sample_audio() -> np.ndarray:
    """Two seconds of a deterministic chirp with harmonics and a little noise."""
    t = np.arange(2 * SAMPLE_RATE) / SAMPLE_RATE
    rng = np.random.default_rng(7)
    freq = 200 + 600 * t
    x = 0.4 * np.sin(2 * np.pi * np.cumsum(freq) / SAMPLE_RATE)
    x += 0.15 * np.sin(2 * np.pi * 3 * np.cumsum(freq) / SAMPLE_RATE)
    x += 0.02 * rng.standard_normal(t.shape)
    return np.round(np.clip(x, -1, 1) * 32767).astype(np.int16)


def write_wav(path: str, samples: np.ndarray) -> None:
    with wave.open(path, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(SAMPLE_RATE)
        w.writeframes(samples.tobytes())


def main(kind: str, out: str) -> None:
    cfg, prompt = config(kind)
    torch.manual_seed(20261122)
    model = WhisperForConditionalGeneration(cfg).eval()
    model.generation_config = GenerationConfig(
        decoder_start_token_id=prompt[0], eos_token_id=cfg.eos_token_id, pad_token_id=cfg.pad_token_id,
        bos_token_id=cfg.bos_token_id, forced_decoder_ids=[[1, prompt[1]], [2, prompt[2]]], max_length=448)
    work = out + ".hf"
    model.save_pretrained(work)
    WhisperFeatureExtractor(feature_size=80).save_pretrained(work)

    opsets = {18: out, 14: os.path.join(out, "opset14")} if kind == "tiny" else {18: out}
    for opset, folder in opsets.items():
        main_export(work, output=folder, task="automatic-speech-recognition-with-past", opset=opset,
                    do_validation=False)
        for extra in ("preprocessor_config.json", "special_tokens_map.json"):
            if os.path.exists(os.path.join(folder, extra)):
                os.remove(os.path.join(folder, extra))

    audio = sample_audio()
    write_wav(os.path.join(out, "sample.wav"), audio)
    fe = WhisperFeatureExtractor(feature_size=80)
    feats = fe(audio.astype(np.float32) / 32768.0, sampling_rate=SAMPLE_RATE, return_tensors="np").input_features
    np.save(os.path.join(out, "sample_features.npy"), feats.astype(np.float32))

    with torch.no_grad():
        tokens = model.generate(torch.from_numpy(feats), max_new_tokens=MAX_NEW_TOKENS, do_sample=False)
    generated = tokens[0].tolist()
    with open(os.path.join(out, "expected_tokens.json"), "w") as f:
        json.dump({"tokens": generated, "decoder_prompt": prompt, "max_new_tokens": MAX_NEW_TOKENS,
                   "input": "sample.wav", "made_by": "transformers WhisperForConditionalGeneration.generate, greedy"},
                  f, indent=1)
        f.write("\n")
    write_logit_references(out, feats, prompt, generated)
    shutil.rmtree(work)
    print(f"{out}: tokens {generated}")


def write_logit_references(out: str, feats: np.ndarray, prompt, generated) -> None:
    """onnxruntime logits of the merged decoder at decode steps 1, 2 and 20, driven the way
    Optimum drives it (step 0: prompt, no past; then one token at a time with the cache)."""
    opts = ort.SessionOptions()
    enc = ort.InferenceSession(os.path.join(out, "encoder_model.onnx"), opts)
    dec = ort.InferenceSession(os.path.join(out, "decoder_model_merged.onnx"), opts)
    hidden = enc.run(None, {"input_features": feats})[0]
    names = [i.name for i in dec.get_inputs()]
    shapes = {i.name: i.shape for i in dec.get_inputs()}
    past = {}
    for n in names:
        if n.startswith("past_key_values"):
            heads, head_dim = shapes[n][1], shapes[n][3]
            past[n] = np.zeros((1, heads, 0, head_dim), np.float32)
    ids = np.array([prompt], np.int64)
    sequence = list(prompt) + generated
    step = 0
    while step <= 20:
        feed = {"input_ids": ids, "encoder_hidden_states": hidden, "use_cache_branch": np.array([step > 0])}
        feed.update(past)
        outputs = dict(zip([o.name for o in dec.get_outputs()], dec.run(None, feed)))
        if step in (1, 2, 20):
            np.save(os.path.join(out, f"reference_logits_step{step}.npy"), outputs["logits"][:, -1, :])
        for n in list(past):
            p = n.replace("past_key_values", "present")
            if step == 0 or ".decoder." in n:
                past[n] = outputs[p]
        pos = len(prompt) + step
        nxt = sequence[pos] if pos < len(sequence) else int(outputs["logits"][0, -1].argmax())
        ids = np.array([[nxt]], np.int64)
        step += 1


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    main(sys.argv[1], sys.argv[2])
