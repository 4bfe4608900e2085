"""Builds models/tiny-cnn: a small image classifier with random weights, plus one
test-data set whose expected output comes from onnxruntime.

    python3 -m venv .venv && .venv/bin/pip install -r tools/export/requirements-onnx.txt
    .venv/bin/python tools/export/make_tiny_cnn.py models/tiny-cnn
"""
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper


def main(out_dir: str) -> None:
    rng = np.random.default_rng(20261122)

    def weight(name, shape, scale):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    inits = [
        weight("conv1.w", (16, 3, 3, 3), 0.2), weight("conv1.b", (16,), 0.1),
        weight("bn1.scale", (16,), 0.1), weight("bn1.bias", (16,), 0.1),
        numpy_helper.from_array(np.zeros(16, np.float32), "bn1.mean"),
        numpy_helper.from_array(np.ones(16, np.float32), "bn1.var"),
        weight("conv2.w", (32, 16, 3, 3), 0.1), weight("conv2.b", (32,), 0.1),
        weight("fc.w", (10, 32), 0.2), weight("fc.b", (10,), 0.1),
    ]
    nodes = [
        helper.make_node("Conv", ["image", "conv1.w", "conv1.b"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c1", "bn1.scale", "bn1.bias", "bn1.mean", "bn1.var"], ["b1"], name="bn1"),
        helper.make_node("Relu", ["b1"], ["r1"], name="relu1"),
        helper.make_node("MaxPool", ["r1"], ["p1"], name="pool1", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "conv2.w", "conv2.b"], ["c2"], name="conv2", pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("GlobalAveragePool", ["r2"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "fc.w", "fc.b"], ["logits"], name="fc", transB=1),
        helper.make_node("Softmax", ["logits"], ["probs"], name="softmax", axis=1),
    ]
    graph = helper.make_graph(
        nodes, "tiny_cnn",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 3, 32, 32])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", 10])],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="kiln-export")
    model.ir_version = 8
    onnx.checker.check_model(model)
    os.makedirs(os.path.join(out_dir, "test_data_set_0"), exist_ok=True)
    path = os.path.join(out_dir, "model.onnx")
    onnx.save(model, path)

    image = rng.standard_normal((2, 3, 32, 32)).astype(np.float32)
    probs = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"image": image})[0]
    data = os.path.join(out_dir, "test_data_set_0")
    onnx.save_tensor(numpy_helper.from_array(image, "image"), os.path.join(data, "input_0.pb"))
    onnx.save_tensor(numpy_helper.from_array(probs, "probs"), os.path.join(data, "output_0.pb"))
    print(f"wrote {path} ({os.path.getsize(path)} bytes); onnxruntime {ort.__version__}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "models/tiny-cnn")
