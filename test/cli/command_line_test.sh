#!/bin/sh
# Every tool's command line: --help prints the options with status 0; unknown options,
# missing values and bad integers or numbers are usage errors with status 2 and one line
# naming the problem; the --json outputs and the --profile trace parse as JSON.
#   command_line_test.sh BUILD_DIR KILN_JSON_CHECK SOURCE_DIR
set -u
build=$1
check=$2
src=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0

onnx_run="$build/tools/onnx-run"
generate="$build/tools/kiln-generate"
transcribe="$build/tools/kiln-transcribe"
bench="$build/tools/kiln-bench"
rss="$build/tools/kiln-rss"
ops_doc="$build/tools/kiln-ops-doc"
conformance="$build/test/kiln-conformance"
model="$src/models/tiny-cnn/model.onnx"
data="$src/models/tiny-cnn/test_data_set_0"
whisper="$src/models/whisper-tiny-random"
gpt2="$src/models/gpt2-tiny-random"

# expect STATUS PATTERN -- TOOL ARGS...: the exit status must be STATUS and stdout+stderr
# must match the extended regular expression PATTERN.
expect() {
  want=$1
  pattern=$2
  shift 3
  out=$("$@" 2>&1)
  got=$?
  if [ "$got" -ne "$want" ] || ! printf '%s' "$out" | grep -Eq -e "$pattern"; then
    echo "FAIL: $* -> status $got (want $want), output:"
    printf '%s\n' "$out" | sed 's/^/    /'
    failures=$((failures + 1))
  else
    echo "ok: $* -> $got"
  fi
}

# expect_usage_error TOOL ARGS...: status 2, and the first line of stderr is "NAME: ...".
expect_usage_error() {
  pattern=$1
  shift 2
  name=$(basename "$1")
  expect 2 "^$name: $pattern" -- "$@"
  lines=$("$@" 2>&1 >/dev/null | wc -l)
  if [ "$lines" -gt 2 ]; then
    echo "FAIL: $* printed $lines lines on stderr (want the error and a pointer to --help)"
    failures=$((failures + 1))
  fi
}

# --help everywhere, naming options the docs use.
expect 0 "--test-data" -- "$onnx_run" --help
expect 0 "--gemm-weights" -- "$onnx_run" -h
expect 0 "--prompt-ids" -- "$generate" --help
expect 0 "decoder-step MODEL_DIR" -- "$bench" --help
expect 0 "--constants-from" -- "$rss" --help
expect 0 "PATH" -- "$ops_doc" --help
expect 0 "--check-allowlist" -- "$conformance" --help

# Integers read one way everywhere: decimal digits only, within range.
expect_usage_error "--threads needs an integer >= 1, got 'x'" -- "$onnx_run" "$model" --threads x
expect_usage_error "--repeat needs an integer >= 1, got '0'" -- "$onnx_run" "$model" --repeat 0
expect_usage_error "--warmup needs an integer >= 0, got '-1'" -- "$onnx_run" "$model" --warmup -1
expect_usage_error "--repeat needs an integer >= 1, got '2.5'" -- "$onnx_run" "$model" --repeat 2.5
expect_usage_error "--repeat needs an integer >= 1, got '3x'" -- "$onnx_run" "$model" --repeat 3x
expect_usage_error "--repeat needs an integer >= 1, got '0x10'" -- "$onnx_run" "$model" --repeat 0x10
expect_usage_error "--threads needs an integer >= 1, got '99999999999' \(out of range\)" -- "$onnx_run" "$model" --threads 99999999999
expect_usage_error "--rtol needs a number >= 0, got 'abc'" -- "$onnx_run" "$model" --rtol abc
expect_usage_error "--atol needs a number >= 0, got 'nan'" -- "$onnx_run" "$model" --atol nan
expect_usage_error "--threads" -- "$onnx_run" "$model" --threads
expect_usage_error "unknown option '--bogus'" -- "$onnx_run" "$model" --bogus
expect_usage_error "unexpected argument 'extra'" -- "$onnx_run" "$model" extra
expect_usage_error "--input needs NAME=FILE, got 'oops'" -- "$onnx_run" "$model" --input oops

