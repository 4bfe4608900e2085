"""Inputs read in place, outputs viewing kiln's memory, and donated inputs updated in place:
checked through memory addresses (np.shares_memory) and kiln's exact copy counters."""

from __future__ import annotations

import gc

import numpy as np
import pytest
from onnx import TensorProto

import kiln
import models
from conftest import TINY_CNN, read_test_data


def test_outputs_view_kiln_storage_which_outlives_the_session():
    inputs, expected = read_test_data(TINY_CNN / "test_data_set_0")
    session = kiln.InferenceSession(str(TINY_CNN / "model.onnx"))
    (probs,) = session.run(None, {"image": inputs[0]})
    assert isinstance(probs.base, kiln.Storage)
    assert probs.flags.writeable and not probs.flags.owndata
    assert probs.base.capacity >= probs.nbytes
    stats = session.last_run_stats()
    assert stats["bytes_copied"] == 0 and stats["bytes_copied_inputs"] == 0
    del session
    gc.collect()
    np.testing.assert_allclose(probs, expected[0], rtol=1e-3, atol=1e-5)


def test_contiguous_inputs_are_read_in_place():
    session = kiln.InferenceSession(models.identity())
    x = np.arange(16, dtype=np.float32)
    (y,) = session.run(None, {"x": x})
    # kiln hands the input through: the output is the caller's own memory, read-only,
    # and alive as long as the output is.
    assert np.shares_memory(x, y)
    assert not y.flags.writeable
    assert session.last_run_stats()["bytes_copied"] == 0
    del x
    gc.collect()
    np.testing.assert_array_equal(y, np.arange(16, dtype=np.float32))


@pytest.mark.parametrize("layout", ["strided", "fortran", "big-endian", "list"])
def test_other_layouts_are_copied_once(layout):
    session = kiln.InferenceSession(models.add_one(shape=(3, 4)))
    base = np.arange(24, dtype=np.float32).reshape(3, 8)
    x = {
        "strided": base[:, ::2],
        "fortran": np.asfortranarray(base[:, :4]),
        "big-endian": base[:, :4].astype(">f4"),
        "list": base[:, :4].tolist(),
    }[layout]
    want = np.asarray(x, dtype=np.float32) + 1
    if layout == "list":  # a list becomes float64, which the model does not take
        with pytest.raises(kiln.InvalidArgumentError, match="wrong element type"):
            session.run(None, {"x": x})
        x = np.asarray(x, dtype=np.float32)  # now contiguous: borrowed
    (y,) = session.run(None, {"x": x})
    np.testing.assert_array_equal(y, want)
    expected_copy = 0 if layout == "list" else 12 * 4
    assert session.last_run_stats()["bytes_copied_inputs"] == expected_copy
    assert not np.shares_memory(x, y)


def test_kiln_outputs_feed_other_sessions_without_copies():
    first = kiln.InferenceSession(models.add_one())
    second = kiln.InferenceSession(models.identity())
    (a,) = first.run(None, {"x": np.zeros(8, np.float32)})
    (b,) = second.run(None, {"x": a})
    assert np.shares_memory(a, b) and isinstance(b.base, kiln.Storage)
    assert second.last_run_stats()["bytes_copied"] == 0
    # Not donated, the output is only read: a third run leaves it as it was.
    (c,) = first.run(None, {"x": a})
    np.testing.assert_array_equal(a, np.ones(8))
    np.testing.assert_array_equal(c, np.full(8, 2.0))
    # A slice of it is a view of the same storage too.
    (d,) = second.run(None, {"x": a[2:6]})
    assert np.shares_memory(a, d) and second.last_run_stats()["bytes_copied"] == 0


def test_donated_inputs_are_updated_in_place():
    session = kiln.InferenceSession(models.add_one())
    x = np.zeros(8, np.float32)
    (y,) = session.run(None, {"x": x}, donate=["x"])
    # The run owned x: Add wrote its result into x's memory.
    assert np.shares_memory(x, y)
    assert session.last_run_stats()["in_place_ops"] == 1
    np.testing.assert_array_equal(y, np.ones(8))
    # Read-only arrays are never written, donated or not.
    frozen = np.zeros(8, np.float32)
    frozen.flags.writeable = False
    (z,) = session.run(None, {"x": frozen}, donate=["x"])
    assert not np.shares_memory(frozen, z) and not frozen.any()


