#!/bin/sh
# onnx-run end to end: exit codes and one-line messages.
#   onnx_run_test.sh ONNX_RUN SOURCE_DIR
set -u
run=$1
src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0

# expect STATUS PATTERN -- ARGS...: the exit status must be STATUS and stdout+stderr must
# match the extended regular expression PATTERN.
expect() {
  want=$1
  pattern=$2
  shift 3
  out=$("$run" "$@" 2>&1)
  got=$?
  if [ "$got" -ne "$want" ] || ! printf '%s' "$out" | grep -Eq "$pattern"; then
    echo "FAIL: onnx-run $* -> status $got (want $want), output:"
    printf '%s\n' "$out" | sed 's/^/    /'
    failures=$((failures + 1))
  else
    echo "ok: onnx-run $* -> $got"
  fi
}

model="$src/models/tiny-cnn/model.onnx"
data="$src/models/tiny-cnn/test_data_set_0"

expect 0 "PASSED" -- "$model" --test-data "$data"
expect 0 '"passed":true' -- "$model" --test-data "$data" --json --repeat 3
expect 0 '"median"' -- "$model" --test-data "$data" --json --profile "$tmp/trace.json"
grep -q '"ph":"X"' "$tmp/trace.json" || { echo "FAIL: profile has no events"; failures=$((failures + 1)); }
grep -q '_kernel_time' "$tmp/trace.json" || { echo "FAIL: profile lacks node events"; failures=$((failures + 1)); }

# Arena flags: results unchanged; with --inputs-in-arena the third run (planned on the
# second) places the input in the arena.
expect 0 '"passed":true' -- "$model" --test-data "$data" --json --repeat 3 --no-arena
expect 0 '"passed":true.*"arena_input_bytes":0[,}]' -- "$model" --test-data "$data" --json --repeat 3
expect 0 '"passed":true.*"arena_input_bytes":[1-9]' -- "$model" --test-data "$data" --json --repeat 3 --inputs-in-arena
expect 0 "bytes of inputs in it" -- "$model" --test-data "$data" --repeat 3 --inputs-in-arena

# A memory limit the run stays under changes nothing; a malformed one is a usage error.
expect 0 '"passed":true' -- "$model" --test-data "$data" --json --memory-limit 64
expect 2 'memory-limit needs an integer' -- "$model" --memory-limit 1.5

# --timeout stops a run of a Loop of 10^12 iterations: status 2, naming the node it stopped
# before (the Loop, or a node of its body).
expect 2 "endless_loop.onnx: node '[a-z]+' \\((Loop|Add|Identity)\\): run stopped at its deadline" \
  -- "$src/test/cli/data/endless_loop.onnx" \
  --input "n0=$src/test/cli/data/zero.npy" --timeout 0.2
expect 2 'timeout needs a number' -- "$model" --timeout -1

# Denormals (tools/export/make_cli_data.py): softmax_tails.onnx's 63 small probabilities are
# denormal; flushed by default, kept with --denormals keep, counted with --count-denormals.
tails="$src/test/cli/data/softmax_tails.onnx"
expect 0 'denormals: 0 produced by the last run \(flush\)' -- "$tails" \
  --input "x=$src/test/cli/data/zero.npy" --count-denormals
expect 0 'denormals: 63 produced by the last run \(keep\)' -- "$tails" \
  --input "x=$src/test/cli/data/zero.npy" --count-denormals --denormals keep
expect 0 '"denormals":"keep".*"denormals_produced":63' -- "$tails" \
  --input "x=$src/test/cli/data/zero.npy" --count-denormals --denormals keep --json
expect 2 "denormals takes flush or keep, got 'zero'" -- "$tails" --denormals zero

# A 4 TB broadcast output (Expand's view of one value): previewed without copying it; writing
# it out fails naming the file it was for, leaving no file.
huge="$src/test/cli/data/expand_huge.onnx"
expect 0 'y: float32\[1000000,1000000\].*\[1, 1, 1, 1, 1, 1, 1, 1, \.\.\.\]' -- "$huge" \
  --input "x=$src/test/cli/data/one.npy"
expect 2 "y\.npy: .*needs 4\.0 TB: out of memory" -- "$huge" \
  --input "x=$src/test/cli/data/one.npy" --output-dir "$tmp/huge"
[ ! -e "$tmp/huge/y.npy" ] || { echo "FAIL: a partial y.npy was left"; failures=$((failures + 1)); }

# Tight tolerances make the comparison fail: status 1.
expect 1 "MISMATCH" -- "$model" --test-data "$data" --rtol 0 --atol 0

# Bad files: status 2 with a message naming the file.
# --save-optimized writes the graph as run; the file runs unoptimised to the same outputs.
expect 0 "PASSED" -- "$model" --test-data "$data" --save-optimized "$tmp/optimized.onnx"
expect 0 "PASSED" -- "$tmp/optimized.onnx" --test-data "$data" --optimize none
expect 2 "no-such-dir/optimized.onnx" -- "$model" --save-optimized "$tmp/no-such-dir/optimized.onnx"

