"""One-node models of the CNNs' depthwise convolutions and poolings, timed in kiln builds and
onnxruntime on one thread.

    /work/venv/bin/python tools/bench/window_nodes.py [--kiln-bench LABEL=PATH ...]
          [--rounds 2] [--iterations 200] [--filter SUBSTRING]

Each case is one Conv (depthwise 3x3, pads 1, with a bias), MaxPool or AveragePool node on a
random standard-normal input of the shape the light/ models give it (shufflenet, squeezenet,
inception_v2, resnet50, densenet121, vgg19), written once into a temporary folder. For every
round and case each kiln build runs `kiln-bench run CASE.onnx --threads 1 --warmup 20
--iterations N` and onnxruntime (intra_op_num_threads = 1, default graph optimizations) 20
untimed then N timed runs; the table gives each engine's minimum over all runs (the machine is shared: the minimum
is the run least disturbed) and kiln over onnxruntime. Several builds (--kiln-bench given
more than once, e.g. before=... after=...) are timed in the same rounds.
"""
import argparse
import json
import os
import subprocess
import tempfile
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# name: (op, input shape, attributes)
CASES = {
    "dw_s2_112x56": ("Conv", [1, 112, 56, 56], dict(strides=[2, 2], group=112)),
    "dw_s2_136x28": ("Conv", [1, 136, 28, 28], dict(strides=[2, 2], group=136)),
    "dw_s2_272x14": ("Conv", [1, 272, 14, 14], dict(strides=[2, 2], group=272)),
    "dw_s1_136x28": ("Conv", [1, 136, 28, 28], dict(strides=[1, 1], group=136)),
    "dw_s1_272x14": ("Conv", [1, 272, 14, 14], dict(strides=[1, 1], group=272)),
    "dw_s1_544x7": ("Conv", [1, 544, 7, 7], dict(strides=[1, 1], group=544)),
    "mp_s2p0_64x111": ("MaxPool", [1, 64, 111, 111], dict(strides=[2, 2])),
    "mp_s2p0_128x55": ("MaxPool", [1, 128, 55, 55], dict(strides=[2, 2])),
    "mp_s2p1_64x112": ("MaxPool", [1, 64, 112, 112], dict(strides=[2, 2], pads=[1, 1, 1, 1])),
    "mp_s2pe_192x56": ("MaxPool", [1, 192, 56, 56], dict(strides=[2, 2], pads=[0, 0, 1, 1])),
    "ap_s2p1_240x28": ("AveragePool", [1, 240, 28, 28], dict(strides=[2, 2], pads=[1, 1, 1, 1])),
    "ap_s1p1_192x28": ("AveragePool", [1, 192, 28, 28], dict(strides=[1, 1], pads=[1, 1, 1, 1])),
    "ap_s1p1_576x14": ("AveragePool", [1, 576, 14, 14], dict(strides=[1, 1], pads=[1, 1, 1, 1])),
    "ap_k7_2048x7": ("AveragePool", [1, 2048, 7, 7], dict(kernel_shape=[7, 7])),
    "mp_s2p0_256x27": ("MaxPool", [1, 256, 27, 27], dict(strides=[2, 2])),
    "gap_1000x13": ("GlobalAveragePool", [1, 1000, 13, 13], {}),
    # vgg19's five 2x2 stride-2 MaxPools, densenet121's 2x2 stride-2 AveragePools, the rest of
    # inception_v2's pools.
    "mp_k2s2_64x224": ("MaxPool", [1, 64, 224, 224], dict(kernel_shape=[2, 2], strides=[2, 2])),
    "mp_k2s2_128x112": ("MaxPool", [1, 128, 112, 112], dict(kernel_shape=[2, 2], strides=[2, 2])),
    "mp_k2s2_256x56": ("MaxPool", [1, 256, 56, 56], dict(kernel_shape=[2, 2], strides=[2, 2])),
    "mp_k2s2_512x28": ("MaxPool", [1, 512, 28, 28], dict(kernel_shape=[2, 2], strides=[2, 2])),
    "mp_k2s2_512x14": ("MaxPool", [1, 512, 14, 14], dict(kernel_shape=[2, 2], strides=[2, 2])),
    "ap_k2s2_128x56": ("AveragePool", [1, 128, 56, 56], dict(kernel_shape=[2, 2], strides=[2, 2])),
    "ap_k2s2_256x28": ("AveragePool", [1, 256, 28, 28], dict(kernel_shape=[2, 2], strides=[2, 2])),
    "ap_k2s2_512x14": ("AveragePool", [1, 512, 14, 14], dict(kernel_shape=[2, 2], strides=[2, 2])),
    "mp_s2pe_64x112": ("MaxPool", [1, 64, 112, 112], dict(strides=[2, 2], pads=[0, 0, 1, 1])),
    "mp_s2pe_320x28": ("MaxPool", [1, 320, 28, 28], dict(strides=[2, 2], pads=[0, 0, 1, 1])),
    "mp_s2pe_576x14": ("MaxPool", [1, 576, 14, 14], dict(strides=[2, 2], pads=[0, 0, 1, 1])),
    "ap_s1p1_256x28": ("AveragePool", [1, 256, 28, 28], dict(strides=[1, 1], pads=[1, 1, 1, 1])),
    "ap_s1p1_1024x7": ("AveragePool", [1, 1024, 7, 7], dict(strides=[1, 1], pads=[1, 1, 1, 1])),
    "mp_s1p1_1024x7": ("MaxPool", [1, 1024, 7, 7], dict(strides=[1, 1], pads=[1, 1, 1, 1])),
}