def test_a_donated_input_may_not_share_memory_with_another_input():
    session = kiln.InferenceSession(models.append(axis=1))
    cache = kiln.with_capacity((2, 1, 4), np.float32, axis=1, capacity=8)
    with pytest.raises(kiln.InvalidArgumentError, match="'cache' is donated but input 'new'"):
        session.run(None, {"cache": cache, "new": cache}, donate=["cache"])
    x = np.zeros((2, 2, 4), np.float32)
    with pytest.raises(kiln.InvalidArgumentError, match="same memory"):
        session.run(None, {"cache": x, "new": x.reshape(-1)[:8].reshape(2, 1, 4)},
                    donate=["cache"])
    # Not donated, the same memory may be read twice.
    (out,) = session.run(None, {"cache": cache, "new": cache})
    assert out.shape == (2, 2, 4)


def test_a_donated_cache_grows_in_place_step_after_step():
    session = kiln.InferenceSession(models.append(axis=1))
    cache = kiln.with_capacity((2, 0, 4), np.float32, axis=1, capacity=16)
    assert isinstance(cache.base, kiln.Storage) and cache.base.capacity == 2 * 16 * 4 * 4
    outputs = []
    for step in range(16):
        new = np.full((2, 1, 4), step, np.float32)
        (cache,) = session.run(None, {"cache": cache, "new": new}, donate=["cache"])
        stats = session.last_run_stats()
        # Only the new entries are copied, whatever the cache's length.
        assert stats["bytes_copied"] == new.nbytes, step
        assert stats["allocations"] == 0
        assert cache.shape == (2, step + 1, 4) and cache.base.capacity == 2 * 16 * 4 * 4
        outputs.append(cache)
    # Every step's output is the same memory, one entry longer.
    assert all(np.shares_memory(outputs[0], later) for later in outputs[1:])
    np.testing.assert_array_equal(cache[0, :, 0], np.arange(16))
    # Past the capacity, the cache is copied into a new buffer.
    (grown,) = session.run(None, {"cache": cache, "new": new}, donate=["cache"])
    assert grown.shape == (2, 17, 4) and not np.shares_memory(grown, cache)
    assert session.last_run_stats()["bytes_copied"] == grown.nbytes


def test_without_donation_the_cache_is_copied_every_step():
    session = kiln.InferenceSession(models.append(axis=1))
    cache = kiln.with_capacity((2, 0, 4), np.float32, axis=1, capacity=16)
    for step in range(4):
        new = np.full((2, 1, 4), step, np.float32)
        (grown,) = session.run(None, {"cache": cache, "new": new})
        assert session.last_run_stats()["bytes_copied"] == grown.nbytes
        cache = grown


def test_outputs_that_are_weights_keep_the_model_bytes_alive():
    data = models.weight_output()
    session = kiln.InferenceSession(data)
    y, x_out = session.run(None, {"x": np.ones(1, np.float32)})
    assert not y.flags.writeable  # a weight: read-only
    del session, data
    gc.collect()
    np.testing.assert_array_equal(y, np.arange(1024, dtype=np.float32))


@pytest.mark.parametrize("dtype,elem", [
    (np.float16, TensorProto.FLOAT16), (np.float64, TensorProto.DOUBLE),
    (np.int8, TensorProto.INT8), (np.uint16, TensorProto.UINT16), (np.int64, TensorProto.INT64),
    (np.bool_, TensorProto.BOOL), (np.complex64, TensorProto.COMPLEX64),
])
def test_every_numpy_type_round_trips_in_place(dtype, elem):
    session = kiln.InferenceSession(models.identity(elem))
    x = (np.arange(10) % 3).astype(dtype)
    (y,) = session.run(None, {"x": x})
    assert y.dtype == x.dtype and np.shares_memory(x, y)
    np.testing.assert_array_equal(x, y)


def test_strings_and_sub_byte_types_are_converted():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    strings = kiln.InferenceSession(models.identity(TensorProto.STRING))
    (y,) = strings.run(None, {"x": np.array(["a", "bé", ""])})
    assert y.dtype == object and y.tolist() == ["a", "bé", ""]
    int4 = kiln.InferenceSession(models.identity(TensorProto.INT4))
    x = np.array([-8, -1, 0, 7, 3], dtype=ml_dtypes.int4)
    (y,) = int4.run(None, {"x": x})
    assert y.dtype == x.dtype and y.tolist() == x.tolist()
    assert int4.last_run_stats()["bytes_copied_inputs"] == 3  # five int4 values packed


def test_unsupported_numpy_types_are_refused():
    session = kiln.InferenceSession(models.identity())
    with pytest.raises(kiln.InvalidArgumentError, match="datetime64"):
        session.run(None, {"x": np.array(["2020-01-01"], dtype="datetime64[D]")})
