"""Bodies of kiln.serve's requests and responses, and the batching of requests.

A request's inputs come as JSON (``{"inputs": {name: nested lists}}``, typed by the model's
inputs), as one ``.npy`` array (``Content-Type: application/x-npy``, single-input models)
or as an ``.npz``/zip of named arrays (``application/x-npz`` or ``application/zip``). The
answer is JSON (``{"outputs": {name: nested lists}}``) unless ``Accept`` asks for ``.npy``
(one output) or ``.npz``. Nothing here needs Ray, so it is tested on its own.

Bodies are bounded: :func:`read_body` stops reading past the limit (413), an ``.npy`` must
hold exactly the bytes its header declares, and an ``.npz`` may not unpack to more than the
limit, so no request makes the server allocate much more than the limit.
"""

from __future__ import annotations

import collections
import io
import json
import math
import zipfile
import zlib
from typing import Any, AsyncIterator, Awaitable, Callable, Sequence

import numpy as np

JSON = "application/json"
NPY = "application/x-npy"
NPZ = "application/x-npz"
ZIP = "application/zip"

# ONNX element types as onnxruntime names them in NodeArg.type ('tensor(float)').
_NUMPY_TYPES = {
    "float": np.float32,
    "double": np.float64,
    "float16": np.float16,
    "int8": np.int8,
    "int16": np.int16,
    "int32": np.int32,
    "int64": np.int64,
    "uint8": np.uint8,
    "uint16": np.uint16,
    "uint32": np.uint32,
    "uint64": np.uint64,
    "bool": np.bool_,
    "string": np.str_,
}


# The default limit on a request's body (and on what an .npz unpacks to): 32 MiB.
DEFAULT_MAX_BODY_BYTES = 32 << 20


class RequestError(ValueError):
    """A request the server cannot take (answered with ``status`` and this message)."""

    status = 400


class BodyTooLarge(RequestError):
    """A body (or the arrays an .npz holds) over the server's limit: status 413."""

    status = 413


