"""Per-node times of kiln and onnxruntime on one CNN, grouped by convolution shape class.

    /work/venv/bin/python tools/bench/conv_profile.py MODEL.onnx [--threads 1] [--runs 5]
          [--onnx-run build/tools/onnx-run] [--top 15]

Both engines run the model on the same random input of its declared shape (symbolic
dimensions 1). kiln: `onnx-run MODEL --input X=FILE --warmup 2 --repeat 1 --profile`, once
per round; onnxruntime: one session with enable_profiling (default graph optimizations, so its
NCHWc convolutions), intra_op_num_threads=N, two untimed runs, then one run per round. The
rounds alternate between the engines, and each node's time is its minimum over the rounds (the
machine is shared: the minimum is the run least disturbed).

A convolution's class is its kernel, stride, group, input and output channels and input map
size, read from the shapes both profilers record (onnxruntime's NCHWc nodes keep the logical
NCHW shapes; the fused activation and residual add are part of the node in both engines). The
table lists the classes by kiln's time minus onnxruntime's time, the time there is to win,
and for convolutions each engine's GFLOP/s (the class's flops, 2 x multiply-adds from kiln's
recorded shapes, over its time; `kiln-bench gemm` prints the machine's FMA peak).
"""
import argparse
import json
import os
import subprocess
import tempfile
from collections import defaultdict

import numpy as np
import onnxruntime as ort

CONV_OPS = {"Conv", "FusedConv", "NchwcConv"}


def shape_list(entries):
    """[[dims], ...] from a profiler's input_type_shape (kiln: "float32[1,3]" strings; ORT:
    [{"float": [1, 3]}, ...])."""
    out = []
    for e in entries:
        if isinstance(e, dict):
            out.append(list(next(iter(e.values()))))
        else:
            inner = e[e.index("[") + 1:e.rindex("]")]
            out.append([int(v) for v in inner.split(",")] if inner else [])
    return out


