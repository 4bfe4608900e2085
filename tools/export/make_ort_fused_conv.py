"""One-node com.microsoft.FusedConv models with onnxruntime's outputs, for kiln's FusedConv.

onnxruntime runs com.microsoft.FusedConv on its CPU provider (contrib_ops/cpu/fused_conv.cc):
Conv, plus the optional fourth input Z, then the `activation` given by name with its
`activation_params`. Each case goes to OUT/<name>/model.onnx with test_data_set_0 (random
inputs and onnxruntime's output, run on the file as written):

- relu-z: 2-D, bias and Z, Relu;
- leakyrelu-group: 2-D, 2 groups, stride 2, LeakyRelu(0.1);
- clip-dilated: 2-D, dilation 2, padding, Clip(-0.5, 0.5), no bias;
- hardsigmoid-1d: 1-D with Z, HardSigmoid(0.2, 0.5);
- sigmoid-depthwise: 2-D depthwise (group = channels), Sigmoid;
- tanh-3d: 3-D, Tanh;
- identity: no activation attribute, Z only.

    /work/venv/bin/python tools/export/make_ort_fused_conv.py models/ort-fused-conv

Versions: see requirements-export.txt (onnx 1.23.2, onnxruntime 1.32.0).
"""
import os
import shutil
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

SEED = 20261124

# name: x shape, w shape, conv attributes, activation, params, bias, Z
CASES = {
    "relu-z": ((2, 3, 9, 8), (4, 3, 3, 3), {"pads": [1, 1, 1, 1]}, "Relu", None, True, True),
    "leakyrelu-group": ((1, 4, 11, 10), (6, 2, 3, 3), {"group": 2, "strides": [2, 2]}, "LeakyRelu", [0.1], True,
                        False),
    "clip-dilated": ((1, 3, 12, 12), (5, 3, 3, 3), {"dilations": [2, 2], "pads": [2, 1, 2, 1]}, "Clip",
                     [-0.5, 0.5], False, False),
    "hardsigmoid-1d": ((2, 5, 17), (4, 5, 3), {"pads": [1, 1]}, "HardSigmoid", [0.2, 0.5], True, True),
    "sigmoid-depthwise": ((1, 6, 9, 9), (6, 1, 3, 3), {"group": 6, "pads": [1, 1, 1, 1]}, "Sigmoid", None, True,
                          False),
    "tanh-3d": ((1, 2, 5, 6, 7), (3, 2, 2, 3, 3), {}, "Tanh", None, True, False),
    "identity": ((1, 3, 7, 7), (8, 3, 1, 1), {}, None, None, True, True),
}


def build(name, x_shape, w_shape, attrs, activation, params, bias, z, rng):
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = (rng.standard_normal(w_shape) / np.sqrt(np.prod(w_shape[1:]))).astype(np.float32)
    inits = [numpy_helper.from_array(w, "W")]
    inputs = ["X", "W"]
    if bias or z:
        inputs.append("B" if bias else "")
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(w_shape[0]).astype(np.float32), "B"))
    node_attrs = dict(attrs)
    if activation:
        node_attrs["activation"] = activation
    if params:
        node_attrs["activation_params"] = params
    feed = {"X": x}
    graph_inputs = [helper.make_tensor_value_info("X", TensorProto.FLOAT, list(x_shape))]
    if z:
        inputs.append("Z")
        graph_inputs.append(helper.make_tensor_value_info("Z", TensorProto.FLOAT, None))
    node = helper.make_node("FusedConv", inputs, ["Y"], domain="com.microsoft", **node_attrs)
    graph = helper.make_graph([node], name, graph_inputs, [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    if z:
        # Z has the output's shape: run once without it to learn that shape.
        plain = onnx.ModelProto()
        plain.CopyFrom(model)
        del plain.graph.node[0].input[3]
        del plain.graph.input[1]
        y = session(plain.SerializeToString()).run(None, {"X": x})[0]
        feed["Z"] = rng.standard_normal(y.shape).astype(np.float32)
    return model, feed


def session(model_bytes) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])


def main(out: str) -> None:
    rng = np.random.default_rng(SEED)
    for name, case in CASES.items():
        model, feed = build(name, *case, rng)
        folder = os.path.join(out, name)
        shutil.rmtree(folder, ignore_errors=True)
        data = os.path.join(folder, "test_data_set_0")
        os.makedirs(data)
        onnx.save(model, os.path.join(folder, "model.onnx"))
        sess = session(os.path.join(folder, "model.onnx"))
        outputs = sess.run(None, feed)
        for k, i in enumerate(sess.get_inputs()):
            onnx.save_tensor(numpy_helper.from_array(feed[i.name], i.name), os.path.join(data, f"input_{k}.pb"))
        for k, o in enumerate(sess.get_outputs()):
            onnx.save_tensor(numpy_helper.from_array(outputs[k], o.name), os.path.join(data, f"output_{k}.pb"))
        print(f"{folder}: Y {outputs[0].shape}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    main(sys.argv[1])
