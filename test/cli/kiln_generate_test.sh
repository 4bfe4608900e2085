#!/bin/sh
# kiln-generate end to end: reference tokens, --json, and exit status 2 with one clear line
# for a missing file, a model not following Optimum's naming, and bad audio; any audio format.
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
# Any audio file: an MP3 at 44.1 kHz, stereo, is read, mixed to mono and resampled.
expect 0 "5 tokens" -- "$whisper" --audio "$src/test/data/audio/mp3_44k_stereo.mp3" --max-new-tokens 5
# Bad audio: garbage bytes, text, a WAV without samples; one line naming the file.
awk 'BEGIN { for (i = 0; i < 3000; i++) printf "%c", 32 + (i * 37) % 90 }' > "$tmp/garbage.flac"
expect 2 "garbage.flac: not a readable audio file" -- "$whisper" --audio "$tmp/garbage.flac"
lines=$("$gen" "$whisper" --audio "$tmp/garbage.flac" 2>&1 | grep -c .)
if [ "$lines" -ne 1 ]; then
  echo "FAIL: garbage audio printed $lines lines, want 1"
  failures=$((failures + 1))
fi
printf 'this is not audio' > "$tmp/text.wav"
expect 2 "text.wav: not a readable audio file" -- "$whisper" --audio "$tmp/text.wav"
printf 'RIFF\044\000\000\000WAVEfmt \020\000\000\000\001\000\001\000\104\254\000\000\210\130\001\000\002\000\020\000data\000\000\000\000' > "$tmp/44k.wav"
expect 2 "44k.wav: no audio samples" -- "$whisper" --audio "$tmp/44k.wav"
expect 2 "not a folder" -- "$tmp/nope"
expect 2 "unknown option" -- "$whisper" --bogus

if [ "$failures" -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all kiln-generate checks passed"
