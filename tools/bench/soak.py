#!/usr/bin/env python3
"""Memory over long runs with changing shapes: kiln and onnxruntime side by side, each
workload in a child process of its own, its resident memory (RSS) sampled as it runs.

Workloads (each engine runs the same inputs, drawn from one seed):
  minilm   a BERT-style encoder (all-MiniLM-L6-v2 from --minilm, or the committed bert-tiny
           with --small) at batch 1 and a sequence length drawn at random in 1..--max-seq
           (512; 64 for bert-tiny, its number of positions) for every run;
  decode   a Whisper decode loop (the Optimum export's encoder and decoder_model_merged.onnx
           from --whisper): utterance after utterance, the encoder on random features, then
           greedy steps with the caches growing for 1..--max-tokens tokens (a length drawn
           per utterance); each session.run counts as one run;
  cnn      a CNN (tiny-cnn, or --cnn) at a batch drawn at random in 1..--max-batch.

For each (workload, engine): RSS after warm-up (the first quarter of the runs, at least 50), at the
end and at its highest, and growth: the median RSS over the last quarter of the runs after
warm-up minus the median over the first quarter (a trend; a run at the largest shapes raises
RSS for as long as its buffers are kept, which the highest RSS shows), and for kiln the pool's held bytes after each run
(RunStats pool_bytes_cached + arena_capacity: the buffers it keeps for later runs, which
SessionOptions.pool_keep_runs bounds by what the last 64 runs used). --check fails (exit 1)
when kiln's growth exceeds --max-growth-mib (2).

Usage (from the repository root, after `make python-install`):
  .venv/bin/python tools/bench/soak.py --runs 100000 [--workloads minilm,decode,cnn]
      [--engines kiln,ort] [--threads 1] [--json out.json]
  .venv/bin/python tools/bench/soak.py --small --runs 2000 --engines kiln --check   # CI size

Needs numpy, and onnxruntime for --engines ort.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MiB = 1024 * 1024


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def make_session(engine, path, args):
    threads = args.threads
    if engine == "kiln":
        import kiln
        so = kiln.SessionOptions()
        so.intra_op_num_threads = threads
        if args.pool_keep_runs is not None:
            so.pool_keep_runs = args.pool_keep_runs
        return kiln.InferenceSession(path, so)
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


class Sampler:
    """RSS every `every` runs; for kiln, the pool's held bytes after every run."""

    def __init__(self, engine, runs):
        self.engine = engine
        self.runs = runs
        self.every = max(1, runs // 400)
        self.done = 0
        self.samples = []  # (run, rss)
        self.held_max = 0
        self.held_last = 0

    def ran(self, session):
        self.done += 1
        if self.engine == "kiln":
            st = session.last_run_stats()
            held = st["pool_bytes_cached"] + st["arena_capacity"]
            self.held_max = max(self.held_max, held)
            self.held_last = held
        if self.done % self.every == 0 or self.done == self.runs:
            self.samples.append((self.done, rss_bytes(), self.held_last))
        return self.done < self.runs


def minilm_workload(engine, args, rng, sampler):
    import numpy as np
    path = args.minilm_model
    s = make_session(engine, path, args)
    names = [i.name for i in s.get_inputs()]
    while True:
        n = int(rng.integers(1, args.max_seq + 1))
        feeds = {}
        for name in names:
            if name == "input_ids":
                feeds[name] = rng.integers(100, 500, (1, n)).astype(np.int64)
            elif name == "attention_mask":
                feeds[name] = np.ones((1, n), np.int64)
            else:
                feeds[name] = np.zeros((1, n), np.int64)
        s.run(None, feeds)
        if not sampler.ran(s):
            return


def decode_workload(engine, args, rng, sampler):
    import numpy as np
    enc = make_session(engine, os.path.join(args.whisper, "encoder_model.onnx"), args)
    dec = make_session(engine, os.path.join(args.whisper, "decoder_model_merged.onnx"),
                       args)
    dec_inputs = {i.name: i for i in dec.get_inputs()}
    out_names = [o.name for o in dec.get_outputs()]
    enc_shape = enc.get_inputs()[0].shape
    mels, frames = int(enc_shape[1]), int(enc_shape[2])
    layers = sorted({int(n.split(".")[1]) for n in dec_inputs if n.startswith("past_key_values.")})
    kv = dec_inputs["past_key_values.0.decoder.key"].shape
    heads, head_dim = int(kv[1]), int(kv[3])
    with open(os.path.join(args.whisper, "generation_config.json")) as f:
        start = json.load(f).get("decoder_start_token_id", 50258)
    empty = np.zeros((1, heads, 0, head_dim), np.float32)
    while True:
        features = rng.standard_normal((1, mels, frames)).astype(np.float32)
        hidden = enc.run(None, {enc.get_inputs()[0].name: features})[0]
        if not sampler.ran(enc):
            return
        feeds = {"input_ids": np.array([[start]], np.int64), "encoder_hidden_states": hidden,
                 "use_cache_branch": np.array([False])}
        for i in layers:
            for part in ("decoder", "encoder"):
                for kind in ("key", "value"):
                    feeds[f"past_key_values.{i}.{part}.{kind}"] = empty
        for _ in range(int(rng.integers(1, args.max_tokens + 1))):
            outs = dict(zip(out_names, dec.run(None, feeds)))
            token = int(np.argmax(outs["logits"][0, -1]))
            use_cache = bool(feeds["use_cache_branch"][0])
            feeds = {"input_ids": np.array([[token]], np.int64), "encoder_hidden_states": hidden,
                     "use_cache_branch": np.array([True])}
            for i in layers:
                for kind in ("key", "value"):
                    feeds[f"past_key_values.{i}.decoder.{kind}"] = outs[f"present.{i}.decoder.{kind}"]
                    # The cross-attention caches come from the first step only.
                    enc_kv = f"past_key_values.{i}.encoder.{kind}"
                    feeds[enc_kv] = prev_enc[enc_kv] if use_cache else outs[f"present.{i}.encoder.{kind}"]
            prev_enc = {k: v for k, v in feeds.items() if ".encoder." in k}
            if not sampler.ran(dec):
                return


def cnn_workload(engine, args, rng, sampler):
    import numpy as np
    s = make_session(engine, args.cnn, args)
    inp = s.get_inputs()[0]
    rest = [int(d) for d in inp.shape[1:]]
    while True:
        batch = int(rng.integers(1, args.max_batch + 1))
        s.run(None, {inp.name: rng.standard_normal([batch] + rest).astype(np.float32)})
        if not sampler.ran(s):
            return


WORKLOADS = {"minilm": minilm_workload, "decode": decode_workload, "cnn": cnn_workload}


def child(args):
    import numpy as np
    rng = np.random.default_rng(args.seed)
    sampler = Sampler(args.engine, args.runs)
    start = time.perf_counter()
    WORKLOADS[args.workload](args.engine, args, rng, sampler)
    result = {"seconds": time.perf_counter() - start, "samples": sampler.samples}
    if args.engine == "kiln":
        result.update(held_max=sampler.held_max, held_last=sampler.held_last)
    json.dump(result, sys.stdout)


def summarize(result, runs):
    samples = result["samples"]
    warm = max(50, runs // 4)
    after = [rss for run, rss, _ in samples if run > warm] or [samples[-1][1]]
    at_warm = [rss for run, rss, _ in samples if run <= warm]
    quarter = max(1, len(after) // 4)
    out = {
        "runs": runs,
        "seconds": round(result["seconds"], 1),
        "rss_after_warmup_mib": round((at_warm[-1] if at_warm else after[0]) / MiB, 1),
        "rss_end_mib": round(samples[-1][1] / MiB, 1),
        "rss_max_mib": round(max(rss for _, rss, _ in samples) / MiB, 1),
        "growth_mib": round((statistics.median(after[-quarter:]) - statistics.median(after[:quarter])) / MiB, 2),
        "samples": [[run, rss, held] for run, rss, held in samples],
    }
    if "held_max" in result:
        out["pool_held_max_mib"] = round(result["held_max"] / MiB, 2)
        out["pool_held_end_mib"] = round(result["held_last"] / MiB, 2)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=100000, help="runs per workload and engine")
    p.add_argument("--workloads", default="minilm,decode,cnn")
    p.add_argument("--engines", default="kiln,ort")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=20261207)
    p.add_argument("--small", action="store_true",
                   help="the committed models: bert-tiny (lengths 1..64), whisper-tiny-random, tiny-cnn")
    p.add_argument("--minilm", default=os.path.join(ROOT, "models/cache/all-MiniLM-L6-v2"))
    p.add_argument("--whisper", default=os.path.join(ROOT, "models/cache/whisper-tiny-random"))
    p.add_argument("--cnn", default=os.path.join(ROOT, "models/tiny-cnn/model.onnx"))
    p.add_argument("--max-seq", type=int, default=None)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--max-batch", type=int, default=32)
    p.add_argument("--pool-keep-runs", type=int, default=None,
                   help="kiln's SessionOptions.pool_keep_runs (default: the library's, 64; 0: never freed)")
    p.add_argument("--check", action="store_true", help="exit 1 when kiln's growth is over the limit")
    p.add_argument("--max-growth-mib", type=float, default=2.0)
    p.add_argument("--json", help="write the results here")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--engine", help=argparse.SUPPRESS)
    p.add_argument("--workload", help=argparse.SUPPRESS)
    p.add_argument("--minilm-model", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args)

    if args.small:
        args.minilm_model = os.path.join(ROOT, "models/bert-tiny-ort-optimized/O1/model.onnx")
        args.whisper = os.path.join(ROOT, "models/whisper-tiny-random")
        args.max_seq = args.max_seq or 64
    else:
        args.minilm_model = os.path.join(args.minilm, "model.onnx")
        args.max_seq = args.max_seq or 512
    workloads = args.workloads.split(",")
    engines = args.engines.split(",")
    for w in workloads:
        if w not in WORKLOADS:
            p.error(f"unknown workload {w!r} (have {', '.join(WORKLOADS)})")
    needed = {"minilm": args.minilm_model, "decode": args.whisper, "cnn": args.cnn}
    for w in workloads:
        if not os.path.exists(needed[w]):
            p.error(f"{w}: {needed[w]} does not exist (see models/README.md, or --small)")

    results, failed = {}, []
    print(f"{'workload':8} {'engine':6} {'runs':>7} {'s':>7} {'RSS warm':>9} {'RSS end':>8} "
          f"{'RSS max':>8} {'growth':>7} {'pool held max/end':>18}  (MiB)")
    for w in workloads:
        for e in engines:
            cmd = [sys.executable, os.path.abspath(__file__), "--child", "--engine", e, "--workload", w,
                   "--runs", str(args.runs), "--threads", str(args.threads), "--seed", str(args.seed),
                   "--minilm-model", args.minilm_model, "--whisper", args.whisper, "--cnn", args.cnn,
                   "--max-seq", str(args.max_seq), "--max-tokens", str(args.max_tokens),
                   "--max-batch", str(args.max_batch)]
            if args.pool_keep_runs is not None:
                cmd += ["--pool-keep-runs", str(args.pool_keep_runs)]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                sys.stderr.write(proc.stderr)
                print(f"{w}/{e}: the child failed (exit {proc.returncode})")
                failed.append(f"{w}/{e}")
                continue
            r = summarize(json.loads(proc.stdout), args.runs)
            results[f"{w}/{e}"] = r
            held = (f"{r['pool_held_max_mib']:.2f}/{r['pool_held_end_mib']:.2f}"
                    if "pool_held_max_mib" in r else "")
            print(f"{w:8} {e:6} {r['runs']:7d} {r['seconds']:7.1f} {r['rss_after_warmup_mib']:9.1f} "
                  f"{r['rss_end_mib']:8.1f} {r['rss_max_mib']:8.1f} {r['growth_mib']:7.2f} {held:>18}",
                  flush=True)
            if e == "kiln" and r["growth_mib"] > args.max_growth_mib:
                failed.append(f"{w}/{e}: RSS grew {r['growth_mib']} MiB after warm-up "
                              f"(limit {args.max_growth_mib})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": {k: v for k, v in vars(args).items() if not k.startswith("child")},
                       "results": results}, f, indent=1)
    if failed and (args.check or len(failed) == len(workloads) * len(engines)):
        print("FAILED: " + "; ".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
