#!/usr/bin/env python3
"""Checks kiln's layering: every #include "..." in engine/, proto/, ops/ and tools/ against
the layers the including file's layer may use (docs/architecture.md, "Layers").

    check_layers.py SOURCE_DIR

Prints one line per illegal include (FILE:LINE: ...) and exits 1; exits 0 when every include
is allowed. An include naming no layer's file (a path not from the repository root, a header
that does not exist) is illegal too, and so is an exception below that nothing needs any more.
"""

import pathlib
import re
import sys

# Each layer is the files under its folders; the longest matching folder decides.
LAYERS = {
    "kiln": ["engine/include/kiln/"],  # the public API
    "util": ["engine/util/"],
    "ir": ["engine/ir/"],
    "proto": ["proto/"],
    "ops": ["ops/"],  # the kernels, ops/math included
    "passes": ["engine/passes/"],
    "plan": ["engine/plan/"],
    "runtime": ["engine/runtime/"],
    "generate": ["engine/generate/"],
    "tools": ["tools/"],
}

# What layers above the kernels may see of them: the op contract, the registry and the
# inference that runs the contracts' shape rules over a graph.
OP_CONTRACT = ["ops/core/kernel.h", "ops/core/contract.h", "ops/core/inference.h"]

# Per layer: the layers (names) and single headers (paths) its files may include.
ALLOWED = {
    "kiln": ["kiln"],
    "util": ["kiln", "util"],
    "ir": ["kiln", "ir"],
    "proto": ["kiln", "util", "ir", "proto"],
    "ops": ["kiln", "util", "ir", "ops"],
    "passes": ["kiln", "util", "ir", "passes", *OP_CONTRACT],
    "plan": ["kiln", "util", "ir", "plan", *OP_CONTRACT],
    "runtime": ["kiln", "util", "ir", "proto", "passes", "plan", "runtime", *OP_CONTRACT],
    "generate": ["kiln", "util", "generate"],
    # json_file.h is header-only (nlohmann-json reading with kiln::Error).
    "tools": ["kiln", "tools", "engine/util/json_file.h"],
}

# (including file, included header) pairs allowed against the matrix, each with its reason.
EXCEPTIONS = {
    # `kiln-bench gemm` measures the GEMM layer itself, beside Eigen (docs/benchmarks.md).
    ("tools/bench/kiln-bench/gemm_case.cpp", "ops/math/gemm.h"),
}

# Include roots: the repository, and engine/include for the public headers ("kiln/...").
PUBLIC_ROOT = "engine/include/"

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
SOURCES = ("*.h", "*.cpp")


def resolve(header):
    """The repository path an include names."""
    return PUBLIC_ROOT + header if header.startswith("kiln/") else header


def layer_of(path):
    best = None
    for layer, folders in LAYERS.items():
        for folder in folders:
            if path.startswith(folder) and (best is None or len(folder) > len(best[1])):
                best = (layer, folder)
    return best[0] if best else None


def allowed(layer, header):
    rules = ALLOWED[layer]
    return header in rules or layer_of(header) in rules


def main():
    if len(sys.argv) != 2:
        print("usage: check_layers.py SOURCE_DIR", file=sys.stderr)
        return 2
    root = pathlib.Path(sys.argv[1]).resolve()
    problems, used, checked = [], set(), 0
    for top in sorted({folder.split("/")[0] for folders in LAYERS.values() for folder in folders}):
        for pattern in SOURCES:
            for file in sorted((root / top).rglob(pattern)):
                # Hidden folders (a benchmark's .venv under tools/bench) hold no kiln source.
                if any(part.startswith(".") for part in file.relative_to(root).parts):
                    continue
                rel = file.relative_to(root).as_posix()
                layer = layer_of(rel)
                if layer is None:
                    continue
                for number, line in enumerate(file.read_text(errors="replace").splitlines(), 1):
                    m = INCLUDE.match(line)
                    if not m:
                        continue
                    checked += 1
                    header = resolve(m.group(1))
                    where = f"{rel}:{number}"
                    if layer_of(header) is None or not (root / header).is_file():
                        problems.append(f'{where}: "{header}" is no layer\'s file '
                                        "(include headers by their path from the repository root)")
                    elif (rel, header) in EXCEPTIONS:
                        used.add((rel, header))
                    elif not allowed(layer, header):
                        problems.append(f'{where}: layer {layer} may not include "{header}" '
                                        f"(layer {layer_of(header)}; {layer} may include: "
                                        f"{', '.join(ALLOWED[layer])})")
    for rel, header in sorted(EXCEPTIONS - used):
        problems.append(f'{rel}: no longer includes "{header}": remove its exception from '
                        "test/build/check_layers.py")
    for p in problems:
        print(p)
    if problems:
        print(f"check_layers: {len(problems)} illegal include(s)")
        return 1
    print(f"check_layers: {checked} includes follow the layers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
