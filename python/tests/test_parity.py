"""kiln.InferenceSession against onnxruntime.InferenceSession on the committed models: the same
input/output descriptions, model metadata and outputs, and onnxruntime's API surface."""

from __future__ import annotations

import json
import os
import pathlib

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import kiln
from conftest import GPT2, MINILM, TINY_CNN, WHISPER, read_test_data, require


def tiny_cnn_case():
    inputs, _ = read_test_data(TINY_CNN / "test_data_set_0")
    return TINY_CNN / "model.onnx", {"image": inputs[0]}


def gpt2_case():
    prompt = np.array([[17, 512, 9, 333, 101]], dtype=np.int64)
    feed = {
        "input_ids": prompt,
        "attention_mask": np.ones_like(prompt),
        "position_ids": np.arange(prompt.shape[1], dtype=np.int64)[None],
    }
    for layer in range(5):
        for kind in ("key", "value"):
            feed[f"past_key_values.{layer}.{kind}"] = np.zeros((1, 4, 0, 8), np.float32)
    return GPT2 / "model.onnx", feed


def whisper_encoder_case():
    return WHISPER / "encoder_model.onnx", {"input_features": np.load(WHISPER / "sample_features.npy")}


def minilm_case():
    inputs, _ = read_test_data(require(MINILM) / "test_data_set_0")
    names = ["input_ids", "attention_mask", "token_type_ids"]
    return MINILM / "model.onnx", dict(zip(names, inputs))


CASES = {
    "tiny-cnn": tiny_cnn_case,
    "gpt2-tiny-random": gpt2_case,
    "whisper-encoder": whisper_encoder_case,
    "all-MiniLM-L6-v2": minilm_case,
}


def describe(args) -> list[tuple]:
    return [(a.name, a.shape, a.type) for a in args]


def metadata(m) -> dict:
    return {k: getattr(m, k) for k in ("producer_name", "graph_name", "domain", "description",
                                       "graph_description", "version", "custom_metadata_map")}


@pytest.mark.parametrize("case", CASES)
def test_same_description_and_outputs_as_onnxruntime(case):
    path, feed = CASES[case]()
    ours = kiln.InferenceSession(str(path))
    theirs = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert describe(ours.get_inputs()) == describe(theirs.get_inputs())
    assert describe(ours.get_outputs()) == describe(theirs.get_outputs())
    assert describe(ours.get_overridable_initializers()) == describe(
        theirs.get_overridable_initializers())
    assert metadata(ours.get_modelmeta()) == metadata(theirs.get_modelmeta())
    got = ours.run(None, feed)
    want = theirs.run(None, feed)
    assert len(got) == len(want)
    for name, g, w in zip([o.name for o in theirs.get_outputs()], got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, name
        np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-4, err_msg=name)


