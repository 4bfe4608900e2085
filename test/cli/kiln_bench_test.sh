#!/bin/sh
# kiln-bench end to end on the committed whisper-tiny-random: every case prints one JSON
# object with the expected keys and counters, and bad arguments give exit status 2 with one
# clear line.
#   kiln_bench_test.sh KILN_BENCH KILN_JSON_CHECK SOURCE_DIR
set -u
bench=$1
check=$2
src=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
whisper="$src/models/whisper-tiny-random"

# expect_json NAME CHECKS... -- ARGS...: kiln-bench ARGS exits 0 and its stdout passes CHECKS.
expect_json() {
  name=$1
  shift
  checks=""
  while [ "$1" != "--" ]; do
    checks="$checks $1"
    shift
  done
  shift
  if ! "$bench" "$@" >"$tmp/$name.json" 2>"$tmp/$name.err"; then
    echo "FAIL: kiln-bench $* -> status $? (want 0):"
    sed 's/^/    /' "$tmp/$name.err"
    failures=$((failures + 1))
    return
  fi
  lines=$(wc -l <"$tmp/$name.json")
  # shellcheck disable=SC2086
  if [ "$lines" -ne 1 ] || ! out=$("$check" "$tmp/$name.json" $checks 2>&1); then
    echo "FAIL: kiln-bench $* ($lines line(s) of output):"
    printf '%s\n' "$out" | sed 's/^/    /'
    sed 's/^/    /' "$tmp/$name.json" | cut -c1-400
    failures=$((failures + 1))
  else
    echo "ok: kiln-bench $*"
  fi
}

expect_status() {
  want=$1
  pattern=$2
  shift 3
  out=$("$bench" "$@" 2>&1)
  got=$?
  if [ "$got" -ne "$want" ] || ! printf '%s' "$out" | grep -Eq -e "$pattern"; then
    echo "FAIL: kiln-bench $* -> status $got (want $want), output:"
    printf '%s\n' "$out" | sed 's/^/    /'
    failures=$((failures + 1))
  else
    echo "ok: kiln-bench $* -> $got"
  fi
}

common="engine=kiln load_ms iterations_ms median_ms p90_ms min_ms bytes_copied allocations
        last_run_stats/bytes_copied last_run_stats/allocations last_run_stats/nodes_run
        load_stats/weights_bytes rss_before_load_bytes peak_rss_bytes threads=1 kiln_version isa"

# shellcheck disable=SC2086
expect_json encoder $common case=encoder iterations_ms#=2 bytes_copied#=2 \
  "inputs/input_features=float32[1,80,3000]" -- encoder "$whisper" --threads 1 --warmup 1 --iterations 2
# The caches are fed by move with room to grow: every timed run gets them back without
# rebuilding them, and copies the same bytes whatever the cache length.
# shellcheck disable=SC2086
expect_json step $common case=decoder-step past_len=16 kv_capacity=448 iterations_ms#=3 \
  kv_rebuilt_outside_timer=0 bytes_copied/2=@bytes_copied/0 \
  "inputs/past_key_values.0.decoder.key=float32[1,4,16,16]" \
  -- decoder-step "$whisper" --past-len 16 --threads 1 --warmup 1 --iterations 3
# shellcheck disable=SC2086
expect_json run $common case=run iterations_ms#=1 \
  -- run "$whisper/encoder_model.onnx" --input "input_features=$whisper/sample_features.npy" \
  --threads 1 --warmup 0 --iterations 1 --output-dir "$tmp/out"
if [ ! -s "$tmp/out/last_hidden_state.npy" ]; then
  echo "FAIL: --output-dir did not write last_hidden_state.npy"
  failures=$((failures + 1))
fi
# Steps with the cache copy the same bytes whatever its length (the cache is not copied).
# The prompt: start of transcript, language, task, no timestamps.
expect_json decode engine=kiln case=decode kiln_version isa threads=1 load_ms encoder_ms decode_ms tokens#=5 \
  prompt#=4 steps#=5 steps/0/step=0 steps/0/past_len=0 steps/1/past_len=4 steps/4/step=4 \
  steps/4/past_len=7 steps/4/ms steps/4/bytes_copied=@steps/1/bytes_copied steps/4/allocations \
  peak_rss_bytes \
  -- decode "$whisper" --steps 5 --warmup 0 --threads 1

expect_status 2 "unknown case 'fast'" -- fast "$whisper"
expect_status 2 "no case given" --
expect_status 2 "no model given" -- encoder
expect_status 2 "--past-len does not apply to case 'encoder'" -- encoder "$whisper" --past-len 3
expect_status 2 "--threads needs an integer >= 1, got '0'" -- encoder "$whisper" --threads 0
expect_status 2 "--iterations needs an integer >= 1, got 'x'" -- encoder "$whisper" --iterations x
expect_status 2 "--input needs NAME=FILE.npy" -- run "$whisper/encoder_model.onnx" --input oops
expect_status 2 "unknown option '--bogus'" -- encoder "$whisper" --bogus
expect_status 2 "nope.*no such file" -- encoder "$tmp/nope"
expect_status 2 "not a folder" -- decode "$tmp/nope"
expect_status 2 "the model has no input 'x'" -- run "$whisper/encoder_model.onnx" --input "x=$tmp/x.npy"
expect_status 2 "no value for input 'input_features" -- run "$whisper/encoder_model.onnx"
printf 'not numpy' >"$tmp/bad.npy"
expect_status 2 "bad.npy" -- run "$whisper/encoder_model.onnx" --input "input_features=$tmp/bad.npy"

if [ "$failures" -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all kiln-bench checks passed"
