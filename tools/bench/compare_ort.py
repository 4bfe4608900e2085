"""kiln next to onnxruntime on the same models and the same inputs, in alternating rounds, and
docs/benchmarks.md from the results.

    python3 -m venv tools/bench/.venv && tools/bench/.venv/bin/pip install -r tools/bench/requirements.txt
    tools/bench/.venv/bin/python tools/bench/compare_ort.py \
        --whisper models/cache/whisper-tiny-random --minilm models/cache/all-MiniLM-L6-v2

Each measurement is a child process: build/tools/kiln-bench for kiln, tools/bench/ort_worker.py
for onnxruntime (intra_op_num_threads = N, inter_op_num_threads = 1, default graph
optimizations). Both read the same .npy inputs, written once into a temporary folder. For
every case and thread count the two engines run alternately for --rounds rounds (the order
flips every round) so that machine noise hits both; the timed iterations of all rounds are
pooled for the median and p90. Peak RSS is each child's own high-water mark (VmHWM).

Cases: whisper encoder on [1,80,3000] features; one merged-decoder step (use_cache_branch
true) at past lengths 16, 128 and 400; MiniLM at sequence length 128, batch 1; a 200-step
Whisper decode loop (--decode-steps), reported per step; the ONNX backend data's light/ CNN
models (--light, case "light") on a random input of their declared shape; a ResNet-50 with
random weights exported from torch (--resnet, case "resnet", tools/export/make_resnet.py);
three models of tiny ops where the time is the engines' fixed cost per node (case "small",
tools/export/make_small_models.py, built into the temporary folder): a chain of 1,000 Adds on
float32[1,16], a chain of 200 Ifs with one-node branches, and a voice-activity-like model with
nested Ifs and LSTMs, with the time per executed node; one decode step of a GPT-2 with the real gpt2 dimensions and random weights
(--gpt2, case "gpt2", tools/export/make_gpt2.py --size gpt2) at past lengths --gpt2-past-lens,
with the bytes read per step (weights + KV cache) over the time; the same GPT-2 quantized to int4 by
onnxruntime's MatMulNBitsQuantizer (case "gpt2-int4", made from --gpt2 into --gpt2-int4 when missing), with
its memory floor (packed int4 bytes per step over the measured read bandwidth), and that file with
accuracy_level 4 on every MatMulNBits (case "gpt2-int4-acc4", written beside it as --gpt2-int4 + "-acc4":
both engines quantize the activations to int8 per block); MiniLM quantized to int8 with
dynamic activations (case "minilm-int8"): onnxruntime.quantization.quantize_dynamic's int8
weights (what ORTQuantizer's avx512_vnni dynamic configuration writes), saved by onnxruntime at
its extended optimization level (DynamicQuantizeMatMul, MatMulIntegerToFloat), both engines on
that file.

The decoder step and the decode loop are also set against their memory floor: the bytes a
cached step reads (the weights of the use_cache_branch branch, one row of each embedding, and
the caches) over the read bandwidth kiln-bench --bandwidth measures in the same run; and
kiln's time outside its kernels (kiln-bench --profile: each timed run's wall time minus the
node times of the same run on a profiled twin session; the decode loop's generator time is
each step minus its Session::run).

Every table gives kiln's node count as loaded and as planned after its graph optimisation.

With --openvino, OpenVINO is a third engine in every case but the decode loop
(tools/bench/ov_worker.py: the CPU plugin, PERFORMANCE_HINT LATENCY, INFERENCE_NUM_THREADS = N,
INFERENCE_PRECISION_HINT f32, the model reshaped to the input shapes), in the same alternating
rounds (the order of the three rotates); each case and thread count also gets one OpenVINO child
at the plugin's default precision (bf16 on some processors), whose time and output difference
are reported apart. A case OpenVINO cannot run is reported with its error.
"""
import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MIB = 1024 * 1024


def run_child(cmd):
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"compare_ort: command failed ({proc.returncode}): {shlex.join(cmd)}\n{proc.stderr.strip()}")
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    return json.loads(lines[-1])


def pct(values, p):
    return float(np.percentile(np.array(values), p)) if values else float("nan")


# ---------------------------------------------------------------- inputs

def write_inputs(folder, arrays):
    os.makedirs(folder, exist_ok=True)
    for name, value in arrays.items():
        path = os.path.join(folder, name + ".npy")  # a name with "/" becomes a subfolder
        os.makedirs(os.path.dirname(path), exist_ok=True)
        np.save(path, value)
    return folder


def whisper_inputs(whisper, tmp, past_lens):
    """Encoder features (the model folder's sample clip, else random) and, per past length,
    every input of the merged decoder with use_cache_branch true (random caches)."""
    import onnxruntime as ort

    with open(os.path.join(whisper, "config.json")) as f:
        cfg = json.load(f)
    enc_len = cfg.get("max_source_positions", 1500)
    sample = os.path.join(whisper, "sample_features.npy")
    rng = np.random.default_rng(20261122)
    if os.path.exists(sample):
        features = np.load(sample).astype(np.float32)
    else:
        features = (0.5 * rng.standard_normal((1, 80, 2 * enc_len))).astype(np.float32)
    dirs = {"encoder": write_inputs(os.path.join(tmp, "encoder"), {"input_features": features})}
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    decoder = ort.InferenceSession(os.path.join(whisper, "decoder_model_merged.onnx"), opts)
    decl = {i.name: i.shape for i in decoder.get_inputs()}
    del decoder
    d_model = cfg["d_model"]
    for p in past_lens:
        arrays = {"input_ids": np.array([[int(rng.integers(1, 1000))]], np.int64),
                  "encoder_hidden_states": rng.standard_normal((1, enc_len, d_model), np.float32),
                  "use_cache_branch": np.array([True])}
        for name, shape in decl.items():
            if name.startswith("past_key_values."):
                length = enc_len if ".encoder." in name else p
                arrays[name] = rng.standard_normal((1, shape[1], length, shape[3]), np.float32)
        missing = set(decl) - set(arrays)
        if missing:
            sys.exit(f"compare_ort: the merged decoder has inputs this script does not make: {sorted(missing)}")
        dirs[f"decoder-step-{p}"] = write_inputs(os.path.join(tmp, f"decoder-step-{p}"), arrays)
    return dirs


def light_models(folder, tmp):
    """Every light/*.onnx with a random standard-normal input of its declared shape (batch 1
    where the batch is symbolic): [(name, model path, input folder)]."""
    import onnx

    out = []
    for f in sorted(os.listdir(folder)):
        if not f.endswith(".onnx"):
            continue
        path = os.path.join(folder, f)
        m = onnx.load(path, load_external_data=False)
        inits = {i.name for i in m.graph.initializer}
        inputs = [i for i in m.graph.input if i.name not in inits]
        rng = np.random.default_rng(11)
        arrays = {}
        for i in inputs:
            shape = [d.dim_value if d.dim_value > 0 else 1 for d in i.type.tensor_type.shape.dim]
            arrays[i.name] = rng.standard_normal(shape).astype(np.float32)
        name = f[:-5].removeprefix("light_")
        out.append((name, path, write_inputs(os.path.join(tmp, "light", name), arrays)))
    return out


def minilm_inputs(tmp, seq_len):
    rng = np.random.default_rng(7)
    ids = rng.integers(1000, 29000, size=(1, seq_len), dtype=np.int64)
    ids[0, 0], ids[0, -1] = 101, 102  # [CLS] ... [SEP]
    return write_inputs(os.path.join(tmp, "minilm"), {
        "input_ids": ids, "attention_mask": np.ones((1, seq_len), np.int64),
        "token_type_ids": np.zeros((1, seq_len), np.int64)})


def minilm_int8_model(minilm, tmp):
    """all-MiniLM-L6-v2 with int8 weights and dynamically quantized activations: the file both
    engines run (see the module docstring)."""
    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic

    folder = os.path.join(tmp, "minilm-int8")
    os.makedirs(folder, exist_ok=True)
    quantized = os.path.join(folder, "quantized.onnx")
    quantize_dynamic(os.path.join(minilm, "model.onnx"), quantized, weight_type=QuantType.QInt8,
                     op_types_to_quantize=["MatMul"])
    fused = os.path.join(folder, "model.onnx")
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = fused
    ort.InferenceSession(quantized, options, providers=["CPUExecutionProvider"])
    return fused


# ---------------------------------------------------------------- the decode step's memory floor

