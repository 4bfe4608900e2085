"""kiln behind Ray Serve: one kiln session (or Whisper transcriber) per replica.

``build_app(model, replicas=..., max_batch_size=...)`` makes the Serve application of an
ONNX model or of a Whisper export folder; ``python -m kiln.serve MODEL`` runs it (see
docs/serving.md). A model whose inputs and outputs all have a symbolic first dimension is
batched: requests waiting together (``@serve.batch``) are concatenated along axis 0, run
once, and the outputs split back. Routes, under the application's prefix:

- ``GET``: the model's metadata (inputs, outputs, batching) and this replica's counters.
- ``POST`` to a model: inputs as JSON, ``.npy`` or ``.npz`` (see :mod:`kiln.serve.codec`);
  ``?outputs=a,b`` picks outputs; the answer is JSON, ``.npy`` or ``.npz`` after ``Accept``,
  with the headers ``X-Kiln-Batch-Size`` (requests in the run that answered it) and
  ``X-Kiln-Replica``.
- ``POST`` to Whisper: the body is an audio file (WAV, FLAC, Ogg, MP3); the query takes
  ``language``, ``task``, ``return_timestamps``, ``num_beams``, ``max_new_tokens``,
  ``prompt``, ``temperature``, and with a VAD model given to the server (``vad=``) ``vad``
  and its ``vad_threshold``, ``vad_min_speech_ms``, ``vad_min_silence_ms``, ``vad_pad_ms``,
  ``vad_max_speech_s``; the answer is ``{"text", "language", "tokens", "segments"}`` (and
  ``speech_regions`` with ``vad``).

Failures: a body over the limit is answered 413, a request the model cannot take (malformed
JSON, .npy or .npz, an unknown or missing input, a wrong type or shape) 400 naming the
input, a failing run 500; a request beyond the queue bound gets Serve's 503.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import tempfile
import threading
from pathlib import Path
from typing import Any

from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

import kiln

from . import codec

__all__ = ["ModelServer", "WhisperServer", "build_app", "is_whisper_folder"]

# A replica whose last runs all failed this many times for reasons other than the request
# (out of memory, a failing kernel) reports itself unhealthy, and Serve replaces it.
UNHEALTHY_AFTER_FAILURES = 5

# The default bound of the requests each Serve proxy holds for a deployment while all its
# replicas are busy; the proxy answers requests beyond it 503.
DEFAULT_MAX_QUEUED_REQUESTS = 64

_log = logging.getLogger("ray.serve")


def is_whisper_folder(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a Whisper export folder (served for transcription)."""
    return Path(path, "encoder_model.onnx").is_file()


def _replica_id() -> str:
    return serve.get_replica_context().replica_id.unique_id


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def _unexpected(e: Exception) -> JSONResponse:
    """500 for a failure that is neither the request's nor kiln's (a bug): logged in full."""
    _log.exception("kiln.serve: request failed")
    return _error(500, f"internal error: {type(e).__name__}: {e}")


async def _body(request: Request, limit: int) -> bytes:
    return await codec.read_body(request.stream(), request.headers.get("content-length"), limit)


def _node_args(args: list) -> list[dict]:
    return [{"name": a.name, "shape": a.shape, "type": a.type} for a in args]