def size_text(n: int) -> str:
    """'32 MiB', '64 KiB', '100 bytes': a limit as the error messages state it."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << (shift - 4)) == 0:
            return f"{n / (1 << shift):g} {unit}"
    return f"{n} bytes"


async def read_body(chunks: AsyncIterator[bytes], content_length: str | None,
                    limit: int) -> bytes:
    """A request's body from its ``chunks``, refused with :class:`BodyTooLarge` as soon as it
    is known to be over ``limit`` bytes: before reading when ``Content-Length`` says so, else
    when the chunks read pass it (a chunked body has no length)."""
    if content_length is not None:
        try:
            declared = int(content_length)
        except ValueError:
            raise RequestError(f"Content-Length {content_length!r} is not a number") from None
        if declared > limit:
            raise BodyTooLarge(f"the body ({declared} bytes) is over the server's limit of "
                               f"{size_text(limit)}")
    parts, size = [], 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"the body is over the server's limit of {size_text(limit)}")
        parts.append(chunk)
    return b"".join(parts)


def numpy_dtype(onnx_type: str) -> np.dtype:
    """The numpy type of a JSON input declared as ``onnx_type`` ('tensor(float)')."""
    element = onnx_type.removeprefix("tensor(").removesuffix(")")
    if element not in _NUMPY_TYPES or not onnx_type.startswith("tensor("):
        raise RequestError(f"inputs of type {onnx_type} cannot be sent as JSON: send .npy/.npz")
    return np.dtype(_NUMPY_TYPES[element])


def media_type(header: str | None) -> str:
    """'application/json' of 'application/json; charset=utf-8'."""
    return (header or "").split(";")[0].strip().lower()


def decode_inputs(body: bytes, content_type: str | None, inputs: Sequence,
                  limit: int = DEFAULT_MAX_BODY_BYTES) -> dict[str, Any]:
    """The input feed of a request; ``inputs``: the model's inputs (NodeArg); ``limit``: the
    most bytes the arrays of an .npz may unpack to."""
    media = media_type(content_type)
    if media == NPY:
        if len(inputs) != 1:
            names = ", ".join(i.name for i in inputs)
            raise RequestError(f"an .npy body feeds single-input models; this one takes {names}: "
                               "send an .npz of named arrays or JSON")
        feed = {inputs[0].name: _load_npy(body, f"the .npy body (input '{inputs[0].name}')")}
    elif media in (NPZ, ZIP):
        feed = _load_npz(body, inputs, limit)
    elif media in (JSON, ""):
        feed = _json_feed(body, inputs)
    else:
        raise RequestError(f"unsupported Content-Type '{media}': use {JSON}, {NPY} or {NPZ}")
    _check_names(feed, inputs)
    return feed


def _load_npy(data: bytes, what: str) -> np.ndarray:
    """The array of an .npy file's bytes (a read-only view of them), after checking that its
    data is exactly what the header declares: a header cannot make the server allocate more
    than the body holds. No object arrays (they would be pickles)."""
    stream = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(stream)
        if version == (1, 0):
            shape, fortran_order, dtype = np.lib.format.read_array_header_1_0(stream)
        elif version == (2, 0):
            shape, fortran_order, dtype = np.lib.format.read_array_header_2_0(stream)
        else:
            raise ValueError(f".npy version {version[0]}.{version[1]} is not read here")
    except (ValueError, OSError, EOFError, SyntaxError, TypeError) as e:
        raise RequestError(f"{what} is not an .npy array: {e}") from None
    if dtype.hasobject:
        raise RequestError(f"{what} holds Python objects ({dtype}), which are not accepted")
    if any(d < 0 for d in shape):
        raise RequestError(f"{what} declares the shape {shape}, of a negative dimension")
    count = math.prod(shape)
    declared = count * dtype.itemsize
    held = len(data) - stream.tell()
    if declared != held:
        raise RequestError(f"{what} declares {shape} {dtype} ({declared} bytes of data) but "
                           f"holds {held} bytes")
    try:
        flat = np.frombuffer(data, dtype, count, offset=stream.tell())
        return flat.reshape(shape, order="F" if fortran_order else "C")
    except ValueError as e:  # a type of no bytes, a sub-array type
        raise RequestError(f"{what} of type {dtype} cannot be read: {e}") from None


def _load_npz(body: bytes, inputs: Sequence, limit: int) -> dict[str, np.ndarray]:
    """The arrays of an .npz (a zip of NAME.npy files), refused before anything is unpacked
    when it names inputs the model lacks or its files would unpack to more than ``limit``."""
    try:
        with zipfile.ZipFile(io.BytesIO(body)) as archive:
            members = [m for m in archive.infolist() if not m.is_dir()]
            names = [m.filename.removesuffix(".npy") for m in members]
            _check_names(dict.fromkeys(names), inputs)
            unpacked = sum(m.file_size for m in members)
            if unpacked > limit:
                raise BodyTooLarge(f"the .npz unpacks to {unpacked} bytes, over the server's "
                                   f"limit of {size_text(limit)}")
            # The zip module reads no more than each file's declared size.
            return {name: _load_npy(archive.read(m), f"input '{name}' of the .npz")
                    for name, m in zip(names, members)}
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, NotImplementedError,
            zlib.error) as e:
        if isinstance(e, RequestError):
            raise
        raise RequestError(f"the body is not an .npz of arrays: {e}") from None


def _json_feed(body: bytes, inputs: Sequence) -> dict[str, np.ndarray]:
    try:
        request = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise RequestError(f"the body is not JSON: {e}") from None
    except RecursionError:
        raise RequestError("the body is not JSON kiln reads: lists nested too deeply") from None
    if not isinstance(request, dict) or not isinstance(request.get("inputs"), dict):
        raise RequestError('a JSON request is {"inputs": {"NAME": nested lists, ...}}')
    types = {i.name: i.type for i in inputs}
    feed = {}
    for name, value in request["inputs"].items():
        if name not in types:
            raise RequestError(f"unknown input '{name}'")
        try:
            feed[name] = np.asarray(value, dtype=numpy_dtype(types[name]))
        except (ValueError, TypeError, OverflowError, RecursionError) as e:
            raise RequestError(f"input '{name}' is not a {types[name]} array: {e}") from None
    return feed


def _check_names(feed: dict, inputs: Sequence) -> None:
    names = [i.name for i in inputs]
    unknown = [n for n in feed if n not in names]
    if unknown:
        raise RequestError(f"unknown input '{unknown[0]}' (the model takes {', '.join(names)})")
    missing = [n for n in names if n not in feed]
    if missing:
        raise RequestError(f"missing input '{missing[0]}'")


def select_outputs(query: str | None, outputs: Sequence) -> list[str]:
    """The outputs a request asks for (``?outputs=a,b``), all when it names none."""
    names = [o.name for o in outputs]
    if not query:
        return names
    wanted = [n for n in query.split(",") if n]
    for n in wanted:
        if n not in names:
            raise RequestError(f"unknown output '{n}' (the model gives {', '.join(names)})")
    return wanted


def encode_outputs(outputs: dict[str, np.ndarray], accept: str | None) -> tuple[bytes, str]:
    """The response body and its media type: the first of JSON, .npy and .npz in ``accept``."""
    media = next((m for m in (media_type(a) for a in (accept or "").split(","))
                  if m in (JSON, NPY, NPZ, ZIP)), JSON)
    buffer = io.BytesIO()
    if media == NPY:
        if len(outputs) != 1:
            raise RequestError("an .npy response holds one output: name it with ?outputs=NAME "
                               f"or accept {NPZ}")
        np.save(buffer, next(iter(outputs.values())), allow_pickle=False)
        return buffer.getvalue(), NPY
    if media in (NPZ, ZIP):
        np.savez(buffer, **outputs)
        return buffer.getvalue(), media
    body = {"outputs": {name: np.asarray(a).tolist() for name, a in outputs.items()}}
    return json.dumps(body).encode(), JSON


def batchable(inputs: Sequence, outputs: Sequence) -> bool:
    """Whether requests can be stacked along axis 0: every input's and output's first
    dimension is symbolic or unknown (a batch axis), not a fixed size."""
    args = list(inputs) + list(outputs)
    return bool(args) and all(a.type.startswith("tensor(") and a.shape and
                              not isinstance(a.shape[0], int) for a in args)


def batch_key(feed: dict[str, np.ndarray]) -> tuple | None:
    """Requests with the same key stack into one run: same names, types and shapes past
    axis 0. None for a feed that cannot stack (a scalar input, or inputs whose first
    dimensions differ, which are then not one batch axis)."""
    if any(np.ndim(a) == 0 for a in feed.values()) or len({len(a) for a in feed.values()}) > 1:
        return None
    return tuple(sorted((n, a.dtype.str, a.shape[1:]) for n, a in feed.items()))


def stack(feeds: Sequence[dict[str, np.ndarray]]) -> tuple[dict[str, np.ndarray], list[int]]:
    """One feed of the requests' inputs concatenated along axis 0, and each one's rows."""
    sizes = [len(next(iter(f.values()))) for f in feeds]
    names = feeds[0].keys()
    return {n: np.concatenate([f[n] for f in feeds]) for n in names}, sizes


def unstack(outputs: dict[str, np.ndarray], sizes: Sequence[int]) -> list[dict[str, np.ndarray]]:
    """The outputs of a stacked run split back into each request's rows."""
    total = sum(sizes)
    for name, a in outputs.items():
        if np.ndim(a) == 0 or a.shape[0] != total:
            raise ValueError(f"output '{name}' of shape {np.shape(a)} does not follow the "
                             f"batch of {total} rows")
    bounds = np.cumsum([0, *sizes])
    return [{n: a[bounds[i]:bounds[i + 1]] for n, a in outputs.items()}
            for i in range(len(sizes))]


# run(feed, requests) -> outputs by name: one session run answering `requests` requests.
Runner = Callable[[dict, int], Awaitable[dict]]


async def run_stacked(feeds: Sequence[dict], run: Runner) -> list[tuple[dict, int] | Exception]:
    """Answers requests waiting together: those of one batch key as one stacked run. Each
    answer is (outputs, requests in its run), or the exception for that request alone: when a
    stacked run fails, its requests are run one by one so only a bad one fails."""
    groups: dict[tuple | None, list[int]] = collections.defaultdict(list)
    for i, feed in enumerate(feeds):
        groups[batch_key(feed)].append(i)
    results: list[Any] = [None] * len(feeds)
    for key, members in groups.items():
        if key is not None and len(members) > 1:
            try:
                stacked, sizes = stack([feeds[i] for i in members])
                outputs = unstack(await run(stacked, len(members)), sizes)
                for i, out in zip(members, outputs):
                    results[i] = (out, len(members))
                continue
            except (RuntimeError, ValueError):  # kiln.KilnError is a RuntimeError
                pass
        for i in members:
            try:
                results[i] = (await run(feeds[i], 1), 1)
            except (RuntimeError, ValueError) as e:
                results[i] = e
    return results
