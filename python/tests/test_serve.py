"""kiln.serve on a real local Ray (loopback only): two replicas of models/tiny-cnn answering
concurrent JSON and .npy requests, checked against a direct kiln.InferenceSession run, with
requests stacked into batches; the Whisper endpoint against the committed transformers
references; and faults: bodies over the limit (413), malformed bodies (400 naming the
input), a replica killed under load (replaced, no request hung or answered wrongly), more
requests than the queue bound (503). Ray is shut down at the end whatever happens, and no
process of it may remain."""

from __future__ import annotations

import collections
import http.client
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
import wave
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln
from conftest import REPO, TINY_CNN, WHISPER
from models import model, tensor

pytestmark = pytest.mark.serve

import ray
from ray import serve

from kiln.serve import build_app, codec

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
        deploy(build_app(WHISPER, num_cpus=0.5,
                         vad=REPO / "models" / "vad-energy" / "model.onnx"), "whisper")
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


def test_whisper_filters_silence_when_asked(server) -> None:
    # 40 s of silence: with vad=true nothing is transcribed and no region is kept.
    wav = io.BytesIO()
    with wave.open(wav, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(bytes(2 * 16000 * 40))
    status, _, body = post(f"{server}/whisper?vad=true&vad_min_silence_ms=1000&language=en",
                           wav.getvalue(), "audio/wav")
    assert status == 200, body
    result = json.loads(body)
    assert result["text"] == "" and result["segments"] == [] and result["speech_regions"] == []
    status, _, body = post(f"{server}/whisper?vad_threshold=0.3", wav.getvalue(), "audio/wav")
    assert status == 400 and "without vad=true" in json.loads(body)["error"]


def test_whisper_refuses_what_is_not_audio(server) -> None:
    status, _, body = post(f"{server}/whisper", b"not audio at all", "audio/wav")
    assert status == 400 and "the request body" in json.loads(body)["error"]
    status, _, body = post(f"{server}/whisper?beams=3", b"x", "audio/wav")
    assert status == 400 and "unknown parameter 'beams'" in json.loads(body)["error"]


# Faults. Each test deploys an application of its own and deletes it after.

def npz(**arrays) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def npy_declaring(shape: tuple, data: bytes) -> bytes:
    """An .npy file whose header declares `shape` (float32) followed by `data`."""
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": "<f4", "fortran_order": False,
                                                  "shape": shape})
    return buffer.getvalue() + data


def error_of(body: bytes) -> str:
    return json.loads(body)["error"]


def chunked_post(url: str, chunks, content_type: str = "application/x-npy"):
    """A POST whose body has no length (Transfer-Encoding: chunked), as streaming clients send."""
    address, _, path = url.removeprefix("http://").partition("/")
    host, port = address.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=REQUEST_TIMEOUT_S)
    try:
        conn.request("POST", "/" + path, body=iter(chunks), encode_chunked=True,
                     headers={"Content-Type": content_type, "Transfer-Encoding": "chunked"})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def declared_post(url: str, length: int):
    """A POST that declares a body of `length` bytes and sends only its first KiB: a server
    that checks Content-Length answers before the rest would arrive."""
    address, _, path = url.removeprefix("http://").partition("/")
    host, port = address.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=REQUEST_TIMEOUT_S)
    try:
        conn.putrequest("POST", "/" + path)
        conn.putheader("Content-Type", "application/x-npy")
        conn.putheader("Content-Length", str(length))
        conn.endheaders()
        conn.send(b"\0" * 1024)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


@pytest.mark.parametrize("route", ["cnn", "whisper"])
def test_a_body_over_the_default_limit_is_refused_before_it_is_read(server, route) -> None:
    assert get(f"{server}/{route}")["max_body_bytes"] == codec.DEFAULT_MAX_BODY_BYTES == 32 << 20
    status, body = declared_post(f"{server}/{route}", (32 << 20) + 1)
    assert status == 413 and "over the server's limit of 32 MiB" in error_of(body)