def described_model() -> onnx.ModelProto:
    """A model with every descriptive field set, each kind of dimension and an undeclared shape.

    (Outputs are declared with their shapes: for an output declared without one, onnxruntime
    reports the shape its own inference finds, kiln what the file declares.)"""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, None])
    u = helper.make_tensor_value_info("u", TensorProto.INT64, None)
    w = helper.make_tensor_value_info("w", TensorProto.DOUBLE, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3, None])
    v = helper.make_tensor_value_info("v", TensorProto.INT64, None)
    z = helper.make_tensor_value_info("z", TensorProto.DOUBLE, [2])
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="relu"),
         helper.make_node("Neg", ["u"], ["v"], name="neg_u"),
         helper.make_node("Neg", ["w"], ["z"], name="neg")],
        "described", [x, u, w], [y, v, z],
        initializer=[helper.make_tensor("w", TensorProto.DOUBLE, [2], [1.0, -2.0])],
        doc_string="the graph's own words")
    model = helper.make_model(graph, producer_name="tests", producer_version="1.2",
                              domain="org.example", model_version=7,
                              doc_string="the model's own words",
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    helper.set_model_props(model, {"author": "kiln", "licence": "none"})
    return model


def test_descriptions_of_every_kind_of_field_match_onnxruntime():
    data = described_model().SerializeToString()
    ours = kiln.InferenceSession(data)
    theirs = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    assert describe(ours.get_inputs()) == describe(theirs.get_inputs()) == [
        ("x", ["batch", 3, None], "tensor(float)"), ("u", [], "tensor(int64)")]
    assert describe(ours.get_overridable_initializers()) == describe(
        theirs.get_overridable_initializers()) == [("w", [2], "tensor(double)")]
    assert describe(ours.get_outputs()) == describe(theirs.get_outputs())
    assert metadata(ours.get_modelmeta()) == metadata(theirs.get_modelmeta())
    assert ours.get_modelmeta().custom_metadata_map == {"author": "kiln", "licence": "none"}
    # An initializer that is also an input may be fed.
    (z,) = ours.run(["z"], {"x": np.zeros((1, 3, 2), np.float32), "u": np.array(1),
                            "w": np.array([3.0, 4.0])})
    np.testing.assert_array_equal(z, [-3.0, -4.0])


def test_paths_bytes_and_pathlike_load_the_same_model():
    path, feed = tiny_cnn_case()
    want = kiln.InferenceSession(str(path)).run(None, feed)[0]
    for source in (pathlib.Path(path), path.read_bytes()):
        np.testing.assert_array_equal(kiln.InferenceSession(source).run(None, feed)[0], want)


def test_output_names_select_and_order_the_outputs():
    path, feed = gpt2_case()
    session = kiln.InferenceSession(str(path))
    everything = dict(zip([o.name for o in session.get_outputs()], session.run(None, feed)))
    picked = session.run(["present.1.value", "logits"], feed)
    np.testing.assert_array_equal(picked[0], everything["present.1.value"])
    np.testing.assert_array_equal(picked[1], everything["logits"])
    assert len(session.run([], feed)) == len(everything)


def test_providers_device_and_version():
    session = kiln.InferenceSession(str(TINY_CNN / "model.onnx"),
                                    providers=["CPUExecutionProvider"])
    assert session.get_providers() == ["CPUExecutionProvider"]
    assert kiln.get_available_providers() == ["CPUExecutionProvider"]
    assert kiln.get_device() == "CPU"
    assert kiln.__version__.count(".") == 2
    assert kiln.isa_level() in ("generic", "avx2", "avx512")
    with pytest.warns(RuntimeWarning, match="CUDAExecutionProvider"):
        kiln.InferenceSession(str(TINY_CNN / "model.onnx"), providers=["CUDAExecutionProvider"])


@pytest.mark.parametrize("level", ["ORT_DISABLE_ALL", "ORT_ENABLE_BASIC", "ORT_ENABLE_EXTENDED",
                                   "ORT_ENABLE_ALL"])
def test_every_optimisation_level_gives_onnxruntimes_outputs(level):
    path, feed = gpt2_case()
    options = kiln.SessionOptions()
    options.graph_optimization_level = getattr(kiln.GraphOptimizationLevel, level)
    options.intra_op_num_threads = 1
    session = kiln.InferenceSession(str(path), options)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feed)
    for g, w in zip(session.run(None, feed), want):
        np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-4)
    stats = session.load_stats()
    if level == "ORT_DISABLE_ALL":
        assert stats["fusions"] == 0 and stats["folded_nodes"] == 0
    elif level == "ORT_ENABLE_BASIC":
        assert stats["fusions"] == 0 and stats["folded_nodes"] > 0
    else:
        assert stats["fusions"] > 0


