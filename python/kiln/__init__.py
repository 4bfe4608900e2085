"""kiln: an ONNX graph execution engine for CPUs, with onnxruntime's Python API.

Switching from onnxruntime is one line::

    import kiln as ort            # instead of: import onnxruntime as ort
    session = ort.InferenceSession("model.onnx")
    outputs = session.run(None, {"x": x})

Inputs are read in place when they are C-contiguous arrays of a type kiln stores the same
way, and outputs are numpy arrays viewing kiln's buffers (their ``base`` is a
:class:`Storage`). ``run`` releases the GIL, so Python threads run one session in parallel.
A decode loop keeps its KV caches growing in place by donating them::

    cache = kiln.with_capacity((1, heads, 0, head_dim), np.float32, axis=2, capacity=n)
    outputs = session.run(None, {"past": cache, ...}, donate=["past"])
"""

from __future__ import annotations

import json
import os
import threading
import time
import warnings
from typing import Any, Iterable, Sequence

import numpy as np

from . import _kiln
from ._kiln import (
    CausalLmGenerator,
    Environment,
    FileError,
    GraphOptimizationLevel,
    InvalidArgumentError,
    InvalidModelError,
    KilnError,
    OutOfMemoryError,
    RunCancelledError,
    RunError,
    RunOptions,
    SessionOptions,
    Storage,
    Tokenizer,
    UnsupportedError,
    VoiceActivityDetector,
    WhisperTranscriber,
    read_audio,
)

__version__ = _kiln.version()

__all__ = [
    "CausalLmGenerator",
    "Environment",
    "FileError",
    "GraphOptimizationLevel",
    "InferenceSession",
    "InvalidArgumentError",
    "InvalidModelError",
    "KilnError",
    "ModelMetadata",
    "NodeArg",
    "OutOfMemoryError",
    "RunCancelledError",
    "RunError",
    "RunOptions",
    "SessionOptions",
    "Storage",
    "Tokenizer",
    "UnsupportedError",
    "VoiceActivityDetector",
    "WhisperTranscriber",
    "get_all_providers",
    "get_available_providers",
    "get_device",
    "isa_level",
    "read_audio",
    "with_capacity",
]

_CPU = "CPUExecutionProvider"


def get_device() -> str:
    """The device kiln runs on: always 'CPU'."""
    return "CPU"


def get_available_providers() -> list[str]:
    return [_CPU]


def get_all_providers() -> list[str]:
    return [_CPU]


def isa_level() -> str:
    """The instruction-set level kiln's kernels use here: 'generic', 'avx2' or 'avx512'."""
    return _kiln.isa_level()


def with_capacity(shape: Sequence[int], dtype: Any = np.float32, axis: int = 0,
                  capacity: int = 0) -> np.ndarray:
    """A zero-filled array of ``shape`` with room for ``capacity`` elements along ``axis``.

    Donated to ``run`` (``donate=[name]``), a Concat along that axis appends into the spare
    room in place, and the output comes back viewing the same memory, so it can be donated
    again the next step: a KV cache grows without ever being copied.
    """
    return _kiln.with_capacity(list(shape), np.dtype(dtype), axis, capacity)


class NodeArg:
    """A graph input or output as onnxruntime describes it."""

    __slots__ = ("name", "shape", "type")

    def __init__(self, name: str, shape: list, type: str) -> None:  # noqa: A002
        self.name = name
        # Ints for fixed dimensions, strings for symbolic ones, None for unknown ones.
        self.shape = shape
        # 'tensor(float)', 'seq(tensor(int64))', ...
        self.type = type

    def __repr__(self) -> str:
        return f"NodeArg(name={self.name!r}, type={self.type!r}, shape={self.shape!r})"


class ModelMetadata:
    """The model file's descriptive fields, under onnxruntime's names."""

    __slots__ = ("producer_name", "graph_name", "domain", "description", "graph_description",
                 "version", "custom_metadata_map")

    def __init__(self, info: dict) -> None:
        self.producer_name = info["producer_name"]
        self.graph_name = info["graph_name"]
        self.domain = info["domain"]
        self.description = info["description"]
        self.graph_description = info["graph_description"]
        # onnxruntime reports 2**63 - 1 when the file sets no model_version; so does kiln.
        version = info["model_version"]
        self.version = (1 << 63) - 1 if version is None else version
        self.custom_metadata_map = dict(info["metadata"])


# Sessions made without an Environment share one per thread count, so they share a thread
# pool and, with share_weights, one copy of identical weights (as in the C++ library, where
# sessions given one Environment do).
_environments: dict[int, Environment] = {}
_environments_lock = threading.Lock()


