"""kiln.serve without a Ray cluster: request and response bodies, the stacking of requests
along the batch axis, and a replica's batch function run in this process."""

from __future__ import annotations

import asyncio
import io
import json
import subprocess
import sys

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln
from conftest import TINY_CNN
from kiln.serve import build_app, codec, whisper_options
from models import model, tensor

pytestmark = pytest.mark.serve


def npy(a: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, a)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def cnn() -> kiln.InferenceSession:
    return kiln.InferenceSession(str(TINY_CNN / "model.onnx"))


def test_json_inputs_take_the_models_types(cnn) -> None:
    image = np.arange(2 * 3 * 32 * 32).reshape(2, 3, 32, 32) / 7
    body = json.dumps({"inputs": {"image": image.tolist()}}).encode()
    feed = codec.decode_inputs(body, "application/json; charset=utf-8", cnn.get_inputs())
    assert feed["image"].dtype == np.float32
    np.testing.assert_array_equal(feed["image"], image.astype(np.float32))


def test_npy_and_npz_inputs(cnn) -> None:
    image = np.ones((1, 3, 32, 32), np.float32)
    feed = codec.decode_inputs(npy(image), codec.NPY, cnn.get_inputs())
    np.testing.assert_array_equal(feed["image"], image)
    buffer = io.BytesIO()
    np.savez(buffer, image=image)
    feed = codec.decode_inputs(buffer.getvalue(), codec.NPZ, cnn.get_inputs())
    np.testing.assert_array_equal(feed["image"], image)


@pytest.mark.parametrize("body, media, message", [
    (b"{", "application/json", "the body is not JSON"),
    (b'{"image": []}', "application/json", '{"inputs"'),
    (b'{"inputs": {"x": [1]}}', "application/json", "unknown input 'x'"),
    (b'{"inputs": {"image": [[1], [1, 2]]}}', "application/json", "not a tensor\\(float\\)"),
    (b'{"inputs": {}}', "application/json", "missing input 'image'"),
    (b"not an array", codec.NPY, "not an .npy array"),
    (b"not a zip", codec.NPZ, "not an .npz"),
    (b"", "text/plain", "unsupported Content-Type 'text/plain'"),
])
def test_bad_requests_say_what_is_wrong(cnn, body, media, message) -> None:
    with pytest.raises(codec.RequestError, match=message):
        codec.decode_inputs(body, media, cnn.get_inputs())


def npy_declaring(shape: tuple, data: bytes, descr: str = "<f4") -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": descr, "fortran_order": False,
                                                  "shape": shape})
    return buffer.getvalue() + data


@pytest.mark.parametrize("body, message", [
    # A header may not make the server allocate what the body does not hold.
    (npy_declaring((1 << 40,), bytes(16)), r"declares \(1099511627776,\) float32 "
                                           r"\(4398046511104 bytes of data\) but holds 16 bytes"),
    (npy_declaring((2, 2), bytes(17)), "but holds 17 bytes"),
    (npy_declaring((-1, 4), bytes(16)), "declares the shape \\(-1, 4\\), of a negative"),
    (npy(np.array([1, "a", None], object)), "holds Python objects"),
    (npy(np.zeros(3))[:6], "not an .npy array"),
    (b"\x93NUMPY\x09\x00" + bytes(8), "not an .npy array"),
])
def test_npy_bodies_hold_what_they_declare(body, message) -> None:
    inputs = [kiln.NodeArg("x", ["n"], "tensor(float)")]
    with pytest.raises(codec.RequestError, match=message) as error:
        codec.decode_inputs(body, codec.NPY, inputs)
    assert error.value.status == 400 and "input 'x'" in str(error.value)


def test_npy_arrays_view_the_body_in_either_order() -> None:
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    inputs = [kiln.NodeArg("x", ["n", 3], "tensor(float)")]
    for array in (a, np.asfortranarray(a)):
        body = npy(array)
        got = codec.decode_inputs(body, codec.NPY, inputs)["x"]
        np.testing.assert_array_equal(got, a)
        assert np.shares_memory(got, np.frombuffer(body, np.uint8))  # no copy


def test_an_npz_is_checked_before_it_is_unpacked() -> None:
    inputs = [kiln.NodeArg("x", ["n"], "tensor(float)")]
    bomb = io.BytesIO()
    np.savez_compressed(bomb, x=np.zeros(1 << 20, np.float32))  # 4 MiB in 4 KiB
    assert len(bomb.getvalue()) < 8192
    with pytest.raises(codec.BodyTooLarge, match="the .npz unpacks to 4194(.*) bytes, over "
                                                 "the server's limit of 1 MiB") as error:
        codec.decode_inputs(bomb.getvalue(), codec.NPZ, inputs, limit=1 << 20)
    assert error.value.status == 413
    assert codec.decode_inputs(bomb.getvalue(), codec.NPZ, inputs, limit=8 << 20)["x"].size \
        == 1 << 20
    other = io.BytesIO()
    np.savez_compressed(other, y=np.zeros(1 << 20, np.float32))
    with pytest.raises(codec.RequestError, match="unknown input 'y'"):
        codec.decode_inputs(other.getvalue(), codec.NPZ, inputs, limit=1)


