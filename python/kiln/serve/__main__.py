"""python -m kiln.serve MODEL: serves an ONNX model or a Whisper export folder over HTTP with
Ray Serve, on a local Ray instance or, with --address, on a running Ray cluster.

Exit status 2 and one line for a bad option or a model kiln cannot load.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

import kiln


def _fail(message: str) -> None:
    """One line on stderr and exit status 2, as kiln's tools do."""
    print(f"kiln.serve: {message}", file=sys.stderr)
    sys.exit(2)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:
        _fail(message)


def _positive(kind):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{text}' is not a number") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"'{text}' is not positive")
        return value
    return parse


def _queue_bound(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1 and value != -1:
        raise argparse.ArgumentTypeError(f"'{text}' is not a positive number or -1")
    return value


def _range(text: str) -> tuple[int, int]:
    low, sep, high = text.partition(":")
    try:
        bounds = (int(low), int(high))
    except ValueError:
        bounds = None
    if not sep or bounds is None or not 0 <= bounds[0] <= bounds[1] or bounds[1] == 0:
        raise argparse.ArgumentTypeError(f"'{text}' is not MIN:MAX replicas")
    return bounds


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = _Parser(prog="python -m kiln.serve", description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="an .onnx file or a Whisper export folder")
    scale = p.add_mutually_exclusive_group()
    scale.add_argument("--replicas", type=_positive(int), default=1,
                       help="replicas, each with its own kiln session (default 1)")
    scale.add_argument("--autoscale", type=_range, metavar="MIN:MAX",
                       help="let Serve scale between MIN and MAX replicas on load")
    p.add_argument("--max-batch-size", type=_positive(int), default=8,
                   help="requests stacked into one run for models with a batch axis (1: off)")
    p.add_argument("--batch-wait-ms", type=_positive(float), default=5.0,
                   help="how long a batch waits to fill (default 5 ms)")
    p.add_argument("--threads", type=_positive(int), default=1,
                   help="kiln threads per replica (default 1)")
    p.add_argument("--num-cpus", type=_positive(float), default=None,
                   help="CPUs Ray reserves per replica (default: --threads)")
    p.add_argument("--max-body-mb", type=_positive(float), default=32.0,
                   help="largest request body in MiB; larger ones are answered 413 (default 32)")
    p.add_argument("--max-ongoing-requests", type=_positive(int), default=None,
                   help="requests a replica takes at once (default: 2 x --max-batch-size, at "
                        "least 4; Whisper: 4)")
    p.add_argument("--max-queued-requests", type=_queue_bound, default=64,
                   help="requests each proxy queues while every replica is full; more are "
                        "answered 503 (default 64; -1: no bound)")
    p.add_argument("--vad", default=None, metavar="MODEL.onnx",
                   help="Whisper: a Silero VAD model that requests may filter audio with (?vad=true)")
    p.add_argument("--host", default="127.0.0.1", help="HTTP address (default 127.0.0.1)")
    p.add_argument("--port", type=_positive(int), default=8000, help="HTTP port (default 8000)")
    p.add_argument("--route-prefix", default="/", help="URL prefix (default /)")
    p.add_argument("--address", default=None,
                   help="a running Ray cluster (HEAD:6379, or 'auto'); default: a local Ray")
    return p.parse_args(argv)


def _check_model(path: str, vad: str | None = None) -> None:
    """Loads the model once here, so a bad file is one line rather than failing replicas."""
    from . import is_whisper_folder
    if not os.path.exists(path):
        _fail(f"{path}: no such file or folder")
    try:
        if is_whisper_folder(path):
            kiln.WhisperTranscriber(path, 1)
            if vad:
                kiln.VoiceActivityDetector(vad)
        else:
            kiln.InferenceSession(path)
    except kiln.KilnError as e:
        _fail(str(e))


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    _check_model(args.model, args.vad)
    # Ray's usage statistics would be sent over the network: off unless asked for.
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if not args.address:
        # Ray's single-node mode: its processes talk over the loopback address only.
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray
    from ray import serve

    from . import build_app

    if args.address:
        ray.init(address=args.address)
    else:  # a Ray of this process only, on the loopback address
        ray.init(address="local", include_dashboard=False)
    # An HTTP proxy on every node: any node of a cluster takes requests.
    serve.start(proxy_location="EveryNode", http_options={"host": args.host, "port": args.port})
    app = build_app(args.model, replicas=args.replicas, autoscale=args.autoscale,
                    max_batch_size=args.max_batch_size, batch_wait_ms=args.batch_wait_ms,
                    threads=args.threads, num_cpus=args.num_cpus or args.threads,
                    max_body_bytes=max(1, int(args.max_body_mb * (1 << 20))),
                    max_ongoing_requests=args.max_ongoing_requests,
                    max_queued_requests=args.max_queued_requests, vad=args.vad)
    # Ctrl-C is remembered as well as raised: the proxy answers before serve.run returns, and
    # an interrupt that arrives inside serve.run may be caught there, which would otherwise
    # leave the server waiting for another.
    interrupted = threading.Event()

    def on_interrupt(signum, frame):
        interrupted.set()
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_interrupt)
    try:
        serve.run(app, name="kiln", route_prefix=args.route_prefix)
        scale = (f"{args.autoscale[0]}-{args.autoscale[1]} replicas" if args.autoscale
                 else f"{args.replicas} replica{'s' if args.replicas > 1 else ''}")
        if not interrupted.is_set():
            print(f"kiln.serve: {args.model} at http://{args.host}:{args.port}{args.route_prefix} "
                  f"({scale}); Ctrl-C stops", flush=True)
        while not interrupted.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        serve.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    main()
