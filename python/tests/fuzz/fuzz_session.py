"""Fuzzes kiln's Python API with hostile feeds: ``InferenceSession.run`` on committed models
(models/) given arrays of every numpy type, random shapes, strides (transposed, stepped,
reversed, broadcast), unaligned, byte-swapped, read-only, zero-size and object arrays, lists,
scalars and objects whose ``__array__`` misbehaves, with donations that are unknown, aliased
or read-only, unknown or non-str output names, cancelled runs, ``with_capacity`` arrays and
outputs fed back (kiln's own memory, donated or viewed differently).

The contract checked: ``run`` either returns the outputs or raises a ``kiln.KilnError``
(``InvalidArgumentError`` for the feed, naming what is wrong), a ``TypeError`` (arguments of
the wrong Python type) or the exception a user object raised; the process never crashes;
inputs not donated and read-only arrays are never written; outputs can be read whole.
Anything else is a finding: atheris stops with its traceback and keeps the input.

    .venv/bin/python python/tests/fuzz/fuzz_session.py [libFuzzer flags] [CORPUS | FILES]

(test/fuzz/run.sh runs it for FUZZ_SECONDS after replaying python/tests/fuzz/regressions.)
Each input is one self-contained case, so a finding replays from its file alone.
"""

from __future__ import annotations

import sys
from pathlib import Path

import atheris
import ml_dtypes
import numpy as np

with atheris.instrument_imports():
    import kiln

REPO = Path(__file__).resolve().parents[3]

# Small committed models with different kinds of inputs: a batch axis (tiny-cnn), token ids
# and KV caches to donate (GPT-2), an If on a bool input with optional caches (Whisper's
# merged decoder), int32 lengths read by a kernel (GroupQueryAttention), quantized weights.
MODELS = [
    "models/tiny-cnn/model.onnx",
    "models/gpt2-tiny-random/model.onnx",
    "models/whisper-tiny-random/decoder_model_merged.onnx",
    "models/ort-attention-ops/gqa_decode_shared_buffer/model.onnx",
    "models/ort-attention-ops/mha_past_mask/model.onnx",
    "models/ort-quantized/mlp-qgemm/model.onnx",
    "models/ort-fused-conv/identity/model.onnx",
]

DTYPES = [np.dtype(t) for t in (
    np.float32, np.float64, np.float16, np.int8, np.int16, np.int32, np.int64, np.uint8,
    np.uint16, np.uint32, np.uint64, np.bool_, np.complex64, np.complex128,
    ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2, ml_dtypes.int4,
    ml_dtypes.uint4, ml_dtypes.int2, ml_dtypes.float4_e2m1fn, ml_dtypes.float8_e8m0fnu,
    ">f4", ">i8", "<U3", "S4", "O", "datetime64[s]", "timedelta64[ms]", "V4",
    [("a", "<f4"), ("b", "<i2")], "(2,)f4",
)]

# onnxruntime's type names (NodeArg.type) -> numpy.
ONNX_TYPES = {
    "float": np.float32, "double": np.float64, "float16": np.float16, "bfloat16":
    ml_dtypes.bfloat16, "int8": np.int8, "int16": np.int16, "int32": np.int32, "int64":
    np.int64, "uint8": np.uint8, "uint16": np.uint16, "uint32": np.uint32, "uint64":
    np.uint64, "bool": np.bool_, "string": object,
}

MAX_ELEMENTS = 1 << 17  # per array: runs stay fast and small


class Hostile(Exception):
    """Raised by the feed's own objects: run must let it through unchanged."""


class RaisingArray:
    def __array__(self, dtype=None, copy=None):
        raise Hostile("__array__ failed")


class JunkArray:
    def __array__(self, dtype=None, copy=None):
        return "not an array"


class FeedMutator:
    """An array-like that empties the feed being converted and drops its own references."""

    def __init__(self, feed: dict, value: np.ndarray) -> None:
        self.feed, self.value = feed, value

    def __array__(self, dtype=None, copy=None):
        value = self.value
        self.feed.clear()
        self.feed["zz"] = np.zeros(3)
        self.value = None
        return value


