"""Writes models/cache/whisper-tiny.en/vad_references.json: the speech regions faster-whisper's
get_speech_timestamps finds with its own Silero VAD (faster_whisper/assets/silero_vad_v6.onnx)
in the real-speech clips `make whisper-real` made (long.wav, stella.wav, and long.wav with 15 s
of silence put in), under faster-whisper's default VadOptions and kiln's (a minimum speech
duration of 250 ms). test_vad.cpp compares kiln's regions with them when `make vad-real` has
restored the same model. The clips are espeak-ng's, so the references are made where the clips
were.

    python3 -m venv /tmp/fw && /tmp/fw/bin/pip install -r tools/bench/requirements-transcribe.txt
    /tmp/fw/bin/python tools/export/make_vad_refs.py
"""
import json
import os

import numpy as np
from faster_whisper.audio import decode_audio
from faster_whisper.vad import VadOptions, get_speech_timestamps
from faster_whisper.version import __version__

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FOLDER = os.path.join(ROOT, "models", "cache", "whisper-tiny.en")


def main():
    audio = {name: decode_audio(os.path.join(FOLDER, "audio", name + ".wav"), sampling_rate=16000)
             for name in ("long", "stella")}
    # long.wav's first 20 s, 15 s of zeros, then its 40 s to 60 s.
    long = audio["long"]
    audio["long with a gap"] = np.concatenate(
        [long[: 20 * 16000], np.zeros(15 * 16000, np.float32), long[40 * 16000: 60 * 16000]])
    cases = []
    for name, samples in audio.items():
        for min_speech in (0, 250):
            regions = get_speech_timestamps(samples, VadOptions(min_speech_duration_ms=min_speech))
            cases.append({"audio": name, "min_speech_duration_ms": min_speech,
                          "regions": [[r["start"], r["end"]] for r in regions]})
    out = {"faster_whisper": __version__, "model": "faster_whisper/assets/silero_vad_v6.onnx",
           "gap": "long.wav [0, 20 s) + 15 s of zeros + [40 s, 60 s)", "cases": cases}
    with open(os.path.join(FOLDER, "vad_references.json"), "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
