"""Shared paths and helpers for the kiln package's tests."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

# Ray (kiln.serve's tests) stays on this machine: a single-node instance on the loopback
# address (Ray's "no cluster" mode), and no usage statistics sent. Set before Ray is imported.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

REPO = Path(__file__).resolve().parents[2]
MODELS = REPO / "models"
TINY_CNN = MODELS / "tiny-cnn"
GPT2 = MODELS / "gpt2-tiny-random"
WHISPER = MODELS / "whisper-tiny-random"
# Made on demand (models/README.md), never committed: tests using it skip without it.
MINILM = MODELS / "cache" / "all-MiniLM-L6-v2"


def read_test_data(folder: Path) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The inputs and expected outputs of an ONNX test-data folder (input_K.pb, output_K.pb)."""
    def load(prefix: str) -> list[np.ndarray]:
        files = sorted(folder.glob(f"{prefix}_*.pb"), key=lambda p: int(p.stem.split("_")[1]))
        return [numpy_helper.to_array(onnx.load_tensor(str(f))) for f in files]
    return load("input"), load("output")


def gpt2_expected() -> dict:
    return json.loads((GPT2 / "expected_tokens.json").read_text())


def require(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"{path.relative_to(REPO)} is absent (made on demand, see models/README.md)")
    return path
