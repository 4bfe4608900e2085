#!/usr/bin/env python3
"""Peak resident memory of kiln and onnxruntime on the Whisper export, each run in its own
child process (peak = the child's own VmHWM, so nothing of this script counts).

  1. Weights: page release (layer streaming): the encoder run with and without
     SessionOptions::release_weights_after_use (kiln-rss --release-weights), both as exported
     (weights embedded in the .onnx, mostly misaligned, hence copied at load) and re-saved by
     the onnx package with external data (aligned, hence used in place from the mapping).
  2. Load peak: loading + first run of decoder_model_merged.onnx, and of all-MiniLM-L6-v2
     (sequence 128, from --minilm-dir when it exists), kiln vs onnxruntime.
  4. Graph first, weights later: the encoder re-saved with external data, loaded without its
     data file (hollow constants), then each weight given with Session::set_constant, read
     one at a time (kiln-rss --constants-from); peak vs weights + largest weight + 16 MiB.
     Run alone with --parts hollow.
  3. Two sessions over the same weights: decoder_model.onnx alone, then beside
     decoder_with_past_model.onnx in one Environment (weights shared, kiln-rss --also) and
     with sharing off (--no-share-weights); onnxruntime with two InferenceSessions. The first
     session is run once after both are loaded, so its weights are resident in every row.

Peaks are each child's own high-water mark (VmHWM from /proc/self/status).

Usage (from the repository root, after building):
  /work/venv/bin/python tools/bench/memory_rss.py --kiln-rss build/tools/kiln-rss \
      --model-dir /work/model-cache/whisper-tiny-random [--threads 2] [--repeat 3] [--json]

Needs numpy and onnxruntime in the Python running it (onnxruntime only for part 2).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import numpy as np

MiB = 1024 * 1024

ORT_CHILD = r"""
import json, resource, sys, time
import numpy as np
import onnxruntime as ort

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()

def peak():
    # VmHWM: ru_maxrss would include the parent's size (Linux keeps it across exec).
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024

model, threads, save, *specs = sys.argv[1:]
feeds = {}
for spec in specs:
    name, path = spec.split("=", 1)
    feeds[name] = np.load(path)
rss_inputs = rss()
opts = ort.SessionOptions()
opts.intra_op_num_threads = int(threads)
opts.inter_op_num_threads = 1
t0 = time.perf_counter()
sess = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
load_ms = (time.perf_counter() - t0) * 1e3
rss_loaded, peak_loaded = rss(), peak()
t0 = time.perf_counter()
out = sess.run(None, feeds)
run_ms = (time.perf_counter() - t0) * 1e3
np.save(save, out[0])
print(json.dumps({"rss_inputs_bytes": rss_inputs, "load_ms": load_ms,
                  "rss_after_load_bytes": rss_loaded, "peak_rss_after_load_bytes": peak_loaded,
                  "runs": [{"ms": run_ms, "rss_after_bytes": rss(), "peak_rss_bytes": peak()}],
                  "peak_rss_end_bytes": peak(), "onnxruntime": ort.__version__}))
"""


def run_child(cmd):
    """Runs `cmd`, returns (parsed JSON stdout, the child's peak RSS in bytes). The peak is
    the child's own VmHWM, which it reports as peak_rss_end_bytes: the ru_maxrss that wait4
    returns is not used, because Linux carries a process's high-water mark across exec, so a
    child forked from this Python process would include this process's size."""
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err)
        out = proc.stdout.read()
        proc.wait()
        if proc.returncode != 0:
            err.seek(0)
            raise SystemExit(f"{' '.join(cmd[:2])} failed ({proc.returncode}):\n"
                             f"{err.read().decode()}")
    report = json.loads(out)
    return report, report["peak_rss_end_bytes"]


def npy_args(flag, inputs):
    args = []
    for name, path in inputs.items():
        args += ([flag, f"{name}={path}"] if flag else [f"{name}={path}"])
    return args