@serve.deployment
class ModelServer:
    """An ONNX model run by one kiln.InferenceSession per replica."""

    def __init__(self, model: str, max_batch_size: int = 8, batch_wait_ms: float = 5.0,
                 threads: int = 1, max_body_bytes: int = codec.DEFAULT_MAX_BODY_BYTES) -> None:
        options = kiln.SessionOptions()
        options.intra_op_num_threads = threads
        self._model = model
        self._max_body_bytes = max_body_bytes
        self._session = kiln.InferenceSession(model, options)
        self._inputs = self._session.get_inputs()
        self._outputs = self._session.get_outputs()
        self._batching = max_batch_size > 1 and codec.batchable(self._inputs, self._outputs)
        self._run_batch.set_max_batch_size(max_batch_size)
        self._run_batch.set_batch_wait_timeout_s(batch_wait_ms / 1000)
        self._max_batch_size = max_batch_size
        self._batch_sizes: collections.Counter[int] = collections.Counter()
        self._failures = 0

    async def __call__(self, request: Request) -> Response:
        if request.method == "GET":
            return JSONResponse(self.metadata())
        if request.method != "POST":
            return _error(405, f"{request.method} is not served: GET the metadata, POST inputs")
        try:
            names = codec.select_outputs(request.query_params.get("outputs"), self._outputs)
            body = await _body(request, self._max_body_bytes)
            feed = codec.decode_inputs(body, request.headers.get("content-type"), self._inputs,
                                       self._max_body_bytes)
            outputs, batch_size = await self._infer(feed)
            body, media = codec.encode_outputs({n: outputs[n] for n in names},
                                               request.headers.get("accept"))
        except codec.RequestError as e:
            return _error(e.status, str(e))
        except kiln.InvalidArgumentError as e:  # the request's inputs, named in the message
            return _error(400, str(e))
        except kiln.KilnError as e:
            return _error(500, str(e))
        except Exception as e:  # noqa: BLE001 - answered, and logged
            return _unexpected(e)
        return Response(body, media_type=media, headers={
            "X-Kiln-Batch-Size": str(batch_size), "X-Kiln-Replica": _replica_id()})

    def metadata(self) -> dict[str, Any]:
        meta = self._session.get_modelmeta()
        return {
            "model": Path(self._model).name,
            "kind": "onnx",
            "producer": meta.producer_name,
            "graph": meta.graph_name,
            "inputs": _node_args(self._inputs),
            "outputs": _node_args(self._outputs),
            "batching": self._batching,
            "max_batch_size": self._max_batch_size if self._batching else 1,
            "max_body_bytes": self._max_body_bytes,
            "replica": _replica_id(),
            "stats": self.stats(),
        }

    def stats(self) -> dict[str, Any]:
        """This replica's counters: runs by the number of requests they answered."""
        return {"runs": sum(self._batch_sizes.values()),
                "requests": sum(n * c for n, c in self._batch_sizes.items()),
                "batch_sizes": {str(n): c for n, c in sorted(self._batch_sizes.items())},
                "failures_in_a_row": self._failures}

    def check_health(self) -> None:
        if self._failures >= UNHEALTHY_AFTER_FAILURES:
            raise RuntimeError(f"the last {self._failures} runs of {self._model} failed")

    async def _infer(self, feed: dict) -> tuple[dict, int]:
        if self._batching and codec.batch_key(feed) is not None:
            result = await self._run_batch(feed)
            if isinstance(result, Exception):
                raise result
            return result
        return await self._run(feed), 1

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.005)
    async def _run_batch(self, feeds: list[dict]) -> list[tuple[dict, int] | Exception]:
        """The requests that waited together (up to max_batch_size, batch_wait_ms)."""
        return await codec.run_stacked(feeds, self._run)

    async def _run(self, feed: dict, requests: int = 1) -> dict:
        """One session run in a worker thread (kiln releases the GIL), so the replica keeps
        taking requests meanwhile; counts failures that are not the request's fault."""
        try:
            values = await asyncio.to_thread(self._session.run, None, feed)
        except kiln.InvalidArgumentError:
            raise
        except kiln.KilnError:
            self._failures += 1
            raise
        self._failures = 0
        self._batch_sizes[requests] += 1
        return {o.name: v for o, v in zip(self._outputs, values)}


# Query parameters of the transcription route and how each is read.
_TRUE = ("1", "true", "yes")
_WHISPER_QUERY = {
    "language": str,
    "task": str,
    "prompt": str,
    "return_timestamps": lambda v: v.lower() in _TRUE,
    "num_beams": int,
    "max_new_tokens": int,
    "temperature": float,
}