class Case:
    """One fuzz input: builds a feed for a session from the provider's bytes."""

    def __init__(self, data: bytes) -> None:
        self.fdp = atheris.FuzzedDataProvider(data)
        self.dims: dict[str, int] = {}  # symbolic dimension -> its size in this case

    def int(self, low: int, high: int) -> int:
        return self.fdp.ConsumeIntInRange(low, high)

    def chance(self, percent: int) -> bool:
        """True `percent` times in 100; False once the input's bytes run out (the provider
        then gives zeros), as every choice here makes the plain case the one of zero."""
        return self.int(0, 99) >= 100 - percent

    def pick(self, values: list):
        return self.fdp.PickValueInList(values)

    def dim(self, d) -> int:
        """A declared dimension's size: itself when fixed; a symbolic one the same size
        (1 to 3) wherever it appears in this case; an unknown one 1 to 3."""
        if isinstance(d, int) and d >= 0:
            return d
        if isinstance(d, str):
            if d not in self.dims:
                self.dims[d] = self.int(1, 3)
            return self.dims[d]
        return self.int(1, 3)

    def shape(self, declared: list, plain: bool = False) -> tuple[int, ...]:
        mode = 0 if plain else self.int(0, 7)
        if mode <= 5 and declared:  # the declared shape, or one dimension off (0 to 4)
            shape = [self.dim(d) for d in declared]
            if mode == 5 and shape:
                shape[self.int(0, len(shape) - 1)] = self.int(0, 4)
        else:
            shape = [self.int(0, 4) for _ in range(self.int(0, 5))]
        while shape and np.prod(shape, dtype=np.int64) > MAX_ELEMENTS:
            shape[self.int(0, len(shape) - 1)] //= 2
        return tuple(shape)

    def values(self, dtype: np.dtype, shape: tuple) -> np.ndarray:
        count = int(np.prod(shape, dtype=np.int64))
        if dtype.kind == "O":
            items = [self.pick([1, 2.5, "text", b"bytes", None, [1, 2], {"a": 1},
                                "\udcff", np.float32(3)]) for _ in range(min(count, 64))]
            out = np.empty(count, dtype)
            for i in range(count):
                out[i] = items[i % len(items)] if items else None
            return out.reshape(shape)
        if dtype.kind in "US":
            return np.full(shape, self.fdp.ConsumeUnicode(3), dtype) if dtype.kind == "U" \
                else np.full(shape, self.fdp.ConsumeBytes(4), dtype)
        if dtype.kind in "iu" and not self.chance(40):  # small values: indices, lengths
            high = self.pick([4, 1, 40])
            return np.asarray(self.fdp.ConsumeIntListInRange(count, -1, high) if count <= 4096
                              else np.arange(count) % 3).astype(dtype).reshape(shape)
        raw = self.fdp.ConsumeBytes(min(count * dtype.itemsize, 4096))
        raw = (raw or b"\0") * (count * dtype.itemsize // max(len(raw), 1) + 1)
        return np.frombuffer(raw[:count * dtype.itemsize], dtype).reshape(shape).copy()

    def layout(self, a: np.ndarray) -> np.ndarray:
        """The same values in another memory layout, or another kind of object."""
        mode = self.int(0, 13)
        if mode == 0:
            return np.asfortranarray(a)
        if mode == 1 and a.ndim >= 2:  # a transposed view
            return np.ascontiguousarray(a.T).T
        if mode == 2 and a.ndim >= 1:  # every other element
            wide = np.repeat(a, 2, axis=-1)
            return wide[..., ::2]
        if mode == 3 and a.ndim >= 1:  # negative strides
            return np.ascontiguousarray(a[::-1])[::-1]
        if mode == 4 and a.ndim >= 1 and a.size:  # zero strides, read-only
            return np.broadcast_to(a[(slice(0, 1),) * a.ndim], a.shape)
        if mode == 5 and a.dtype.kind not in "OUS" and a.dtype.itemsize > 1:  # unaligned
            buffer = bytearray(a.nbytes + 1)
            out = np.frombuffer(buffer, a.dtype, a.size, offset=1).reshape(a.shape)
            out[...] = a
            return out
        if mode == 6:
            a = a.copy()
            a.flags.writeable = False
            return a
        if mode == 7 and a.dtype.kind not in "OUSV" and a.dtype.isnative:  # byte-swapped
            return a.astype(a.dtype.newbyteorder())
        if mode == 8 and a.dtype.kind not in "O":  # viewing immutable bytes
            return np.frombuffer(a.tobytes(), a.dtype).reshape(a.shape)
        if mode == 9:
            return a.tolist() if a.size <= 4096 else a
        if mode == 10 and a.ndim == 2:
            return np.asmatrix(a)
        if mode == 11:
            return np.ma.masked_array(a, mask=np.zeros(a.shape, bool))
        if mode == 12:  # zero-size, or one row (a scalar of a 0-d array)
            if self.chance(50) or (a.ndim and not len(a)):
                return a.reshape(-1)[:0]
            return a[()] if a.ndim == 0 else a[0]
        return a

    def oddity(self, feed: dict, like: np.ndarray):
        """Something that is not quite an array."""
        return self.pick([
            None, 3, 2.5, True, "text", b"bytes", [1, [2, 3]], [[1, 2], [3]], {"a": 1},
            (np.zeros(2), np.ones(3)), np.float32(1), object(), RaisingArray(), JunkArray(),
            FeedMutator(feed, like), bytearray(b"\x01\x02\x03\x04"),
            memoryview(np.arange(4, dtype=np.float32)), [[[[[[1]]]]]] * 2,
            np.array([np.zeros(2), None], dtype=object), range(3), iter([1, 2]),
        ])

    def array(self, arg, feed: dict, plain: bool = False):
        """A value for a declared input (or an unknown name: arg None); `plain`: of the
        declared type and shape, C-contiguous (its values still fuzzed)."""
        declared = arg.shape if arg is not None and isinstance(arg.shape, list) else []
        element = arg.type.removeprefix("tensor(").removesuffix(")") if arg else "float"
        typed = ONNX_TYPES.get(element)
        odd_type = typed is None or (not plain and self.chance(30))
        dtype = self.pick(DTYPES) if odd_type else np.dtype(typed)
        shape = self.shape(declared, plain)
        try:
            a = self.values(dtype, shape)
        except (ValueError, TypeError):  # a type numpy will not fill this way
            a = np.zeros(shape, np.float32)
        if plain:
            return a
        kind = self.int(0, 9)
        if kind == 9:
            return self.oddity(feed, a)
        if kind >= 6:
            try:
                return self.layout(a)
            except (ValueError, TypeError):  # a layout numpy has not for this type
                return a
        return a


def capacity_array(case: Case):
    """kiln.with_capacity with fuzzed arguments (its errors are part of the contract)."""
    shape = [case.int(-1, 3) for _ in range(case.int(0, 4))]
    return kiln.with_capacity(shape, case.pick(DTYPES[:14] + [np.dtype("O")]),
                              axis=case.int(-5, 5), capacity=case.int(-2, 8))


EXPECTED = (kiln.KilnError, TypeError, Hostile)


def call(session: kiln.InferenceSession, output_names, feed: dict, donate: list,
         options) -> list | None:
    """One run; None when it raised what the contract allows. Checks that inputs not donated
    (and read-only ones) are unchanged and that every output reads whole."""
    donated = [feed[n] for n in donate if isinstance(n, str) and n in feed]
    watched = []
    for name, value in list(feed.items()):
        if not isinstance(value, np.ndarray) or value.dtype.hasobject:
            continue
        if name in donate and value.flags.writeable:
            continue
        if any(isinstance(d, np.ndarray) and np.may_share_memory(value, d) for d in donated):
            continue  # memory the caller gave away under another name
        watched.append((name, value, value.tobytes()))
    try:
        outputs = session.run(output_names, feed, options, donate=donate)
    except EXPECTED as e:
        if isinstance(e, kiln.InvalidArgumentError):  # names what is wrong, quoted
            assert "'" in e.message, f"an InvalidArgumentError naming nothing: {e}"
        outputs = None
    for name, value, before in watched:
        assert value.tobytes() == before, f"input '{name}' was written though not donated"
    for out in outputs or []:
        for a in out if isinstance(out, list) else [out]:
            if isinstance(a, np.ndarray):
                a.tobytes()
                if not a.flags.writeable:
                    try:
                        a.flags.writeable = True
                    except ValueError:
                        continue
                    np.copyto(a, a.copy())  # numpy let it be written: it must be writable
            else:
                assert a is None or isinstance(a, (np.generic, str, bytes)), type(a)
    return outputs


def one_input(data: bytes) -> None:
    case = Case(data)
    session = SESSIONS[case.int(0, len(SESSIONS) - 1)]
    args = session.get_inputs()
    feed: dict = {}
    # Half the cases keep every input but one plain, so that runs get past the checks of
    # the feed into the kernels (with fuzzed values) and the outputs.
    one_odd = not case.chance(50)
    odd = case.int(0, len(args) - 1) if args else -1
    for i, arg in enumerate(args):
        if one_odd and i != odd:
            feed[arg.name] = case.array(arg, feed, plain=True)
        elif not case.chance(8):
            feed[arg.name] = case.array(arg, feed)
    if case.chance(10):
        feed[case.pick(["x", "", "image ", "\udcff", args[0].name.upper()])] = \
            case.array(None, feed)
    if case.chance(8) and len(args) >= 2 and args[0].name in feed:
        feed[args[1].name] = feed[args[0].name]  # one array under two names
    if case.chance(8) and args:
        try:
            feed[args[case.int(0, len(args) - 1)].name] = capacity_array(case)
        except EXPECTED:
            pass
    if case.chance(3):
        feed = {case.pick([1, b"image", None, ("a",)]): np.zeros(1)} | feed

    names = [n for n in feed if isinstance(n, str)]
    donate = [n for n in names if case.chance(30)]
    if case.chance(10):
        donate.append(case.pick(["nope", "", *(a.name for a in args)]))
    outputs_declared = [o.name for o in session.get_outputs()]
    choice = case.int(0, 9)
    output_names = (None if choice <= 4 else [] if choice == 5
                    else [n for n in outputs_declared if case.chance(50)] if choice <= 7
                    else [case.pick(outputs_declared), case.pick(["nope", 7, None, b"x",
                                                                  "\udcff"])])
    options = None
    if case.chance(5):
        options = kiln.RunOptions()
        options.terminate = case.chance(50)
        options.timeout = case.pick([0.0, 1e-9, 5.0])

    outputs = call(session, output_names, feed, donate, options)
    if not outputs or not case.chance(50):
        return
    # A second run fed the first one's outputs (kiln's memory) where names and shapes allow:
    # views of them, other dtypes over the same bytes, donated or not.
    by_name = dict(zip(output_names or outputs_declared, outputs))
    feed2 = dict(feed) if isinstance(feed, dict) else {}
    for arg in args:
        source = by_name.get(arg.name.replace("past_key_values", "present"))
        if source is None:
            source = by_name.get(case.pick(outputs_declared))
        if isinstance(source, np.ndarray) and case.chance(60):
            mode = case.int(0, 4)
            if mode == 1 and source.ndim >= 2:
                source = source.swapaxes(0, -1)
            elif mode == 2 and source.ndim >= 1:
                source = source[..., ::-1] if case.chance(50) else source[..., 1:]
            elif mode == 3 and source.dtype.itemsize in (2, 4, 8) and source.flags.c_contiguous:
                source = source.view(case.pick([np.uint8, np.int16, np.float32]))
            feed2[arg.name] = source
    donate2 = [n for n in feed2 if isinstance(n, str) and case.chance(50)]
    call(session, None, feed2, donate2, None)


def load_sessions() -> list[kiln.InferenceSession]:
    options = kiln.SessionOptions()
    options.intra_op_num_threads = 1
    options.memory_limit = 1 << 30  # a run over it raises OutOfMemoryError
    return [kiln.InferenceSession(str(REPO / m), options) for m in MODELS]


SESSIONS: list[kiln.InferenceSession] = []

if __name__ == "__main__":
    SESSIONS.extend(load_sessions())
    # Coverage of this file's own branches (which kinds of values were made) guides the
    # search too; kiln's C++ is not instrumented.
    atheris.instrument_all()
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()
