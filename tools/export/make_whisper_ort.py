"""The random Whisper of models/whisper-tiny-random (made by make_whisper.py) rewritten by
Optimum's onnxruntime tools, with onnxruntime's outputs, for kiln's com.microsoft ops.

Each variant goes to OUT/<variant>/ as encoder_model.onnx and decoder_model_merged.onnx, with
the config, generation config and tokenizer files of the source folder (so kiln-generate and
Seq2SeqGenerator load it as they load the source), and:
- encoder/test_data_set_0: the source's sample_features.npy and onnxruntime's encoder output;
- decoder/test_data_set_0: the merged decoder's first step (the 4-token decoder prompt, no
  cache) on random encoder states of 24 positions (the decoder takes any encoder length; a
  short one keeps the files small), and test_data_set_1: the cached branch, one token after
  those 4 positions, fed the first step's presents;
- encoder/model.onnx and decoder/model.onnx: links to the two models, as the reference test
  finds a data set's model beside it;
- expected_tokens.json: onnxruntime's greedy tokens on sample_features.npy (the generation
  config's suppressions, no timestamp rules), 40 new tokens at most, and at each step the
  margin of the chosen token's logit over the next one's: in the quantized models a float
  rounded differently before a DynamicQuantizeLinear moves an 8-bit value by one step, which
  moves logits by up to ~0.1, so a token chosen by a smaller margin is not decided by the
  operators' semantics.

Variants:
- O3: ORTOptimizer at level O3 (Attention, SkipLayerNormalization, FastGelu). The optimizer
  turns the merged decoder into an empty graph (its pruning does not see into If branches), so
  it rewrites the decoder pair and Optimum's merge_decoders joins the two rewritten decoders,
  as Optimum's exporter joins the pair it exports.
- O4: the same at level O4, O3 in float16 (weights and activations, a Cast to and from float at
  the graph's inputs and outputs; no Attention fusion for Whisper at this level); Optimum meant
  it for GPUs but writes it on a CPU, and onnxruntime's CPU provider runs it (in float where it
  has no float16 kernel).
- avx512-vnni, avx2: ORTQuantizer with AutoQuantizationConfig.avx512_vnni(is_static=False,
  per_channel=True) and .avx2(is_static=False) on the encoder and the merged decoder, then saved
  by onnxruntime at its extended optimization level (DynamicQuantizeMatMul,
  MatMulIntegerToFloat, Gelu, SkipLayerNormalization; the convolutions stay ConvInteger).

Not written: O1 emits no com.microsoft op (ONNX-level fusions only); O2 is O3 with BiasGelu
and Gelu in place of FastGelu.

    HF_HUB_OFFLINE=1 /work/venv/bin/python tools/export/make_whisper_ort.py \
        models/whisper-tiny-random models/whisper-tiny-ort

Versions: see requirements-export.txt (optimum 2.1.0, optimum-onnx 0.1.0, onnxruntime 1.32.0).
"""
import collections
import json
import os
import shutil
import sys
import tempfile

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper
from optimum.onnx import merge_decoders
from optimum.onnxruntime import ORTOptimizer, ORTQuantizer
from optimum.onnxruntime.configuration import AutoOptimizationConfig, AutoQuantizationConfig

SEED = 20261124
MAX_NEW_TOKENS = 40
ENCODER_POSITIONS = 24
COPIED = ["config.json", "generation_config.json", "preprocessor_config.json", "tokenizer.json",
          "tokenizer_config.json", "vocab.json", "merges.txt", "added_tokens.json", "special_tokens_map.json"]


def session(path: str) -> ort.InferenceSession:
    options = ort.SessionOptions()
    # The file as written is the reference: onnxruntime must not fuse it further.
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = 1
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def contrib_ops(path: str) -> dict:
    """com.microsoft and integer ops by kind, If branches included."""
    counts = collections.Counter()

    def walk(graph):
        for n in graph.node:
            if n.domain == "com.microsoft" or "Integer" in n.op_type:
                counts[f"{n.domain or 'ai.onnx'}.{n.op_type}"] += 1
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    walk(a.g)

    walk(onnx.load(path).graph)
    return dict(sorted(counts.items()))