def _environment(threads: int) -> Environment:
    with _environments_lock:
        env = _environments.get(threads)
        if env is None:
            env = _environments[threads] = Environment(threads)
        return env


def _check_providers(providers: Iterable | None) -> None:
    if not providers:
        return
    names = [p[0] if isinstance(p, (tuple, list)) else p for p in providers]
    if _CPU not in names:
        warnings.warn(
            f"kiln runs on the CPU only: providers {names} are not available, using {_CPU}",
            RuntimeWarning, stacklevel=3)


class InferenceSession:
    """onnxruntime.InferenceSession, run by kiln.

    ``path_or_bytes``: a path (str or os.PathLike) or the model's serialized bytes (whose
    weights are then used in place). ``sess_options``: a :class:`SessionOptions`;
    ``providers``: accepted for compatibility, kiln runs on the CPU.
    """

    def __init__(self, path_or_bytes: str | bytes | os.PathLike,
                 sess_options: SessionOptions | None = None,
                 providers: Sequence | None = None, provider_options: Sequence | None = None,
                 environment: Environment | None = None) -> None:
        _check_providers(providers)
        options = sess_options if sess_options is not None else SessionOptions()
        if environment is None:
            environment = _environment(options.intra_op_num_threads)
        self._options = options
        self._sess = _kiln.Session(path_or_bytes, options, environment)
        self._environment = environment
        self._inputs = [NodeArg(*io) for io in self._sess.inputs()]
        self._outputs = [NodeArg(*io) for io in self._sess.outputs()]
        self._overridable = [NodeArg(*io) for io in self._sess.overridable_initializers()]

    def run(self, output_names: Sequence[str] | None, input_feed: dict[str, Any],
            run_options: RunOptions | None = None, *,
            donate: Iterable[str] = ()) -> list:
        """Runs the model; returns the outputs named (all when None) as numpy arrays.

        ``donate``: names of inputs the run may overwrite or extend in place (a KV cache made
        with :func:`with_capacity`, or a previous step's ``present.*`` output). Their arrays'
        contents are unspecified afterwards; the memory stays valid. Inputs not donated, and
        read-only arrays, are never written.

        Errors: :class:`InvalidArgumentError` (also a ``ValueError``) naming the input or
        output for what the model cannot take: an unknown or missing name, a wrong element
        type or shape, a value numpy cannot make an array of, a donated input sharing memory
        with another; other :class:`KilnError` subclasses when the run fails; ``TypeError``
        for arguments of the wrong Python type (``input_feed`` not a dict, names not str).
        """
        if not isinstance(input_feed, dict):
            raise TypeError(f"input_feed must be a dict of name -> value, not {type(input_feed)}")
        return self._sess.run(output_names, input_feed, run_options, list(donate))

    def get_inputs(self) -> list[NodeArg]:
        return list(self._inputs)

    def get_outputs(self) -> list[NodeArg]:
        return list(self._outputs)

    def get_overridable_initializers(self) -> list[NodeArg]:
        return list(self._overridable)

    def get_modelmeta(self) -> ModelMetadata:
        return ModelMetadata(self._sess.model_info())

    def get_providers(self) -> list[str]:
        return [_CPU]

    def get_provider_options(self) -> dict[str, dict]:
        return {_CPU: {}}

    def get_session_options(self) -> SessionOptions:
        return self._options

    def last_run_stats(self) -> dict[str, Any]:
        """kiln's exact counters for the last run to finish: bytes_copied (everything copied
        for the run, bytes_copied_inputs being the inputs converted on the way in),
        allocations, bytes_allocated, peak_bytes_in_use, in_place_ops, arena_*, ..."""
        return self._sess.last_run_stats()

    def load_stats(self) -> dict[str, Any]:
        """kiln's counters of the load: weights mapped, copied, shared, prepared, folded."""
        return self._sess.load_stats()

    def end_profiling(self) -> str:
        """Writes the node events recorded since the session was made (or since the last
        call) as a Chrome trace, as onnxruntime does, and returns the file's name."""
        events = self._sess.take_profile()
        name = f"{self._options.profile_file_prefix}_{time.strftime('%Y-%m-%d_%H-%M-%S')}.json"
        trace = [{
            "cat": "Node",
            "pid": os.getpid(),
            "tid": 0,
            "name": f"{e['name']}_kernel_time",
            "ph": "X",
            "ts": round(e["start_us"]),
            "dur": round(e["duration_us"]),
            "args": {
                "op_name": e["op_type"],
                "input_type_shape": e["input_shapes"],
                "output_type_shape": e["output_shapes"],
                "bytes_copied": e["bytes_copied"],
            },
        } for e in events]
        with open(name, "w", encoding="utf-8") as f:
            json.dump(trace, f)
        return name
