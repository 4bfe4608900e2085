#!/bin/sh
# Files written by onnxruntime's static quantization (models/tiny-cnn-quantized, made by
# tools/export/make_ort_qlinear.py: QOperator uint8 and int8, QDQ uint8) run in kiln and
# match onnxruntime's 8-bit outputs within one quantization step (--atol 1 on the uint8 or
# int8 output tensor): onnxruntime computes some element-wise ops in float with its own
# summation order, so a value within float rounding of a half may round either way.
#   ort_qlinear_test.sh ONNX_RUN SOURCE_DIR
set -u
onnx_run=$1
src=$2
status=0
count=0
for dir in "$src"/models/tiny-cnn-quantized/*/; do
  count=$((count + 1))
  if out=$("$onnx_run" "$dir/model.onnx" --test-data "$dir/test_data_set_0" --rtol 0 --atol 1 2>&1) &&
    echo "$out" | grep -q PASSED; then
    echo "ok: $dir"
  else
    echo "FAILED: $dir"
    echo "$out"
    status=1
  fi
done
# Three forms: a missing folder fails rather than passing unseen.
if [ "$count" -ne 3 ]; then
  echo "FAILED: expected 3 model folders, found $count"
  status=1
fi
exit $status
