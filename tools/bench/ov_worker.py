"""OpenVINO's side of the kiln comparison: the session cases of ort_worker.py run by OpenVINO's
CPU plugin in their own process, printing one JSON object with the same keys (load_ms,
iterations_ms, median_ms, peak RSS...).

    ov_worker.py CASE MODEL --input-dir DIR [--threads N] [--precision f32|default] [--warmup N]
                 [--warmup-ms MS] [--iterations N] [--output-dir DIR] [--static|--dynamic]

CASE is encoder, decoder-step, minilm or run (any model file), as for ort_worker.py; every model
input is read from DIR/NAME.npy. The model is read from the .onnx file by OpenVINO's ONNX
front end and compiled for "CPU" with PERFORMANCE_HINT = LATENCY, INFERENCE_NUM_THREADS = N and,
with --precision f32 (the default), INFERENCE_PRECISION_HINT = f32; --precision default leaves
the precision to the plugin (bf16 or f16 on processors that have them, f32 otherwise) and the
result says which it chose. With --static (the default) the model is first reshaped to the
shapes of the given inputs, as OpenVINO's documentation recommends for fixed-size inputs.

A model OpenVINO cannot read, compile or run gives {"error": "..."} (exit status 0), so that
a comparison can report it and go on.
"""
import argparse
import json
import os
import sys
import time

import numpy as np

from worker_common import MODEL_FILES, current_rss_bytes, peak_rss_bytes, percentile


def precision_name(t):
    """f32, bf16, f16 (an openvino Type)."""
    return t.to_string() if hasattr(t, "to_string") else str(t)


def output_name(port, index):
    try:
        return port.get_any_name()
    except RuntimeError:  # an output without a tensor name
        return f"output_{index}"


def run(args) -> dict:
    import openvino as ov

    path = args.model
    if os.path.isdir(path):
        path = os.path.join(path, MODEL_FILES[args.case])
    rss_before = current_rss_bytes()
    t0 = time.perf_counter()
    core = ov.Core()
    model = core.read_model(path)
    names = [p.get_any_name() for p in model.inputs]
    feed = {}
    for name in names:
        file = os.path.join(args.input_dir, name + ".npy")
        if not os.path.exists(file):
            raise SystemExit(f"ov_worker: {file}: missing (input '{name}')")
        feed[name] = np.load(file)
    if args.static:
        model.reshape({name: ov.PartialShape(list(feed[name].shape)) for name in names})
    config = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": args.threads}
    if args.precision == "f32":
        config["INFERENCE_PRECISION_HINT"] = "f32"
    compiled = core.compile_model(model, "CPU", config)
    request = compiled.create_infer_request()
    load_ms = (time.perf_counter() - t0) * 1000
    inputs = {name: feed[name] for name in names}
    outs = compiled.outputs
    start, it = time.perf_counter(), 0
    while it < args.warmup or (time.perf_counter() - start) * 1000 < args.warmup_ms:
        request.infer(inputs)
        it += 1
    times = []
    for it in range(args.iterations):
        t0 = time.perf_counter()
        request.infer(inputs)
        times.append((time.perf_counter() - t0) * 1000)
    if args.output_dir:
        os.makedirs(args.output_dir, exist_ok=True)
        files = {}
        for i, port in enumerate(outs):
            file = output_name(port, i)
            for c in "/\\:":  # as kiln-bench and onnx-run name their files
                file = file.replace(c, "_")
            np.save(os.path.join(args.output_dir, file + ".npy"), request.get_output_tensor(i).data.copy())
            files[i] = {"file": file + ".npy", "names": sorted(port.get_names())}
        with open(os.path.join(args.output_dir, "outputs.json"), "w") as f:
            json.dump(files, f)  # each output's file and tensor names, in the model's output order
    return {"load_ms": load_ms, "iterations_ms": times, "median_ms": percentile(times, 0.5),
            "p90_ms": percentile(times, 0.9), "min_ms": min(times),
            "inference_precision": precision_name(compiled.get_property("INFERENCE_PRECISION_HINT")),
            "rss_before_load_bytes": rss_before, "peak_rss_bytes": peak_rss_bytes()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("case", choices=["encoder", "decoder-step", "minilm", "run"])
    p.add_argument("model")
    p.add_argument("--input-dir", required=True)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--precision", choices=["f32", "default"], default="f32")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--warmup-ms", type=float, default=0,
                   help="untimed runs go on until this many milliseconds have passed too")
    p.add_argument("--iterations", type=int, default=10)
    p.add_argument("--output-dir")
    p.add_argument("--static", dest="static", action="store_true", default=True,
                   help="reshape the model to the inputs' shapes before compiling (default)")
    p.add_argument("--dynamic", dest="static", action="store_false", help="compile the model as it is")
    args = p.parse_args()
    if args.threads < 1 or args.iterations < 1 or args.warmup < 0:
        p.error("--threads and --iterations must be >= 1, --warmup >= 0")
    import openvino as ov

    head = {"engine": "openvino", "version": ov.__version__, "case": args.case, "model": args.model,
            "threads": args.threads, "precision": args.precision, "warmup": args.warmup,
            "iterations": args.iterations}
    try:
        result = run(args)
    except SystemExit:
        raise
    except Exception as e:  # OpenVINO's errors are RuntimeErrors with long messages
        message = " ".join(str(e).split())
        result = {"error": message[:600]}
    print(json.dumps({**head, **result}))


if __name__ == "__main__":
    sys.exit(main())
