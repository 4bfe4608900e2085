"""onnxruntime's side of the kiln comparison: the same cases as kiln-bench, run in their own
process, printing one JSON object with the same keys (load_ms, iterations_ms, peak RSS...).

    ort_worker.py CASE MODEL --input-dir DIR [--threads N] [--warmup N] [--warmup-ms MS] [--iterations N]
                  [--steps N] [--output-dir DIR]

CASE is encoder, decoder-step, minilm, decode or run (any model file; see kiln-bench). Every model input is read
from DIR/NAME.npy. Sessions use intra_op_num_threads=N, inter_op_num_threads=1 and the
default graph optimizations. The decode case drives the merged decoder the way Optimum does:
step 0 with the prompt and empty caches, then one token a step, present.* fed back as
past_key_values.* (onnxruntime allocates new presents and copies the caches every step).
"""
import argparse
import json
import os
import sys
import time

import numpy as np
import onnxruntime as ort

from worker_common import MODEL_FILES, current_rss_bytes, peak_rss_bytes, percentile


def session(path: str, threads: int) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])


def load_inputs(sess: ort.InferenceSession, input_dir: str) -> dict:
    feed = {}
    for i in sess.get_inputs():
        path = os.path.join(input_dir, i.name + ".npy")
        if not os.path.exists(path):
            raise SystemExit(f"ort_worker: {path}: missing (input '{i.name}')")
        feed[i.name] = np.load(path)
    return feed


def run_session_case(args) -> dict:
    path = args.model
    if os.path.isdir(path):
        path = os.path.join(path, MODEL_FILES[args.case])
    rss_before = current_rss_bytes()
    t0 = time.perf_counter()
    sess = session(path, args.threads)
    load_ms = (time.perf_counter() - t0) * 1000
    feed = load_inputs(sess, args.input_dir)
    names = [o.name for o in sess.get_outputs()]
    times, present_bytes = [], []
    # Untimed runs: --warmup of them, and more until --warmup-ms have passed.
    start, it = time.perf_counter(), 0
    while it < args.warmup or (time.perf_counter() - start) * 1000 < args.warmup_ms:
        sess.run(None, feed)
        it += 1
    for it in range(args.iterations):
        t0 = time.perf_counter()
        outs = sess.run(None, feed)
        ms = (time.perf_counter() - t0) * 1000
        if it + 1 == args.iterations and args.output_dir:
            os.makedirs(args.output_dir, exist_ok=True)
            for n, v in zip(names, outs):
                np.save(os.path.join(args.output_dir, n + ".npy"), v)
        times.append(ms)
        present_bytes.append(sum(v.nbytes for n, v in zip(names, outs) if n.startswith("present")))
        del outs
    result = {"load_ms": load_ms, "iterations_ms": times, "median_ms": percentile(times, 0.5),
              "p90_ms": percentile(times, 0.9), "min_ms": min(times)}
    if any(n.startswith("present") for n in names):
        result["present_bytes"] = present_bytes[-1]
    result.update({"rss_before_load_bytes": rss_before, "peak_rss_bytes": peak_rss_bytes()})
    return result


def generation_settings(model_dir: str):
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    gen = {}
    if os.path.exists(os.path.join(model_dir, "generation_config.json")):
        with open(os.path.join(model_dir, "generation_config.json")) as f:
            gen = json.load(f)
    prompt = [gen.get("decoder_start_token_id", cfg["decoder_start_token_id"])]
    for pos, token in gen.get("forced_decoder_ids") or []:
        assert pos == len(prompt), "forced_decoder_ids must force consecutive positions"
        prompt.append(token)
    eos = gen.get("eos_token_id", cfg.get("eos_token_id"))
    eos = eos if isinstance(eos, list) else [eos]
    return prompt, eos, gen.get("suppress_tokens") or [], gen.get("begin_suppress_tokens") or []


