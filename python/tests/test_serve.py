"""kiln.serve on a real local Ray (loopback only): two replicas of models/tiny-cnn answering
concurrent JSON and .npy requests, checked against a direct kiln.InferenceSession run, with
requests stacked into batches; the Whisper endpoint against the committed transformers
references. Ray is shut down at the end whatever happens, and no process of it may remain."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import kiln
from conftest import TINY_CNN, WHISPER

pytestmark = pytest.mark.serve

import ray
from ray import serve

from kiln.serve import build_app

DEPLOY_TIMEOUT_S = 120
REQUEST_TIMEOUT_S = 30
CLIENTS = 8
REQUESTS = 64

TRANSCRIPTS = json.loads((WHISPER / "expected_transcripts.json").read_text())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (from /proc), such as the Ray processes it started."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def deploy(app, name: str) -> None:
    """serve.run, given DEPLOY_TIMEOUT_S to have the application running."""
    error: list[BaseException] = []

    def run() -> None:
        try:
            serve.run(app, name=name, route_prefix=f"/{name}")
        except BaseException as e:  # noqa: BLE001 - reported by the caller
            error.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(DEPLOY_TIMEOUT_S)
    if thread.is_alive():
        raise TimeoutError(f"{name} was not running after {DEPLOY_TIMEOUT_S} s")
    if error:
        raise error[0]


@pytest.fixture(scope="module", autouse=True)
def ray_tmpdir():
    """Ray's session files (logs, sockets) in a folder of the tests' own, removed after; short,
    as Ray's socket paths must be."""
    folder = tempfile.mkdtemp(prefix="kiln-ray-")
    before = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = folder  # this process's Ray and python -m kiln.serve's
    yield folder
    if before is None:
        del os.environ["RAY_TMPDIR"]
    else:
        os.environ["RAY_TMPDIR"] = before
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def server(ray_tmpdir):
    port = free_port()
    # Loopback only: conftest.py keeps Ray to one node on 127.0.0.1.
    ray.init(address="local", include_dashboard=False, num_cpus=2, log_to_driver=False)
    assert ray.util.get_node_ip_address() == "127.0.0.1"
    started: set[int] = set()
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        # Two replicas sharing the 2 CPUs with the Whisper one; a wait long enough for the
        # concurrent clients' requests to meet in batches.
        deploy(build_app(TINY_CNN / "model.onnx", replicas=2, max_batch_size=8,
                         batch_wait_ms=30, num_cpus=0.5), "cnn")
        deploy(build_app(WHISPER, num_cpus=0.5), "whisper")
        started = descendants(os.getpid())
        yield f"http://127.0.0.1:{port}"
    finally:
        started |= descendants(os.getpid())
        try:
            serve.shutdown()
        finally:
            ray.shutdown()
    deadline = time.monotonic() + 30
    while any(alive(p) for p in started) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in started if alive(p)], "Ray processes left after ray.shutdown()"


def post(url: str, body: bytes, content_type: str, accept: str = "application/json"):
    request = urllib.request.Request(url, data=body, method="POST",
                                     headers={"Content-Type": content_type, "Accept": accept})
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=REQUEST_TIMEOUT_S) as response:
        return json.loads(response.read())


def npy(a: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, a)
    return buffer.getvalue()


def test_the_command_line_serves_until_interrupted(tmp_path) -> None:
    """python -m kiln.serve on its own local Ray: answers, then stops cleanly on Ctrl-C.
    Runs before the module's Ray is started (the fixture's first user comes after it)."""
    port = free_port()
    log = (tmp_path / "serve.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "kiln.serve", str(TINY_CNN / "model.onnx"), "--port", str(port),
         "--replicas", "1", "--route-prefix", "/tiny"], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + DEPLOY_TIMEOUT_S
        while True:
            assert process.poll() is None, (tmp_path / "serve.log").read_text()[-2000:]
            try:
                meta = get(f"http://127.0.0.1:{port}/tiny")
                break
            except (urllib.error.URLError, ConnectionError):
                assert time.monotonic() < deadline, "python -m kiln.serve did not come up"
                time.sleep(0.5)
        assert meta["outputs"][0]["name"] == "probs"
        image = np.zeros((1, 3, 32, 32), np.float32)
        status, _, body = post(f"http://127.0.0.1:{port}/tiny", npy(image), "application/x-npy")
        assert status == 200 and np.array(json.loads(body)["outputs"]["probs"]).shape == (1, 10)
        started = descendants(process.pid)
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0
        deadline = time.monotonic() + 30
        while any(alive(p) for p in started) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [p for p in started if alive(p)], "Ray processes left by python -m kiln.serve"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        log.close()