def conv_class(inputs, outputs):
    x, w, y = inputs[0], inputs[1], outputs[0]
    if len(x) != 4 or len(w) != 4:
        return "conv " + str(x)
    group = max(1, x[1] // w[1])
    stride = max(1, round(x[2] / y[2])) if y[2] else 1
    return f"k{w[2]}x{w[3]} s{stride} g{group} {x[1]}->{y[1]} {x[2]}x{x[3]}"


# onnxruntime's fused forms of ops kiln names plainly (its Gemm + activation).
SAME_OP = {"FusedGemm": "Gemm"}


def node_key(op, inputs, outputs):
    if op in CONV_OPS and len(inputs) >= 2:
        return "Conv " + conv_class(inputs, outputs)
    return SAME_OP.get(op, op)


def conv_flops(inputs, outputs):
    """2 x the multiply-adds of a convolution node: output elements x filter elements per
    output channel (W's dims past the first)."""
    if len(inputs) < 2 or not outputs:
        return 0
    n = 2
    for d in outputs[0]:
        n *= d
    for d in inputs[1][1:]:
        n *= d
    return n


def kiln_round(onnx_run, model, input_name, input_path, threads, trace, flops=None):
    subprocess.run([onnx_run, model, "--input", f"{input_name}={input_path}", "--threads",
                    str(threads), "--warmup", "2", "--repeat", "1", "--profile", trace],
                   check=True, stdout=subprocess.DEVNULL)
    with open(trace) as f:
        events = json.load(f)
    times = defaultdict(float)
    for e in events:
        if e.get("cat") != "Node" or e["args"].get("depth", 0) != 0:
            continue
        a = e["args"]
        ins, outs = shape_list(a["input_type_shape"]), shape_list(a["output_type_shape"])
        key = node_key(a["op_name"], ins, outs)
        times[(e["name"], key)] += e["dur"]
        if flops is not None and a["op_name"] in CONV_OPS:
            flops[(e["name"], key)] = conv_flops(ins, outs)
    return times


def ort_rounds(model, feed, threads, rounds, prefix):
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.enable_profiling = True
    opts.profile_file_prefix = prefix
    sess = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
    for _ in range(2):
        sess.run(None, feed)

    def run_once():
        sess.run(None, feed)

    return sess, run_once


def ort_times(trace_path, warm_runs):
    with open(trace_path) as f:
        events = json.load(f)
    runs = [e for e in events if e.get("cat") == "Session" and e["name"] == "model_run"]
    runs.sort(key=lambda e: e["ts"])
    per_run = []
    for r in runs[warm_runs:]:
        t0, t1 = r["ts"], r["ts"] + r["dur"]
        times = defaultdict(float)
        for e in events:
            if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time"):
                continue
            if not t0 <= e["ts"] <= t1:
                continue
            a = e["args"]
            key = node_key(a["op_name"], shape_list(a.get("input_type_shape", [])),
                           shape_list(a.get("output_type_shape", [])))
            times[(e["name"], key)] += e["dur"]
        per_run.append(times)
    return per_run


def median_by_class(rounds):
    """Per class: the sum over its nodes of each node's minimum time (µs)."""
    nodes = defaultdict(list)
    for r in rounds:
        for k, v in r.items():
            nodes[k].append(v)
    classes = defaultdict(lambda: [0.0, 0])
    for (_, key), values in nodes.items():
        classes[key][0] += min(values)
        classes[key][1] += 1
    return classes


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--onnx-run", default="build/tools/onnx-run")
    p.add_argument("--top", type=int, default=15)
    args = p.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        probe = ort.InferenceSession(args.model, providers=["CPUExecutionProvider"])
        inp = probe.get_inputs()[0]
        shape = [d if isinstance(d, int) else 1 for d in inp.shape]
        x = np.random.default_rng(11).standard_normal(shape).astype(np.float32)
        input_path = os.path.join(tmp, "x.npy")
        np.save(input_path, x)
        sess, ort_once = ort_rounds(args.model, {inp.name: x}, args.threads, args.runs,
                                    os.path.join(tmp, "ort"))
        kiln_runs, flops = [], {}
        for i in range(args.runs):
            if i % 2 == 0:
                kiln_runs.append(kiln_round(args.onnx_run, args.model, inp.name, input_path,
                                            args.threads, os.path.join(tmp, "kiln.json"), flops))
                ort_once()
            else:
                ort_once()
                kiln_runs.append(kiln_round(args.onnx_run, args.model, inp.name, input_path,
                                            args.threads, os.path.join(tmp, "kiln.json")))
        ort_runs = ort_times(sess.end_profiling(), 2)

    kc, oc = median_by_class(kiln_runs), median_by_class(ort_runs)
    k_total = sum(v[0] for v in kc.values())
    o_total = sum(v[0] for v in oc.values())
    print(f"{os.path.basename(args.model)}: node time kiln {k_total / 1000:.2f} ms, "
          f"onnxruntime {o_total / 1000:.2f} ms ({k_total / o_total:.2f}), {args.threads} "
          f"thread(s), minima of {args.runs} runs, load average {os.getloadavg()[0]:.1f}")
    class_flops = defaultdict(int)
    for (_, key), f in flops.items():
        class_flops[key] += f
    rows = []
    for key in set(kc) | set(oc):
        k, o = kc.get(key, [0.0, 0]), oc.get(key, [0.0, 0])
        rows.append((k[0] - o[0], key, k[0], o[0], max(k[1], o[1])))
    rows.sort(reverse=True)
    # GFLOP/s: the class's convolution flops (from kiln's shapes) over each engine's time.
    print(f"{'class':48} {'nodes':>5} {'kiln ms':>8} {'ort ms':>8} {'ratio':>6} {'excess':>7} "
          f"{'kiln GF/s':>9} {'ort GF/s':>9}")
    for diff, key, k, o, n in rows[:args.top]:
        ratio = f"{k / o:.2f}" if o > 0 else "-"
        f = class_flops.get(key, 0)
        kg = f"{f / k / 1e3:.0f}" if f and k > 0 else "-"
        og = f"{f / o / 1e3:.0f}" if f and o > 0 else "-"
        print(f"{key:48} {n:5d} {k / 1000:8.3f} {o / 1000:8.3f} {ratio:>6} {diff / 1000:7.3f} "
              f"{kg:>9} {og:>9}")


if __name__ == "__main__":
    main()