def test_json_nested_too_deeply_is_a_request_error() -> None:
    inputs = [kiln.NodeArg("x", ["n"], "tensor(float)")]
    with pytest.raises(codec.RequestError, match="nested too deeply"):
        codec.decode_inputs(b"[" * 100_000 + b"]" * 100_000, codec.JSON, inputs)
    deep = b'{"inputs": {"x": ' + b"[" * 100 + b"1" + b"]" * 100 + b"}}"
    with pytest.raises(codec.RequestError, match="input 'x' is not a tensor\\(float\\) array"):
        codec.decode_inputs(deep, codec.JSON, inputs)


async def chunks(*parts: bytes):
    for part in parts:
        yield part


def test_bodies_are_read_up_to_the_limit() -> None:
    read = lambda length, *parts, limit=10: asyncio.run(  # noqa: E731
        codec.read_body(chunks(*parts), length, limit))
    assert read("10", b"01234", b"56789") == b"0123456789"
    assert read(None, b"0123", b"456789") == b"0123456789"  # chunked: no length
    assert read(None) == b""
    with pytest.raises(codec.BodyTooLarge, match=r"the body \(11 bytes\) is over the "
                                                 "server's limit of 10 bytes") as error:
        read("11", b"never read")
    assert error.value.status == 413
    with pytest.raises(codec.BodyTooLarge, match="the body is over the server's limit"):
        read(None, b"0123456", b"789ab", b"never read")
    with pytest.raises(codec.RequestError, match="Content-Length 'ten' is not a number"):
        read("ten", b"")
    assert [codec.size_text(n) for n in (32 << 20, 64 << 10, 3 << 29, 100_000, 5)] == \
        ["32 MiB", "64 KiB", "1.5 GiB", "100000 bytes", "5 bytes"]


def test_npy_needs_a_single_input_model() -> None:
    two = kiln.InferenceSession(model([helper.make_node("Add", ["a", "b"], ["y"])],
                                      [tensor("a", shape=[2]), tensor("b", shape=[2])],
                                      [tensor("y", shape=[2])]))
    with pytest.raises(codec.RequestError, match="single-input models; this one takes a, b"):
        codec.decode_inputs(npy(np.zeros(2, np.float32)), codec.NPY, two.get_inputs())


def test_responses_follow_accept() -> None:
    y = np.arange(6, dtype=np.float32).reshape(2, 3)
    body, media = codec.encode_outputs({"y": y}, None)
    assert media == codec.JSON and json.loads(body) == {"outputs": {"y": y.tolist()}}
    body, media = codec.encode_outputs({"y": y}, "application/x-npy, application/json")
    assert media == codec.NPY
    np.testing.assert_array_equal(np.load(io.BytesIO(body)), y)
    body, media = codec.encode_outputs({"y": y, "z": y[0]}, codec.NPZ)
    with np.load(io.BytesIO(body)) as npz:
        assert sorted(npz.files) == ["y", "z"]
        np.testing.assert_array_equal(npz["z"], y[0])
    with pytest.raises(codec.RequestError, match="one output: name it with \\?outputs=NAME"):
        codec.encode_outputs({"y": y, "z": y}, codec.NPY)


def test_outputs_are_picked_by_name(cnn) -> None:
    assert codec.select_outputs(None, cnn.get_outputs()) == ["probs"]
    assert codec.select_outputs("probs", cnn.get_outputs()) == ["probs"]
    with pytest.raises(codec.RequestError, match="unknown output 'logits'"):
        codec.select_outputs("logits", cnn.get_outputs())


def test_only_a_symbolic_first_axis_batches(cnn) -> None:
    assert codec.batchable(cnn.get_inputs(), cnn.get_outputs())
    fixed = kiln.InferenceSession(model([helper.make_node("Relu", ["x"], ["y"])],
                                        [tensor("x", shape=[1, 4])], [tensor("y", shape=[1, 4])]))
    assert not codec.batchable(fixed.get_inputs(), fixed.get_outputs())


def test_stack_and_unstack_keep_each_requests_rows() -> None:
    feeds = [{"x": np.full((n, 2), n, np.float32)} for n in (1, 3, 2)]
    stacked, sizes = codec.stack(feeds)
    assert stacked["x"].shape == (6, 2) and sizes == [1, 3, 2]
    parts = codec.unstack({"y": stacked["x"] * 10}, sizes)
    for feed, part in zip(feeds, parts):
        np.testing.assert_array_equal(part["y"], feed["x"] * 10)
    with pytest.raises(ValueError, match="does not follow the batch of 6 rows"):
        codec.unstack({"y": np.zeros((5, 2))}, sizes)
    # Other trailing shapes, types or a scalar: another key, or none.
    assert codec.batch_key(feeds[0]) == codec.batch_key(feeds[1])
    assert codec.batch_key(feeds[0]) != codec.batch_key({"x": np.zeros((1, 3), np.float32)})
    assert codec.batch_key(feeds[0]) != codec.batch_key({"x": np.zeros((1, 2), np.float64)})
    assert codec.batch_key({"x": np.float32(1)}) is None


