#!/bin/sh
# Files written by onnxruntime's quantization tools (models/ort-quantized/*, made by
# tools/export/make_ort_quantized.py: DynamicQuantizeMatMul, MatMulIntegerToFloat, QGemm,
# DynamicQuantizeLSTM, QAttention) run in kiln and match onnxruntime's outputs. Activations are
# quantized exactly as onnxruntime quantizes them and the int8 sums are exact, so the outputs
# differ only by float rounding: the tolerances of onnxruntime's own model tests (rtol 1e-3,
# atol 1e-5) hold, tighter than those of its quantized-op unit tests (rtol 0.02).
#   ort_quantized_test.sh ONNX_RUN SOURCE_DIR
set -u
onnx_run=$1
src=$2
status=0
count=0
for dir in "$src"/models/ort-quantized/*/; do
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
# A missing folder fails rather than passing unseen.
if [ "$count" -ne 5 ]; then
  echo "FAILED: expected 5 model folders, found $count"
  status=1
fi
exit $status