def write_set(folder: str, feed: dict, sess: ort.InferenceSession, outputs: list) -> None:
    """A test data set. Inputs are saved without names (the runner takes them by position) so
    that equal tensors are equal files across variants."""
    os.makedirs(folder, exist_ok=True)
    for k, i in enumerate(sess.get_inputs()):
        onnx.save_tensor(numpy_helper.from_array(feed[i.name]), os.path.join(folder, f"input_{k}.pb"))
    for k, o in enumerate(sess.get_outputs()):
        onnx.save_tensor(numpy_helper.from_array(outputs[k], o.name), os.path.join(folder, f"output_{k}.pb"))


def empty_past(sess: ort.InferenceSession) -> dict:
    return {i.name: np.zeros((1, i.shape[1], 0, i.shape[3]), np.float32)
            for i in sess.get_inputs() if i.name.startswith("past_key_values")}


def next_past(past: dict, outputs: dict, first_step: bool) -> dict:
    """Optimum's cache update: the encoder's keys and values come from the first step only."""
    return {n: outputs[n.replace("past_key_values", "present")] if first_step or ".decoder." in n else v
            for n, v in past.items()}


def write_references(folder: str, features: np.ndarray, prompt: list) -> None:
    enc = session(os.path.join(folder, "encoder_model.onnx"))
    write_set(os.path.join(folder, "encoder", "test_data_set_0"), {"input_features": features}, enc,
              enc.run(None, {"input_features": features}))
    dec = session(os.path.join(folder, "decoder_model_merged.onnx"))
    names = [o.name for o in dec.get_outputs()]
    rng = np.random.default_rng(SEED)
    hidden = rng.standard_normal((1, ENCODER_POSITIONS, 64)).astype(np.float32)
    past = empty_past(dec)
    ids = np.array([prompt], np.int64)
    for step in range(2):
        feed = {"input_ids": ids, "encoder_hidden_states": hidden, "use_cache_branch": np.array([step > 0]), **past}
        outputs = dec.run(None, feed)
        write_set(os.path.join(folder, "decoder", f"test_data_set_{step}"), feed, dec, outputs)
        past = next_past(past, dict(zip(names, outputs)), step == 0)
        ids = np.array([[int(outputs[0][0, -1].argmax())]], np.int64)
    for part, model in (("encoder", "encoder_model.onnx"), ("decoder", "decoder_model_merged.onnx")):
        os.symlink(os.path.join("..", model), os.path.join(folder, part, "model.onnx"))


def greedy(folder: str, features: np.ndarray, prompt: list, gen: dict) -> list:
    """Greedy decoding with onnxruntime, the merged decoder driven as Optimum drives it, with
    the generation config's suppressions, until end of text or MAX_NEW_TOKENS. Also returns
    each step's margin: how far the chosen token's logit lies above the next one's."""
    hidden = session(os.path.join(folder, "encoder_model.onnx")).run(None, {"input_features": features})[0]
    dec = session(os.path.join(folder, "decoder_model_merged.onnx"))
    names = [o.name for o in dec.get_outputs()]
    past = empty_past(dec)
    ids, tokens, margins = np.array([prompt], np.int64), [], []
    for step in range(MAX_NEW_TOKENS):
        feed = {"input_ids": ids, "encoder_hidden_states": hidden, "use_cache_branch": np.array([step > 0])}
        outputs = dict(zip(names, dec.run(None, {**feed, **past})))
        logits = outputs["logits"][0, -1].copy()
        logits[gen["suppress_tokens"]] = -np.inf
        if step == 0:
            logits[gen["begin_suppress_tokens"]] = -np.inf
        tokens.append(int(logits.argmax()))
        top = np.sort(logits)[-2:]
        margins.append(round(float(top[1] - top[0]), 4))
        if tokens[-1] == gen["eos_token_id"]:
            break
        past = next_past(past, outputs, step == 0)
        ids = np.array([[tokens[-1]]], np.int64)
    return tokens, margins


