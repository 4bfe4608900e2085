"""A GPT-2 decode loop driven from Python: KV caches made with spare capacity and donated each
step grow in place (the present.* outputs come back in the same memory and are donated again),
so the bytes copied per step stay flat, and the tokens are transformers' own."""

from __future__ import annotations

import numpy as np

import kiln
from conftest import GPT2, gpt2_expected


def decode(session: kiln.InferenceSession, prompt: list[int], steps: int, donate: bool):
    """Greedy decoding; returns the tokens, each step's run counters and each step's caches."""
    past_args = [i for i in session.get_inputs() if i.name.startswith("past_key_values.")]
    past = [i.name for i in past_args]
    _, heads, _, head_dim = past_args[0].shape  # [batch, heads, past_sequence_length, head_dim]
    capacity = len(prompt) + steps
    caches = {name: kiln.with_capacity((1, heads, 0, head_dim), np.float32, axis=2,
                                       capacity=capacity) for name in past}
    names = [o.name for o in session.get_outputs()]
    ids, position, tokens, stats, history = list(prompt), 0, [], [], []
    for _ in range(steps):
        feed = {
            "input_ids": np.array([ids], np.int64),
            "attention_mask": np.ones((1, position + len(ids)), np.int64),
            "position_ids": np.arange(position, position + len(ids), dtype=np.int64)[None],
            **caches,
        }
        outputs = dict(zip(names, session.run(None, feed, donate=past if donate else ())))
        stats.append(session.last_run_stats())
        tokens.append(int(np.argmax(outputs["logits"][0, -1])))
        caches = {name: outputs["present." + name.removeprefix("past_key_values.")]
                  for name in past}
        history.append(caches)
        position += len(ids)
        ids = [tokens[-1]]
    return tokens, stats, history


def test_donated_caches_grow_in_place_and_give_transformers_tokens():
    expected = gpt2_expected()
    session = kiln.InferenceSession(str(GPT2 / "model.onnx"))
    tokens, stats, history = decode(session, expected["prompt"], expected["max_new_tokens"],
                                    donate=True)
    assert tokens == expected["tokens"]
    copied = [s["bytes_copied"] for s in stats]
    # The caches add nothing per step; the only growth is the model's own Gather of a bool
    # attention-mask row of past + 1 elements: one byte per position (as in the C++
    # generator's test).
    for step in range(2, len(copied)):
        assert copied[step] == copied[1] + (step - 1), (step, copied)
    assert all(s["bytes_copied_inputs"] == 0 for s in stats)
    # Every step's present.* is the memory of the first step's, one token longer.
    for name, first in history[0].items():
        last = history[-1][name]
        assert np.shares_memory(first, last), name
        assert last.shape[2] == len(expected["prompt"]) + len(tokens) - 1
        assert isinstance(last.base, kiln.Storage)


def test_without_donation_every_step_copies_the_whole_cache():
    expected = gpt2_expected()
    session = kiln.InferenceSession(str(GPT2 / "model.onnx"))
    tokens, stats, _ = decode(session, expected["prompt"], 12, donate=False)
    assert tokens == expected["tokens"][:12]
    # 5 layers x (key, value) x 4 heads x 8 floats: each step copies the caches again, one
    # position (1280 bytes) more than the step before.
    growth = [b["bytes_copied"] - a["bytes_copied"] for a, b in zip(stats[1:], stats[2:])]
    assert all(g >= 10 * 4 * 8 * 4 for g in growth), growth
