"""com.microsoft attention ops with onnxruntime's outputs, for kiln's MultiHeadAttention,
GroupQueryAttention and RotaryEmbedding.

OUT/ort-attention-ops/<case>/: one-node models (random inputs, each case a feature: bias,
padding masks, attention_bias, past/present, unidirectional, packed QKV, rotary, local
window, softcap, a past buffer with room for the step) with test_data_set_0 holding
onnxruntime's outputs.

OUT/llama-tiny-genai/: a 2-layer Llama with random weights (built from a config, nothing
downloaded) written by onnxruntime-genai's model builder at fp32 for the CPU (its
GroupQueryAttention with packed QKV and rotary, SkipSimplifiedLayerNormalization). Data sets:
0, a prefill of 5 tokens (the second sequence right-padded to 3) into a 16-position cache as
onnxruntime-genai shares past and present buffers; 1, one decoding step after it.

    HF_HUB_OFFLINE=1 /work/venv/bin/python tools/export/make_ort_attention.py models

Versions: requirements-export.txt (onnxruntime 1.32.0, onnxruntime-genai 0.11.2, onnx-ir 1.1.0).
"""
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnx import TensorProto, helper, numpy_helper

SEED = 20261124
F = TensorProto.FLOAT
I32 = TensorProto.INT32
I64 = TensorProto.INT64


def write_set(folder, names, feed, out_names, outputs, index=0):
    data = os.path.join(folder, f"test_data_set_{index}")
    os.makedirs(data, exist_ok=True)
    for k, name in enumerate(names):
        onnx.save_tensor(numpy_helper.from_array(feed[name], name), os.path.join(data, f"input_{k}.pb"))
    for k, name in enumerate(out_names):
        onnx.save_tensor(numpy_helper.from_array(outputs[k], name), os.path.join(data, f"output_{k}.pb"))


def run_ort(path, feed):
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    return sess, sess.run(None, {i.name: feed[i.name] for i in sess.get_inputs()})


