#!/bin/sh
# kiln-generate end to end: reference tokens, --json, and exit status 2 with one clear line
# for a missing file, a model not following Optimum's naming, and bad audio.
#   kiln_generate_test.sh KILN_GENERATE SOURCE_DIR
set -u
gen=$1
src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0

expect() {
  want=$1
  pattern=$2
  shift 3
  out=$("$gen" "$@" 2>&1)
  got=$?
  if [ "$got" -ne "$want" ] || ! printf '%s' "$out" | grep -Eq "$pattern"; then
    echo "FAIL: kiln-generate $* -> status $got (want $want), output:"
    printf '%s\n' "$out" | sed 's/^/    /'
    failures=$((failures + 1))
  else
    echo "ok: kiln-generate $* -> $got"
  fi
}

whisper="$src/models/whisper-tiny-random"
gpt2="$src/models/gpt2-tiny-random"

expect 0 "matches expected_tokens.json" -- "$whisper"
expect 0 "matches expected_tokens.json" -- "$whisper" --decoder-pair
expect 0 '"matches_expected":true' -- "$whisper" --json
expect 0 '"steps":\[\{"past_len":0' -- "$whisper" --json --max-new-tokens 5
expect 0 "matches expected_tokens.json" -- "$gpt2"
expect 0 "5 tokens" -- "$gpt2" --prompt-ids 1,2,3 --max-new-tokens 5 --sampling sample --seed 7 --top-k 10

# A folder missing a file.
mkdir -p "$tmp/incomplete"
cp "$whisper/config.json" "$whisper/generation_config.json" "$whisper/encoder_model.onnx" "$tmp/incomplete/"
expect 2 "decoder_model.onnx: missing from the model folder" -- "$tmp/incomplete"
# A model whose inputs do not follow Optimum's naming.
mkdir -p "$tmp/naming"
cp "$gpt2/config.json" "$tmp/naming/"
cp "$src/models/tiny-cnn/model.onnx" "$tmp/naming/model.onnx"
expect 2 "model.onnx: has no input 'input_ids'" -- "$tmp/naming" --prompt-ids 1,2
# Bad audio: not a WAV, and the wrong sample rate.
printf 'this is not audio' > "$tmp/text.wav"
expect 2 "text.wav: not a WAV file" -- "$whisper" --audio "$tmp/text.wav"
printf 'RIFF\044\000\000\000WAVEfmt \020\000\000\000\001\000\001\000\104\254\000\000\210\130\001\000\002\000\020\000data\000\000\000\000' > "$tmp/44k.wav"
expect 2 "44k.wav: sample rate 44100 Hz: expected 16000 Hz" -- "$whisper" --audio "$tmp/44k.wav"
expect 2 "not a folder" -- "$tmp/nope"
expect 2 "unknown option" -- "$whisper" --bogus

if [ "$failures" -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all kiln-generate checks passed"
