"""Small models built in code for the tests (onnx.helper)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def model(nodes, inputs, outputs, initializers=(), opset: int = 17) -> bytes:
    graph = helper.make_graph(nodes, "test", inputs, outputs, initializer=list(initializers))
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m.SerializeToString()


def tensor(name: str, elem=TensorProto.FLOAT, shape=None):
    return helper.make_tensor_value_info(name, elem, shape)


def identity(elem=TensorProto.FLOAT, shape=("n",)) -> bytes:
    """y = Identity(x): kiln hands the input through as the output."""
    return model([helper.make_node("Identity", ["x"], ["y"], name="identity")],
                 [tensor("x", elem, list(shape))], [tensor("y", elem, list(shape))])


def add_one(shape=("n",)) -> bytes:
    """y = x + 1 (an elementwise op kiln runs in place on an input it owns)."""
    one = numpy_helper.from_array(np.array(1.0, np.float32), "one")
    return model([helper.make_node("Add", ["x", "one"], ["y"], name="add")],
                 [tensor("x", shape=list(shape))], [tensor("y", shape=list(shape))], [one])


def weight_output() -> bytes:
    """y = Identity(w) for an initializer w: the output is the weight itself."""
    w = numpy_helper.from_array(np.arange(1024, dtype=np.float32), "w")
    x = tensor("x", shape=[1])
    return model([helper.make_node("Identity", ["w"], ["y"], name="identity"),
                  helper.make_node("Identity", ["x"], ["x_out"], name="pass")],
                 [x], [tensor("y", shape=[1024]), tensor("x_out", shape=[1])], [w])


def append(axis: int = 1) -> bytes:
    """cache_out = Concat(cache, new) along `axis` (a KV cache's append)."""
    return model([helper.make_node("Concat", ["cache", "new"], ["cache_out"], axis=axis,
                                   name="append")],
                 [tensor("cache", shape=[2, "past", 4]), tensor("new", shape=[2, 1, 4])],
                 [tensor("cache_out", shape=[2, "total", 4])])
