"""InferenceSession.run given what it cannot take: every value of the feed that is wrong is
one InvalidArgumentError naming the input, arguments of the wrong Python type a TypeError,
a user object's own exception passes through, and nothing crashes. The cases the fuzz
harness (python/tests/fuzz/fuzz_session.py) found are here as regression tests."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto

import kiln
import models
from conftest import TINY_CNN

CNN = str(TINY_CNN / "model.onnx")
IMAGE = np.zeros((1, 3, 32, 32), np.float32)


@pytest.fixture(scope="module")
def cnn() -> kiln.InferenceSession:
    return kiln.InferenceSession(CNN)


@pytest.fixture(scope="module")
def strings() -> kiln.InferenceSession:
    return kiln.InferenceSession(models.identity(TensorProto.STRING))


def test_feed_keys_and_output_names_must_be_str(cnn) -> None:
    # Were RuntimeError("Unable to cast Python instance ...") from the binding.
    with pytest.raises(TypeError, match="input_feed keys must be str, not int"):
        cnn.run(None, {1: IMAGE})
    with pytest.raises(TypeError, match="input_feed keys must be str, not bytes"):
        cnn.run(None, {"image": IMAGE, b"image": IMAGE})
    with pytest.raises(TypeError, match="output names must be str, not int"):
        cnn.run(["probs", 7], {"image": IMAGE})
    # Names with no UTF-8 form (lone surrogates): were RuntimeError too.
    with pytest.raises(kiln.InvalidArgumentError, match=r"the name '\\udcff' has no UTF-8"):
        cnn.run(None, {"image": IMAGE, "\udcff": IMAGE})
    with pytest.raises(kiln.InvalidArgumentError, match=r"the name '\\udcff' has no UTF-8"):
        cnn.run(["\udcff"], {"image": IMAGE})
    with pytest.raises(TypeError):  # pybind11's conversion of the list
        cnn.run(None, {"image": IMAGE}, donate=["\udcff"])
    assert cnn.run(None, {"image": IMAGE})[0].shape == (1, 10)


@pytest.mark.parametrize("value, message", [
    # Were numpy's own ValueError, naming nothing.
    ([[1.0, 2.0], [3.0]], "input 'image': not an array kiln can read: setting an array element"),
    ([np.zeros(2), np.zeros(3)], "input 'image': not an array kiln can read"),
    # Were InvalidArgumentError without the input's name.
    (np.zeros((1, 3, 32, 32), [("a", "<f4"), ("b", "<i2")]),
     r"input 'image': numpy type \[\('a', '<f4'\), \('b', '<i2'\)\] has no ONNX element type"),
    (np.zeros(4, "datetime64[s]"), "input 'image': numpy type datetime64.s. has no ONNX"),
    (np.zeros(4, "V4"), "input 'image': numpy type |V4 has no ONNX element type"),
    (np.array([{"a": 1}], object),
     r"input 'image': a string tensor holds \{'a': 1\}, which is neither str nor bytes"),
    # Kiln's own checks, as before.
    (np.zeros((1, 3, 32, 32), np.float64), "input 'image': wrong element type"),
    (np.zeros((0, 3, 32), np.float32), "input 'image': wrong rank"),
])
def test_values_kiln_cannot_take_name_the_input(cnn, value, message) -> None:
    with pytest.raises(kiln.InvalidArgumentError, match=message) as error:
        cnn.run(None, {"image": value})
    assert str(error.value).startswith(CNN + ": ") and error.value.file == CNN


def test_a_str_without_utf8_is_an_invalid_argument(strings) -> None:
    # Was RuntimeError("Unable to cast Python instance of type <class 'str'> ...").
    with pytest.raises(kiln.InvalidArgumentError, match="input 'x': a string tensor holds "
                                                         r"'\\udcff', which has no UTF-8 form"):
        strings.run(None, {"x": np.array(["ok", "\udcff"], object)})
    (y,) = strings.run(None, {"x": np.array(["ok", "été"], object)})
    assert y.tolist() == ["ok", "été"]


class Failing(Exception):
    pass


class RaisingArray:
    def __array__(self, dtype=None, copy=None):
        raise Failing("the user's own error")


class JunkArray:
    def __array__(self, dtype=None, copy=None):
        return "not an array"


def test_an_array_method_returning_junk_is_an_invalid_argument(cnn) -> None:
    # Was numpy's ValueError ("object __array__ method not producing an array").
    with pytest.raises(kiln.InvalidArgumentError, match="input 'image': not an array kiln can "
                                                         "read: object __array__ method"):
        cnn.run(None, {"image": JunkArray()})


@pytest.mark.parametrize("shape, axis, capacity", [([-1], 0, 0), ([2, -3], 1, 4),
                                                   ([-2, 2], 1, 4)])
def test_with_capacity_refuses_negative_dimensions(shape, axis, capacity) -> None:
    # Was numpy's ValueError ("negative dimensions are not allowed") for a negative dimension
    # along `axis`, which the engine's check sees as `capacity`.
    with pytest.raises(kiln.InvalidArgumentError, match="with_capacity: negative dimension in "
                                                         "shape"):
        kiln.with_capacity(shape, np.float32, axis=axis, capacity=capacity)


def test_a_user_objects_exception_passes_through(cnn) -> None:
    with pytest.raises(Failing, match="the user's own error"):
        cnn.run(None, {"image": RaisingArray()})


class FeedEmptier:
    """Converted to an array, it empties the feed it is in and drops its own array."""

    def __init__(self, feed: dict, value: np.ndarray) -> None:
        self.feed, self.value = feed, value

    def __array__(self, dtype=None, copy=None):
        value, self.value = self.value, None
        self.feed.clear()
        self.feed["other"] = np.zeros(3)
        return value


def test_a_feed_changed_while_it_is_read_is_run_as_given(cnn) -> None:
    """run holds the feed's items before converting any: a value whose conversion changes the
    dict does not change what the run reads (the dict was iterated while changing)."""
    feed: dict = {}
    feed["image"] = FeedEmptier(feed, np.ones((2, 3, 32, 32), np.float32))
    (probs,) = cnn.run(None, feed)
    np.testing.assert_array_equal(probs, cnn.run(None, {"image": np.ones((2, 3, 32, 32),
                                                                          np.float32)})[0])
    assert list(feed) == ["other"]


@pytest.mark.parametrize("make", [
    lambda: IMAGE.copy(order="F"),
    lambda: np.ascontiguousarray(np.swapaxes(IMAGE, 2, 3)).swapaxes(2, 3),
    lambda: np.repeat(IMAGE, 2, axis=-1)[..., ::2],
    lambda: np.ascontiguousarray(IMAGE[..., ::-1])[..., ::-1],
    lambda: np.broadcast_to(IMAGE[:, :1], IMAGE.shape),
    lambda: IMAGE.astype(">f4"),
    lambda: np.frombuffer(IMAGE.tobytes(), np.float32).reshape(IMAGE.shape),
    lambda: np.frombuffer(bytearray(IMAGE.nbytes + 1), np.float32, IMAGE.size,
                          offset=1).reshape(IMAGE.shape),  # unaligned
    lambda: np.ma.masked_array(IMAGE),
])
def test_any_layout_of_the_same_values_gives_the_same_outputs(cnn, make) -> None:
    value = make()
    expected = cnn.run(None, {"image": np.ascontiguousarray(value, np.float32)})[0]
    before = np.array(value, copy=True)
    (probs,) = cnn.run(None, {"image": value})
    np.testing.assert_array_equal(probs, expected)
    np.testing.assert_array_equal(np.asarray(value), before)  # not donated: as it was
    (probs,) = cnn.run(None, {"image": value}, donate=["image"])
    np.testing.assert_array_equal(probs, expected)


def test_zero_size_inputs_run_or_are_refused_by_name(cnn) -> None:
    empty = np.zeros((0, 3, 32, 32), np.float32)
    assert cnn.run(None, {"image": empty})[0].shape == (0, 10)
    with pytest.raises(kiln.InvalidArgumentError, match="input 'image': dimension 2 must be 32"):
        cnn.run(None, {"image": np.zeros((1, 3, 0, 32), np.float32)})
