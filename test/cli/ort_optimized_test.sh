#!/bin/sh
# Files written by onnxruntime's transformer optimizer (models/*-ort-optimized, made by
# tools/export/make_ort_optimized.py) run in kiln and match onnxruntime's outputs within the
# tolerances of onnxruntime's own model tests (rtol 1e-3, atol 1e-5).
#   ort_optimized_test.sh ONNX_RUN SOURCE_DIR
set -u
onnx_run=$1
src=$2
status=0
count=0
for dir in "$src"/models/bert-tiny-ort-optimized/*/ "$src"/models/gpt2-tiny-ort-optimized/*/; do
  count=$((count + 1))
  if out=$("$onnx_run" "$dir/model.onnx" --test-data "$dir/test_data_set_0" --rtol 1e-3 --atol 1e-5 2>&1) &&
    echo "$out" | grep -q PASSED; then
    echo "ok: $dir"
  else
    echo "FAILED: $dir"
    echo "$out"
    status=1
  fi
done
# Four BERT files and one GPT-2 file: a missing folder fails rather than passing unseen.
if [ "$count" -ne 5 ]; then
  echo "FAILED: expected 5 model folders, found $count"
  status=1
fi
exit $status