# The voice-activity filter's query parameters and faster-whisper's VadOptions names.
_VAD_QUERY = {
    "vad": ("", lambda v: v.lower() in _TRUE),
    "vad_threshold": ("threshold", float),
    "vad_min_speech_ms": ("min_speech_duration_ms", int),
    "vad_min_silence_ms": ("min_silence_duration_ms", int),
    "vad_pad_ms": ("speech_pad_ms", int),
    "vad_max_speech_s": ("max_speech_duration_s", float),
}


def whisper_options(query: dict[str, str], vad: Any = None) -> dict[str, Any]:
    """transcribe()'s keyword arguments from a request's query parameters; ``vad``: the
    server's VoiceActivityDetector, or None when it has none."""
    options: dict[str, Any] = {}
    vad_parameters: dict[str, Any] = {}
    use_vad = False
    for name, value in query.items():
        if name not in _WHISPER_QUERY and name not in _VAD_QUERY:
            raise codec.RequestError(f"unknown parameter '{name}' (known: "
                                     f"{', '.join([*_WHISPER_QUERY, *_VAD_QUERY])})")
        try:
            if name in _VAD_QUERY:
                key, read = _VAD_QUERY[name]
                if key:
                    vad_parameters[key] = read(value)
                else:
                    use_vad = read(value)
            else:
                options[name] = _WHISPER_QUERY[name](value)
        except ValueError:
            raise codec.RequestError(f"parameter {name}={value!r} is not valid") from None
    if vad_parameters and not use_vad:
        raise codec.RequestError("VAD parameters without vad=true")
    if use_vad:
        if vad is None:
            raise codec.RequestError("this server has no VAD model (start it with --vad MODEL)")
        options["vad"] = vad
        options["vad_parameters"] = vad_parameters
    return options


@serve.deployment
class WhisperServer:
    """A Whisper export folder transcribed by one kiln.WhisperTranscriber per replica."""

    def __init__(self, model_dir: str, threads: int = 1,
                 max_body_bytes: int = codec.DEFAULT_MAX_BODY_BYTES,
                 vad_model: str | None = None) -> None:
        self._model_dir = model_dir
        self._max_body_bytes = max_body_bytes
        self._whisper = kiln.WhisperTranscriber(model_dir, threads)
        self._vad = kiln.VoiceActivityDetector(vad_model) if vad_model else None
        # One transcription at a time per replica: its decoder state is not shared safely.
        self._lock = threading.Lock()
        self._requests = 0
        self._failures = 0

    async def __call__(self, request: Request) -> Response:
        if request.method == "GET":
            return JSONResponse(self.metadata())
        if request.method != "POST":
            return _error(405, f"{request.method} is not served: GET the metadata, POST audio")
        try:
            options = whisper_options(dict(request.query_params), self._vad)
            body = await _body(request, self._max_body_bytes)
            if not body:
                raise codec.RequestError("the body is empty: POST an audio file")
            result = await asyncio.to_thread(self._transcribe, body, options)
        except codec.RequestError as e:
            return _error(e.status, str(e))
        except (kiln.InvalidArgumentError, kiln.FileError) as e:
            return _error(400, str(e))
        except kiln.KilnError as e:
            return _error(500, str(e))
        except Exception as e:  # noqa: BLE001 - answered, and logged
            return _unexpected(e)
        keys = ["text", "language", "tokens", "segments"]
        if "vad" in options:
            keys.append("speech_regions")
        return JSONResponse({k: result[k] for k in keys},
                            headers={"X-Kiln-Replica": _replica_id()})

    def _transcribe(self, audio: bytes, options: dict) -> dict:
        # kiln reads audio from files (libsndfile and mpg123 find the format in the bytes).
        with tempfile.NamedTemporaryFile(prefix="kiln-serve-", suffix=".audio") as f:
            f.write(audio)
            f.flush()
            try:
                samples = kiln.read_audio(f.name)
            except kiln.KilnError as e:  # its message names the temporary file
                raise codec.RequestError(str(e).replace(f.name, "the request body")) from None
        with self._lock:
            try:
                result = self._whisper.transcribe(samples, **options)
            except kiln.KilnError as e:
                if not isinstance(e, kiln.InvalidArgumentError):
                    self._failures += 1
                raise
            self._failures = 0
            self._requests += 1
        return result

    def metadata(self) -> dict[str, Any]:
        return {"model": Path(self._model_dir).name, "kind": "whisper",
                "multilingual": self._whisper.multilingual, "vad": self._vad is not None,
                "max_body_bytes": self._max_body_bytes, "replica": _replica_id(),
                "stats": {"requests": self._requests, "failures_in_a_row": self._failures}}

    def check_health(self) -> None:
        if self._failures >= UNHEALTHY_AFTER_FAILURES:
            raise RuntimeError(f"the last {self._failures} transcriptions failed")


