"""Files written by onnxruntime's transformer optimizer, for kiln's com.microsoft ops.

BERT (OUT/bert-tiny-ort-optimized):

A 2-layer BERT with random weights (built from a config, nothing downloaded) is exported by
Optimum (feature-extraction) and then rewritten by Optimum's ORTOptimizer at levels O1-O4,
which run onnxruntime.transformers.optimizer underneath, and by that optimizer called directly
with its BERT defaults (which also fuse the embeddings into EmbedLayerNormalization, a fusion
Optimum turns off). Each model goes to OUT/<name>/model.onnx with test_data_set_0: one batch of
token ids, attention mask and token types, and onnxruntime's outputs for them.

O4 is O3 with float16 mixed precision (AutoOptimizationConfig.O4(): optimize_for_gpu and fp16,
which runs the same optimizer and then its float16 conversion, keeping the graph's inputs and
outputs in their types with a Cast at each end). Optimum prints "There is no gpu for
onnxruntime to do optimization" and writes the file all the same; onnxruntime's CPU provider
runs it (computing in float where it has no float16 kernel), and its outputs are the reference.

GPT-2 (OUT/gpt2-tiny-ort-optimized): a 2-layer GPT-2 with random weights exported by Optimum
as a decoder with past (text-generation-with-past), rewritten by ORTOptimizer at level O2 (its
FastGelu takes the bias; SkipLayerNormalization adds the residual). The data set is one
decoding step of 4 tokens after 3 cached positions, the first 2 of the second sequence padded.
Also at level O4 (the same ops on float16, as for BERT).

    HF_HUB_OFFLINE=1 /work/venv/bin/python tools/export/make_ort_optimized.py models

Versions: see requirements-export.txt (optimum 2.1.0, optimum-onnx 0.1.0, onnxruntime 1.32.0).
"""
import collections
import os
import shutil
import sys
import tempfile

import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnx import numpy_helper
from optimum.exporters.onnx import main_export
from optimum.onnxruntime import ORTOptimizer
from optimum.onnxruntime.configuration import AutoOptimizationConfig
from onnxruntime.transformers.optimizer import optimize_model
from transformers import BertConfig, BertModel, GPT2Config, GPT2LMHeadModel

SEED = 20261124
BATCH, SEQUENCE = 2, 7


def make_bert(folder: str) -> None:
    """A small BERT with random weights, saved as a transformers model folder."""
    torch.manual_seed(SEED)
    config = BertConfig(
        vocab_size=512,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=64,
        type_vocab_size=2,
    )
    model = BertModel(config).eval()
    model.save_pretrained(folder)


def make_gpt2(folder: str) -> None:
    """A small GPT-2 language model with random weights, saved as a transformers model folder."""
    torch.manual_seed(SEED)
    config = GPT2Config(vocab_size=512, n_embd=64, n_layer=2, n_head=4, n_positions=64)
    GPT2LMHeadModel(config).eval().save_pretrained(folder)


def gpt2_inputs(sess):
    """One decoding step: 4 new tokens after 3 cached positions; the second sequence's first 2
    positions are padding (left-padded, as batched generation pads)."""
    rng = np.random.default_rng(SEED)
    past, new = 3, 4
    feed = {}
    for i in sess.get_inputs():
        if i.name.startswith("past_key_values"):
            feed[i.name] = rng.standard_normal((BATCH, 4, past, 16)).astype(np.float32)
    feed["input_ids"] = rng.integers(1, 512, size=(BATCH, new), dtype=np.int64)
    mask = np.ones((BATCH, past + new), dtype=np.int64)
    mask[1, :2] = 0
    feed["attention_mask"] = mask
    feed["position_ids"] = (np.cumsum(mask, axis=1) - 1).clip(min=0)[:, past:].astype(np.int64)
    return {i.name: feed[i.name] for i in sess.get_inputs()}


def inputs(sess):
    """Token ids, a mask with padding at the end of the second sequence, and token types."""
    names = [i.name for i in sess.get_inputs()]
    if "past_key_values.0.key" in names:
        return gpt2_inputs(sess)
    rng = np.random.default_rng(SEED)
    ids = rng.integers(1, 512, size=(BATCH, SEQUENCE), dtype=np.int64)
    mask = np.ones((BATCH, SEQUENCE), dtype=np.int64)
    mask[1, 5:] = 0
    types = np.zeros((BATCH, SEQUENCE), dtype=np.int64)
    types[:, 4:] = 1
    values = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
    return {n: values[n] for n in names}


def write_reference(model_path: str, out: str) -> None:
    """test_data_set_0 beside the model: the inputs and onnxruntime's outputs for them."""
    options = ort.SessionOptions()
    # The file as written is the reference: onnxruntime must not fuse it further.
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model_path, options, providers=["CPUExecutionProvider"])
    feed = inputs(sess)
    outputs = sess.run(None, feed)
    folder = os.path.join(out, "test_data_set_0")
    os.makedirs(folder, exist_ok=True)
    for k, i in enumerate(sess.get_inputs()):
        onnx.save_tensor(numpy_helper.from_array(feed[i.name], i.name), os.path.join(folder, f"input_{k}.pb"))
    for k, o in enumerate(sess.get_outputs()):
        onnx.save_tensor(numpy_helper.from_array(outputs[k], o.name), os.path.join(folder, f"output_{k}.pb"))


def contrib_ops(model_path: str):
    model = onnx.load(model_path)
    counts = collections.Counter(
        f"{n.domain or 'ai.onnx'}.{n.op_type}" for n in model.graph.node if n.domain == "com.microsoft"
    )
    return dict(sorted(counts.items()))


def save(model_path: str, out: str, name: str) -> None:
    folder = os.path.join(out, name)
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    shutil.copy(model_path, os.path.join(folder, "model.onnx"))
    write_reference(os.path.join(folder, "model.onnx"), folder)
    print(f"{folder}: {contrib_ops(os.path.join(folder, 'model.onnx'))}")


def main(out: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        gpt2, gpt2_exported = os.path.join(tmp, "gpt2"), os.path.join(tmp, "gpt2-onnx")
        make_gpt2(gpt2)
        main_export(gpt2, output=gpt2_exported, task="text-generation-with-past", library_name="transformers")
        for level in ("O2", "O4"):
            optimized = os.path.join(tmp, f"gpt2-{level}")
            ORTOptimizer.from_pretrained(gpt2_exported, file_names=["model.onnx"]).optimize(
                getattr(AutoOptimizationConfig, level)(), optimized
            )
            save(os.path.join(optimized, "model_optimized.onnx"), os.path.join(out, "gpt2-tiny-ort-optimized"), level)

        out = os.path.join(out, "bert-tiny-ort-optimized")
        source, exported = os.path.join(tmp, "bert"), os.path.join(tmp, "onnx")
        make_bert(source)
        main_export(source, output=exported, task="feature-extraction", library_name="transformers")
        for level in ("O1", "O2", "O3", "O4"):
            optimized = os.path.join(tmp, level)
            config = getattr(AutoOptimizationConfig, level)()
            ORTOptimizer.from_pretrained(exported).optimize(config, optimized)
            save(os.path.join(optimized, "model_optimized.onnx"), out, level)
        bert = optimize_model(os.path.join(exported, "model.onnx"), model_type="bert", num_heads=4, hidden_size=64)
        bert.save_model_to_file(os.path.join(tmp, "bert_optimized.onnx"))
        save(os.path.join(tmp, "bert_optimized.onnx"), out, "transformers-optimizer")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    main(sys.argv[1])
