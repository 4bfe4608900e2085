#!/bin/sh
# com.microsoft MultiHeadAttention, GroupQueryAttention and RotaryEmbedding against
# onnxruntime's outputs (models made by tools/export/make_ort_attention.py): one-node models,
# and onnxruntime-genai's tiny Llama over a prefill and a decoding step.
#   ort_attention_test.sh ONNX_RUN SOURCE_DIR
set -u
onnx_run=$1
src=$2
status=0
count=0
for set in "$src"/models/ort-attention-ops/*/test_data_set_0 "$src"/models/llama-tiny-genai/test_data_set_*; do
  count=$((count + 1))
  dir=$(dirname "$set")
  if out=$("$onnx_run" "$dir/model.onnx" --test-data "$set" --rtol 1e-3 --atol 1e-5 2>&1) &&
    echo "$out" | grep -q PASSED; then
    echo "ok: $set"
  else
    echo "FAILED: $set"
    echo "$out"
    status=1
  fi
done
# Eleven one-node models and the decoder's two steps: a missing one fails rather than passing unseen.
if [ "$count" -ne 13 ]; then
  echo "FAILED: expected 13 data sets, found $count"
  status=1
fi
exit $status