expect_usage_error "--seed needs an integer >= 0, got '-1'" -- "$generate" "$gpt2" --seed -1
expect_usage_error "--seed needs an integer >= 0, got '18446744073709551616' \(out of range\)" -- "$generate" "$gpt2" --seed 18446744073709551616
expect_usage_error "--max-new-tokens needs an integer >= 0, got 'ten'" -- "$generate" "$gpt2" --max-new-tokens ten
expect_usage_error "--top-k needs an integer >= 0, got '-3'" -- "$generate" "$gpt2" --top-k -3
expect_usage_error "--temperature needs a number >= 0, got 'hot'" -- "$generate" "$gpt2" --temperature hot
expect_usage_error "--sampling takes greedy or sample, got 'beam'" -- "$generate" "$gpt2" --sampling beam
expect_usage_error "--prompt-ids needs an integer >= 0, got 'x'" -- "$generate" "$gpt2" --prompt-ids 1,x
expect_usage_error "give at most one of" -- "$generate" "$gpt2" --prompt-ids 1 --features f.npy
expect_usage_error "give at most one of .*--prompt" -- "$generate" "$gpt2" --prompt hi --prompt-ids 1
expect_usage_error "no model folder given" -- "$generate"
expect_usage_error "unknown option '--bogus'" -- "$generate" "$gpt2" --bogus
expect_usage_error "--weights takes f32, bf16, f16 or int8, got 'f8'" -- "$generate" "$gpt2" --weights f8
expect 0 "--beams" -- "$transcribe" --help
expect_usage_error "--beams needs an integer >= 1 and <= 64, got '0'" -- "$transcribe" m a.wav --beams 0
expect_usage_error "--format takes txt, srt, vtt or json, got 'doc'" -- "$transcribe" m a.wav --format doc
expect_usage_error "--temperature needs a number >= 0, got '-1'" -- "$transcribe" m a.wav --temperature -1
expect_usage_error "give --prompt or --prompt-ids, not both" -- "$transcribe" m a.wav --prompt x --prompt-ids 1
expect_usage_error "no model folder given" -- "$transcribe"

expect_usage_error "N needs an integer >= 1, got 'x'" -- "$bench" gemm 4 x 4
expect_usage_error "K needs an integer >= 1, got '-4'" -- "$bench" gemm 4 4 -4
expect_usage_error "--steps needs an integer >= 1, got '0'" -- "$bench" decode "$whisper" --steps 0
expect_usage_error "--past-len needs an integer >= 0, got '1e3'" -- "$bench" decoder-step "$whisper" --past-len 1e3

expect_usage_error "--runs needs an integer >= 1, got '0'" -- "$rss" "$model" --runs 0
expect_usage_error "--threads needs an integer >= 1, got 'many'" -- "$rss" "$model" --threads many
expect_usage_error "MODEL is required" -- "$rss"
expect_usage_error "unknown option '--bogus'" -- "$rss" "$model" --bogus

expect_usage_error "unexpected argument 'b.md'" -- "$ops_doc" a.md b.md
expect_usage_error "--jobs needs an integer >= 1, got '0'" -- "$conformance" --jobs 0
expect_usage_error "--timeout needs an integer >= 1, got '1m'" -- "$conformance" --timeout 1m
expect_usage_error "unknown option '--bogus'" -- "$conformance" --bogus

# The last of a repeated option counts; --name=value works too.
expect 0 '"latency_ms":\{[^}]*"runs":2[,}]' -- "$onnx_run" "$model" --test-data "$data" --json --repeat 5 --repeat=2

# expect_json FILE CHECKS...: kiln-json-check FILE CHECKS passes (FILE parses as JSON).
expect_json() {
  if out=$("$check" "$@" 2>&1); then
    echo "ok: $1 parses and holds $*"
  else
    echo "FAIL: kiln-json-check $*:"
    printf '%s\n' "$out" | sed 's/^/    /'
    sed 's/^/    /' "$1" | cut -c1-400
    failures=$((failures + 1))
  fi
}

# JSON outputs parse, with the members the scripts read.
"$onnx_run" "$model" --test-data "$data" --json --profile "$tmp/trace.json" >"$tmp/run.json" 2>&1
expect_json "$tmp/run.json" passed=true latency_ms/median latency_ms/runs=1 \
  run_stats/arena_bytes load_stats/nodes_planned outputs/0/name=probs outputs/0/shape#=2
expect_json "$tmp/trace.json" 0/name=session_initialization 1/name=model_run \
  2/ph=X 2/args/provider=kiln 2/args/input_type_shape
"$onnx_run" --version --json >"$tmp/version.json" 2>&1
expect_json "$tmp/version.json" kiln_version isa
"$generate" "$gpt2" --json --max-new-tokens 3 >"$tmp/generate.json" 2>&1
expect_json "$tmp/generate.json" tokens#=3 prompt text=null steps#=3 steps/2/past_len \
  matches_expected=null
"$generate" "$gpt2" --json --max-new-tokens 3 --weights int8 >"$tmp/generate_int8.json" 2>&1
expect_json "$tmp/generate_int8.json" tokens#=3 steps#=3
printf 'not json' >"$tmp/bad.json"
expect 2 "bad.json: invalid JSON: parse error at line 1, column 2" -- "$check" "$tmp/bad.json"

if [ "$failures" -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all command-line checks passed"
