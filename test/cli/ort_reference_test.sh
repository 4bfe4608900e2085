#!/bin/sh
# Models written by onnxruntime's own tools (made by the tools/export/make_ort_*.py scripts, each
# data set holding onnxruntime's outputs) run in kiln and match those outputs.
#   ort_reference_test.sh ONNX_RUN SOURCE_DIR COUNT RTOL ATOL PATTERN...
# PATTERN: data-set folders relative to SOURCE_DIR, shell globs allowed; each folder's model is
# the model.onnx beside it. COUNT is how many data sets must be found, so a missing folder
# fails rather than passing unseen.
set -u
onnx_run=$1
src=$2
want=$3
rtol=$4
atol=$5
shift 5
status=0
count=0
for pattern in "$@"; do
  for set in "$src"/$pattern; do
    [ -d "$set" ] || continue
    count=$((count + 1))
    if out=$("$onnx_run" "$(dirname "$set")/model.onnx" --test-data "$set" --rtol "$rtol" --atol "$atol" 2>&1) &&
      echo "$out" | grep -q PASSED; then
      echo "ok: $set"
    else
      echo "FAILED: $set"
      echo "$out"
      status=1
    fi
  done
done
if [ "$count" -ne "$want" ]; then
  echo "FAILED: expected $want data sets, found $count"
  status=1
fi
exit $status