def external_data_copy(model, tmp):
    """The same model with its initializers in one external data file beside it."""
    import onnx
    out_dir = os.path.join(tmp, "external")
    os.makedirs(out_dir, exist_ok=True)
    out = os.path.join(out_dir, os.path.basename(model))
    m = onnx.load(model)
    onnx.save_model(m, out, save_as_external_data=True, all_tensors_to_one_file=True,
                    location=os.path.basename(model) + ".data", size_threshold=1024)
    return out


def encoder_inputs(model_dir, tmp):
    features = os.path.join(model_dir, "sample_features.npy")
    if not os.path.exists(features):
        features = os.path.join(tmp, "input_features.npy")
        rng = np.random.default_rng(0)
        np.save(features, rng.standard_normal((1, 80, 3000), dtype=np.float32))
    return {"input_features": features}


def decoder_inputs(model_dir, tmp):
    """First step of the merged decoder: a 4-token prompt, empty caches, no-cache branch."""
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    d_model = config["d_model"]
    heads = config["decoder_attention_heads"]
    layers = config["decoder_layers"]
    enc_len = config["max_source_positions"]
    rng = np.random.default_rng(0)
    start = config["decoder_start_token_id"]
    arrays = {
        "input_ids": np.array([[start, 100, 200, 300]], dtype=np.int64),
        "encoder_hidden_states": rng.standard_normal((1, enc_len, d_model), dtype=np.float32),
        "use_cache_branch": np.array([False]),
    }
    head_dim = d_model // heads
    for layer in range(layers):
        for part in ("decoder", "encoder"):
            for kv in ("key", "value"):
                arrays[f"past_key_values.{layer}.{part}.{kv}"] = np.zeros(
                    (1, heads, 0, head_dim), dtype=np.float32)
    paths = {}
    for name, a in arrays.items():
        paths[name] = os.path.join(tmp, f"dec_{name}.npy")
        np.save(paths[name], a)
    return paths


ORT_PAIR_CHILD = r"""
import json, resource, sys
import numpy as np
import onnxruntime as ort

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()

threads, models, *specs = sys.argv[1:]
feeds = {}
for spec in specs:
    name, path = spec.split("=", 1)
    feeds[name] = np.load(path)
opts = ort.SessionOptions()
opts.intra_op_num_threads = int(threads)
opts.inter_op_num_threads = 1
sessions = [ort.InferenceSession(m, opts, providers=["CPUExecutionProvider"])
            for m in models.split(",")]
rss_loaded = rss()
sessions[0].run(None, feeds)
with open("/proc/self/status") as f:
    hwm = next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmHWM:"))
print(json.dumps({"rss_after_all_loaded_bytes": rss_loaded, "rss_after_run_bytes": rss(),
                  "peak_rss_end_bytes": hwm, "onnxruntime": ort.__version__}))
"""


def minilm_inputs(tmp, seq=128):
    """One sentence of `seq` tokens: ids drawn from the vocabulary, full attention mask."""
    rng = np.random.default_rng(0)
    arrays = {
        "input_ids": np.concatenate([[101], rng.integers(1000, 30000, seq - 2), [102]])
        .astype(np.int64)[None, :],
        "attention_mask": np.ones((1, seq), dtype=np.int64),
        "token_type_ids": np.zeros((1, seq), dtype=np.int64),
    }
    paths = {}
    for name, a in arrays.items():
        paths[name] = os.path.join(tmp, f"minilm_{name}.npy")
        np.save(paths[name], a)
    return paths


def first_decoder_inputs(model_dir, tmp):
    """decoder_model.onnx (no cache): a 4-token prompt and encoder states."""
    paths = decoder_inputs(model_dir, tmp)
    return {k: paths[k] for k in ("input_ids", "encoder_hidden_states")}


