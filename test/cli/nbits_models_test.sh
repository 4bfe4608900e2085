#!/bin/sh
# int4 weight-only quantized GPT-2s (models/gpt2-tiny-int4, made by tools/export/make_nbits.py
# with onnxruntime's MatMulNBitsQuantizer: com.microsoft MatMulNBits and GatherBlockQuantized)
# run in kiln: a prefill and a decoding step match onnxruntime's outputs within the tolerances
# of onnxruntime's own model tests (rtol 1e-3, atol 1e-5), and a greedy decode gives
# onnxruntime's tokens.
#   nbits_models_test.sh ONNX_RUN KILN_GENERATE SOURCE_DIR
set -u
onnx_run=$1
generate=$2
src=$3
status=0
count=0
for dir in "$src"/models/gpt2-tiny-int4/*/; do
  for data in "$dir"test_data_set_*/; do
    count=$((count + 1))
    if out=$("$onnx_run" "$dir/model.onnx" --test-data "$data" --rtol 1e-3 --atol 1e-5 2>&1) &&
      echo "$out" | grep -q PASSED; then
      echo "ok: $data"
    else
      echo "FAILED: $data"
      echo "$out"
      status=1
    fi
  done
  if out=$("$generate" "$dir" 2>&1) && echo "$out" | grep -q "matches expected_tokens.json"; then
    echo "ok: greedy decode of $dir"
  else
    echo "FAILED: greedy decode of $dir"
    echo "$out"
    status=1
  fi
done
# Two models of two data sets each: a missing folder fails rather than passing unseen.
if [ "$count" -ne 4 ]; then
  echo "FAILED: expected 4 data sets, found $count"
  status=1
fi
exit $status
