"""run() releases the GIL: Python threads run one session at once, and a run can be stopped
from another thread while it is going."""

from __future__ import annotations

import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import kiln
from conftest import REPO, TINY_CNN

ENDLESS_LOOP = REPO / "test" / "cli" / "data" / "endless_loop.onnx"


def test_threads_running_one_session_get_their_own_results():
    session = kiln.InferenceSession(str(TINY_CNN / "model.onnx"))
    rng = np.random.default_rng(0)
    images = [rng.random((2, 3, 32, 32), dtype=np.float32) for _ in range(16)]
    expected = [session.run(None, {"image": x})[0].copy() for x in images]

    def work(i: int) -> bool:
        ok = True
        for _ in range(10):
            (got,) = session.run(None, {"image": images[i]})
            ok = ok and np.array_equal(got, expected[i])
        return ok

    with ThreadPoolExecutor(max_workers=8) as pool:
        assert all(pool.map(work, range(len(images))))


def endless_loop_feed(session: kiln.InferenceSession) -> dict:
    return {i.name: np.zeros([d if isinstance(d, int) else 1 for d in i.shape],
                             dtype=np.int64 if "int64" in i.type else np.float32)
            for i in session.get_inputs()}


def test_terminate_stops_a_run_from_another_thread():
    session = kiln.InferenceSession(str(ENDLESS_LOOP))
    feed = endless_loop_feed(session)
    options = kiln.RunOptions()
    outcome: dict = {}

    def run() -> None:
        try:
            session.run(None, feed, options)
        except kiln.KilnError as error:
            outcome["error"] = error

    worker = threading.Thread(target=run)
    worker.start()
    # This thread keeps running Python while the run goes on: the GIL is released.
    time.sleep(0.3)
    assert worker.is_alive() and "error" not in outcome
    options.terminate = True
    worker.join(timeout=30)
    assert not worker.is_alive()
    assert isinstance(outcome["error"], kiln.RunCancelledError)
    assert "cancelled" in str(outcome["error"])
    # Runs started while terminate is set stop at once; clearing it lets them go again.
    with pytest.raises(kiln.RunCancelledError):
        session.run(None, feed, options)
    # A timeout stops the endless run by itself. Checked by what it guarantees, not by how
    # long it took: the run ends with the deadline's error (a watchdog that terminates it
    # after minutes only keeps a broken deadline from hanging the suite, and fails the match).
    options.terminate = False
    options.timeout = 0.2
    timed = threading.Thread(target=run)
    outcome.clear()
    timed.start()
    timed.join(timeout=300)
    if timed.is_alive():
        options.terminate = True
        timed.join()
    assert isinstance(outcome["error"], kiln.RunCancelledError)
    assert re.search("deadline|timeout|time", str(outcome["error"]))
