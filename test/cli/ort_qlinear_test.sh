#!/bin/sh
# Files written by onnxruntime's static quantization (models/tiny-cnn-quantized, made by
# tools/export/make_ort_qlinear.py: QOperator uint8 and int8, QDQ uint8) run in kiln and
# match onnxruntime's outputs, the results of every quantized node included. QOperator
# folders hold 8-bit outputs, which must match exactly. The QDQ folder holds dequantized float
# outputs compared within one quantization step (its file `atol`: the largest scale), as
# kiln's float ops (AveragePool's sum) may round a value lying at a half the other way.
#   ort_qlinear_test.sh ONNX_RUN SOURCE_DIR
set -u
onnx_run=$1
src=$2
status=0
count=0
for dir in "$src"/models/tiny-cnn-quantized/*/; do
  count=$((count + 1))
  atol=0
  if [ -f "$dir/atol" ]; then atol=$(cat "$dir/atol"); fi
  if out=$("$onnx_run" "$dir/model.onnx" --test-data "$dir/test_data_set_0" --rtol 0 --atol "$atol" 2>&1) &&
    echo "$out" | grep -q PASSED; then
    echo "ok: $dir (atol $atol)"
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