@pytest.mark.parametrize("name, body, content_type, status, message", [
    ("float64", npy(np.zeros((1, 3, 32, 32))), "application/x-npy", 400,
     "input 'image': wrong element type"),
    ("int64 in an npz", npz(image=np.zeros((1, 3, 32, 32), np.int64)), "application/x-npz",
     400, "input 'image': wrong element type"),
    ("wrong rank", npy(np.zeros((3, 32, 32), np.float32)), "application/x-npy", 400,
     "input 'image': wrong rank"),
    ("zero rows", npy(np.zeros((0, 3, 32, 32), np.float32)), "application/x-npy", 200, ""),
    ("objects", npy(np.array([None, 1], object)), "application/x-npy", 400,
     "input 'image') holds Python objects"),
    ("a header larger than its data", npy_declaring((9999, 3, 32, 32), bytes(12288)),
     "application/x-npy", 400, "declares (9999, 3, 32, 32) float32 (122867712 bytes of data) "
     "but holds 12288 bytes"),
    ("truncated", npy(np.zeros((1, 3, 32, 32), np.float32))[:-5], "application/x-npy", 400,
     "but holds 12283 bytes"),
    ("not a zip", b"PK\x03\x04garbage", "application/x-npz", 400, "not an .npz"),
    ("an unknown name", npz(images=np.zeros((1, 3, 32, 32), np.float32)), "application/x-npz",
     400, "unknown input 'images'"),
    ("ragged JSON", b'{"inputs": {"image": [[1, 2], [3]]}}', "application/json", 400,
     "input 'image' is not a tensor(float) array"),
    ("strings for floats", b'{"inputs": {"image": "cat"}}', "application/json", 400,
     "input 'image' is not a tensor(float) array"),
    ("JSON nested too deeply", b'{"inputs": {"image": ' + b"[" * 100_000 + b"]" * 100_000 + b"}}",
     "application/json", 400, "nested too deeply"),
    ("text", b"image=1", "text/plain", 400, "unsupported Content-Type 'text/plain'"),
])
def test_malformed_bodies_are_400_naming_the_input(server, name, body, content_type, status,
                                                    message) -> None:
    got, _, answer = post(f"{server}/cnn", body, content_type)
    assert got == status, answer
    if status != 200:
        assert message in error_of(answer)


def test_an_npz_unpacking_past_the_limit_is_refused(server) -> None:
    """A zip of zeros: 40 MB of arrays in a 40 KB body."""
    buffer = io.BytesIO()
    np.savez_compressed(buffer, image=np.zeros((3300, 3, 32, 32), np.float32))
    assert len(buffer.getvalue()) < 1 << 20
    status, _, body = post(f"{server}/cnn", buffer.getvalue(), "application/x-npz")
    assert status == 413 and "the .npz unpacks to" in error_of(body)


def test_a_chunked_body_is_read_to_its_end_or_to_the_limit(server) -> None:
    data = npy(np.ones((2, 3, 32, 32), np.float32))
    status, body = chunked_post(f"{server}/cnn", [data[i:i + 4096]
                                                  for i in range(0, len(data), 4096)])
    assert status == 200 and np.array(json.loads(body)["outputs"]["probs"]).shape == (2, 10)


def replica_actors(app: str) -> set[str]:
    """The names of the live replica actors of `app` (Serve names them after the app)."""
    return {a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
            if a["name"].startswith(f"SERVE_REPLICA::{app}#")}


def wait_for(condition, what: str, timeout_s: float = DEPLOY_TIMEOUT_S):
    deadline = time.monotonic() + timeout_s
    while not (result := condition()):
        assert time.monotonic() < deadline, f"{what}: not after {timeout_s} s"
        time.sleep(0.5)
    return result


KILL_REQUESTS = 500
KILL_AFTER = 100


def test_a_replica_killed_under_load_is_replaced(server) -> None:
    """ray.kill of one of two replicas while 8 clients send 500 requests: each request is
    answered correctly or fails with a 5xx, none hangs (each has REQUEST_TIMEOUT_S), the
    other replica goes on answering, and Serve starts a replica in the dead one's place."""
    deploy(build_app(TINY_CNN / "model.onnx", replicas=2, max_batch_size=4, batch_wait_ms=2,
                     num_cpus=0.1), "faults")
    try:
        before = wait_for(lambda: len(replica_actors("faults")) == 2 and replica_actors("faults"),
                          "two replicas")
        session = kiln.InferenceSession(str(TINY_CNN / "model.onnx"))
        rng = np.random.default_rng(11)
        images = [rng.standard_normal((int(rng.integers(1, 3)), 3, 32, 32), dtype=np.float32)
                  for _ in range(KILL_REQUESTS)]
        done = collections.Counter()
        lock = threading.Lock()
        enough, killed = threading.Event(), threading.Event()

        def send(i: int):
            after_kill = killed.is_set()
            status, headers, body = post(f"{server}/faults", npy(images[i]), "application/x-npy",
                                         "application/x-npy")
            with lock:
                done["all"] += 1
                if done["all"] >= KILL_AFTER:
                    enough.set()
            return after_kill, status, headers, body

        with ThreadPoolExecutor(CLIENTS) as pool:
            futures = [pool.submit(send, i) for i in range(KILL_REQUESTS)]
            assert enough.wait(DEPLOY_TIMEOUT_S), "the first requests were not answered"
            victim = sorted(before)[0]
            ray.kill(ray.get_actor(victim, namespace="serve"), no_restart=True)
            killed.set()
            # A request that hangs past REQUEST_TIMEOUT_S raises here (socket timeout).
            answers = [f.result(timeout=DEPLOY_TIMEOUT_S) for f in futures]

        statuses = collections.Counter(status for _, status, _, _ in answers)
        assert set(statuses) <= {200} | set(range(500, 600)), statuses
        for image, (_, status, _, body) in zip(images, answers):
            if status == 200:
                (expected,) = session.run(None, {"image": image})
                np.testing.assert_allclose(np.load(io.BytesIO(body)), expected, rtol=1e-5,
                                           atol=1e-6)
        assert sum(1 for after, status, _, _ in answers if after and status == 200) > 0, \
            f"no request sent after the kill was answered: {statuses}"

        def replaced():
            now = replica_actors("faults")
            states = serve.status().applications["faults"].deployments["ModelServer"]
            return (len(now) == 2 and victim not in now and
                    states.replica_states == {"RUNNING": 2} and now)
        new = (wait_for(replaced, "the killed replica replaced") - before).pop()
        # The new replica answers (requests go to either replica: 100 reach it in all but
        # a 2**-100 chance).
        new_id = new.rsplit("#", 1)[1]
        assert any(get(f"{server}/faults")["replica"] == new_id for _ in range(100))
    finally:
        serve.delete("faults")