def generate(enc, dec, features, prompt, eos, suppress, begin_suppress, steps):
    """Greedy decoding for `steps` decoder runs with the stop tokens suppressed, as kiln's
    Seq2SeqGenerator does with min_new_tokens = max_new_tokens."""
    t0 = time.perf_counter()
    hidden = enc.run(None, {"input_features": features})[0]
    encoder_ms = (time.perf_counter() - t0) * 1000
    inputs = {i.name: i for i in dec.get_inputs()}
    out_names = [o.name for o in dec.get_outputs()]
    past = {n: np.zeros((1, i.shape[1], 0, i.shape[3]), np.float32)
            for n, i in inputs.items() if n.startswith("past_key_values")}
    ids = np.array([prompt], np.int64)
    tokens, records = [], []
    for step in range(steps):
        t0 = time.perf_counter()
        past_len = 0 if step == 0 else next(v.shape[2] for n, v in past.items() if ".decoder." in n)
        feed = {"input_ids": ids, "encoder_hidden_states": hidden, "use_cache_branch": np.array([step > 0])}
        feed.update(past)
        outs = dict(zip(out_names, dec.run(None, feed)))
        logits = outs["logits"][0, -1].copy()
        logits[suppress] = -np.inf
        if step == 0:
            logits[begin_suppress] = -np.inf
        logits[eos] = -np.inf
        token = int(logits.argmax())
        present_bytes = sum(v.nbytes for n, v in outs.items() if n.startswith("present"))
        for n in past:
            if step == 0 or ".decoder." in n:
                past[n] = outs[n.replace("past_key_values", "present")]
        ids = np.array([[token]], np.int64)
        ms = (time.perf_counter() - t0) * 1000
        # Outside the timed part: how close the runner-up was, to tell a near-tie that float
        # rounding decides from a real disagreement when two engines pick different tokens.
        top2 = np.partition(logits, -2)[-2:]
        tokens.append(token)
        records.append({"step": step, "past_len": past_len, "ms": ms, "present_bytes": present_bytes,
                        "top2_gap": float(top2[1] - top2[0])})
    return encoder_ms, tokens, records


def run_decode_case(args) -> dict:
    prompt, eos, suppress, begin_suppress = generation_settings(args.model)
    rss_before = current_rss_bytes()
    t0 = time.perf_counter()
    enc = session(os.path.join(args.model, "encoder_model.onnx"), args.threads)
    dec = session(os.path.join(args.model, "decoder_model_merged.onnx"), args.threads)
    load_ms = (time.perf_counter() - t0) * 1000
    features = np.load(os.path.join(args.input_dir, "input_features.npy"))
    for _ in range(args.warmup):
        generate(enc, dec, features, prompt, eos, suppress, begin_suppress, args.steps)
    encoder_ms, tokens, steps = generate(enc, dec, features, prompt, eos, suppress, begin_suppress, args.steps)
    return {"load_ms": load_ms, "encoder_ms": encoder_ms, "decode_ms": sum(s["ms"] for s in steps),
            "prompt": prompt, "tokens": tokens, "steps": steps,
            "rss_before_load_bytes": rss_before, "peak_rss_bytes": peak_rss_bytes()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("case", choices=["encoder", "decoder-step", "minilm", "decode", "run"])
    p.add_argument("model")
    p.add_argument("--input-dir", required=True)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--warmup-ms", type=float, default=0,
                   help="untimed runs go on until this many milliseconds have passed too (not decode)")
    p.add_argument("--iterations", type=int, default=10)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--output-dir")
    args = p.parse_args()
    if args.warmup is None:
        args.warmup = 1 if args.case == "decode" else 3
    if args.threads < 1 or args.iterations < 1 or args.warmup < 0 or args.steps < 1:
        p.error("--threads, --iterations and --steps must be >= 1, --warmup >= 0")
    result = run_decode_case(args) if args.case == "decode" else run_session_case(args)
    head = {"engine": "onnxruntime", "version": ort.__version__, "case": args.case, "model": args.model,
            "threads": args.threads, "warmup": args.warmup}
    if args.case != "decode":
        head["iterations"] = args.iterations
    print(json.dumps({**head, **result}))


if __name__ == "__main__":
    sys.exit(main())
