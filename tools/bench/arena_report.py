#!/usr/bin/env python3
"""Activation-arena report over ONNX backend-test models.

For every model under light/ and pytorch-converted/ it runs onnx-run three times with the
same inputs (the arena is planned on the second run and used on the third) and reports the
arena size, its lower bound (the most bytes alive at once), and what the buffer pool
obtained for one run without the arena. Prints a Markdown table.

  python3 tools/bench/arena_report.py --onnx-run build/tools/onnx-run \
      --data ../shared/onnx-backend-tests

With --from-shapes it reports the arena planned before the first run from the shapes
inferred for its inputs (onnx-run --repeat 1): whether the model could be planned so, that
arena's size, the requests of the first run it did not foresee (a kernel's scratch buffers;
served by the pool), and the arena recorded from a run (--arena-from-recording) beside it.

With --inputs-in-arena it compares instead the arena without and with graph inputs in it
(onnx-run --inputs-in-arena): both arenas, the input bytes the third run placed in the
arena, and the bytes saved against keeping the inputs beside the arena.

Needs numpy and onnx (tools/export/requirements-onnx.txt) only for the light/ models, whose
all-zero inputs it writes as .npy files.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile


def run(onnx_run, model, args):
    cmd = [onnx_run, model, "--json"] + args
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode not in (0, 1):
        raise RuntimeError(f"{' '.join(cmd)}: exit {p.returncode}: {p.stderr.strip()}")
    return json.loads(p.stdout)


def zero_inputs(model, folder):
    import numpy as np
    import onnx

    m = onnx.load(model, load_external_data=False)
    init = {i.name for i in m.graph.initializer}
    args = []
    for inp in m.graph.input:
        if inp.name in init:
            continue
        t = inp.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else 1 for d in t.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(t.elem_type)
        path = os.path.join(folder, inp.name.replace("/", "_") + ".npy")
        np.save(path, np.zeros(shape, dtype=dtype))
        args += ["--input", f"{inp.name}={path}"]
    return args


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--onnx-run", default="build/tools/onnx-run")
    ap.add_argument("--data", default=os.environ.get("ONNX_BACKEND_TEST_DATA",
                                                     "../shared/onnx-backend-tests"))
    ap.add_argument("--inputs-in-arena", action="store_true",
                    help="compare the arena without and with the graph inputs in it")
    ap.add_argument("--from-shapes", action="store_true",
                    help="the arena planned from inferred shapes before the first run")
    a = ap.parse_args()
    cases = []
    light = os.path.join(a.data, "light")
    for f in sorted(os.listdir(light)):
        if f.endswith(".onnx"):
            cases.append(("light/" + f[:-5], os.path.join(light, f), None))
    conv = os.path.join(a.data, "pytorch-converted")
    for d in sorted(os.listdir(conv)):
        model = os.path.join(conv, d, "model.onnx")
        if os.path.exists(model):
            cases.append(("pytorch-converted/" + d, model, os.path.join(conv, d, "test_data_set_0")))

    if a.inputs_in_arena:
        inputs_report(a, cases)
        return
    if a.from_shapes:
        shapes_report(a, cases)
        return
    print("| model | arena bytes | lower bound | arena / bound | pool, one run without arena |")
    print("|---|---|---|---|---|")
    totals = [0, 0, 0]
    with tempfile.TemporaryDirectory() as tmp:
        for name, model, data in cases:
            args = ["--test-data", data] if data else zero_inputs(model, tmp)
            with_arena = run(a.onnx_run, model, args + ["--repeat", "3"])["run_stats"]
            pool = run(a.onnx_run, model, args + ["--repeat", "1", "--no-arena"])["run_stats"]
            arena, bound = with_arena["arena_bytes"], with_arena["arena_lower_bound"]
            if with_arena["arena_missed"] != 0:
                print(f"{name}: the third run diverged from the plan", file=sys.stderr)
            ratio = f"{arena / bound:.3f}" if bound else "-"
            print(f"| {name} | {arena:,} | {bound:,} | {ratio} | {pool['bytes_allocated']:,} |")
            totals[0] += arena
            totals[1] += bound
            totals[2] += pool["bytes_allocated"]
    print(f"| **all {len(cases)}** | {totals[0]:,} | {totals[1]:,} | "
          f"{totals[0] / totals[1]:.3f} | {totals[2]:,} |")


def shapes_report(a, cases):
    print("| model | first run: arena from shapes | unforeseen requests | served | "
          "recorded arena | from shapes / recorded |")
    print("|---|---|---|---|---|---|")
    planned, totals = 0, [0, 0]
    with tempfile.TemporaryDirectory() as tmp:
        for name, model, data in cases:
            args = ["--test-data", data] if data else zero_inputs(model, tmp)
            first = run(a.onnx_run, model, args + ["--repeat", "1"])["run_stats"]
            recorded = run(a.onnx_run, model,
                           args + ["--repeat", "3", "--arena-from-recording"])["run_stats"]
            if not first["arena_from_shapes"]:
                print(f"| {name} | not planned | - | - | {recorded['arena_bytes']:,} | - |")
                continue
            planned += 1
            totals[0] += first["arena_bytes"]
            totals[1] += recorded["arena_bytes"]
            ratio = (f"{first['arena_bytes'] / recorded['arena_bytes']:.3f}"
                     if recorded["arena_bytes"] else "-")
            print(f"| {name} | {first['arena_bytes']:,} | {first['arena_missed']:,} | "
                  f"{first['arena_served']:,} | {recorded['arena_bytes']:,} | {ratio} |")
    ratio = f"{totals[0] / totals[1]:.3f}" if totals[1] else "-"
    print(f"| **{planned} of {len(cases)} planned from shapes** | {totals[0]:,} | | | "
          f"{totals[1]:,} | {ratio} |")


def inputs_report(a, cases):
    print("| model | arena, inputs beside it | arena with inputs | input bytes in it | "
          "saved |")
    print("|---|---|---|---|---|")
    totals = [0, 0, 0, 0]
    with tempfile.TemporaryDirectory() as tmp:
        for name, model, data in cases:
            args = (["--test-data", data] if data else zero_inputs(model, tmp)) + ["--repeat", "3"]
            beside = run(a.onnx_run, model, args)["run_stats"]
            within = run(a.onnx_run, model, args + ["--inputs-in-arena"])["run_stats"]
            for stats in (beside, within):
                if stats["arena_missed"] != 0:
                    print(f"{name}: the third run diverged from the plan", file=sys.stderr)
            # Inputs outside the arena occupy their own bytes for the whole run.
            before = beside["arena_bytes"] + within["arena_input_bytes"]
            saved = before - within["arena_bytes"]
            print(f"| {name} | {beside['arena_bytes']:,} | {within['arena_bytes']:,} | "
                  f"{within['arena_input_bytes']:,} | {saved:,} |")
            for k, v in enumerate((beside["arena_bytes"], within["arena_bytes"],
                                   within["arena_input_bytes"], saved)):
                totals[k] += v
    print(f"| **all {len(cases)}** | {totals[0]:,} | {totals[1]:,} | {totals[2]:,} | "
          f"{totals[3]:,} |")


if __name__ == "__main__":
    main()
