#!/bin/sh
# Runs a command with KILN_ISA set to a level, or reports it skipped (exit 77) when this
# processor does not run that level.
#   run_at_isa.sh LEVEL ONNX_RUN COMMAND [ARGS...]
set -u
level=$1
onnx_run=$2
shift 2
if ! KILN_ISA=$level "$onnx_run" --version >/dev/null 2>&1; then
  echo "skipped: this processor does not run the $level kernels: $(KILN_ISA=$level "$onnx_run" --version 2>&1)"
  exit 77
fi
echo "KILN_ISA=$level"
KILN_ISA=$level exec "$@"