def slow_model(path: Path, size: int = 192) -> None:
    """y = the state after `n` steps of x = Tanh(x @ W), x and W `size` x `size`: a run that
    takes as long as the request asks (n)."""
    w = numpy_helper.from_array(np.eye(size, dtype=np.float32), "w")
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond"], ["cond_out"]),
         helper.make_node("MatMul", ["x", "w"], ["xw"]),
         helper.make_node("Tanh", ["xw"], ["x_out"])],
        "step", [tensor("i", TensorProto.INT64, []), tensor("cond", TensorProto.BOOL, []),
                 tensor("x", shape=[size, size])],
        [tensor("cond_out", TensorProto.BOOL, []), tensor("x_out", shape=[size, size])])
    x0 = numpy_helper.from_array(np.ones((size, size), np.float32), "x0")
    path.write_bytes(model(
        [helper.make_node("Constant", [], ["true"], value=helper.make_tensor(
            "t", TensorProto.BOOL, [], [True])),
         helper.make_node("Loop", ["n", "true", "x0"], ["y"], body=body)],
        [tensor("n", TensorProto.INT64, [])], [tensor("y", shape=[size, size])], [w, x0]))


def test_requests_over_the_queue_bound_are_503(server, tmp_path) -> None:
    """One replica taking one request at a time, a queue of one: of 8 clients sending 3 slow
    requests (about half a second of running each) at once, those beyond the bound are
    answered 503 at once, the others correctly, and the server answers again afterwards. Its
    bodies are limited to 64 KiB."""
    slow_model(tmp_path / "slow.onnx")
    deploy(build_app(tmp_path / "slow.onnx", replicas=1, max_batch_size=1, num_cpus=0.1,
                     max_ongoing_requests=1, max_queued_requests=1, max_body_bytes=64 << 10),
           "bounded")
    try:
        url = f"{server}/bounded"
        request = json.dumps({"inputs": {"n": 2000}}).encode()
        (expected,) = kiln.InferenceSession(str(tmp_path / "slow.onnx")).run(
            None, {"n": np.array(2000, np.int64)})
        start = threading.Barrier(CLIENTS)

        def send(_):
            start.wait(timeout=DEPLOY_TIMEOUT_S)
            return [post(url, request, "application/json") for _ in range(3)]

        with ThreadPoolExecutor(CLIENTS) as pool:
            answers = [a for client in pool.map(send, range(CLIENTS), timeout=DEPLOY_TIMEOUT_S)
                       for a in client]
        statuses = collections.Counter(status for status, _, _ in answers)
        assert set(statuses) == {200, 503}, statuses
        for status, _, body in answers:
            if status == 200:
                np.testing.assert_allclose(np.array(json.loads(body)["outputs"]["y"]), expected,
                                           rtol=1e-6)
            else:
                assert b"max_queued_requests=1" in body
        assert post(url, request, "application/json")[0] == 200

        # The limit on bodies, over a chunked body: refused once 64 KiB have been read.
        status, body = chunked_post(url, [b" " * 4096] * 32, "application/json")
        assert status == 413 and "over the server's limit of 64 KiB" in error_of(body)
        assert get(url)["max_body_bytes"] == 64 << 10
    finally:
        serve.delete("bounded")
