"""int4 weight-only quantized GPT-2s, for kiln's com.microsoft MatMulNBits and GatherBlockQuantized.

The committed tiny GPT-2 (models/gpt2-tiny-random/model.onnx, made by make_gpt2.py) is
quantized by onnxruntime's MatMulNBitsQuantizer (4 bits, block 32) twice, into
OUT/symmetric and OUT/asymmetric (with zero points). Optimum exports GPT-2's Conv1D layers as
Gemm, which the quantizer leaves alone, so each Gemm with a constant weight is first written
as the MatMul + Add it is; the quantizer then turns every MatMul with a constant weight into
MatMulNBits and the token and position embeddings (Gather) into GatherBlockQuantized (int4
data when symmetric, uint4 with zero points otherwise). In the asymmetric model each bias
Add after a MatMulNBits whose bias is an initializer is folded into the op's bias input, so
that input is checked too.

OUT/accuracy4 is the asymmetric model with accuracy_level = 4 on every MatMulNBits: onnxruntime
then quantizes the activations to int8 per block and computes each block in integers (its
CompInt8 kernels), which kiln follows; its outputs are onnxruntime's at that level.

Each folder holds model.onnx, the tiny model's config files, test_data_set_0 (a prefill of
the prompt) and test_data_set_1 (the decoding step after it) with onnxruntime's outputs, and
expected_tokens.json: onnxruntime's greedy decode of MAX_NEW_TOKENS tokens.

    HF_HUB_OFFLINE=1 /work/venv/bin/python tools/export/make_nbits.py models/gpt2-tiny-int4

Versions: see requirements-export.txt (onnxruntime 1.32.0).
"""
import collections
import json
import logging
import os
import shutil
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper
from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

# The quantizer logs every node it looks at.
logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.WARNING)

SOURCE = os.path.join(os.path.dirname(__file__), "..", "..", "models", "gpt2-tiny-random")
BLOCK = 32
MAX_NEW_TOKENS = 12
PROMPT = [17, 512, 9, 333, 101]


def gemm_to_matmul(model: onnx.ModelProto) -> None:
    """Gemm(A, W, b) with constant W (alpha = beta = 1, no transposes) as MatMul(A, W) + b."""
    inits = {i.name for i in model.graph.initializer}
    nodes = []
    for n in model.graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        plain = all(attrs.get(k, d) == d for k, d in (("alpha", 1.0), ("beta", 1.0), ("transA", 0), ("transB", 0)))
        if n.op_type != "Gemm" or not plain or n.input[1] not in inits:
            nodes.append(n)
            continue
        product = n.output[0] + "_matmul" if len(n.input) > 2 else n.output[0]
        nodes.append(helper.make_node("MatMul", n.input[:2], [product], name=n.name + "_MatMul"))
        if len(n.input) > 2:
            nodes.append(helper.make_node("Add", [product, n.input[2]], [n.output[0]], name=n.name + "_Add"))
    del model.graph.node[:]
    model.graph.node.extend(nodes)


def fold_bias(model: onnx.ModelProto) -> None:
    """MatMulNBits followed by Add(its output, constant bias [N]) as MatMulNBits with that bias."""
    inits = {i.name: i for i in model.graph.initializer}
    readers = collections.Counter(x for n in model.graph.node for x in n.input)
    producer = {n.output[0]: n for n in model.graph.node if n.op_type == "MatMulNBits"}
    keep = []
    for n in model.graph.node:
        q = producer.get(n.input[0]) if n.op_type == "Add" else None
        bias = inits.get(n.input[1]) if q is not None else None
        if q is None or bias is None or readers[n.input[0]] != 1 or len(bias.dims) != 1:
            keep.append(n)
            continue
        inputs = list(q.input) + [""] * (5 - len(q.input))
        q.input[:] = inputs[:5] + [n.input[1]]
        q.output[0] = n.output[0]
    del model.graph.node[:]
    model.graph.node.extend(keep)