def cached_step_weight_bytes(model_path):
    """Bytes of weights one cached step of the merged decoder reads: the initializers read by
    the main graph and by the use_cache_branch = true branch (then_branch), each once; of a
    table only Gather reads (the token and position embeddings), one row."""
    import onnx
    from onnx import helper

    m = onnx.load(model_path, load_external_data=False)
    sizes = {}

    def collect(graph):
        for t in graph.initializer:
            sizes[t.name] = (list(t.dims), np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize)
        for node in graph.node:
            for a in node.attribute:
                for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                    collect(g)

    read = {}

    def walk(graph):
        for node in graph.node:
            branches = {a.name: a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH}
            if node.op_type == "If" and node.input[0] == "use_cache_branch":
                walk(branches["then_branch"])
                continue
            for i, name in enumerate(node.input):
                if name not in sizes:
                    continue
                dims, item = sizes[name]
                full = int(np.prod(dims)) * item
                row = node.op_type == "Gather" and i == 0 and len(dims) > 1
                read[name] = max(read.get(name, 0), full // dims[0] if row else full)
            for g in branches.values():
                walk(g)

    collect(m.graph)
    walk(m.graph)
    return sum(read.values())


class DecodeFloor:
    """Bytes one cached decoder step reads (weights of the cached branch + the decoder caches
    at `past` + the cross-attention caches), and the time streaming them would take."""

    def __init__(self, whisper):
        with open(os.path.join(whisper, "config.json")) as f:
            cfg = json.load(f)
        self.weights = cached_step_weight_bytes(os.path.join(whisper, "decoder_model_merged.onnx"))
        # Keys and values of one position over every decoder layer (float32).
        self.per_position = 2 * cfg["decoder_layers"] * cfg["d_model"] * 4
        self.cross = cfg.get("max_source_positions", 1500) * self.per_position

    def bytes(self, past):
        return self.weights + self.cross + past * self.per_position

    def ms(self, past, gbps):
        return self.bytes(past) / (gbps * 1e9) * 1e3


# ---------------------------------------------------------------- measurements

class Runner:
    def __init__(self, args, tmp):
        self.args = args
        self.tmp = tmp
        self.kiln = os.path.abspath(args.kiln_bench)
        self.worker = [sys.executable, os.path.join(HERE, "ort_worker.py")]
        self.ov_worker = [sys.executable, os.path.join(HERE, "ov_worker.py")] if args.openvino else None
        self.raw = []  # every child's result, with its command

    def commands(self, case, model, input_dir, threads, extra_kiln, out_dirs):
        common = ["--input-dir", input_dir, "--threads", str(threads)]
        kiln = [self.kiln, case, model] + common + extra_kiln
        ort = self.worker + [case, model] + common
        ov = self.ov_worker + [case, model] + common + ["--precision", "f32"] if self.ov_worker else None
        if case != "decode":
            iters = ["--warmup", str(self.args.warmup), "--warmup-ms", str(self.args.warmup_ms),
                     "--iterations", str(self.args.iterations)]
            kiln += iters
            ort += iters
            if ov:
                ov += iters
        else:
            kiln += ["--steps", str(self.args.decode_steps), "--bandwidth"]
            ort += ["--steps", str(self.args.decode_steps)]
            ov = None
        if out_dirs:
            kiln += ["--output-dir", out_dirs[0]]
            ort += ["--output-dir", out_dirs[1]]
            if ov:
                ov += ["--output-dir", out_dirs[2]]
        cmds = {"kiln": kiln, "onnxruntime": ort}
        if ov:
            cmds["openvino"] = ov
        return cmds

    def measure(self, label, case, model, input_dir, threads, extra_kiln=(), rounds=None, compare_output=None):
        """Alternating rounds; returns {engine: [result per round]} and the output difference."""
        rounds = rounds or self.args.rounds
        results = {"kiln": [], "onnxruntime": [], "openvino": []}
        diff = None
        ov_failed = None
        base = os.path.join(self.tmp, "out", f"{label}-t{threads}")
        for r in range(rounds):
            out_dirs = None
            if r == 0 and compare_output:
                out_dirs = (base + "-kiln", base + "-ort", base + "-ov")
            cmds = self.commands(case, model, input_dir, threads, list(extra_kiln), out_dirs)
            if ov_failed:
                cmds.pop("openvino", None)
            engines = [e for e in ("kiln", "onnxruntime", "openvino") if e in cmds]
            if len(engines) == 2:
                order = engines if r % 2 == 0 else engines[::-1]
            else:
                order = engines[r % 3:] + engines[:r % 3]
            for engine in order:
                t0 = time.time()
                res = run_child(cmds[engine])
                self.raw.append({"command": cmds[engine], "result": res})
                if "error" in res:  # OpenVINO could not run the case
                    ov_failed = res["error"]
                    print(f"  {label} threads={threads} {engine}: error: {res['error'][:200]}", flush=True)
                    continue
                results[engine].append(res)
                print(f"  {label} threads={threads} round={r + 1} {engine}: "
                      f"{res.get('median_ms', res.get('decode_ms')):.2f} ms ({time.time() - t0:.1f} s)", flush=True)
            if out_dirs:
                a = np.load(os.path.join(out_dirs[0], compare_output + ".npy"))
                b = np.load(os.path.join(out_dirs[1], compare_output + ".npy"))
                diff = float(np.max(np.abs(a.astype(np.float64) - b))) if a.shape == b.shape else float("inf")
        if self.ov_worker and case != "decode":
            self.attach_openvino(results, case, model, input_dir, threads, compare_output, base, ov_failed)
        results.pop("openvino")
        return results, diff

    def attach_openvino(self, results, case, model, input_dir, threads, compare_output, base, failed):
        """OpenVINO's rounds (and one child at its default precision) ride along with
        onnxruntime's first result, where summarize() finds them."""
        ov = {"rounds": results["openvino"], "error": failed}
        if not failed:
            cmd = self.commands(case, model, input_dir, threads, [], None)["openvino"]
            cmd[cmd.index("--precision") + 1] = "default"
            if compare_output:
                cmd += ["--output-dir", base + "-ov-default"]
            res = run_child(cmd)
            self.raw.append({"command": cmd, "result": res})
            ov["default"] = res
            if compare_output and "error" not in res:
                ref = np.load(os.path.join(base + "-ort", compare_output + ".npy")).astype(np.float64)
                for key, folder in (("diff_f32", base + "-ov"), ("diff_default", base + "-ov-default")):
                    path = os.path.join(folder, compare_output + ".npy")
                    if os.path.exists(path):
                        v = np.load(path)
                        ov[key] = float(np.max(np.abs(v - ref))) if v.shape == ref.shape else float("inf")
        results["onnxruntime"][0]["openvino"] = ov


    def overhead(self, model, input_dir, threads, extra_kiln):
        """One profiled kiln child of the decoder step: its summed node times per run (the
        kernels) and the read bandwidth measured after its timed runs, in the same process."""
        cmd = [self.kiln, "decoder-step", model, "--input-dir", input_dir, "--threads", str(threads),
               "--warmup", str(self.args.warmup), "--warmup-ms", str(self.args.warmup_ms),
               "--iterations", str(self.args.iterations), "--profile", "--bandwidth"] + list(extra_kiln)
        res = run_child(cmd)
        self.raw.append({"command": cmd, "result": res})
        return res

    def profile(self, case, model, input_dir, extra_kiln=()):
        """One untimed-for-the-table kiln run with per-node timing: where kiln spends its time."""
        cmd = [self.kiln, case, model, "--input-dir", input_dir, "--threads", str(min(self.args.threads)),
               "--warmup", "1", "--iterations", "1", "--profile"] + list(extra_kiln)
        res = run_child(cmd)
        self.raw.append({"command": cmd, "result": res})
        ops = sorted(res["profile_ms_by_op"].items(), key=lambda x: -x[1])
        total = sum(ms for _, ms in ops)
        top = ", ".join(f"{op} {ms / total:.0%}" for op, ms in ops[:5])
        return (f"Where kiln's time goes ({min(self.args.threads)} thread, one profiled run, share of the "
                f"summed node times): {top}.")


def summarize(runs):
    times = [t for r in runs for t in r["iterations_ms"]]
    ls = runs[0].get("load_stats", {})
    nodes = (ls["nodes_loaded"], ls["nodes_planned"]) if "nodes_planned" in ls else None
    s = {"median": pct(times, 50), "p90": pct(times, 90), "n": len(times), "nodes": nodes,
         "load": statistics.median(r["load_ms"] for r in runs),
         "rss": max(r["peak_rss_bytes"] for r in runs),
         "rss_over": max(r["peak_rss_bytes"] - r["rss_before_load_bytes"] for r in runs)}
    ov = runs[0].get("openvino")
    if ov is not None:  # onnxruntime's results carry OpenVINO's (Runner.attach_openvino)
        s["openvino"] = summarize(ov["rounds"]) if ov["rounds"] and not ov["error"] else {"error": ov["error"]}
        default = ov.get("default")
        if default and "error" not in default:
            s["openvino"]["default"] = {"median": default["median_ms"],
                                        "precision": default.get("inference_precision"),
                                        "diff": ov.get("diff_default"), "diff_f32": ov.get("diff_f32")}
    return s


def bf16_section(runner, args, dirs, past_lens):
    """kiln with its MatMul/Gemm weights packed as bfloat16 and float16 next to float weights:
    time, and the largest difference of the first output from kiln's float-weight output."""
    cases = [("encoder", "encoder", dirs["encoder"], [], "last_hidden_state")]
    cases += [(f"decoder step, past {p}", "decoder-step", dirs[f"decoder-step-{p}"],
               ["--past-len", str(p)], "logits") for p in past_lens]
    t = min(args.threads)
    head = ["case", "weights", "median ms", "vs float weights", "max abs diff of the output vs float weights"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, case, idir, extra_args, output in cases:
        base = None
        for prec in ("f32", "bf16", "f16"):
            odir = os.path.join(runner.tmp, "out", f"prec-{case}-{prec}-{len(out)}")
            times = []
            for r in range(args.rounds):
                cmd = [runner.kiln, case, args.whisper, "--input-dir", idir, "--threads", str(t),
                       "--warmup", str(args.warmup), "--warmup-ms", str(args.warmup_ms),
                       "--iterations", str(args.iterations), "--gemm-weights", prec] + extra_args + (["--output-dir", odir] if r == 0 else [])
                res = run_child(cmd)
                runner.raw.append({"command": cmd, "result": res})
                times += res["iterations_ms"]
            median = pct(times, 50)
            value = np.load(os.path.join(odir, output + ".npy"))
            if base is None:
                base = (median, value)
                cells = [label, prec, fmt_ms(median), "1.00", "0 (the reference)"]
            else:
                diff = float(np.max(np.abs(value.astype(np.float64) - base[1])))
                cells = [label, prec, fmt_ms(median), f"{median / base[0]:.2f}", f"{diff:.2e}"]
            print(f"  weights {label} {prec}: {median:.2f} ms", flush=True)
            out.append("| " + " | ".join(cells) + " |")
    desc = (f"`kiln-bench ... --gemm-weights f32|bf16|f16` ({t} thread, {args.rounds} rounds of "
            f"{args.iterations} timed runs): SessionOptions::gemm_weights keeps the constant B of every "
            "MatMul and Gemm packed in bfloat16 or float16 (half the bytes), widened to float in "
            "registers; sums stay in float. onnxruntime has no such option for float models on CPU. "
            "The difference column is the largest absolute difference of the first output from kiln's "
            "own float-weight output on the same inputs.")
    return ("kiln with bfloat16 / float16 GEMM weights", desc, out)


def small_section(runner, args, tmp):
    """The add chain and the small If/LSTM model, with the time per node kiln executed."""
    sys.path.insert(0, os.path.join(ROOT, "tools", "export"))
    import make_small_models

    paths = make_small_models.write(os.path.join(tmp, "small"))
    rng = np.random.default_rng(16)
    x = rng.standard_normal((1, make_small_models.WIDTH)).astype(np.float32)
    idir = write_inputs(os.path.join(tmp, "small-inputs"), {"x": x, "flag": np.array(True)})
    # The add chain's x has a unit axis before the values (see make_small_models.add_chain).
    chain_dir = write_inputs(os.path.join(tmp, "add-chain-inputs"), {"x": x.reshape(1, 1, -1)})
    rows = []
    for case, path in paths.items():
        for t in args.threads:
            res, diff = runner.measure(case, "run", path, chain_dir if case == "add-chain" else idir, t,
                                       compare_output="probs" if case == "small-if" else "y")
            k, o = summarize(res["kiln"]), summarize(res["onnxruntime"])
            executed = res["kiln"][0]["last_run_stats"]["nodes_run"]
            for s in (k, o):
                s["rate_label"] = "µs per executed node"
                s["rate"] = f"{1000 * s['median'] / executed:.2f}"
            print(f"  {case} threads={t}: kiln {k['median'] * 1000:.0f} µs, onnxruntime "
                  f"{o['median'] * 1000:.0f} µs, kiln/ORT {k['median'] / o['median']:.2f}, {executed} nodes run: "
                  f"kiln {k['rate']} µs/node, onnxruntime {o['rate']} µs/node; kiln nodes "
                  f"{k['nodes'][0]} → {k['nodes'][1]}", flush=True)
            rows.append((case, t, k, o, diff))
    desc = ("`tools/export/make_small_models.py`: `add-chain` is x float32[1,1,16] through 1,000 Adds, each "
            "with its own [1,1,16] constant (varying along the last axis, so the chain does not fuse into one "
            "per-channel op); `if-chain` is x through 200 Ifs on a flag input, each branch one "
            "Add or Sub of a [1,16] constant (the cost of dispatching an If); `small-if` repeats a voice-activity-like block 4 times (MatMul, "
            "Add, Relu, an If on the block's sum whose then-branch holds a second If on its mean, branches "
            "of 2-4 small ops, a one-step LSTM with hidden size 16). Both run in microseconds, so the time "
            "is mostly each engine's fixed cost per node (and per `run` call: onnxruntime is driven from "
            "Python, kiln from C++). µs per executed node divides each engine's median by the nodes kiln "
            "ran, nested graphs included (`RunStats::nodes_run`).")
    return ("Per-node cost: tiny ops", desc, rows, "model")



def gpt2_step_inputs(cfg, plen, rng):
    """One decoding step's inputs for a GPT-2 with `plen` cached positions (random caches)."""
    layers, heads, d = cfg["n_layer"], cfg["n_head"], cfg["n_embd"]
    arrays = {"input_ids": np.array([[int(rng.integers(0, cfg["vocab_size"]))]], np.int64),
              "attention_mask": np.ones((1, plen + 1), np.int64),
              "position_ids": np.array([[plen]], np.int64)}
    for layer in range(layers):
        for kind in ("key", "value"):
            arrays[f"past_key_values.{layer}.{kind}"] = rng.standard_normal(
                (1, heads, plen, d // heads), np.float32)
    return arrays

def gpt2_section(runner, args, tmp, past_lens):
    """One decode step of the real-size GPT-2 at each past length, with the bytes read per step
    (weights + KV cache) over the median time."""
    import onnx

    path = os.path.join(args.gpt2, "model.onnx")
    with open(os.path.join(args.gpt2, "config.json")) as f:
        cfg = json.load(f)
    layers, heads, d = cfg["n_layer"], cfg["n_head"], cfg["n_embd"]
    declared = [i.name for i in onnx.load(path, load_external_data=False).graph.input]
    # What a step streams: every weight once, but of the token and position tables (read by
    # Gather) one row; GPT-2's lm_head is its own [n_embd, vocab] initializer beside wte.
    step_weights = cached_step_weight_bytes(path)
    rng = np.random.default_rng(2)
    rows = []
    for plen in past_lens:
        arrays = gpt2_step_inputs(cfg, plen, rng)
        arrays = {k: v for k, v in arrays.items() if k in declared}
        missing = set(declared) - set(arrays)
        if missing:
            sys.exit(f"compare_ort: the GPT-2 model has inputs this script does not make: {sorted(missing)}")
        idir = write_inputs(os.path.join(tmp, f"gpt2-{plen}"), arrays)
        kv_bytes = sum(v.nbytes for k, v in arrays.items() if k.startswith("past_key_values."))
        for t in args.threads:
            res, diff = runner.measure(f"gpt2-past-{plen}", "run", path, idir, t,
                                       ["--kv-capacity", str(cfg["n_positions"])], compare_output="logits")
            k, o = summarize(res["kiln"]), summarize(res["onnxruntime"])
            read = step_weights + kv_bytes
            for s in (k, o):
                s["rate_label"] = "GB/s read (weights + KV)"
                s["rate"] = f"{read / (s['median'] / 1000) / 1e9:.1f}"
            print(f"  gpt2 past {plen} threads={t}: kiln {k['median']:.2f} ms ({k['rate']} GB/s), onnxruntime "
                  f"{o['median']:.2f} ms ({o['rate']} GB/s), kiln/ORT {k['median'] / o['median']:.2f}; kiln "
                  f"nodes {k['nodes'][0]} → {k['nodes'][1]}", flush=True)
            rows.append((plen, t, k, o, diff))
    desc = (f"`tools/export/make_gpt2.py --size gpt2`: GPT-2's real dimensions ({layers} layers, n_embd {d}, "
            f"{heads} heads, vocabulary {cfg['vocab_size']}, {cfg['n_positions']} positions) with random "
            "weights, exported by Optimum (text-generation-with-past, opset 18) as one `model.onnx`. One "
            "decode step: one new token, random caches of `past` tokens (attention_mask of past + 1 ones). "
            "kiln gets its caches as tensors with room for n_positions, passed by move; onnxruntime plain "
            "arrays. GB/s read: the weight bytes a step streams (every initializer once, one row of "
            "the token and position tables; the export keeps lm_head as its own initializer "
            f"beside wte: {step_weights / 1e6:.0f} MB) plus the KV cache bytes, over the median step time.")
    return ("GPT-2 (real dimensions), one decode step", desc, rows, "past")


def make_gpt2_int4(source, folder):
    """The real-size GPT-2 (--gpt2) quantized as tools/export/make_nbits.py quantizes the tiny one:
    Gemm layers written as MatMul + Add, then onnxruntime's MatMulNBitsQuantizer (4 bits, block 32,
    with zero points) on every MatMul and Gather with a constant weight."""
    import onnx

    sys.path.insert(0, os.path.join(ROOT, "tools", "export"))
    from make_nbits import gemm_to_matmul
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    print(f"  making {folder} from {source} (MatMulNBitsQuantizer, 4 bits, block 32)", flush=True)
    model = onnx.load(os.path.join(source, "model.onnx"))
    gemm_to_matmul(model)
    quantizer = MatMulNBitsQuantizer(model, bits=4, block_size=32, is_symmetric=False,
                                     op_types_to_quantize=("MatMul", "Gather"))
    quantizer.process()
    os.makedirs(folder, exist_ok=True)
    onnx.save(quantizer.model.model, os.path.join(folder, "model.onnx"))
    for name in ("config.json", "generation_config.json"):
        if os.path.exists(os.path.join(source, name)):
            with open(os.path.join(source, name)) as f, open(os.path.join(folder, name), "w") as g:
                g.write(f.read())


def packed_int4_bytes(path):
    """Bytes a decode step streams from the MatMulNBits weights: packed values, scales, zero points."""
    import onnx

    model = onnx.load(path)
    inits = {i.name: i for i in model.graph.initializer}
    total = 0
    for n in model.graph.node:
        if n.op_type == "MatMulNBits":
            total += sum(len(inits[x].raw_data) for x in n.input[1:4] if x in inits)
    return total


def make_gpt2_int4_acc4(source, folder):
    """The int4 GPT-2 in `source` with accuracy_level 4 on every MatMulNBits (make_nbits.py's)."""
    import shutil

    import onnx

    sys.path.insert(0, os.path.join(ROOT, "tools", "export"))
    from make_nbits import with_accuracy_level

    print(f"  making {folder} from {source} (accuracy_level 4)", flush=True)
    os.makedirs(folder, exist_ok=True)
    onnx.save(with_accuracy_level(onnx.load(os.path.join(source, "model.onnx")), 4),
              os.path.join(folder, "model.onnx"))
    for name in ("config.json", "generation_config.json"):
        if os.path.exists(os.path.join(source, name)):
            shutil.copy(os.path.join(source, name), folder)


def gpt2_int4_section(runner, args, tmp, past_lens, accuracy4=False):
    """One decode step of the real-size GPT-2 quantized to int4 (MatMulNBits), beside onnxruntime,
    with the memory floor: the packed int4 bytes per step over the measured read bandwidth. With
    accuracy4, the same file with accuracy_level 4 on every MatMulNBits."""
    folder = args.gpt2_int4
    path = os.path.join(folder, "model.onnx")
    if not os.path.exists(path):
        make_gpt2_int4(args.gpt2, folder)
    name = "gpt2-int4"
    if accuracy4:
        name, folder = "gpt2-int4-acc4", folder + "-acc4"
        if not os.path.exists(os.path.join(folder, "model.onnx")):
            make_gpt2_int4_acc4(args.gpt2_int4, folder)
        path = os.path.join(folder, "model.onnx")
    with open(os.path.join(folder, "config.json")) as f:
        cfg = json.load(f)
    layers, heads, d = cfg["n_layer"], cfg["n_head"], cfg["n_embd"]
    packed = packed_int4_bytes(path)
    rng = np.random.default_rng(2)
    rows = []
    for plen in past_lens:
        arrays = gpt2_step_inputs(cfg, plen, rng)
        idir = write_inputs(os.path.join(tmp, f"{name}-{plen}"), arrays)
        kv_bytes = sum(v.nbytes for k, v in arrays.items() if k.startswith("past_key_values."))
        for t in args.threads:
            bw = run_child([runner.kiln, "gemm", "1", "384", "384", "--threads", str(t), "--warmup", "1",
                            "--iterations", "3"])["read_bandwidth_gbps"]
            res, diff = runner.measure(f"{name}-past-{plen}", "run", path, idir, t,
                                       ["--kv-capacity", str(cfg["n_positions"])], compare_output="logits")
            k, o = summarize(res["kiln"]), summarize(res["onnxruntime"])
            floor_ms = (packed + kv_bytes) / (bw * 1e9) * 1000
            for s in (k, o):
                s["rate_label"] = "floor / time (int4 weights + KV at measured bandwidth)"
                s["rate"] = f"{floor_ms / s['median']:.2f}"
            print(f"  {name} past {plen} threads={t}: kiln {k['median']:.2f} ms, onnxruntime "
                  f"{o['median']:.2f} ms, kiln/ORT {k['median'] / o['median']:.2f}; memory floor "
                  f"{floor_ms:.2f} ms ({(packed + kv_bytes) / 1e6:.1f} MB at {bw:.1f} GB/s measured); "
                  f"max |logits diff| {diff:.2e}", flush=True)
            rows.append((plen, t, k, o, diff))
    desc = (f"The GPT-2 of case gpt2 ({layers} layers, n_embd {d}, random weights) with every MatMul and Gather "
            "weight quantized by onnxruntime's `MatMulNBitsQuantizer` (4 bits, block 32, zero points; "
            "GPT-2's Gemm layers first written as MatMul + Add, as `tools/export/make_nbits.py` does): "
            "com.microsoft MatMulNBits and GatherBlockQuantized. One decode step at each past length. The memory "
            f"floor is the packed int4 bytes a step streams ({packed / 1e6:.1f} MB of values, scales and "
            "zero points) plus the KV cache, over the read bandwidth `kiln-bench gemm` measures on the "
            "same threads; the rate column is floor / time (1.0 = at the floor).")
    if accuracy4:
        desc += (" This file has accuracy_level 4 on every MatMulNBits: both engines quantize the activations "
                 "to int8 per block and compute each block's product in integers.")
        return ("GPT-2 int4 (MatMulNBits, accuracy_level 4), one decode step", desc, rows, "past")
    return ("GPT-2 int4 (MatMulNBits), one decode step", desc, rows, "past")


GEMM_SHAPES = [(1500, 384, 384), (1500, 1536, 384), (1500, 384, 1536), (128, 384, 384),
               (128, 1536, 384), (1, 51865, 384), (1, 384, 384)]


def gemm_section(runner, threads_list):
    """kiln-bench gemm for the GEMM layer's reference shapes: GFLOP/s beside the FMA peak and
    read bandwidth measured in the same process."""
    rows = []
    for m, n, k in GEMM_SHAPES:
        for t in threads_list:
            cmd = [runner.kiln, "gemm", str(m), str(n), str(k), "--threads", str(t),
                   "--warmup", "5", "--iterations", "30"]
            res = run_child(cmd)
            runner.raw.append({"command": cmd, "result": res})
            print(f"  gemm {m}x{n}x{k} threads={t}: " +
                  ", ".join(f"{r['impl']} {r['gflops']:.1f}" for r in res["results"]), flush=True)
            rows.append(res)
    head = ["M x N x K", "threads", "kiln packed B GFLOP/s", "kiln unpacked B GFLOP/s",
            "Eigen GFLOP/s (1 thread)", "measured FMA peak GFLOP/s", "packed / peak",
            "packed B read GB/s", "measured read GB/s", "B read / bandwidth",
            "streamed B read GB/s", "streamed / bandwidth"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        by = {x["impl"]: x for x in r["results"]}
        packed, unpacked = by["kiln packed B"], by["kiln unpacked B"]
        eigen = next(x for x in r["results"] if x["impl"].startswith("eigen"))
        streamed = by.get("kiln packed B, streamed")
        out.append("| " + " | ".join([
            f"{r['m']} x {r['n']} x {r['k']}", str(r["threads"]), f"{packed['gflops']:.1f}",
            f"{unpacked['gflops']:.1f}", f"{eigen['gflops']:.1f}", f"{r['fma_peak_gflops']:.0f}",
            f"{packed['gflops'] / r['fma_peak_gflops']:.2f}", f"{packed['b_gbps']:.1f}",
            f"{r['read_bandwidth_gbps']:.1f}",
            f"{packed['b_gbps'] / r['read_bandwidth_gbps']:.2f}",
            f"{streamed['b_gbps']:.1f}" if streamed else "",
            f"{streamed['b_gbps'] / r['read_bandwidth_gbps']:.2f}" if streamed else ""]) + " |")
    isa = rows[0]["isa"] if rows else "?"
    desc = (f"`kiln-bench gemm M N K --threads T` (kiln's **{isa}** kernels): the GEMM layer alone, "
            "C = A B with B packed ahead (a weight) and unpacked (packed inside each call when M is "
            "large enough to repay it); the median of 30 timed calls after 5 warm-ups and at least "
            "0.25 s of untimed calls (a fresh arena's worker threads join split products only after "
            "tens of milliseconds). The FMA peak "
            "and the read bandwidth are measured by the same process on all T threads (independent "
            "FMA chains; the vector sum of a 1 GiB array). Eigen is Eigen 3.4's product as compiled "
            "into kiln-bench for the build's baseline (x86-64-v2), on one thread, which is what "
            "kiln's products ran on before the GEMM layer (they ran with whatever `-march` the build "
            "used). For M = 1 the limit is memory: `packed B read GB/s` is the bytes of B over the "
            "time, with B left in the cache by the previous call (the same B every call); the "
            "`streamed` columns time the same product cycling through copies of the packed B that "
            "together exceed any cache (256 MiB; the median of at least 100 calls), as a decode "
            "step reads its weights, against the measured read bandwidth.")
    return desc, out


# ---------------------------------------------------------------- report

def machine():
    cpu = "unknown"
    flags = set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name") and cpu == "unknown":
                cpu = line.split(":", 1)[1].strip()
            if line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    mem = "?"
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal"):
                mem = f"{int(line.split()[1]) / 1024 / 1024:.0f} GiB"
    avx512 = all(f in flags for f in ("avx512f", "avx512bw", "avx512dq", "avx512vl"))
    return {"nproc": os.cpu_count(), "cpu": cpu, "mem": mem, "kernel": platform.release(),
            "avx512": avx512, "avx2": "avx2" in flags and "fma" in flags}


def git_commit():
    try:
        sha = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short=12", "HEAD"], capture_output=True,
                             text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
        return sha + (" (with uncommitted changes)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def fmt_ms(x):
    if x < 0.1:  # the per-node cases run in microseconds
        return f"{x:.4f}"
    return f"{x:.1f}" if x >= 10 else f"{x:.2f}"


def session_table(rows, extra_col=None):
    """rows: (extra value, threads, kiln summary, ort summary, output diff)."""
    rate = next((k["rate_label"] for _, _, k, _, _ in rows if "rate_label" in k), None)
    head = ([extra_col] if extra_col else []) + [
        "threads", "engine", "median ms", "p90 ms", "kiln/ORT (median)"] + ([rate] if rate else []) + [
        "load ms", "peak RSS MiB", "RSS growth MiB", "kiln nodes (loaded → planned)"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for extra, threads, k, o, _ in rows:
        ratio = k["median"] / o["median"]
        for engine, s, r in (("kiln", k, f"**{ratio:.2f}**"), ("onnxruntime", o, "")):
            nodes = f"{s['nodes'][0]} → {s['nodes'][1]}" if s.get("nodes") else ""
            cells = ([str(extra)] if extra_col else []) + [
                str(threads), engine, fmt_ms(s["median"]), fmt_ms(s["p90"]), r] + (
                [s.get("rate", "")] if rate else []) + [
                fmt_ms(s["load"]), f"{s['rss'] / MIB:.0f}", f"{s['rss_over'] / MIB:.0f}", nodes]
            out.append("| " + " | ".join(cells) + " |")
        v = o.get("openvino")
        if v is not None:
            if "error" in v:
                cells = ([str(extra)] if extra_col else []) + [str(threads), "OpenVINO", "error", "", ""] + (
                    [""] if rate else []) + ["", "", "", ""]
            else:
                cells = ([str(extra)] if extra_col else []) + [
                    str(threads), "OpenVINO (f32)", fmt_ms(v["median"]), fmt_ms(v["p90"]),
                    f"kiln/OV {k['median'] / v['median']:.2f}"] + ([""] if rate else []) + [
                    fmt_ms(v["load"]), f"{v['rss'] / MIB:.0f}", f"{v['rss_over'] / MIB:.0f}", ""]
            out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def openvino_lines(rows, extra_col):
    """OpenVINO's errors, and its default-precision runs, below a section's table."""
    lines = []
    for extra, threads, _, o, _ in rows:
        v = o.get("openvino")
        where = (f"{extra_col} {extra}, " if extra_col and extra is not None else "") + \
            f"{threads} thread{'s' if threads > 1 else ''}"
        if v is None:
            continue
        if "error" in v:
            lines.append(f"- OpenVINO ({where}) could not run the case: {v['error']}")
            continue
        d = v.get("default")
        if d:
            diff = (f"; max |OV - ORT| of the first output {d['diff']:.2e} (f32: {d['diff_f32']:.2e})"
                    if d.get("diff") is not None and d.get("diff_f32") is not None else "")
            lines.append(f"- OpenVINO at its default precision ({d['precision']}), {where}: median "
                         f"{fmt_ms(d['median'])} ms (f32 hint: {fmt_ms(v['median'])} ms){diff}.")
    return lines


def verdict(rows, what, extra_col="past"):
    lines = []
    for extra, threads, k, o, _ in rows:
        ratio = k["median"] / o["median"]
        where = f"{what}{', ' + extra_col + ' ' + str(extra) if extra is not None else ''}, " \
                f"{threads} thread{'s' if threads > 1 else ''}"
        if ratio > 1.05:
            lines.append(f"kiln is **slower** than onnxruntime ({where}): {ratio:.2f}x its median time.")
        elif ratio < 0.95:
            lines.append(f"kiln is faster ({where}): {ratio:.2f}x onnxruntime's median time.")
        else:
            lines.append(f"kiln and onnxruntime are within 5% ({where}): {ratio:.2f}x.")
    return lines


def floor_table(floor, floor_rows):
    """The decoder step next to its memory floor, and kiln's time outside its kernels."""
    head = ["past", "threads", "MB read per step (weights + caches)", "read GB/s (same run)",
            "memory floor ms", "kiln median ms", "kiln / floor", "ORT median ms", "ORT / floor",
            "kiln node times ms", "kiln outside its kernels ms (share)"]
    out = ["Against the memory floor: a cached step reads at least the weights of the cached branch "
           f"({floor.weights / 1e6:.1f} MB: the initializers the main graph and the use_cache_branch "
           "branch read, one row of the token and position embeddings) and the caches "
           f"(cross-attention {floor.cross / 1e6:.1f} MB, decoder {floor.per_position:,} B per past "
           "position). The floor is those bytes over the streaming read bandwidth that kiln-bench "
           "measures (`--bandwidth`: the vector sum of a 1 GiB array on the same threads) in the "
           "child it runs for each row (`--profile --bandwidth`), after that child's timed runs. That "
           "child follows each timed run with the same run on a profiled twin session: kiln node "
           "times are the median of the twin's summed per-node times (If excluded: its nested "
           "nodes have their own), and outside its kernels is that child's fastest step minus its "
           "fastest summed node times (the executor's dispatch, the If, Session::run's own work: "
           "what is not model math; minima, because on a shared machine other processes only add "
           "to either), with its share of that fastest step.", "",
           "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for plen, t, k_ms, o_ms, prof in floor_rows:
        gbps = prof["read_bandwidth_gbps"]
        f_ms = floor.ms(plen, gbps)
        kern = prof["median_kernel_ms"]
        outside = prof["min_ms"] - prof["min_kernel_ms"]
        out.append("| " + " | ".join([
            str(plen), str(t), f"{floor.bytes(plen) / 1e6:.1f}", f"{gbps:.1f}", fmt_ms(f_ms), fmt_ms(k_ms),
            f"**{k_ms / f_ms:.2f}**", fmt_ms(o_ms), f"{o_ms / f_ms:.2f}", fmt_ms(kern),
            f"{outside * 1000:.0f} µs ({outside / prof['min_ms']:.1%})"]) + " |")
    by = {(p, t): k for p, t, k, _, _ in floor_rows}
    lens = sorted({p for p, _, _, _, _ in floor_rows})
    if len(lens) > 1:
        out.append("")
        ratios = ", ".join(f"{t} thread{'s' if t > 1 else ''} {by[(lens[-1], t)] / by[(lens[0], t)]:.2f}"
                           for t in sorted({t for _, t, _, _, _ in floor_rows}))
        out.append(f"kiln's step at past {lens[-1]} over its step at past {lens[0]}: {ratios} (the "
                   f"bytes read grow {floor.bytes(lens[-1]) / floor.bytes(lens[0]):.3f}x).")
    return out


def decode_floor_lines(decode, threads_list, floor):
    """Per thread count: the mean cached step over the mean memory floor of the same steps (the
    bandwidth measured by each kiln child after its generation), and the generator's own time
    per step (the step minus the decoder's Session::run)."""
    lines = []
    for t in threads_list:
        runs = decode[t]["kiln"]
        gbps = statistics.median(r["read_bandwidth_gbps"] for r in runs if "read_bandwidth_gbps" in r)
        steps = [s for r in runs for s in r["steps"][1:]]
        step_ms = statistics.mean(s["ms"] for s in steps)
        floor_ms = statistics.mean(floor.ms(s["past_len"], gbps) for s in steps)
        outside = [s["ms"] - s["run_ms"] for s in steps if "run_ms" in s]
        line = (f"- {t} thread{'s' if t > 1 else ''}, kiln against the memory floor: mean cached step "
                f"{step_ms:.2f} ms, floor {floor_ms:.2f} ms ({floor.weights / 1e6:.1f} MB of weights and "
                f"{floor.cross / 1e6:.1f} MB of cross-attention caches plus the decoder caches, over "
                f"{gbps:.1f} GB/s measured by the same processes): **{step_ms / floor_ms:.2f}x** the floor")
        if outside:
            line += (f"; the generator's own time per step (the step minus the decoder's Session::run: "
                     f"inputs, cache bookkeeping, token choice) median {statistics.median(outside) * 1000:.0f} µs")
        lines.append(line + ".")
    return lines


def decode_section(decode, steps_requested, every, floor=None):
    threads_list = sorted(decode)
    out = []
    # Per step: median over rounds of each engine's step time.
    def per_step(runs, key):
        n = min(len(r["steps"]) for r in runs)
        return [statistics.median(r["steps"][i][key] for r in runs) for i in range(n)]

    cols = ["step", "past_len"]
    data = {}
    for t in threads_list:
        k, o = decode[t]["kiln"], decode[t]["onnxruntime"]
        data[t] = {"kiln": per_step(k, "ms"), "ort": per_step(o, "ms")}
        cols += [f"kiln ms ({t}t)", f"ORT ms ({t}t)"]
    first = decode[threads_list[0]]
    kiln_steps = first["kiln"][0]["steps"]
    ort_steps = first["onnxruntime"][0]["steps"]
    cols += ["kiln bytes copied", "ORT present bytes written (from shapes)"]
    n = min(len(kiln_steps), len(ort_steps))
    shown = sorted(set([0, 1] + list(range(every, n, every)) + [n - 1]))
    out.append("| " + " | ".join(cols) + " |")
    out.append("|" + "---|" * len(cols))
    for i in shown:
        cells = [str(i), str(kiln_steps[i]["past_len"])]
        for t in threads_list:
            cells += [fmt_ms(data[t]["kiln"][i]), fmt_ms(data[t]["ort"][i])]
        cells += [f"{kiln_steps[i]['bytes_copied']:,}", f"{ort_steps[i]['present_bytes']:,}"]
        out.append("| " + " | ".join(cells) + " |")
    # Totals (steps 1..n-1: the cached steps; step 0 runs the prompt without cache).
    cells = ["total 1..%d" % (n - 1), ""]
    for t in threads_list:
        cells += [fmt_ms(sum(data[t]["kiln"][1:n])), fmt_ms(sum(data[t]["ort"][1:n]))]
    cells += [f"{sum(s['bytes_copied'] for s in kiln_steps[1:n]):,}",
              f"{sum(s['present_bytes'] for s in ort_steps[1:n]):,}"]
    out.append("| " + " | ".join(cells) + " |")
    out.append("")
    summary = []
    for t in threads_list:
        k = sum(data[t]["kiln"][1:n]) / (n - 1)
        o = sum(data[t]["ort"][1:n]) / (n - 1)
        kr = decode[t]["kiln"]
        orr = decode[t]["onnxruntime"]
        summary.append(
            f"- {t} thread{'s' if t > 1 else ''}: mean cached step kiln {k:.2f} ms, onnxruntime {o:.2f} ms "
            f"(kiln/ORT {k / o:.2f}); encoder inside the loop kiln {statistics.median(r['encoder_ms'] for r in kr):.0f} ms, "
            f"onnxruntime {statistics.median(r['encoder_ms'] for r in orr):.0f} ms; load (encoder + merged decoder) "
            f"kiln {statistics.median(r['load_ms'] for r in kr):.0f} ms, onnxruntime "
            f"{statistics.median(r['load_ms'] for r in orr):.0f} ms; peak RSS kiln "
            f"{max(r['peak_rss_bytes'] for r in kr) / MIB:.0f} MiB, onnxruntime "
            f"{max(r['peak_rss_bytes'] for r in orr) / MIB:.0f} MiB.")
    if floor:
        summary += decode_floor_lines(decode, threads_list, floor)
    summary += token_agreement(decode, threads_list)
    return out, summary


def token_agreement(decode, threads_list):
    """Whether the engines generated the same tokens and, where they part, how close
    onnxruntime's top two logits were at that step."""
    def runs(engine):
        return [r["tokens"] for t in threads_list for r in decode[t][engine]]

    lines = []
    for engine in ("kiln", "onnxruntime"):
        all_same = all(tokens == runs(engine)[0] for tokens in runs(engine))
        lines.append(f"- {engine}: the same tokens in every round and thread count: {'yes' if all_same else 'NO'}.")
    ref = decode[threads_list[0]]["onnxruntime"][0]
    k = decode[threads_list[0]]["kiln"][0]["tokens"]
    o = ref["tokens"]
    split = next((i for i, (a, b) in enumerate(zip(k, o)) if a != b), None)
    if split is None and len(k) == len(o):
        lines.append(f"- kiln and onnxruntime generated identical tokens ({len(k)} decoder runs, greedy, "
                     "end-of-text suppressed).")
    elif split is not None:
        gap = ref["steps"][split]["top2_gap"]
        lines.append(
            f"- kiln and onnxruntime generated identical tokens for steps 0..{split - 1}; at step {split} "
            f"kiln picked {k[split]} and onnxruntime {o[split]}, where onnxruntime's two highest logits "
            f"differ by {gap:.2g} (a near-tie that float rounding decides), and the sequences differ "
            "from there on. Step times do not depend on which tokens are fed.")
    return lines


def contention_notes(sections, decode, threads):
    """Cases where an engine got slower with more threads: on a shared machine that is
    contention, and those rows say more about the machine than about the engine."""
    if len(threads) < 2:
        return []
    lo, hi = min(threads), max(threads)
    slower = []
    for title, _, rows, extra_col, *_ in sections:
        by = {(r[0], r[1]): r for r in rows}
        for (extra, t), r in by.items():
            if t != hi or (extra, lo) not in by:
                continue
            for idx, engine in ((2, "kiln"), (3, "onnxruntime")):
                if r[idx]["median"] > by[(extra, lo)][idx]["median"]:
                    slower.append(f"{engine} on {title}{', ' + (extra_col or 'past') + ' ' + str(extra) if extra is not None else ''}")
    for engine, key in (("kiln", "kiln"), ("onnxruntime", "onnxruntime")):
        if lo in decode and hi in decode:
            m = {t: statistics.mean(s["ms"] for r in decode[t][key] for s in r["steps"][1:]) for t in (lo, hi)}
            if m[hi] > m[lo]:
                slower.append(f"{engine} on the decode loop")
    if not slower:
        return []
    return ["", f"Slower with {hi} threads than with {lo}: " + "; ".join(slower) + ". On this shared "
            "2-core machine (see the load average above) a second thread competes with other processes; "
            "onnxruntime's worker threads spin while they wait, which suffers most. The one-thread "
            "columns are the more reliable comparison."]


def decoder_prompt_length(whisper):
    """The start token and the tokens generation_config.json forces after it."""
    path = os.path.join(whisper, "generation_config.json")
    if not os.path.exists(path):
        return 1
    with open(path) as f:
        return 1 + len(json.load(f).get("forced_decoder_ids") or [])


def write_report(path, args, cmdline, info, sections, decode, started, ended, loads, appendix=()):
    lines = [
        "# Benchmarks: kiln next to onnxruntime",
        "",
        "Made by `tools/bench/compare_ort.py`; every number below comes from the run described here.",
        "Regenerate with:",
        "",
        "```sh",
        cmdline,
        "```",
        "",
        f"- Date: {started} to {ended} (UTC)",
        f"- Machine: {info['nproc']} cores, {info['cpu']}, {info['mem']} RAM, Linux {info['kernel']}; "
        f"load average {loads[0]} at the start, {loads[1]} at the end (the machine is shared, so "
        "other processes ran during the measurements)",
        f"- Instruction sets: the processor {'has AVX-512 (F/BW/DQ/VL)' if info['avx512'] else 'has no AVX-512'}"
        f"{' and AVX2/FMA' if info['avx2'] else ''}; kiln ran its **{info.get('kiln_isa', '?')}** kernels "
        f"(kiln-bench's `isa`; KILN_ISA={os.environ.get('KILN_ISA') or 'unset'}); onnxruntime picks its own "
        "kernels (MLAS) for the same processor",
        f"- kiln commit: {info['commit']}",
        f"- onnxruntime: {info['ort_version']} (CPU execution provider, intra_op_num_threads = N, "
        "inter_op_num_threads = 1, default graph optimizations, driven from Python)",
    ] + ([
        f"- OpenVINO: {info.get('ov_version')} (CPU plugin, PERFORMANCE_HINT LATENCY, INFERENCE_NUM_THREADS = N, "
        "INFERENCE_PRECISION_HINT f32, the model reshaped to the input shapes, driven from Python; in the same "
        "rounds, the order of the three engines rotating; not in the decode loop)"] if args.openvino else []) + [
        f"- Method: each engine in its own child process; {args.rounds} alternating rounds per case and "
        f"thread count (order flipped every round), {args.warmup} warm-up runs (and more until "
        f"{args.warmup_ms} ms have passed: a pool's threads and the processor's clocks settle over the first "
        f"tens of milliseconds of work) + {args.iterations} timed runs per round; median and p90 over the pooled timed runs; load = median session creation time; "
        "peak RSS = the child's VmHWM (largest over rounds; ru_maxrss is not used because Linux carries "
        "the parent's high-water mark over exec); RSS growth = peak minus the child's RSS "
        "just before loading the model (so the Python interpreter and onnxruntime's import are not "
        "counted against onnxruntime). Only `run` is timed: inputs are built before the timer starts.",
        "- kiln feeds the decoder caches as intended: tensors made with `Tensor::with_capacity` "
        "(room for max_target_positions) and passed by move, so the model's Concat appends in place; "
        "onnxruntime gets plain arrays, as Optimum feeds it.",
        "- max |kiln - ORT|: the largest absolute difference between the two engines' first output "
        "(logits, last_hidden_state) on the same inputs.",
        "- Where a case misses its speed target, `docs/performance.md` says what limits it.",
        "",
        "## Summary (kiln median / onnxruntime median; below 1 means kiln is faster)",
        "",
    ]
    head = ["case"] + [f"{t} thread{'s' if t > 1 else ''}" for t in args.threads]
    if args.openvino:
        head += [f"kiln/OpenVINO, {t} thread{'s' if t > 1 else ''}" for t in args.threads]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for title, _, rows, extra_col, *_ in sections:
        by_extra, by_ov = {}, {}
        for extra, threads, k, o, _ in rows:
            by_extra.setdefault(extra, {})[threads] = k["median"] / o["median"]
            v = o.get("openvino")
            by_ov.setdefault(extra, {})[threads] = k["median"] / v["median"] if v and "median" in v else None
        for extra, ratios in by_extra.items():
            name = title + (f", {extra_col} {extra}" if extra is not None else "")
            cells = [name] + [f"{ratios.get(t, float('nan')):.2f}" for t in args.threads]
            if args.openvino:
                cells += [f"{by_ov[extra][t]:.2f}" if by_ov[extra].get(t) else "—" for t in args.threads]
            lines.append("| " + " | ".join(cells) + " |")
    if decode:
        cells = ["Whisper decode loop, mean cached step"]
        for t in args.threads:
            if t in decode:
                k = statistics.mean(s["ms"] for r in decode[t]["kiln"] for s in r["steps"][1:])
                o = statistics.mean(s["ms"] for r in decode[t]["onnxruntime"] for s in r["steps"][1:])
                cells.append(f"{k / o:.2f}")
            else:
                cells.append("")
        lines.append("| " + " | ".join(cells) + " |")
    lines += contention_notes(sections, decode, args.threads)
    lines.append("")
    for title, desc, rows, extra_col, *after in sections:
        lines += [f"## {title}", "", desc, ""]
        rows_tab = [(r[0], r[1], r[2], r[3], r[4]) for r in rows]
        lines.append(session_table(rows_tab, extra_col))
        lines.append("")
        diffs = [f"{r[4]:.2e}" for r in rows if r[4] is not None]
        if diffs:
            lines.append(f"max |kiln - ORT| of the first output, per row pair above: {', '.join(diffs)}.")
            lines.append("")
        lines += [f"- {v}" for v in verdict(rows, title, extra_col or "past")]
        lines += openvino_lines(rows, extra_col)
        lines.append("")
        for block in after:
            lines += block + [""]
    if decode:
        table, summary = decode_section(decode, args.decode_steps, args.decode_every,
                                        DecodeFloor(args.whisper))
        lines += [
            f"## Whisper decode loop ({args.decode_steps} decoder runs)", "",
            "Greedy decoding on the sample clip's features with the merged decoder: step 0 runs the "
            f"{decoder_prompt_length(args.whisper)}-token prompt without cache (use_cache_branch false), then "
            "one token a step with the cache. "
            "End-of-text is suppressed so every run decodes the same number of steps. kiln: "
            "`Seq2SeqGenerator` (caches with room for prompt + steps tokens, passed by move). onnxruntime: "
            "the loop Optimum runs (present.* fed back as past_key_values.* every step). A step's time "
            "covers the decoder run and picking the token (argmax). Times are the median over "
            f"{args.decode_rounds} alternating rounds (after one untimed warm-up generation per process); "
            f"every {args.decode_every}th step is shown. `kiln bytes copied` is kiln's exact counter for "
            "the step (run + generator). `ORT present bytes written` is not measured: it is the size of "
            "all present.* outputs computed from their shapes, which onnxruntime must allocate and fill "
            "every step because past and present are separate buffers (the Concat in each layer copies "
            "the whole cache).", ""]
        lines += table
        lines += summary
        lines.append("")
    for title, desc, table in appendix:
        lines += [f"## {title}", "", desc, ""] + table + [""]
    kept = kept_sections(path)
    with open(path, "w") as f:
        f.write("\n".join(lines).rstrip() + "\n" + (f"\n{kept}" if kept else ""))


# Sections after this line are written by other tools (serve_bench.py) and kept as they are.
KEEP_MARKER = "<!-- Sections below are not made by compare_ort.py, which keeps them. -->"


def kept_sections(path):
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        return ""
    at = text.find(KEEP_MARKER)
    return text[at:] if at >= 0 else ""


# ---------------------------------------------------------------- main

def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--whisper", default=os.path.join(ROOT, "models/cache/whisper-tiny-random"),
                   help="Optimum Whisper export folder (make_whisper.py whisper-tiny ...)")
    p.add_argument("--minilm", default=os.path.join(ROOT, "models/cache/all-MiniLM-L6-v2"),
                   help="Optimum feature-extraction export folder (make_minilm.py)")
    p.add_argument("--kiln-bench", default=os.path.join(ROOT, "build/tools/kiln-bench"))
    p.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--warmup-ms", type=int, default=300,
                   help="warm-up runs go on until this many milliseconds have passed too")
    p.add_argument("--iterations", type=int, default=10)
    p.add_argument("--past-lens", default="16,128,400")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--decode-steps", type=int, default=200)
    p.add_argument("--decode-rounds", type=int, default=2)
    p.add_argument("--decode-every", type=int, default=10)
    p.add_argument("--light", default=os.path.join(
        os.environ.get("ONNX_BACKEND_TEST_DATA") or os.path.join(ROOT, "..", "shared", "onnx-backend-tests"),
        "light"), help="folder of the ONNX backend data's light/ CNN models")
    p.add_argument("--resnet", default=os.path.join(ROOT, "models/cache/resnet50-random"),
                   help="folder of tools/export/make_resnet.py's model (case resnet)")
    p.add_argument("--gpt2", default=os.path.join(ROOT, "models/cache/gpt2-random"),
                   help="folder of tools/export/make_gpt2.py --size gpt2's model (case gpt2)")
    p.add_argument("--gpt2-past-lens", default="128,512")
    p.add_argument("--gpt2-int4", default=os.path.join(ROOT, "models/cache/gpt2-random-int4"),
                   help="folder of the int4 GPT-2 (case gpt2-int4; made from --gpt2 when missing)")
    p.add_argument("--cases",
                   default="encoder,decoder-step,minilm,minilm-int8,decode,light,resnet,small,gpt2,gpt2-int4,gpt2-int4-acc4,gemm,bf16")
    p.add_argument("--out", default=os.path.join(ROOT, "docs/benchmarks.md"))
    p.add_argument("--raw", help="also write every child's JSON result to this file")
    p.add_argument("--openvino", action="store_true",
                   help="OpenVINO as a third engine (tools/bench/ov_worker.py; not the decode loop)")
    args = p.parse_args()
    try:
        args.threads = [int(t) for t in args.threads.split(",")]
        past_lens = [int(x) for x in args.past_lens.split(",")]
        gpt2_past_lens = [int(x) for x in args.gpt2_past_lens.split(",")]
    except ValueError:
        p.error("--threads and --past-lens take comma-separated integers")
    cases = args.cases.split(",")
    unknown = set(cases) - {"encoder", "decoder-step", "minilm", "minilm-int8", "decode", "light", "resnet",
                            "small", "gpt2", "gpt2-int4", "gpt2-int4-acc4", "gemm", "bf16"}
    if unknown:
        p.error(f"unknown case(s): {', '.join(sorted(unknown))}")
    if min(args.threads) < 1 or args.rounds < 1 or args.iterations < 1 or args.decode_rounds < 1:
        p.error("--threads, --rounds, --iterations and --decode-rounds must be >= 1")
    if not os.access(args.kiln_bench, os.X_OK):
        p.error(f"{args.kiln_bench}: not found (build kiln first: cmake --build build)")
    whisper_cases = {"encoder", "decoder-step", "decode", "bf16"} & set(cases)
    for folder, needed in ((args.whisper, whisper_cases), (args.minilm, {"minilm", "minilm-int8"} & set(cases)),
                           (args.resnet, {"resnet"} & set(cases)), (args.gpt2, {"gpt2", "gpt2-int4", "gpt2-int4-acc4"} & set(cases))):
        if needed and not os.path.isdir(folder):
            p.error(f"{folder}: no such model folder (see models/README.md to make it)")
    if "light" in cases and not os.path.isdir(args.light):
        p.error(f"{args.light}: no such folder (the ONNX backend data's light/ models; see --light)")

    import onnxruntime as ort

    cmdline = shlex.join(["python", os.path.relpath(os.path.abspath(sys.argv[0]), ROOT)] + sys.argv[1:])
    info = machine()
    info["commit"] = git_commit()
    info["ort_version"] = ort.__version__
    if args.openvino:
        import openvino as ov
        info["ov_version"] = ov.__version__.split("-")[0]
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
    load_start = loadavg()
    t_start = time.time()

    sections = []
    decode = {}
    extra = []
    with tempfile.TemporaryDirectory(prefix="kiln-bench-") as tmp:
        runner = Runner(args, tmp)
        dirs = whisper_inputs(args.whisper, tmp, past_lens) if whisper_cases else {}
        if "encoder" in cases:
            rows = []
            for t in args.threads:
                res, diff = runner.measure("encoder", "encoder", args.whisper, dirs["encoder"], t,
                                           compare_output="last_hidden_state")
                rows.append((None, t, summarize(res["kiln"]), summarize(res["onnxruntime"]), diff))
            sections.append(("Whisper encoder", "whisper-tiny dimensions (d_model 384, 4 layers, 6 heads), "
                             "random weights; `encoder_model.onnx` on input_features float32[1,80,3000] "
                             "(the sample clip's log-mel features). " +
                             runner.profile("encoder", args.whisper, dirs["encoder"]), rows, None))
        if "decoder-step" in cases:
            rows = []
            floor = DecodeFloor(args.whisper)
            floor_rows = []
            for plen in past_lens:
                for t in args.threads:
                    res, diff = runner.measure(f"decoder-step-{plen}", "decoder-step", args.whisper,
                                               dirs[f"decoder-step-{plen}"], t, ["--past-len", str(plen)],
                                               compare_output="logits")
                    bytes_copied = res["kiln"][0]["bytes_copied"]
                    rows.append((plen, t, summarize(res["kiln"]), summarize(res["onnxruntime"]), diff))
                    rows[-1][2]["bytes"] = max(bytes_copied)
                    rows[-1][3]["bytes"] = res["onnxruntime"][0].get("present_bytes", 0)
                    prof = runner.overhead(args.whisper, dirs[f"decoder-step-{plen}"], t,
                                           ["--past-len", str(plen)])
                    floor_rows.append((plen, t, rows[-1][2]["median"], rows[-1][3]["median"], prof))
                    print(f"  decoder-step-{plen} threads={t}: node times {prof['median_kernel_ms']:.2f} ms, "
                          f"outside them {(prof['min_ms'] - prof['min_kernel_ms']) * 1000:.0f} µs (minima), "
                          f"read bandwidth {prof['read_bandwidth_gbps']:.1f} GB/s, floor "
                          f"{floor.ms(plen, prof['read_bandwidth_gbps']):.2f} ms", flush=True)
            desc = ("One run of `decoder_model_merged.onnx` with use_cache_branch = true: one new token, "
                    "random decoder caches of `past` tokens and cross-attention caches of 1500 positions "
                    "(4 layers × key/value). Per run, kiln copied (counter): " +
                    ", ".join(f"past {r[0]}: {r[2]['bytes']:,} B" for r in rows if r[1] == args.threads[0]) +
                    "; onnxruntime's present.* outputs (from shapes, written every run): " +
                    ", ".join(f"past {r[0]}: {r[3]['bytes']:,} B" for r in rows if r[1] == args.threads[0]) +
                    ". " + runner.profile("decoder-step", args.whisper, dirs[f"decoder-step-{past_lens[-1]}"],
                                          ["--past-len", str(past_lens[-1])]).replace(
                                              "one profiled run", f"one profiled run at past {past_lens[-1]}"))
            sections.append(("Whisper merged decoder, one step", desc, rows, "past",
                             floor_table(floor, floor_rows)))
        if "minilm" in cases:
            mdir = minilm_inputs(tmp, args.seq_len)
            rows = []
            for t in args.threads:
                res, diff = runner.measure("minilm", "minilm", args.minilm, mdir, t,
                                           compare_output="last_hidden_state")
                rows.append((None, t, summarize(res["kiln"]), summarize(res["onnxruntime"]), diff))
            sections.append(("all-MiniLM-L6-v2", f"sentence-transformers/all-MiniLM-L6-v2 (real weights, 6 layers, "
                             f"hidden 384, 12 heads) exported by Optimum (feature-extraction, opset 18), batch 1, "
                             f"sequence {args.seq_len} (input_ids, attention_mask, token_type_ids). " +
                             runner.profile("minilm", args.minilm, mdir), rows, None))
        if "minilm-int8" in cases:
            mdir = minilm_inputs(tmp, args.seq_len)
            path = minilm_int8_model(args.minilm, tmp)
            rows = []
            for t in args.threads:
                res, diff = runner.measure("minilm-int8", "run", path, mdir, t,
                                           compare_output="last_hidden_state")
                rows.append((None, t, summarize(res["kiln"]), summarize(res["onnxruntime"]), diff))
            sections.append(("all-MiniLM-L6-v2, int8 dynamic quantization",
                             "The MiniLM above with int8 weights and uint8 activations quantized as it runs: "
                             "onnxruntime.quantization.quantize_dynamic (QInt8 weights, MatMul), then saved "
                             "by onnxruntime at its extended optimization level, so both engines run its "
                             "DynamicQuantizeMatMul and MatMulIntegerToFloat; batch 1, sequence "
                             f"{args.seq_len}. Dynamic quantization magnifies float rounding: a "
                             "quantized activation one step apart moves the next product, so kiln's "
                             "fused attention (rounding like onnxruntime's to ~1e-6) can leave the "
                             "output further from onnxruntime's than the float model's; kiln with "
                             "--optimize basic agrees to ~1e-6. " +
                             runner.profile("run", path, mdir), rows, None))
        if "light" in cases:
            rows = []
            for name, path, idir in light_models(args.light, tmp):
                for t in args.threads:
                    res, _ = runner.measure(name, "run", path, idir, t)
                    rows.append((name, t, summarize(res["kiln"]), summarize(res["onnxruntime"]), None))
            sections.append(("CNNs: the ONNX backend data's light/ models",
                             "Each `light/*.onnx` model on one random standard-normal input of its declared "
                             "shape (float32[1,3,224,224]); `kiln-bench run` and onnxruntime's `run` on the "
                             "same .npy file.", rows, "model"))
        if "resnet" in cases:
            import onnx
            from onnx import numpy_helper
            image = numpy_helper.to_array(onnx.load_tensor(os.path.join(args.resnet, "test_data_set_0",
                                                                        "input_0.pb")))
            idir = write_inputs(os.path.join(tmp, "resnet"), {"image": image})
            path = os.path.join(args.resnet, "model.onnx")
            rows = []
            for t in args.threads:
                res, _ = runner.measure("resnet50", "run", path, idir, t)
                rows.append(("resnet50", t, summarize(res["kiln"]), summarize(res["onnxruntime"]), None))
            sections.append(("CNN: ResNet-50 exported from torch",
                             "`tools/export/make_resnet.py`: torchvision's ResNet-50 architecture with random "
                             "weights and batch-normalization statistics, exported by torch 2.9.1's TorchScript "
                             "exporter (opset 17, normalizations folded into the convolutions by the exporter), "
                             "on one random float32[1,3,224,224] image. " +
                             runner.profile("run", path, idir), rows, "model"))
        if "small" in cases:
            sections.append(small_section(runner, args, tmp))
        if "gpt2" in cases:
            sections.append(gpt2_section(runner, args, tmp, gpt2_past_lens))
        if "gpt2-int4" in cases:
            sections.append(gpt2_int4_section(runner, args, tmp, gpt2_past_lens))
        if "gpt2-int4-acc4" in cases:
            sections.append(gpt2_int4_section(runner, args, tmp, gpt2_past_lens, accuracy4=True))
        if "bf16" in cases:
            extra.append(bf16_section(runner, args, dirs, past_lens))
        if "gemm" in cases:
            desc, table = gemm_section(runner, args.threads)
            extra.append(("The GEMM layer", desc, table))
        if "decode" in cases:
            for t in args.threads:
                res, _ = runner.measure("decode", "decode", args.whisper, dirs["encoder"], t,
                                        rounds=args.decode_rounds)
                decode[t] = res

    isas = {r["result"].get("isa") for r in runner.raw if r["result"].get("engine") == "kiln"}
    info["kiln_isa"] = ", ".join(sorted(i for i in isas if i)) or "?"
    if args.raw:
        with open(args.raw, "w") as f:
            json.dump(runner.raw, f)
    ended = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
    write_report(args.out, args, cmdline, info, sections, decode, started, ended, (load_start, loadavg()),
                 extra)
    print(f"wrote {args.out} ({time.time() - t_start:.0f} s)")


if __name__ == "__main__":
    main()
