"""What the engine workers (ort_worker.py, ov_worker.py) share: the model file of each case
folder, memory readings of the worker's own process, and percentiles."""
import os
import resource

import numpy as np

MODEL_FILES = {"encoder": "encoder_model.onnx", "decoder-step": "decoder_model_merged.onnx",
               "minilm": "model.onnx"}


def current_rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGESIZE")


def peak_rss_bytes() -> int:
    """VmHWM: ru_maxrss would include the parent's size (Linux keeps it across exec)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def percentile(values, p):
    return float(np.percentile(np.array(values), p * 100)) if values else 0.0
