"""Memory over changing shapes, CI-sized: tools/bench/soak.py's three workloads (a BERT encoder
at random sequence lengths, a Whisper decode loop over utterances of random lengths, a CNN at
random batch sizes) on the committed models, 2,000 runs each, each in a process of its own.
After warm-up the resident memory may not grow by more than 2 MiB, and the pool holds, after
every run, no more than what a run at the largest shapes needs: buffers no run of the last
SessionOptions.pool_keep_runs used are given back."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import REPO

SOAK = REPO / "tools" / "bench" / "soak.py"


def test_memory_stays_flat_under_changing_shapes(tmp_path):
    out = tmp_path / "soak.json"
    proc = subprocess.run([sys.executable, str(SOAK), "--small", "--runs", "2000", "--engines", "kiln",
                           "--check", "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads(out.read_text())["results"]
    assert set(results) == {"minilm/kiln", "decode/kiln", "cnn/kiln"}
    for name, r in results.items():
        assert r["runs"] == 2000, name
        assert r["growth_mib"] <= 2.0, (name, r)
        # Held between runs: bounded by the largest run's buffers, far below the process.
        assert 0 < r["pool_held_max_mib"] < 16, (name, r)
        assert r["pool_held_end_mib"] <= r["pool_held_max_mib"], (name, r)
