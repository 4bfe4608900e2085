"""Makes models/vad-energy: a model with the inputs and outputs of faster-whisper's Silero VAD
(silero_vad_v6.onnx: `input` float32[windows, 576], `h` and `c` float32[1, 1, 128] ->
`speech_probs` float32[windows], `hn`, `cn`) whose speech probability is a function of each
window's energy alone, so tests know which windows are speech:

    p = sigmoid(8 * (log10(mean(window^2) + 1e-10) + 3))

over the 512 samples after the 64 of context (mean power 1e-3, an RMS of about 0.03, gives
0.5). The states pass through unchanged.

    .venv/bin/python tools/export/make_vad_test.py models/vad-energy
"""
import os
import sys

import onnx
from onnx import TensorProto, helper


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    const = lambda name, dims, vals, t=TensorProto.FLOAT: helper.make_tensor(name, t, dims, vals)
    nodes = [
        helper.make_node("Slice", ["input", "starts", "ends", "axes"], ["window"]),
        helper.make_node("Mul", ["window", "window"], ["square"]),
        helper.make_node("ReduceMean", ["square", "axes"], ["power"], keepdims=0),
        helper.make_node("Add", ["power", "eps"], ["power_eps"]),
        helper.make_node("Log", ["power_eps"], ["ln"]),
        helper.make_node("Mul", ["ln", "inv_ln10"], ["log10"]),
        helper.make_node("Add", ["log10", "offset"], ["shifted"]),
        helper.make_node("Mul", ["shifted", "gain"], ["logit"]),
        helper.make_node("Sigmoid", ["logit"], ["speech_probs"]),
        helper.make_node("Identity", ["h"], ["hn"]),
        helper.make_node("Identity", ["c"], ["cn"]),
    ]
    inits = [
        const("starts", [1], [64], TensorProto.INT64),
        const("ends", [1], [576], TensorProto.INT64),
        const("axes", [1], [1], TensorProto.INT64),
        const("eps", [], [1e-10]),
        const("inv_ln10", [], [0.4342944819032518]),
        const("offset", [], [3.0]),
        const("gain", [], [8.0]),
    ]
    graph = helper.make_graph(
        nodes, "vad_energy",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["windows", 576]),
         helper.make_tensor_value_info("h", TensorProto.FLOAT, [1, 1, 128]),
         helper.make_tensor_value_info("c", TensorProto.FLOAT, [1, 1, 128])],
        [helper.make_tensor_value_info("speech_probs", TensorProto.FLOAT, ["windows"]),
         helper.make_tensor_value_info("hn", TensorProto.FLOAT, [1, 1, 128]),
         helper.make_tensor_value_info("cn", TensorProto.FLOAT, [1, 1, 128])],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)],
                              producer_name="kiln tools/export/make_vad_test.py")
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, os.path.join(out_dir, "model.onnx"))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "models/vad-energy")