def hollow_part(args):
    import onnx
    import shutil
    encoder = os.path.join(args.model_dir, "encoder_model.onnx")
    with tempfile.TemporaryDirectory() as tmp:
        full = external_data_copy(encoder, tmp)
        data_dir = os.path.dirname(full)
        hollow_dir = os.path.join(tmp, "hollow")
        os.makedirs(hollow_dir)
        hollow = os.path.join(hollow_dir, os.path.basename(full))
        shutil.copy(full, hollow)  # the .onnx alone: its data file is missing there
        m = onnx.load(full, load_external_data=False)
        manifest = os.path.join(tmp, "manifest.tsv")
        weights = 0
        with open(manifest, "w") as f:
            for t in m.graph.initializer:
                if t.data_location != onnx.TensorProto.EXTERNAL:
                    continue
                kv = {e.key: e.value for e in t.external_data}
                f.write(f"{t.name}\t{os.path.join(data_dir, kv['location'])}\t"
                        f"{kv.get('offset', '0')}\t{kv['length']}\n")
                weights += int(kv["length"])
        enc_in = encoder_inputs(args.model_dir, tmp)
        reports = [measure_kiln(args.kiln_rss, hollow, enc_in, args.threads, False,
                                extra=("--constants-from", manifest))
                   for _ in range(args.repeat)]
        rep, peaks = median_report(reports)
    largest = rep["largest_constant_bytes"]
    bound = rep["weights_bytes"] + largest + 16 * MiB
    print("## Encoder, graph first, weights later (set_constant)")
    print("| RSS before load MiB | RSS after load, hollow MiB | peak after set_constant MiB | "
          "external weights MiB (constants set) | largest weight MiB | "
          "weights + largest + 16 MiB | RSS after run MiB | child peak MiB (all children) |")
    print("|---|---|---|---|---|---|---|---|")
    print(f"| {mib(rep['rss_inputs_bytes'])} | {mib(rep['rss_hollow_bytes'])} | "
          f"{mib(rep['peak_rss_after_load_bytes'])} | {mib(weights)} ({rep['constants_set']}) | "
          f"{mib(largest)} | {mib(bound)} | {mib(rep['runs'][0]['rss_after_bytes'])} | "
          f"{mib(rep['child_peak_rss_bytes'])} ({', '.join(mib(p) for p in peaks)}) |")


def measure_kiln(kiln_rss, model, inputs, threads, release, save=None, extra=()):
    cmd = [kiln_rss, model, "--threads", str(threads)] + npy_args("--input", inputs)
    cmd += list(extra)
    if release:
        cmd.append("--release-weights")
    if save:
        cmd += ["--save-output", save]
    report, peak = run_child(cmd)
    report["child_peak_rss_bytes"] = peak
    return report


def measure_ort(model, inputs, threads, save):
    cmd = [sys.executable, "-c", ORT_CHILD, model, str(threads), save] + npy_args(None, inputs)
    report, peak = run_child(cmd)
    report["child_peak_rss_bytes"] = peak
    return report