def test_metadata_and_replicas(server) -> None:
    meta = get(f"{server}/cnn")
    assert meta["inputs"] == [{"name": "image", "shape": ["batch", 3, 32, 32],
                               "type": "tensor(float)"}]
    assert meta["batching"] and meta["max_batch_size"] == 8
    status = serve.status().applications
    assert status["cnn"].deployments["ModelServer"].replica_states == {"RUNNING": 2}
    assert get(f"{server}/whisper")["kind"] == "whisper"
    # check_health on every replica, as Serve calls it.
    assert serve.get_app_handle("cnn").check_health.remote().result(timeout_s=30) is None


def test_concurrent_requests_match_a_direct_run(server) -> None:
    session = kiln.InferenceSession(str(TINY_CNN / "model.onnx"))
    rng = np.random.default_rng(7)
    images = [rng.standard_normal((int(rng.integers(1, 4)), 3, 32, 32), dtype=np.float32)
              for _ in range(REQUESTS)]

    def send(i: int):
        if i % 2:  # .npy in and out
            status, headers, body = post(f"{server}/cnn", npy(images[i]), "application/x-npy",
                                         "application/x-npy")
            got = np.load(io.BytesIO(body)) if status == 200 else body
        else:
            request = json.dumps({"inputs": {"image": images[i].tolist()}}).encode()
            status, headers, body = post(f"{server}/cnn", request, "application/json")
            got = np.array(json.loads(body)["outputs"]["probs"], np.float32) \
                if status == 200 else body
        return status, headers, got

    with ThreadPoolExecutor(CLIENTS) as pool:
        answers = list(pool.map(send, range(REQUESTS), timeout=DEPLOY_TIMEOUT_S))
    batch_sizes = []
    for image, (status, headers, got) in zip(images, answers):
        assert status == 200, got
        (expected,) = session.run(None, {"image": image})
        # A stacked run may block its GEMMs differently from a run of this request alone.
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
        batch_sizes.append(int(headers["X-Kiln-Batch-Size"]))
    assert max(batch_sizes) > 1, f"no request was batched: {batch_sizes}"


def test_npz_in_and_bad_requests(server) -> None:
    image = np.ones((2, 3, 32, 32), np.float32)
    buffer = io.BytesIO()
    np.savez(buffer, image=image)
    status, _, body = post(f"{server}/cnn?outputs=probs", buffer.getvalue(), "application/x-npz",
                           "application/x-npz")
    assert status == 200
    with np.load(io.BytesIO(body)) as npz:
        expected = kiln.InferenceSession(str(TINY_CNN / "model.onnx")).run(None, {"image": image})
        np.testing.assert_allclose(npz["probs"], expected[0], rtol=1e-5, atol=1e-6)
    status, _, body = post(f"{server}/cnn", b"{", "application/json")
    assert status == 400 and "the body is not JSON" in json.loads(body)["error"]
    status, _, body = post(f"{server}/cnn", npy(np.ones((1, 3, 8, 8), np.float32)),
                           "application/x-npy")
    assert status == 400 and "image" in json.loads(body)["error"]


@pytest.mark.parametrize("name", ["greedy_en_transcribe", "greedy_timestamps"])
def test_whisper_transcribes_posted_audio(server, name: str) -> None:
    case = next(c for c in TRANSCRIPTS["cases"] if c["name"] == name)
    query = "&".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}"
                     for k, v in case["generate_kwargs"].items())
    status, _, body = post(f"{server}/whisper?{query}", (WHISPER / case["input"]).read_bytes(),
                           "audio/wav")
    assert status == 200, body
    result = json.loads(body)
    assert result["tokens"] == case["sequence"]
    assert result["text"] == case["text"]
    if "segments" in case:
        def times(segments):
            return [t for s in segments for t in (s["start"], s["end"])]
        assert times(result["segments"]) == pytest.approx(times(case["segments"]))


def test_whisper_refuses_what_is_not_audio(server) -> None:
    status, _, body = post(f"{server}/whisper", b"not audio at all", "audio/wav")
    assert status == 400 and "the request body" in json.loads(body)["error"]
    status, _, body = post(f"{server}/whisper?beams=3", b"x", "audio/wav")
    assert status == 400 and "unknown parameter 'beams'" in json.loads(body)["error"]