def write_case(folder, name, op, shape, attrs, rng):
    inits, inputs = [], ["x"]
    if op != "GlobalAveragePool":
        attrs = dict({"kernel_shape": [3, 3]}, **attrs)
    if op == "Conv":
        c = shape[1]
        attrs.setdefault("pads", [1, 1, 1, 1])
        inits = [numpy_helper.from_array(rng.standard_normal((c, 1, 3, 3)).astype(np.float32), "w"),
                 numpy_helper.from_array(rng.standard_normal((c,)).astype(np.float32), "b")]
        inputs = ["x", "w", "b"]
    node = helper.make_node(op, inputs, ["y"], **attrs)
    graph = helper.make_graph([node], name,
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, os.path.join(folder, name + ".onnx"))
    np.save(os.path.join(folder, name + ".npy"), rng.standard_normal(shape).astype(np.float32))


def kiln_min(bench, model, x, iterations):
    out = subprocess.run([bench, "--threads", "1", "--warmup", "20", "--iterations",
                          str(iterations), "run", model, "--input", f"x={x}"],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)["min_ms"]


def ort_min(model, x, iterations):
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
    feed = {"x": np.load(x)}
    for _ in range(20):
        sess.run(None, feed)
    best = float("inf")
    for _ in range(iterations):
        t0 = time.perf_counter()
        sess.run(None, feed)
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kiln-bench", action="append", default=[],
                   help="LABEL=PATH of a kiln-bench (repeatable; default: kiln=build/tools/kiln-bench)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--iterations", type=int, default=200)
    p.add_argument("--filter", default="", help="only the cases whose name contains this")
    args = p.parse_args()
    builds = [b.split("=", 1) for b in args.kiln_bench] or [
        ["kiln", os.path.join(ROOT, "build/tools/kiln-bench")]]
    names = [n for n in CASES if args.filter in n]
    best = {}
    with tempfile.TemporaryDirectory(prefix="window-nodes-") as tmp:
        rng = np.random.default_rng(0)
        for n in names:
            write_case(tmp, n, *CASES[n], rng)
        for _ in range(args.rounds):
            for n in names:
                model, x = os.path.join(tmp, n + ".onnx"), os.path.join(tmp, n + ".npy")
                for label, bench in builds:
                    t = kiln_min(bench, model, x, args.iterations)
                    best[(n, label)] = min(best.get((n, label), t), t)
                t = ort_min(model, x, args.iterations)
                best[(n, "ort")] = min(best.get((n, "ort"), t), t)
    labels = [label for label, _ in builds]
    print("| case | " + " | ".join(f"{l} ms" for l in labels) + " | onnxruntime ms | " +
          " | ".join(f"{l}/ORT" for l in labels) + " |")
    print("|---" * (2 * len(labels) + 2) + "|")
    for n in names:
        o = best[(n, "ort")]
        ks = [best[(n, l)] for l in labels]
        print(f"| {n} | " + " | ".join(f"{k:.4f}" for k in ks) + f" | {o:.4f} | " +
              " | ".join(f"{k / o:.2f}" for k in ks) + " |")
    print("load average: %.2f %.2f %.2f" % os.getloadavg())


if __name__ == "__main__":
    main()
