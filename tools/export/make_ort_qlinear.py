"""Builds models/tiny-cnn-quantized: a small CNN in the style of models/tiny-cnn (random
weights) with a residual Add, a Sigmoid gate (Mul), LeakyRelu, Concat, AveragePool,
GlobalAveragePool and Softmax,
quantized by onnxruntime's `quantize_static` from a small calibration set, in three forms:

    qoperator-u8/  QuantFormat.QOperator, uint8 activations (QLinearConv, QLinearAdd,
                   QLinearMul, QLinearSigmoid, QLinearLeakyRelu, QLinearConcat,
                   QLinearAveragePool, QLinearGlobalAveragePool, QLinearMatMul,
                   QLinearSoftmax)
    qoperator-s8/  the same with int8 activations
    qdq-u8/        QuantFormat.QDQ: QuantizeLinear / DequantizeLinear around float ops

Each folder holds model.onnx and test_data_set_0 with onnxruntime's outputs, with the
intermediate results of the quantized nodes as graph outputs too, so that each op is compared
on its own. QOperator: the graph's final DequantizeLinear is removed and every output is an
8-bit tensor, compared exactly. QDQ: the outputs are the DequantizeLinear results (kiln
computes the float ops, whose rounding may move a requantized value by one unit); the file
`atol` holds the largest of their scales (+0.1%), the tolerance of one quantization step. The QDQ reference runs with
onnxruntime's graph optimizations off, so that it computes the graph as written.

    HF_HUB_OFFLINE=1 /work/venv/bin/python tools/export/make_ort_qlinear.py models/tiny-cnn-quantized
"""
import os
import sys
import tempfile

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                      quantize_static)

IMAGE = (3, 16, 16)


