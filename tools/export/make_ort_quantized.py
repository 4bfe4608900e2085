"""Files written by onnxruntime's quantization tools, for kiln's dynamically quantized
com.microsoft ops (DynamicQuantizeMatMul, MatMulIntegerToFloat, QGemm, DynamicQuantizeLSTM,
QAttention). Every model has random weights (built from a config, nothing downloaded) and goes
to OUT/<name>/model.onnx with test_data_set_0: inputs and onnxruntime's outputs for them, run
on the file as written (no further onnxruntime fusion) on one thread.

- bert-avx512-vnni, bert-avx2: the 2-layer BERT of make_ort_optimized.py (MiniLM-shaped:
  hidden 64, 4 heads) exported by Optimum and quantized by Optimum's ORTQuantizer with
  AutoQuantizationConfig.avx512_vnni(is_static=False) and .avx2(is_static=False), then saved
  by onnxruntime at its extended optimization level, which fuses DynamicQuantizeLinear +
  MatMulInteger + scaling into DynamicQuantizeMatMul and MatMulIntegerToFloat.
- bert-qattention: that BERT rewritten by onnxruntime.transformers.optimizer (com.microsoft
  Attention) and then quantized by onnxruntime.quantization.quantize_dynamic (QAttention).
- lstm: a torch model of two LSTMs (one bidirectional) and a linear head, quantized by
  quantize_dynamic with LSTM among its op types (DynamicQuantizeLSTM), per channel.
- mlp-qgemm: a torch MLP whose Linear layers export as Gemm, quantized statically by
  quantize_static in the QOperator format with per-channel weights (QGemm), calibrated on
  random inputs.

    HF_HUB_OFFLINE=1 /work/venv/bin/python tools/export/make_ort_quantized.py models/ort-quantized

Versions: see requirements-export.txt (optimum 2.1.0, onnxruntime 1.32.0, torch 2.9.1).
"""
import os
import shutil
import sys
import tempfile

import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnx import numpy_helper
from onnxruntime.quantization import (
    CalibrationDataReader,
    QuantFormat,
    QuantType,
    quantize_dynamic,
    quantize_static,
)
from onnxruntime.transformers.optimizer import optimize_model
from optimum.exporters.onnx import main_export
from optimum.onnxruntime import ORTQuantizer
from optimum.onnxruntime.configuration import AutoQuantizationConfig

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_ort_optimized as base  # noqa: E402  (the BERT, its inputs and the reference writer)

SEED = base.SEED


def save(model_path: str, out: str, name: str, feed=None) -> None:
    folder = os.path.join(out, name)
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    shutil.copy(model_path, os.path.join(folder, "model.onnx"))
    write_reference(os.path.join(folder, "model.onnx"), folder, feed)
    print(f"{folder}: {base.contrib_ops(os.path.join(folder, 'model.onnx'))}")


def write_reference(model_path: str, folder: str, feed) -> None:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    # One thread: onnxruntime's LSTM splits the batch rows across its threads and quantizes each
    # part of H on its own, so its quantized recurrent products depend on the thread count. On
    # one thread H is quantized per tensor at each step, which is the operator's meaning.
    options.intra_op_num_threads = 1
    sess = ort.InferenceSession(model_path, options, providers=["CPUExecutionProvider"])
    feed = feed if feed is not None else base.inputs(sess)
    outputs = sess.run(None, feed)
    data = os.path.join(folder, "test_data_set_0")
    os.makedirs(data, exist_ok=True)
    for k, i in enumerate(sess.get_inputs()):
        onnx.save_tensor(numpy_helper.from_array(feed[i.name], i.name), os.path.join(data, f"input_{k}.pb"))
    for k, o in enumerate(sess.get_outputs()):
        onnx.save_tensor(numpy_helper.from_array(outputs[k], o.name), os.path.join(data, f"output_{k}.pb"))


def ort_fused(model_path: str, out_path: str) -> None:
    """The model as onnxruntime's extended-level optimizer saves it (its quantization fusions)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = out_path
    ort.InferenceSession(model_path, options, providers=["CPUExecutionProvider"])


class Recurrent(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.first = torch.nn.LSTM(12, 24, batch_first=False, bidirectional=True)
        self.second = torch.nn.LSTM(48, 20)
        self.head = torch.nn.Linear(20, 7)

    def forward(self, x):
        y, _ = self.first(x)
        y, _ = self.second(y)
        return self.head(y)


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(40, 64)
        self.b = torch.nn.Linear(64, 33)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


class RandomReader(CalibrationDataReader):
    def __init__(self, name, shape, count=8):
        rng = np.random.default_rng(SEED)
        self.items = iter([{name: rng.standard_normal(shape).astype(np.float32)} for _ in range(count)])

    def get_next(self):
        return next(self.items, None)


def make_lstm(tmp: str, out: str) -> None:
    torch.manual_seed(SEED)
    x = torch.randn(6, 3, 12)
    fp32 = os.path.join(tmp, "lstm.onnx")
    torch.onnx.export(Recurrent().eval(), (x,), fp32, input_names=["x"], output_names=["y"],
                      opset_version=14, dynamo=False)
    quantized = os.path.join(tmp, "lstm-q.onnx")
    quantize_dynamic(fp32, quantized, op_types_to_quantize=["LSTM", "MatMul", "Gemm"], per_channel=True,
                     weight_type=QuantType.QInt8)
    save(quantized, out, "lstm", {"x": x.numpy()})


def make_qgemm(tmp: str, out: str) -> None:
    torch.manual_seed(SEED)
    x = torch.randn(5, 40)
    fp32 = os.path.join(tmp, "mlp.onnx")
    torch.onnx.export(Mlp().eval(), (x,), fp32, input_names=["x"], output_names=["y"], opset_version=14,
                      dynamo=False)
    quantized = os.path.join(tmp, "mlp-q.onnx")
    quantize_static(fp32, quantized, RandomReader("x", (5, 40)), quant_format=QuantFormat.QOperator,
                    per_channel=True, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                    op_types_to_quantize=["Gemm"])
    save(quantized, out, "mlp-qgemm", {"x": x.numpy()})


def make_berts(tmp: str, out: str) -> None:
    source, exported = os.path.join(tmp, "bert"), os.path.join(tmp, "onnx")
    base.make_bert(source)
    main_export(source, output=exported, task="feature-extraction", library_name="transformers")
    configs = {
        "bert-avx512-vnni": AutoQuantizationConfig.avx512_vnni(is_static=False, per_channel=True),
        "bert-avx2": AutoQuantizationConfig.avx2(is_static=False, per_channel=False),
    }
    for name, config in configs.items():
        quantized = os.path.join(tmp, name)
        ORTQuantizer.from_pretrained(exported).quantize(save_dir=quantized, quantization_config=config)
        fused = os.path.join(tmp, f"{name}-fused.onnx")
        ort_fused(os.path.join(quantized, "model_quantized.onnx"), fused)
        save(fused, out, name)
    bert = optimize_model(os.path.join(exported, "model.onnx"), model_type="bert", num_heads=4, hidden_size=64)
    optimized = os.path.join(tmp, "bert_optimized.onnx")
    bert.save_model_to_file(optimized)
    quantized = os.path.join(tmp, "bert-qattention.onnx")
    quantize_dynamic(optimized, quantized, weight_type=QuantType.QInt8, op_types_to_quantize=["Attention", "MatMul"],
                     extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    save(quantized, out, "bert-qattention")


def main(out: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        make_lstm(tmp, out)
        make_qgemm(tmp, out)
        make_berts(tmp, out)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    main(sys.argv[1])
