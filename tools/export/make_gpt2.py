"""Builds a GPT-2 with random weights and exports it with Optimum as the single decoder-only
model.onnx that takes past key/values (Optimum's layout since 1.14), plus a sample prompt and
the tokens transformers' greedy generate() produces from it.

    python3 -m venv .venv && .venv/bin/pip install -r tools/export/requirements-export.txt
    HF_HUB_OFFLINE=1 .venv/bin/python tools/export/make_gpt2.py models/gpt2-tiny-random
    HF_HUB_OFFLINE=1 .venv/bin/python tools/export/make_gpt2.py --size gpt2 models/cache/gpt2-random

--size tiny (the default): the dimensions of hf-internal-testing/tiny-random-gpt2 (n_embd 32,
4 heads, 5 layers, vocab 1000), exported at opset 18 into OUT and at opset 14 into OUT/opset14.
--size gpt2: the real gpt2 dimensions (n_embd 768, 12 heads, 12 layers, vocab 50257,
n_positions 1024, 124M parameters, about 500 MB of float32) with GPT-2's default
initialisation, at opset 18 only; made on demand for tools/bench/compare_ort.py (case gpt2).
"""
import argparse
import json
import os
import shutil

import torch
from optimum.exporters.onnx import main_export
from transformers import GenerationConfig, GPT2Config, GPT2LMHeadModel

MAX_NEW_TOKENS = 40
PROMPT = [17, 512, 9, 333, 101]


def main(out: str, size: str) -> None:
    if size == "gpt2":
        eos = 50256
        cfg = GPT2Config(vocab_size=50257, n_embd=768, n_head=12, n_layer=12, n_positions=1024,
                         bos_token_id=eos, eos_token_id=eos, pad_token_id=eos)
        opsets = {18: out}
    else:
        eos = 999
        cfg = GPT2Config(vocab_size=1000, n_embd=32, n_head=4, n_layer=5, n_positions=512,
                         bos_token_id=998, eos_token_id=999, pad_token_id=999,
                         initializer_range=0.3)  # wide init: varied tokens, see make_whisper.py
        opsets = {18: out, 14: os.path.join(out, "opset14")}
    torch.manual_seed(20261122)
    model = GPT2LMHeadModel(cfg).eval()
    model.generation_config = GenerationConfig(bos_token_id=cfg.bos_token_id, eos_token_id=eos,
                                               pad_token_id=eos)
    work = out + ".hf"
    model.save_pretrained(work)
    for opset, folder in opsets.items():
        main_export(work, output=folder, task="text-generation-with-past", opset=opset, do_validation=False)
    with torch.no_grad():
        ids = torch.tensor([PROMPT])
        tokens = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_NEW_TOKENS,
                                do_sample=False)
    generated = tokens[0, len(PROMPT):].tolist()
    with open(os.path.join(out, "expected_tokens.json"), "w") as f:
        json.dump({"tokens": generated, "prompt": PROMPT, "max_new_tokens": MAX_NEW_TOKENS,
                   "made_by": "transformers GPT2LMHeadModel.generate, greedy"}, f, indent=1)
        f.write("\n")
    shutil.rmtree(work)
    print(f"{out}: tokens {generated}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out")
    parser.add_argument("--size", choices=("tiny", "gpt2"), default="tiny")
    args = parser.parse_args()
    main(args.out, args.size)