head -c 1000 /dev/urandom > "$tmp/garbage.onnx"
expect 2 "garbage.onnx" -- "$tmp/garbage.onnx"
head -c 2000 "$model" > "$tmp/truncated.onnx"
expect 2 "truncated.onnx: .*malformed protobuf" -- "$tmp/truncated.onnx"
: > "$tmp/empty.onnx"
expect 2 "empty.onnx: empty file" -- "$tmp/empty.onnx"
expect 2 "nope.onnx: cannot open" -- "$tmp/nope.onnx"
expect 2 "unknown option" -- "$model" --bogus
expect 2 "no model given" --

# Bad inputs: a wrongly shaped .npy (the [2,10] output written by --output-dir).
expect 0 "PASSED" -- "$model" --test-data "$data" --output-dir "$tmp/out"
[ -f "$tmp/out/probs.npy" ] || { echo "FAIL: --output-dir wrote no probs.npy"; failures=$((failures + 1)); }
cp "$tmp/out/probs.npy" "$tmp/x.npy"
expect 2 "input 'image': wrong rank" -- "$model" --input image="$tmp/x.npy"
expect 2 "the model has no input 'nope'" -- "$model" --input nope="$tmp/x.npy"
expect 2 "missing input 'image" -- "$model"

# The official test case for Add.
case_dir="${ONNX_BACKEND_TEST_DATA:-$src/../shared/onnx-backend-tests}/node/test_add"
if [ -d "$case_dir" ]; then
  expect 0 "PASSED" -- "$case_dir/model.onnx" --test-data "$case_dir/test_data_set_0"
else
  echo "note: ONNX backend test data not found; test_add skipped"
fi

# Lower-precision GEMM weights: the tiny CNN's Gemm still matches its reference within the
# default tolerance; a bad value is a usage error.
expect 0 '"gemm_weights":"bf16"' -- "$model" --test-data "$data" --json --gemm-weights bf16 --atol 1e-2 --rtol 1e-2
expect 0 '"gemm_weights":"int8"' -- "$model" --test-data "$data" --json --gemm-weights int8 --atol 1e-2 --rtol 1e-2
expect 2 "gemm-weights takes f32, bf16, f16 or int8" -- "$model" --gemm-weights f8

# Graph optimisation levels: the same result at every level; a bad level is a usage error.
expect 0 '"passed":true.*"folded_nodes":0' -- "$model" --test-data "$data" --json --optimize none
expect 0 '"passed":true' -- "$model" --test-data "$data" --json --optimize basic
expect 2 "optimize takes none, basic or all" -- "$model" --optimize most

# The version and the instruction-set level in use; KILN_ISA caps it, and a bad or
# unsupported value is one clear error with status 2.
expect 0 "onnx-run \(kiln\) [0-9]+\.[0-9]+\.[0-9]+" -- --version
expect 0 '"kiln_version":"[0-9.]+","isa":"(generic|avx2|avx512)"' -- --version --json
expect 0 '"isa":"(generic|avx2|avx512)"' -- "$model" --test-data "$data" --json
check_isa_output() {
  label=$1
  pattern=$2
  out=$3
  if printf '%s' "$out" | grep -Eq "$pattern"; then
    echo "ok: $label"
  else
    echo "FAIL: $label, output:"
    printf '%s\n' "$out" | sed 's/^/    /'
    failures=$((failures + 1))
  fi
}
out=$(KILN_ISA=generic "$run" "$model" --test-data "$data" --json 2>&1; echo "status $?")
check_isa_output "KILN_ISA=generic runs the generic kernels" '"isa":"generic".*"passed":true|"passed":true.*"isa":"generic"' "$out"
check_isa_output "KILN_ISA=generic exits 0" 'status 0$' "$out"
out=$(KILN_ISA=sse9 "$run" "$model" 2>&1; echo "status $?")
check_isa_output "KILN_ISA=sse9 is an error" '^onnx-run: KILN_ISA=sse9 is not an instruction-set level.*status 2$' "$(printf '%s' "$out" | tr '\n' ' ')"
out=$(KILN_ISA=avx512 "$run" --version 2>&1; echo "status $?")
if grep -q avx512f /proc/cpuinfo 2>/dev/null && grep -q avx512bw /proc/cpuinfo && grep -q avx512dq /proc/cpuinfo && grep -q avx512vl /proc/cpuinfo; then
  check_isa_output "KILN_ISA=avx512 on a processor with AVX-512" 'kernels: avx512.*status 0' "$(printf '%s' "$out" | tr '\n' ' ')"
else
  check_isa_output "KILN_ISA=avx512 on a processor without AVX-512 is an error" 'lacks.*status 2' "$(printf '%s' "$out" | tr '\n' ' ')"
fi

if [ "$failures" -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all onnx-run checks passed"
