"""Models of test/cli/data built with the onnx helper (no downloads):

    /path/to/venv/bin/python tools/export/make_cli_data.py test/cli/data

writes softmax_tails.onnx: y = Softmax(x + v) over one row of 64, x a float32 scalar input
(test/cli/data/zero.npy) and v = [0, -100, ..., -100], so that with x = 0 the 63 small
probabilities (e^-100, about 3.7e-44) are denormal floats unless the engine flushes them;
and expand_huge.onnx: y = Expand(x, [1000000, 1000000]), the same scalar input broadcast to a
4 TB float32 output (a view in kiln, which nothing may copy whole without saying so), fed
one.npy (the scalar 1, written here too).
"""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def _model(graph):
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              producer_name="kiln tests")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def softmax_tails():
    v = np.full([1, 64], -100.0, np.float32)
    v[0, 0] = 0.0
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "v"], ["logits"], name="shift"),
         helper.make_node("Softmax", ["logits"], ["y"], name="softmax", axis=-1)],
        "softmax_tails",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])],
        [numpy_helper.from_array(v, "v")])
    return _model(graph)


def expand_huge():
    graph = helper.make_graph(
        [helper.make_node("Expand", ["x", "shape"], ["y"], name="expand")],
        "expand_huge",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1000000, 1000000])],
        [numpy_helper.from_array(np.array([1000000, 1000000], np.int64), "shape")])
    return _model(graph)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "test/cli/data"
    os.makedirs(out, exist_ok=True)
    onnx.save(softmax_tails(), os.path.join(out, "softmax_tails.onnx"))
    onnx.save(expand_huge(), os.path.join(out, "expand_huge.onnx"))
    np.save(os.path.join(out, "one.npy"), np.array(1.0, np.float32))


if __name__ == "__main__":
    main()