def optimized(source: str, tmp: str, level: str) -> dict:
    out = os.path.join(tmp, level)
    files = ["encoder_model.onnx", "decoder_model.onnx", "decoder_with_past_model.onnx"]
    ORTOptimizer.from_pretrained(source, file_names=files).optimize(getattr(AutoOptimizationConfig, level)(), out)
    merged = os.path.join(out, "decoder_model_merged.onnx")
    merge_decoders(os.path.join(out, "decoder_model_optimized.onnx"),
                   os.path.join(out, "decoder_with_past_model_optimized.onnx"), save_path=merged, strict=False)
    return {"encoder_model.onnx": os.path.join(out, "encoder_model_optimized.onnx"), "decoder_model_merged.onnx": merged}


def ort_fused(path: str) -> str:
    """The model as onnxruntime's extended-level optimizer saves it (its quantization fusions)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = path.replace(".onnx", "_fused.onnx")
    ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    return options.optimized_model_filepath


def quantized(source: str, tmp: str, name: str, config) -> dict:
    out = os.path.join(tmp, name)
    result = {}
    for file in ("encoder_model.onnx", "decoder_model_merged.onnx"):
        ORTQuantizer.from_pretrained(source, file_name=file).quantize(save_dir=out, quantization_config=config)
        result[file] = ort_fused(os.path.join(out, file.replace(".onnx", "_quantized.onnx")))
    return result


def main(source: str, out: str) -> None:
    features = np.load(os.path.join(source, "sample_features.npy")).astype(np.float32)
    with open(os.path.join(source, "expected_tokens.json")) as f:
        prompt = json.load(f)["decoder_prompt"]
    with open(os.path.join(source, "generation_config.json")) as f:
        gen = json.load(f)
    with tempfile.TemporaryDirectory() as tmp:
        variants = {
            "O3": optimized(source, tmp, "O3"),
            "O4": optimized(source, tmp, "O4"),
            "avx512-vnni": quantized(source, tmp, "avx512-vnni",
                                     AutoQuantizationConfig.avx512_vnni(is_static=False, per_channel=True)),
            "avx2": quantized(source, tmp, "avx2", AutoQuantizationConfig.avx2(is_static=False)),
        }
        for name, files in variants.items():
            folder = os.path.join(out, name)
            shutil.rmtree(folder, ignore_errors=True)
            os.makedirs(folder)
            for file in COPIED:
                shutil.copy(os.path.join(source, file), folder)
            for file, path in files.items():
                shutil.copy(path, os.path.join(folder, file))
            write_references(folder, features, prompt)
            tokens, margins = greedy(folder, features, prompt, gen)
            doc = {"tokens": tokens, "margins": margins, "decoder_prompt": prompt, "max_new_tokens": MAX_NEW_TOKENS,
                   "input": "sample_features.npy of models/whisper-tiny-random",
                   "made_by": "onnxruntime 1.32.0 greedy decoding with the generation config's suppressions; "
                              "tools/export/make_whisper_ort.py"}
            with open(os.path.join(folder, "expected_tokens.json"), "w") as f:
                f.write("{\n" + ",\n".join(f" {json.dumps(k)}: {json.dumps(v)}" for k, v in doc.items()) + "\n}\n")
            print(f"{folder}: {[contrib_ops(os.path.join(folder, f)) for f in files]} tokens {tokens}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    if os.environ.get("PYTHONHASHSEED") != "0":
        # merge_decoders names the initializers the two decoders share in the order of a set of
        # strings: a fixed string hash makes the merged file the same bytes on every run.
        os.environ["PYTHONHASHSEED"] = "0"
        os.execv(sys.executable, [sys.executable] + sys.argv)
    main(sys.argv[1], sys.argv[2])