def build_app(model: str | os.PathLike, *, replicas: int = 1,
              autoscale: tuple[int, int] | None = None, max_batch_size: int = 8,
              batch_wait_ms: float = 5.0, threads: int = 1, num_cpus: float = 1.0,
              max_body_bytes: int = codec.DEFAULT_MAX_BODY_BYTES,
              max_ongoing_requests: int | None = None,
              max_queued_requests: int = DEFAULT_MAX_QUEUED_REQUESTS,
              vad: str | os.PathLike | None = None) -> serve.Application:
    """The Serve application of an ONNX model or a Whisper export folder.

    ``replicas`` fixed replicas, or ``autoscale=(min, max)``: Serve adds replicas while each
    has more than ``max_batch_size`` requests under way. ``threads``: kiln's threads per
    replica; ``num_cpus``: the CPUs Ray reserves for each (replicas x num_cpus must fit the
    cluster).

    Bounds: ``max_body_bytes`` per request body (larger: 413); ``max_ongoing_requests`` per
    replica (default: 2 x ``max_batch_size``, at least 4; Whisper: 4); beyond those, each
    Serve proxy queues up to ``max_queued_requests`` requests (-1: no bound) and answers
    further ones 503. ``vad``: a Silero VAD model a Whisper server filters audio with when a
    request asks (``?vad=true``).
    """
    if max_body_bytes < 1:
        raise ValueError(f"max_body_bytes must be positive, not {max_body_bytes}")
    if max_ongoing_requests is not None and max_ongoing_requests < 1:
        raise ValueError(f"max_ongoing_requests must be positive, not {max_ongoing_requests}")
    if max_queued_requests == 0 or max_queued_requests < -1:
        raise ValueError(f"max_queued_requests must be positive or -1, not {max_queued_requests}")
    path = str(Path(model).resolve())  # replicas may run in another directory
    options: dict[str, Any] = {"ray_actor_options": {"num_cpus": num_cpus},
                               "max_queued_requests": max_queued_requests}
    if autoscale is not None:
        options["autoscaling_config"] = {"min_replicas": autoscale[0],
                                         "max_replicas": autoscale[1],
                                         "target_ongoing_requests": max(1, max_batch_size)}
    else:
        options["num_replicas"] = replicas
    if is_whisper_folder(path):
        options["max_ongoing_requests"] = max_ongoing_requests or 4
        vad_path = str(Path(vad).resolve()) if vad else None
        return WhisperServer.options(**options).bind(path, threads, max_body_bytes, vad_path)
    # Room for one batch filling while another runs.
    options["max_ongoing_requests"] = max_ongoing_requests or max(2 * max_batch_size, 4)
    return ModelServer.options(**options).bind(path, max_batch_size, batch_wait_ms, threads,
                                               max_body_bytes)