def float_model(rng) -> onnx.ModelProto:
    def weight(name, shape, scale):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    inits = [
        weight("conv1.w", (16, 3, 3, 3), 0.3), weight("conv1.b", (16,), 0.1),
        weight("conv2.w", (16, 16, 3, 3), 0.1), weight("conv2.b", (16,), 0.1),
        weight("conv3.w", (8, 16, 1, 1), 0.3), weight("conv3.b", (8,), 0.1),
        weight("fc.w", (24, 10), 0.3), weight("fc.b", (10,), 0.1),
    ]
    nodes = [
        helper.make_node("Conv", ["image", "conv1.w", "conv1.b"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("LeakyRelu", ["c1"], ["l1"], name="leaky1", alpha=0.1),
        helper.make_node("Sigmoid", ["c1"], ["s1"], name="gate1"),
        helper.make_node("Mul", ["l1", "s1"], ["m1"], name="mul1"),
        helper.make_node("Conv", ["m1", "conv2.w", "conv2.b"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c2", "l1"], ["a1"], name="residual"),
        helper.make_node("MaxPool", ["a1"], ["p1"], name="pool1", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "conv3.w", "conv3.b"], ["c3"], name="conv3"),
        helper.make_node("Concat", ["p1", "c3"], ["cat"], name="concat", axis=1),
        helper.make_node("AveragePool", ["cat"], ["ap"], name="pool2", kernel_shape=[3, 3], strides=[2, 2],
                         pads=[1, 1, 1, 1]),
        helper.make_node("GlobalAveragePool", ["ap"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
        helper.make_node("MatMul", ["f", "fc.w"], ["mm"], name="fc"),
        helper.make_node("Add", ["mm", "fc.b"], ["logits"], name="fc_bias"),
        helper.make_node("Softmax", ["logits"], ["probs"], name="softmax", axis=1),
    ]
    graph = helper.make_graph(
        nodes, "tiny_cnn_quantized",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", *IMAGE])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", 10])],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="kiln-export")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


class Calibration(CalibrationDataReader):
    def __init__(self, rng):
        self.batches = iter([{"image": rng.standard_normal((2, *IMAGE)).astype(np.float32)} for _ in range(8)])

    def get_next(self):
        return next(self.batches, None)


def drop_final_dequantize(model: onnx.ModelProto) -> None:
    """Makes the 8-bit input of the DequantizeLinear that produces the graph output the output."""
    graph = model.graph
    out = graph.output[0]
    node = next(n for n in graph.node if out.name in n.output)
    assert node.op_type == "DequantizeLinear", node.op_type
    zp = next(i for i in graph.initializer if i.name == node.input[2])
    graph.node.remove(node)
    out.name = node.input[0]
    out.type.tensor_type.elem_type = zp.data_type


# The input holding the output zero point (hence the output type) of the QOperator nodes
# whose 8-bit outputs the test data checks as well as the final one.
CHECKED = {"QLinearAdd": 7, "QLinearMul": 7, "QLinearSigmoid": 4, "QLinearLeakyRelu": 4,
           "QLinearGlobalAveragePool": 4, "QLinearAveragePool": 4, "QLinearConcat": 1,
           "QLinearSoftmax": 4}


def expose_intermediates(model: onnx.ModelProto) -> None:
    """Adds the 8-bit outputs of the CHECKED nodes (but the graph input's QuantizeLinear) as
    graph outputs, so that each op is compared on its own and not only through the logits."""
    graph = model.graph
    types = {i.name: i.data_type for i in graph.initializer}
    present = {o.name for o in graph.output}
    for node in list(graph.node):
        if node.op_type in CHECKED and node.input[0] != "image" and node.output[0] not in present:
            elem = types[node.input[CHECKED[node.op_type]]]
            graph.output.append(helper.make_tensor_value_info(node.output[0], elem, None))


def expose_dequantized(model: onnx.ModelProto) -> float:
    """Adds the outputs of the activations' DequantizeLinear nodes (but the graph input's) as
    graph outputs; returns the largest of their scales, widened by 1e-3 for the float rounding
    of the dequantized values."""
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    present = {o.name for o in graph.output}
    steps = []
    for node in graph.node:
        if node.op_type != "DequantizeLinear" or node.input[0] in inits:
            continue
        steps.append(float(numpy_helper.to_array(inits[node.input[1]])))
        if node.output[0] not in present and not node.input[0].startswith("image"):
            graph.output.append(helper.make_tensor_value_info(node.output[0], TensorProto.FLOAT, None))
    return max(steps) * (1 + 1e-3)


def write(variant: str, model: onnx.ModelProto, out_dir: str, image: np.ndarray, optimize: bool) -> None:
    folder = os.path.join(out_dir, variant)
    data = os.path.join(folder, "test_data_set_0")
    os.makedirs(data, exist_ok=True)
    path = os.path.join(folder, "model.onnx")
    onnx.save(model, path)
    options = ort.SessionOptions()
    if not optimize:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    results = session.run(None, {"image": image})
    onnx.save_tensor(numpy_helper.from_array(image, "image"), os.path.join(data, "input_0.pb"))
    for i, (out, result) in enumerate(zip(model.graph.output, results)):
        onnx.save_tensor(numpy_helper.from_array(result, out.name), os.path.join(data, f"output_{i}.pb"))
    ops = sorted({n.op_type for n in model.graph.node})
    print(f"wrote {path} ({os.path.getsize(path)} bytes): {', '.join(ops)}")


def main(out_dir: str) -> None:
    rng = np.random.default_rng(20261124)
    model = float_model(rng)
    image = rng.standard_normal((2, *IMAGE)).astype(np.float32)
    variants = [
        ("qoperator-u8", QuantFormat.QOperator, QuantType.QUInt8),
        ("qoperator-s8", QuantFormat.QOperator, QuantType.QInt8),
        ("qdq-u8", QuantFormat.QDQ, QuantType.QUInt8),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        float_path = os.path.join(tmp, "float.onnx")
        onnx.save(model, float_path)
        for variant, fmt, activation in variants:
            quant_path = os.path.join(tmp, variant + ".onnx")
            quantize_static(float_path, quant_path, Calibration(np.random.default_rng(7)),
                            quant_format=fmt, activation_type=activation, weight_type=QuantType.QInt8,
                            per_channel=False)
            quantized = onnx.load(quant_path)
            if fmt == QuantFormat.QOperator:
                drop_final_dequantize(quantized)
                expose_intermediates(quantized)
                write(variant, quantized, out_dir, image, optimize=True)
            else:
                atol = expose_dequantized(quantized)
                write(variant, quantized, out_dir, image, optimize=False)
                with open(os.path.join(out_dir, variant, "atol"), "w") as f:
                    f.write(f"{atol:.9g}\n")
                print(f"{variant}: atol {atol:.9g} (the largest scale)")
    print(f"onnxruntime {ort.__version__}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "models/tiny-cnn-quantized")