def test_whisper_query_parameters() -> None:
    assert whisper_options({"language": "en", "return_timestamps": "true", "num_beams": "3"}) \
        == {"language": "en", "return_timestamps": True, "num_beams": 3}
    with pytest.raises(codec.RequestError, match="unknown parameter 'beams'"):
        whisper_options({"beams": "3"})
    with pytest.raises(codec.RequestError, match="num_beams='x' is not valid"):
        whisper_options({"num_beams": "x"})
    # The voice-activity filter: with the server's detector, its parameters under
    # faster-whisper's names; without one, or parameters without vad=true, a 400.
    vad = object()
    assert whisper_options({"vad": "true", "vad_threshold": "0.6", "vad_pad_ms": "200"}, vad) \
        == {"vad": vad, "vad_parameters": {"threshold": 0.6, "speech_pad_ms": 200}}
    assert whisper_options({"vad": "false"}, vad) == {}
    with pytest.raises(codec.RequestError, match="no VAD model"):
        whisper_options({"vad": "true"})
    with pytest.raises(codec.RequestError, match="without vad=true"):
        whisper_options({"vad_threshold": "0.6"}, vad)
    with pytest.raises(codec.RequestError, match="vad_min_silence_ms='x' is not valid"):
        whisper_options({"vad": "1", "vad_min_silence_ms": "x"}, vad)


def lookup_model(path) -> None:
    """y = Gather(table, ids): a batch axis, and a run that fails for an id out of range."""
    table = numpy_helper.from_array(np.arange(8, dtype=np.float32).reshape(4, 2), "table")
    path.write_bytes(model([helper.make_node("Gather", ["table", "ids"], ["y"], axis=0)],
                           [tensor("ids", TensorProto.INT64, ["batch"])],
                           [tensor("y", shape=["batch", 2])], [table]))


def test_requests_waiting_together_run_stacked_and_a_bad_one_fails_alone(tmp_path) -> None:
    """A replica's batch: requests of one shape are one run, and when that run fails the
    others are run alone and still get their answers."""
    lookup_model(tmp_path / "lookup.onnx")
    session = kiln.InferenceSession(str(tmp_path / "lookup.onnx"))
    runs = []

    async def run(feed: dict, requests: int) -> dict:
        runs.append(requests)
        return {"y": session.run(None, feed)[0]}

    def answer(ids: list) -> list:
        return asyncio.run(codec.run_stacked([{"ids": np.array(i, np.int64)} for i in ids], run))

    answers = answer([[0], [1, 2], [3]])
    assert runs == [3] and [a[1] for a in answers] == [3, 3, 3]
    for a, expected in zip(answers, [[[0, 1]], [[2, 3], [4, 5]], [[6, 7]]]):
        np.testing.assert_array_equal(a[0]["y"], expected)

    runs.clear()
    answers = answer([[0], [9], [3]])
    assert runs == [3, 1, 1, 1]  # the stacked run failed on id 9
    assert isinstance(answers[1], kiln.KilnError)
    np.testing.assert_array_equal(answers[0][0]["y"], [[0, 1]])
    np.testing.assert_array_equal(answers[2][0]["y"], [[6, 7]])


@pytest.mark.parametrize("bounds, message", [
    ({"max_body_bytes": 0}, "max_body_bytes must be positive, not 0"),
    ({"max_ongoing_requests": -2}, "max_ongoing_requests must be positive, not -2"),
    ({"max_queued_requests": 0}, "max_queued_requests must be positive or -1, not 0"),
])
def test_build_app_takes_only_real_bounds(bounds, message) -> None:
    with pytest.raises(ValueError, match=message):
        build_app(TINY_CNN / "model.onnx", **bounds)


@pytest.mark.parametrize("args, message", [
    (["nothing.onnx"], "nothing.onnx: no such file or folder"),
    ([str(TINY_CNN / "test_data_set_0" / "input_0.pb")], "input_0.pb"),
    ([str(TINY_CNN / "model.onnx"), "--replicas", "0"], "'0' is not positive"),
    ([str(TINY_CNN / "model.onnx"), "--autoscale", "3:1"], "'3:1' is not MIN:MAX replicas"),
    ([str(TINY_CNN / "model.onnx"), "--max-queued-requests", "0"],
     "'0' is not a positive number or -1"),
    ([str(TINY_CNN / "model.onnx"), "--max-body-mb", "-1"], "'-1' is not positive"),
])
def test_command_line_errors_are_one_line(args, message) -> None:
    done = subprocess.run([sys.executable, "-m", "kiln.serve", *args], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kiln.serve: ") and message in lines[0], lines