def quantize(symmetric: bool) -> onnx.ModelProto:
    model = onnx.load(os.path.join(SOURCE, "model.onnx"))
    gemm_to_matmul(model)
    quantizer = MatMulNBitsQuantizer(model, bits=4, block_size=BLOCK, is_symmetric=symmetric,
                                     op_types_to_quantize=("MatMul", "Gather"))
    quantizer.process()
    result = quantizer.model.model
    if not symmetric:
        fold_bias(result)
    onnx.checker.check_model(result)
    return result


def with_accuracy_level(model: onnx.ModelProto, level: int) -> onnx.ModelProto:
    """A copy of the model with accuracy_level = level on every MatMulNBits."""
    result = onnx.ModelProto()
    result.CopyFrom(model)
    for n in result.graph.node:
        if n.op_type != "MatMulNBits":
            continue
        kept = [a for a in n.attribute if a.name != "accuracy_level"]
        del n.attribute[:]
        n.attribute.extend(kept + [helper.make_attribute("accuracy_level", level)])
    return result


def session(path: str) -> ort.InferenceSession:
    options = ort.SessionOptions()
    # The file as written is the reference: onnxruntime must not rewrite it further.
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def feed_for(sess, ids, past):
    """Inputs of one step: new token ids after `past` (present tensors of the last step, or
    None for an empty cache)."""
    feed = {"input_ids": np.array([ids], dtype=np.int64)}
    past_len = 0
    for i in sess.get_inputs():
        if i.name.startswith("past_key_values"):
            name = i.name.replace("past_key_values", "present")
            feed[i.name] = past[name] if past else np.zeros((1, 4, 0, 8), np.float32)
            past_len = feed[i.name].shape[2]
    feed["attention_mask"] = np.ones((1, past_len + len(ids)), dtype=np.int64)
    feed["position_ids"] = np.arange(past_len, past_len + len(ids), dtype=np.int64)[None, :]
    return {i.name: feed[i.name] for i in sess.get_inputs()}


def run(sess, feed):
    outputs = sess.run(None, feed)
    return {o.name: v for o, v in zip(sess.get_outputs(), outputs)}


def write_data_set(sess, feed, outputs, folder: str) -> None:
    os.makedirs(folder, exist_ok=True)
    for k, i in enumerate(sess.get_inputs()):
        onnx.save_tensor(numpy_helper.from_array(feed[i.name], i.name), os.path.join(folder, f"input_{k}.pb"))
    for k, o in enumerate(sess.get_outputs()):
        onnx.save_tensor(numpy_helper.from_array(outputs[o.name], o.name), os.path.join(folder, f"output_{k}.pb"))


def write_folder(model: onnx.ModelProto, folder: str) -> None:
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    path = os.path.join(folder, "model.onnx")
    onnx.save(model, path)
    for name in ("config.json", "generation_config.json"):
        shutil.copy(os.path.join(SOURCE, name), folder)
    sess = session(path)
    # Greedy decode: the prompt, then one token at a time; the first two steps are the data sets.
    tokens, past, ids = [], None, PROMPT
    for step in range(MAX_NEW_TOKENS):
        feed = feed_for(sess, ids, past)
        outputs = run(sess, feed)
        if step < 2:
            write_data_set(sess, feed, outputs, os.path.join(folder, f"test_data_set_{step}"))
        token = int(np.argmax(outputs["logits"][0, -1]))
        tokens.append(token)
        past, ids = outputs, [token]
    with open(os.path.join(folder, "expected_tokens.json"), "w") as f:
        json.dump({"tokens": tokens, "prompt": PROMPT, "max_new_tokens": MAX_NEW_TOKENS,
                   "made_by": "onnxruntime greedy decode of this model.onnx"}, f, indent=1)
        f.write("\n")
    ops = collections.Counter(n.op_type for n in model.graph.node if n.domain == "com.microsoft")
    print(f"{folder}: {dict(ops)}, tokens {tokens}")


def main(out: str) -> None:
    for name, symmetric in (("symmetric", True), ("asymmetric", False)):
        model = quantize(symmetric)
        write_folder(model, os.path.join(out, name))
        if not symmetric:
            write_folder(with_accuracy_level(model, 4), os.path.join(out, "accuracy4"))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    main(sys.argv[1])