def median_report(reports):
    """The report whose child peak is the median one (odd counts) or the lower middle."""
    ordered = sorted(reports, key=lambda r: r["child_peak_rss_bytes"])
    return ordered[(len(ordered) - 1) // 2], [r["child_peak_rss_bytes"] for r in reports]


def mib(b):
    return f"{b / MiB:.1f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--kiln-rss", default="build/tools/kiln-rss")
    ap.add_argument("--model-dir", default="/work/model-cache/whisper-tiny-random")
    ap.add_argument("--minilm-dir", default="/work/model-cache/all-MiniLM-L6-v2")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3, help="children per configuration")
    ap.add_argument("--json", action="store_true", help="print the raw reports as JSON")
    ap.add_argument("--parts", default="all", choices=["all", "hollow"])
    args = ap.parse_args()
    if args.parts == "hollow":
        return hollow_part(args)

    encoder = os.path.join(args.model_dir, "encoder_model.onnx")
    decoder = os.path.join(args.model_dir, "decoder_model_merged.onnx")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        enc_in = encoder_inputs(args.model_dir, tmp)
        variants = {"embedded": encoder, "external": external_data_copy(encoder, tmp)}
        outputs = []
        for variant, path in variants.items():
            for release in (False, True):
                save = os.path.join(tmp, f"enc_{variant}_{release}.npy")
                outputs.append(save)
                reports = [measure_kiln(args.kiln_rss, path, enc_in, args.threads, release, save)
                           for _ in range(args.repeat)]
                results[f"encoder_{variant}_release_{release}"] = median_report(reports)
        encoder_diff = max(float(np.max(np.abs(np.load(o) - np.load(outputs[0]))))
                           for o in outputs)

        dec_in = decoder_inputs(args.model_dir, tmp)
        kiln_out, ort_out = os.path.join(tmp, "kiln_logits.npy"), os.path.join(tmp, "ort.npy")
        reports = [measure_kiln(args.kiln_rss, decoder, dec_in, args.threads, False, kiln_out)
                   for _ in range(args.repeat)]
        results["decoder_kiln"] = median_report(reports)
        reports = [measure_ort(decoder, dec_in, args.threads, ort_out)
                   for _ in range(args.repeat)]
        results["decoder_ort"] = median_report(reports)
        logits_diff = float(np.max(np.abs(np.load(kiln_out) - np.load(ort_out))))

        minilm = os.path.join(args.minilm_dir, "model.onnx")
        minilm_diff = None
        if os.path.exists(minilm):
            mini_in = minilm_inputs(tmp)
            k_out, o_out = os.path.join(tmp, "kiln_minilm.npy"), os.path.join(tmp, "ort_minilm.npy")
            reports = [measure_kiln(args.kiln_rss, minilm, mini_in, args.threads, False, k_out)
                       for _ in range(args.repeat)]
            results["minilm_kiln"] = median_report(reports)
            reports = [measure_ort(minilm, mini_in, args.threads, o_out)
                       for _ in range(args.repeat)]
            results["minilm_ort"] = median_report(reports)
            minilm_diff = float(np.max(np.abs(np.load(k_out) - np.load(o_out))))

        first = os.path.join(args.model_dir, "decoder_model.onnx")
        with_past = os.path.join(args.model_dir, "decoder_with_past_model.onnx")
        pair_in = first_decoder_inputs(args.model_dir, tmp)
        for key, extra in (("pair_one", ()), ("pair_shared", ("--also", with_past)),
                           ("pair_unshared", ("--also", with_past, "--no-share-weights"))):
            reports = [measure_kiln(args.kiln_rss, first, pair_in, args.threads, False,
                                    extra=extra) for _ in range(args.repeat)]
            results[key] = median_report(reports)
        for key, models in (("pair_ort_one", first), ("pair_ort_two", f"{first},{with_past}")):
            cmd = [sys.executable, "-c", ORT_PAIR_CHILD, str(args.threads), models]
            cmd += npy_args(None, pair_in)
            reports = []
            for _ in range(args.repeat):
                report, peak = run_child(cmd)
                report["child_peak_rss_bytes"] = peak
                reports.append(report)
            results[key] = median_report(reports)

    if args.json:
        print(json.dumps({k: v[0] for k, v in results.items()}, indent=2))

    print(f"model sizes: encoder_model.onnx {mib(os.path.getsize(encoder))} MiB, "
          f"decoder_model_merged.onnx {mib(os.path.getsize(decoder))} MiB; "
          f"threads {args.threads}; {args.repeat} children per row (median peak shown)")
    print()
    print("## Encoder run, kiln, with and without release_weights_after_use")
    print("| weights | release | child peak RSS MiB (all children) | RSS after load MiB | "
          "RSS after run MiB | pool peak MiB | mapped / copied MiB | released MiB (calls) | "
          "run ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    for variant in ("embedded", "external"):
        for release in (False, True):
            rep, peaks = results[f"encoder_{variant}_release_{release}"]
            run = rep["runs"][0]
            print(f"| {variant} | {'on' if release else 'off'} | "
                  f"{mib(rep['child_peak_rss_bytes'])} ({', '.join(mib(p) for p in peaks)}) | "
                  f"{mib(rep['rss_after_load_bytes'])} | {mib(run['rss_after_bytes'])} | "
                  f"{mib(run['pool_peak_bytes'])} | {mib(rep['weights_mapped_bytes'])} / "
                  f"{mib(rep['weights_copied_bytes'])} | "
                  f"{mib(run['weight_bytes_released'])} ({run['weight_release_calls']}) | "
                  f"{run['ms']:.0f} |")
    print()
    print(f"encoder outputs, max difference between the four configurations: {encoder_diff:.3g}")
    print()
    print("## Merged decoder, load + first run, kiln vs onnxruntime")
    print("| engine | child peak RSS MiB (all children) | RSS before load (inputs read) MiB | "
          "RSS after load MiB | peak after load MiB | RSS after run MiB | load ms | run ms |")
    print("|---|---|---|---|---|---|---|---|")
    rows = [("decoder_kiln", "kiln"), ("decoder_ort", "onnxruntime")]
    if "minilm_kiln" in results:
        rows += [("minilm_kiln", "kiln"), ("minilm_ort", "onnxruntime")]
    for key, name in rows:
        if key == "minilm_kiln":
            print()
            print(f"## all-MiniLM-L6-v2 (model.onnx {mib(os.path.getsize(minilm))} MiB, embedded "
                  "weights), load + first run at sequence 128, kiln vs onnxruntime")
            print("| engine | child peak RSS MiB (all children) | RSS before load (inputs read) "
                  "MiB | RSS after load MiB | peak after load MiB | RSS after run MiB | load ms | "
                  "run ms |")
            print("|---|---|---|---|---|---|---|---|")
        rep, peaks = results[key]
        run = rep["runs"][0]
        label = name if name == "kiln" else f"onnxruntime {rep['onnxruntime']}"
        print(f"| {label} | {mib(rep['child_peak_rss_bytes'])} "
              f"({', '.join(mib(p) for p in peaks)}) | {mib(rep['rss_inputs_bytes'])} | "
              f"{mib(rep['rss_after_load_bytes'])} | {mib(rep['peak_rss_after_load_bytes'])} | "
              f"{mib(run['rss_after_bytes'])} | {rep['load_ms']:.0f} | {run['ms']:.0f} |")
    print()
    print(f"logits max |kiln - onnxruntime| = {logits_diff:.3g}")
    if minilm_diff is not None:
        print(f"MiniLM first output max |kiln - onnxruntime| = {minilm_diff:.3g}")
    print()
    print("## decoder_model.onnx alone, and beside decoder_with_past_model.onnx")
    print("| engine | sessions | RSS after loading MiB | RSS after the first session's run MiB | "
          "child peak RSS MiB (all children) | weights shared by the second MiB | "
          "second session's weights MiB |")
    print("|---|---|---|---|---|---|---|")
    one = results["pair_one"][0]["runs"][0]["rss_after_bytes"]
    for key, label in (("pair_one", "decoder_model"),
                       ("pair_shared", "+ decoder_with_past, one Environment"),
                       ("pair_unshared", "+ decoder_with_past, share_weights off")):
        rep, peaks = results[key]
        also = rep["also"][0] if rep["also"] else None
        after_run = rep["runs"][0]["rss_after_bytes"]
        print(f"| kiln | {label} | {mib(rep['rss_after_all_loaded_bytes'])} | {mib(after_run)} "
              f"({after_run / one:.2f}x) | {mib(rep['child_peak_rss_bytes'])} "
              f"({', '.join(mib(p) for p in peaks)}) | "
              f"{mib(also['weights_shared_bytes']) if also else '-'} | "
              f"{mib(also['weights_bytes']) if also else '-'} |")
    ort_one = results["pair_ort_one"][0]["rss_after_run_bytes"]
    for key, label in (("pair_ort_one", "decoder_model"),
                       ("pair_ort_two", "+ decoder_with_past, two InferenceSessions")):
        rep, peaks = results[key]
        print(f"| onnxruntime {rep['onnxruntime']} | {label} | "
              f"{mib(rep['rss_after_all_loaded_bytes'])} | {mib(rep['rss_after_run_bytes'])} "
              f"({rep['rss_after_run_bytes'] / ort_one:.2f}x) | {mib(rep['child_peak_rss_bytes'])} "
              f"({', '.join(mib(p) for p in peaks)}) | - | - |")


if __name__ == "__main__":
    main()