def test_optimized_model_filepath_writes_the_graph_kiln_runs(tmp_path):
    # onnxruntime's optimized_model_filepath: the saved file is valid ONNX (the checker
    # passes), carries the fused nodes, and runs unoptimised to the same outputs.
    path, feed = gpt2_case()
    saved = tmp_path / "optimized.onnx"
    options = kiln.SessionOptions()
    options.optimized_model_filepath = str(saved)
    assert options.optimized_model_filepath == str(saved)
    session = kiln.InferenceSession(str(path), options)
    model = onnx.load(str(saved))
    onnx.checker.check_model(model)
    assert len(model.graph.node) == session.load_stats()["nodes_planned"]
    assert any(n.domain in ("com.microsoft", "kiln") for n in model.graph.node)
    options = kiln.SessionOptions()
    options.graph_optimization_level = kiln.GraphOptimizationLevel.ORT_DISABLE_ALL
    reloaded = kiln.InferenceSession(str(saved), options)
    for g, w in zip(reloaded.run(None, feed), session.run(None, feed)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_kilns_own_options():
    path, feed = gpt2_case()
    want = kiln.InferenceSession(str(path)).run(["logits"], feed)[0]

    options = kiln.SessionOptions()
    options.gemm_weights = "bfloat16"
    options.memory_arena = False
    bf16 = kiln.InferenceSession(str(path), options)
    got = bf16.run(["logits"], feed)[0]
    assert not np.array_equal(got, want)  # the weights were rounded...
    np.testing.assert_allclose(got, want, rtol=0.05, atol=0.05)  # ...to bfloat16 only
    assert bf16.last_run_stats()["arena_bytes"] == 0
    options.gemm_weights = "int8"
    assert options.gemm_weights == "int8"
    int8 = kiln.InferenceSession(str(path), options)
    got = int8.run(["logits"], feed)[0]
    np.testing.assert_allclose(got, want, rtol=0.1, atol=0.5)  # per-column int8 weights
    with pytest.raises(kiln.InvalidArgumentError, match="gemm_weights"):
        options.gemm_weights = "int3"

    options = kiln.SessionOptions()
    options.memory_limit = 1000
    with pytest.raises(kiln.OutOfMemoryError, match="memory limit") as error:
        kiln.InferenceSession(str(path), options).run(None, feed)
    assert isinstance(error.value, MemoryError) and error.value.node


def test_sessions_of_one_environment_share_weights():
    env = kiln.Environment(1)
    first = kiln.InferenceSession(str(GPT2 / "model.onnx"), environment=env)
    second = kiln.InferenceSession(str(GPT2 / "model.onnx"), environment=env)
    # The first shares only weights repeated inside the model; the second shares them all.
    weights = first.load_stats()["weights_bytes"]
    assert first.load_stats()["weights_shared_bytes"] < weights
    assert second.load_stats()["weights_shared_bytes"] == weights
    assert env.threads == 1 and env.weights_cache_stats()["references"] > 0
    options = kiln.SessionOptions()
    options.share_weights = False
    alone = kiln.InferenceSession(str(GPT2 / "model.onnx"), options, environment=env)
    assert alone.load_stats()["weights_shared_bytes"] == first.load_stats()["weights_shared_bytes"]


def test_profiling_writes_onnxruntimes_trace_format(tmp_path):
    options = kiln.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = str(tmp_path / "trace")
    path, feed = tiny_cnn_case()
    session = kiln.InferenceSession(str(path), options)
    session.run(None, feed)
    session.run(None, feed)
    name = session.end_profiling()
    assert os.path.dirname(name) == str(tmp_path)
    events = json.loads(pathlib.Path(name).read_text())
    ops = [e["args"]["op_name"] for e in events]
    assert len(events) == 2 * session.last_run_stats()["nodes_run"]
    assert "Softmax" in ops and all(e["name"].endswith("_kernel_time") for e in events)
    assert events[-1]["ts"] >= events[0]["ts"]


def test_sequence_and_optional_types_are_described_as_onnxruntime_does():
    seq = helper.make_sequence_type_proto(helper.make_tensor_type_proto(TensorProto.FLOAT, None))
    opt_seq = helper.make_value_info("opt", helper.make_optional_type_proto(seq))
    opt_tensor = helper.make_value_info(
        "opt_t", helper.make_optional_type_proto(helper.make_tensor_type_proto(TensorProto.INT64,
                                                                               [2])))
    graph = helper.make_graph(
        [helper.make_node("OptionalGetElement", ["opt"], ["items"], name="get"),
         helper.make_node("OptionalHasElement", ["opt_t"], ["has"], name="has")],
        "types", [opt_seq, opt_tensor],
        [helper.make_value_info("items", seq),
         helper.make_tensor_value_info("has", TensorProto.BOOL, [])])
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString()
    ours = kiln.InferenceSession(data)
    theirs = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    assert describe(ours.get_inputs()) == describe(theirs.get_inputs()) == [
        ("opt", [], "optional(seq(tensor(float)))"), ("opt_t", [2], "optional(tensor(int64))")]
    assert describe(ours.get_outputs()) == describe(theirs.get_outputs())
    items = [np.ones(2, np.float32), np.zeros(3, np.float32)]
    got = ours.run(None, {"opt": items, "opt_t": None})
    want = theirs.run(None, {"opt": items, "opt_t": None})
    assert [x.tolist() for x in got[0]] == [x.tolist() for x in want[0]]
    assert got[1] == want[1] == False  # noqa: E712


def test_denormals_are_flushed_by_default_and_kept_on_request(tmp_path):
    # x * c with every product 1e-40, a denormal float32.
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "c"], ["y"])], "scale",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1024]),
         helper.make_tensor_value_info("c", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1024])])
    path = tmp_path / "scale.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    feed = {"x": np.full(1024, 1e-20, np.float32), "c": np.array([1e-20], np.float32)}

    options = kiln.SessionOptions()
    assert options.denormals == "flush"
    (flushed,) = kiln.InferenceSession(str(path), options).run(None, feed)
    assert not flushed.any()
    options.denormals = "keep"
    (kept,) = kiln.InferenceSession(str(path), options).run(None, feed)
    (want,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feed)
    assert np.array_equal(kept, want) and kept.all()  # IEEE, as onnxruntime's default
    with pytest.raises(kiln.InvalidArgumentError, match="denormals"):
        options.denormals = "zero"