def single_op(out, name, op, inputs, outputs, attrs):
    """inputs: list of (name, array or None); outputs: list of names ('' = omitted)."""
    node = helper.make_node(op, [n if a is not None else "" for n, a in inputs], outputs, domain="com.microsoft", **attrs)
    graph_inputs = [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape) for n, a in inputs if a is not None
    ]
    graph_outputs = [helper.make_tensor_value_info(o, F, None) for o in outputs if o]
    graph = helper.make_graph([node], name, graph_inputs, graph_outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    folder = os.path.join(out, name)
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    path = os.path.join(folder, "model.onnx")
    onnx.save(model, path)
    feed = {n: a for n, a in inputs if a is not None}
    _, results = run_ort(path, feed)
    write_set(folder, [n for n, a in inputs if a is not None], feed, [o for o in outputs if o], results)
    print(f"{folder}: {[r.shape for r in results]}")


def rope_caches(rng, positions, half):
    angles = rng.uniform(0, 6.28, size=(positions, half)).astype(np.float32)
    return np.cos(angles), np.sin(angles)


def mha_cases(out, rng):
    def r(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    B, S, L, N, H = 2, 3, 5, 2, 8
    D = N * H
    # Cross attention with the projection bias, no mask.
    single_op(out, "mha_bias", "MultiHeadAttention",
              [("q", r(B, S, D)), ("k", r(B, L, D)), ("v", r(B, L, D)), ("bias", r(3 * D))], ["y"], {"num_heads": N})
    # Self attention after a past of 4: 2-D key padding mask, attention_bias, unidirectional.
    P = 4
    mask = np.ones((B, P + S), dtype=np.int32)
    mask[1, :2] = 0
    single_op(out, "mha_past_mask", "MultiHeadAttention",
              [("q", r(B, S, D)), ("k", r(B, S, D)), ("v", r(B, S, D)), ("bias", r(3 * D)), ("mask", mask),
               ("attn_bias", r(1, N, S, P + S)), ("past_k", r(B, N, P, H)), ("past_v", r(B, N, P, H))],
              ["y", "present_k", "present_v"], {"num_heads": N, "unidirectional": 1})
    # Key lengths [B] (one batch sees no keys at all), custom scale and filter value.
    single_op(out, "mha_key_lengths", "MultiHeadAttention",
              [("q", r(B, S, D)), ("k", r(B, L, D)), ("v", r(B, L, 2 * D)), ("bias", None),
               ("mask", np.array([3, 0], dtype=np.int32))],
              ["y"], {"num_heads": N, "scale": 0.3, "mask_filter_value": -500.0})
    # 3-D mask with a row masked throughout, and present outputs without a past.
    mask3 = (rng.uniform(size=(B, S, L)) > 0.3).astype(np.int32)
    mask3[0, 1, :] = 0
    single_op(out, "mha_mask3d", "MultiHeadAttention",
              [("q", r(B, S, D)), ("k", r(B, L, D)), ("v", r(B, L, D)), ("bias", None), ("mask", mask3)],
              ["y", "present_k", "present_v"], {"num_heads": N})
    # K and V already split into heads (cached cross-attention states), attention_bias per batch.
    single_op(out, "mha_kv_per_head", "MultiHeadAttention",
              [("q", r(B, S, D)), ("k", r(B, N, L, H)), ("v", r(B, N, L, H)), ("bias", None), ("mask", None),
               ("attn_bias", r(B, 1, S, L))], ["y"], {"num_heads": N})


def gqa_inputs(rng, B, S, N, Nk, H, P, seqlens, total, packed, rotary, bias=None):
    def r(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    inputs = []
    if packed:
        inputs += [("qkv", r(B, S, (N + 2 * Nk) * H)), ("k", None), ("v", None)]
    else:
        inputs += [("q", r(B, S, N * H)), ("k", r(B, S, Nk * H)), ("v", r(B, S, Nk * H))]
    inputs += [("past_k", r(B, Nk, P, H)), ("past_v", r(B, Nk, P, H)),
               ("seqlens_k", np.array(seqlens, dtype=np.int32) - 1), ("total", np.array(total, dtype=np.int32))]
    if rotary:
        cos, sin = rope_caches(rng, 32, rotary // 2)
        inputs += [("cos", cos), ("sin", sin)]
    elif bias is not None:
        inputs += [("cos", None), ("sin", None)]
    if bias is not None:
        inputs += [("position_ids", None), ("attn_bias", r(*bias))]
    return inputs


def gqa_cases(out, rng):
    N, Nk, H = 4, 2, 16  # onnxruntime wants head sizes of multiples of 16
    outs = ["y", "present_k", "present_v"]
    # First prompt of 5 into an empty past; the second sequence is 3 long (right padding).
    single_op(out, "gqa_prefill_rotary", "GroupQueryAttention",
              gqa_inputs(rng, 2, 5, N, Nk, H, 0, [5, 3], 5, packed=False, rotary=H),
              outs, {"num_heads": N, "kv_num_heads": Nk, "do_rotary": 1})
    # One token into a 16-row buffer holding 6 and 4 (the buffer is present's shape: shared).
    single_op(out, "gqa_decode_shared_buffer", "GroupQueryAttention",
              gqa_inputs(rng, 2, 1, N, Nk, H, 16, [7, 5], 7, packed=True, rotary=H),
              outs, {"num_heads": N, "kv_num_heads": Nk, "do_rotary": 1, "rotary_interleaved": 1,
                     "local_window_size": 3})
    # One token after a past of exactly 6 (present grows to 7), softcap and a custom scale.
    single_op(out, "gqa_decode_softcap", "GroupQueryAttention",
              gqa_inputs(rng, 2, 1, N, Nk, H, 6, [7, 7], 7, packed=False, rotary=0),
              outs, {"num_heads": N, "kv_num_heads": Nk, "softcap": 2.0, "scale": 0.5})
    # A second chunk of a prompt: 3 tokens after 4, with attention_bias.
    single_op(out, "gqa_chunk_attention_bias", "GroupQueryAttention",
              gqa_inputs(rng, 1, 3, N, Nk, H, 4, [7], 7, packed=True, rotary=0, bias=(1, N, 3, 7)),
              outs, {"num_heads": N, "kv_num_heads": Nk})


def rotary_cases(out, rng):
    cos, sin = rope_caches(rng, 16, 8)
    x = rng.standard_normal((2, 3, 32)).astype(np.float32)
    pos = np.array([[0, 1, 2], [5, 9, 3]], dtype=np.int64)
    single_op(out, "rotary_3d", "RotaryEmbedding",
              [("x", x), ("position_ids", pos), ("cos", cos), ("sin", sin)], ["y"], {})
    cos, sin = rope_caches(rng, 16, 4)
    x = rng.standard_normal((2, 2, 3, 16)).astype(np.float32)
    single_op(out, "rotary_4d_partial_interleaved", "RotaryEmbedding",
              [("x", x), ("position_ids", np.array([4], dtype=np.int64)), ("cos", cos), ("sin", sin)], ["y"],
              {"interleaved": 1, "rotary_embedding_dim": 8, "num_heads": 2})


def make_llama(folder):
    """A tiny Llama with random weights and a word-level tokenizer, as a transformers folder."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(SEED)
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         rms_norm_eps=1e-5, tie_word_embeddings=False)
    LlamaForCausalLM(config).eval().save_pretrained(folder)
    vocab = {f"t{i}": i for i in range(256)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="t1", eos_token="t2", unk_token="t0").save_pretrained(folder)


def llama_case(out, rng):
    folder = os.path.join(out, "llama-tiny-genai")
    shutil.rmtree(folder, ignore_errors=True)
    with tempfile.TemporaryDirectory() as tmp:
        source, built = os.path.join(tmp, "llama"), os.path.join(tmp, "built")
        make_llama(source)
        subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", source, "-o", built,
                        "-p", "fp32", "-e", "cpu", "-c", os.path.join(tmp, "cache")], check=True,
                       stdout=subprocess.DEVNULL)
        os.makedirs(folder)
        for f in ("model.onnx", "model.onnx.data", "genai_config.json"):
            shutil.copy(os.path.join(built, f), folder)
    path = os.path.join(folder, "model.onnx")
    B, S, capacity, layers = 2, 5, 16, 2
    feed = {"input_ids": rng.integers(3, 256, size=(B, S), dtype=np.int64),
            "attention_mask": np.ones((B, S), dtype=np.int64)}
    feed["attention_mask"][1, 3:] = 0
    for i in range(layers):
        for kind in ("key", "value"):
            feed[f"past_key_values.{i}.{kind}"] = np.zeros((B, 2, capacity, 16), dtype=np.float32)
    sess, results = run_ort(path, feed)
    names = [i.name for i in sess.get_inputs()]
    out_names = [o.name for o in sess.get_outputs()]
    write_set(folder, names, feed, out_names, results, 0)
    # Decode: the next token of each sequence at its own position, the caches from the prefill.
    step = {"input_ids": rng.integers(3, 256, size=(B, 1), dtype=np.int64)}
    # The second sequence's token goes right after its 3 (the mask counts its keys).
    step["attention_mask"] = np.array([[1] * 6, [1, 1, 1, 1, 0, 0]], dtype=np.int64)
    for k, name in enumerate(out_names[1:]):
        step[name.replace("present", "past_key_values")] = results[1 + k]
    _, results = run_ort(path, step)
    write_set(folder, names, step, out_names, results, 1)
    print(f"{folder}: logits {results[0].shape}, present {results[1].shape}")


def main(out):
    rng = np.random.default_rng(SEED)
    ops = os.path.join(out, "ort-attention-ops")
    mha_cases(ops, rng)
    gqa_cases(ops, rng)
    rotary_cases(ops, rng)
    llama_case(out, rng)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    main(sys.argv[1])
