"""Bad models and bad inputs raise one kiln exception carrying kiln's message, which names the
file and, where there is one, the node and op."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import kiln
import models
from conftest import TINY_CNN

CNN = str(TINY_CNN / "model.onnx")


def test_a_missing_file_is_a_file_error_naming_it(tmp_path):
    path = str(tmp_path / "absent.onnx")
    with pytest.raises(kiln.FileError, match="absent.onnx: cannot open") as error:
        kiln.InferenceSession(path)
    assert isinstance(error.value, OSError) and isinstance(error.value, kiln.KilnError)
    assert error.value.file == path


def test_garbage_is_an_invalid_model(tmp_path):
    with pytest.raises(kiln.InvalidModelError, match="<memory>: "):
        kiln.InferenceSession(b"\x08\x07 this is not a model")
    path = tmp_path / "garbage.onnx"
    path.write_bytes(b"\xff" * 100)
    with pytest.raises(kiln.InvalidModelError) as error:
        kiln.InferenceSession(str(path))
    assert str(error.value).startswith(str(path) + ": ") and error.value.file == str(path)
    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes(TINY_CNN.joinpath("model.onnx").read_bytes()[:1000])
    with pytest.raises(kiln.InvalidModelError, match="truncated.onnx"):
        kiln.InferenceSession(str(truncated))


@pytest.mark.parametrize("feed,message", [
    ({"images": np.zeros((1, 3, 32, 32), np.float32)},
     r"unknown input 'images' \(model inputs: image\)"),
    ({"image": np.zeros((1, 3, 31, 32), np.float32)}, "input 'image': dimension 2 must be 32"),
    ({"image": np.zeros((1, 3, 32, 32), np.float64)}, "input 'image': wrong element type"),
    ({"image": np.zeros((3, 32, 32), np.float32)}, "input 'image': wrong rank"),
    ({}, r"missing input 'image: float32\[batch,3,32,32\]'"),
])
def test_wrong_inputs_are_invalid_arguments(feed, message):
    session = kiln.InferenceSession(CNN)
    with pytest.raises(kiln.InvalidArgumentError, match=message) as error:
        session.run(None, feed)
    assert isinstance(error.value, ValueError)
    assert str(error.value).startswith(CNN + ": ") and error.value.file == CNN
    # The session stays usable.
    assert session.run(None, {"image": np.zeros((1, 3, 32, 32), np.float32)})[0].shape == (1, 10)


def test_unknown_output_and_donation_names_are_refused():
    session = kiln.InferenceSession(CNN)
    feed = {"image": np.zeros((1, 3, 32, 32), np.float32)}
    with pytest.raises(kiln.InvalidArgumentError, match=r"unknown output 'prob' \(model outputs: "
                                                         r"probs\)"):
        session.run(["prob"], feed)
    with pytest.raises(kiln.InvalidArgumentError, match="donate names 'x'"):
        session.run(None, feed, donate=["x"])
    with pytest.raises(TypeError):
        session.run(None, [feed["image"]])


def test_an_unsupported_op_names_the_node_and_op():
    graph = helper.make_graph(
        [helper.make_node("Frobnicate", ["x"], ["y"], name="frob")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(kiln.UnsupportedError, match="node 'frob' \\(Frobnicate\\)") as error:
        kiln.InferenceSession(model.SerializeToString())
    assert error.value.node == "frob" and error.value.op == "Frobnicate"


def test_a_kernel_error_names_the_node_and_op():
    shape = onnx.numpy_helper.from_array(np.array([4], np.int64), "shape")
    data = models.model([helper.make_node("Reshape", ["x", "shape"], ["y"], name="to_four")],
                        [models.tensor("x", shape=["n"])], [models.tensor("y", shape=[4])],
                        [shape])
    session = kiln.InferenceSession(data)
    np.testing.assert_array_equal(session.run(None, {"x": np.ones(4, np.float32)})[0], 1)
    with pytest.raises(kiln.KilnError, match="node 'to_four' \\(Reshape\\)") as error:
        session.run(None, {"x": np.ones(6, np.float32)})
    assert error.value.node == "to_four" and error.value.op == "Reshape"
    assert error.value.message and error.value.message in str(error.value)
