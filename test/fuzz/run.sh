#!/bin/sh
# Runs each libFuzzer harness for a bounded time: first over the committed regression inputs
# (every finding becomes one), then fuzzing from seed corpora made of the committed models and
# test data (plus, when present, the ONNX backend node models). A finding fails the run; its
# input is kept in BUILD/fuzz-findings/HARNESS/ to be added to test/fuzz/regressions/HARNESS/.
#   test/fuzz/run.sh BUILD_DIR [SECONDS_PER_HARNESS]   (FUZZ_SEED: libFuzzer seed, default 1,
#   so that CI repeats the same search; any other value searches elsewhere; FUZZ_JOBS:
#   harnesses run at once, default one per core)
set -eu
build=$1
seconds=${2:-60}
root=$(cd "$(dirname "$0")/../.." && pwd)
work="$build/fuzz-work"
findings="$build/fuzz-findings"
rm -rf "$work"
mkdir -p "$work" "$findings"

backend=${ONNX_BACKEND_TEST_DATA:-$root/../shared/onnx-backend-tests}
# Leaks inside libraries kiln does not build (the audio decoders) are suppressed as in
# make sanitize.
export LSAN_OPTIONS="suppressions=$root/test/lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}"

# Seeds. fuzz_model: model files. fuzz_tensor: .pb and .npy files behind the byte that picks
# the reader (even: .pb, odd: .npy). fuzz_audio: the committed audio files of every format.
mkdir -p "$work/seed_model" "$work/seed_tensor" "$work/seed_graph" "$work/seed_audio"
for f in "$root"/test/data/audio/*.wav "$root"/test/data/audio/*.flac "$root"/test/data/audio/*.ogg \
    "$root"/test/data/audio/*.opus "$root"/test/data/audio/*.mp3; do
  [ -f "$f" ] && cp "$f" "$work/seed_audio/"
done
for f in "$root"/models/tiny-cnn/model.onnx "$root"/models/whisper-tiny-random/opset14/encoder_model.onnx; do
  [ -f "$f" ] && cp "$f" "$work/seed_model/$(echo "$f" | md5sum | cut -c1-12)"
done
if [ -d "$backend/node" ]; then
  # A sample of the backend's node models (small files, many ops).
  find "$backend/node" -name model.onnx -size -8k | sort | awk 'NR % 8 == 0' | head -300 |
    while read -r f; do cp "$f" "$work/seed_model/$(echo "$f" | md5sum | cut -c1-12)"; done
else
  echo "fuzz: no ONNX backend data at $backend; seeding from the committed models only"
fi
i=0
for f in "$root"/models/*/test_data_set_*/*.pb; do
  [ -f "$f" ] || continue
  i=$((i + 1))
  { printf '\000'; cat "$f"; } > "$work/seed_tensor/pb$i"
done
for f in "$root"/models/*/*.npy; do
  [ -f "$f" ] || continue
  i=$((i + 1))
  { printf '\001'; head -c 4096 "$f"; } > "$work/seed_tensor/npy$i"
done

# One harness: its regression inputs (every committed one must run clean), then fuzzing for
# the time given. Its report goes to $work/NAME.report, its status to $work/NAME.status.
#   run_harness NAME REGRESSIONS_DIR "REPLAY_FLAGS" "FUZZ_FLAGS" "CORPORA" COMMAND...
# (the quoted lists are split at spaces: build folders without spaces in their paths).
run_harness() {
  h=$1 reg=$2 replay=$3 flags=$4 corpora=$5
  shift 5
  out="$work/$h.report"
  st=0
  mkdir -p "$work/corpus_$h" "$findings/$h"
  : > "$out"
  if [ -d "$reg" ] && [ -n "$(ls -A "$reg" 2>/dev/null)" ]; then
    echo "fuzz: $h: $(ls "$reg" | wc -l) regression inputs" >> "$out"
    # shellcheck disable=SC2086
    "$@" $replay "$reg"/* > "$work/$h-regressions.log" 2>&1 ||
      { tail -40 "$work/$h-regressions.log" >> "$out"; st=1; }
  fi
  echo "fuzz: $h: ${seconds}s" >> "$out"
  # shellcheck disable=SC2086
  if ! "$@" -seed="${FUZZ_SEED:-1}" -max_total_time="$seconds" $flags -print_final_stats=1 \
      -artifact_prefix="$findings/$h/" $corpora > "$work/$h.log" 2>&1; then
    echo "fuzz: $h: FINDING (log: $work/$h.log, input in $findings/$h/)" >> "$out"
    tail -40 "$work/$h.log" >> "$out"
    st=1
  else
    { grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "$work/$h.log" | tr '\n' ' '; echo; } >> "$out"
  fi
  echo $st > "$work/$h.status"
}

# A libFuzzer harness of test/fuzz, from its seeds; findings go to test/fuzz/regressions/NAME/.
run_libfuzzer() {
  run_harness "$1" "$root/test/fuzz/regressions/$1" "-rss_limit_mb=2048 -malloc_limit_mb=1024 -timeout=30" \
    "-rss_limit_mb=2048 -malloc_limit_mb=1024 -timeout=10 -max_len=65536" \
    "$work/corpus_$1 $work/seed_$1" "$build/test/fuzz/kiln-fuzz_$1"
}

# The Python API's harness (python/tests/fuzz/fuzz_session.py, atheris, in the venv with the
# kiln package installed: make python-install), from an empty corpus (each input is one
# structured case). Its findings go to BUILD/fuzz-findings/python/, to be added to
# python/tests/fuzz/regressions/.
run_python() {
  run_harness python "$root/python/tests/fuzz/regressions" "-rss_limit_mb=4096 -timeout=60" \
    "-rss_limit_mb=4096 -timeout=60 -max_len=4096" "$work/corpus_python" \
    "${PYTHON:-$root/.venv/bin/python}" "$root/python/tests/fuzz/fuzz_session.py"
}

# The five harnesses, FUZZ_JOBS at a time (default: one per core; each is one process).
jobs=${FUZZ_JOBS:-$(nproc 2>/dev/null || echo 1)}
running=0
for h in model tensor graph audio python; do
  if [ "$h" = python ]; then run_python & else run_libfuzzer "$h" & fi
  running=$((running + 1))
  if [ "$running" -ge "$jobs" ]; then
    wait
    running=0
  fi
done
wait

status=0
for h in model tensor graph audio python; do
  cat "$work/$h.report"
  [ "$(cat "$work/$h.status" 2>/dev/null)" = 0 ] || status=1
done
exit $status
