#!/bin/sh
# kiln-generate end to end: reference tokens, --json, text through a tokenizer, and exit
# status 2 with one clear line for a missing file, a model not following Optimum's naming, and
# bad audio; any audio format.
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

# Text: copies of the models with the unit tests' small tokenizer beside them (the models'
# 1000 ids are within its vocabulary). Text streams by default, after the prompt; --ids
# streams ids; --prompt is encoded as the tokenizer does and fed as --prompt-ids would be.
tok="$src/test/data/tokenizer"
mkdir -p "$tmp/gpt2-text" "$tmp/gpt2-legacy" "$tmp/whisper-text"
cp "$gpt2"/*.json "$gpt2/model.onnx" "$tmp/gpt2-text/"
cp "$gpt2"/*.json "$gpt2/model.onnx" "$tmp/gpt2-legacy/"
cp "$whisper"/*.json "$whisper"/*.onnx "$whisper"/*.npy "$whisper/sample.wav" "$tmp/whisper-text/"
cp "$tok/small-bpe/tokenizer.json" "$tmp/gpt2-text/"
cp "$tok/small-bpe/tokenizer.json" "$tmp/whisper-text/"
cp "$tok/small-bpe-legacy"/* "$tmp/gpt2-legacy/"
expect 0 "^Hello, world!" -- "$tmp/gpt2-text" --prompt "Hello, world!" --max-new-tokens 5
expect 0 "^5 tokens in" -- "$tmp/gpt2-text" --prompt "Hello, world!" --max-new-tokens 5
expect 0 '^([0-9]+ ){5}$' -- "$tmp/gpt2-text" --prompt "Hello, world!" --max-new-tokens 5 --ids
expect 0 '"tokens":\[[0-9,]+\],"prompt":\[[0-9,]+\],"text":"' -- "$tmp/gpt2-text" --json --max-new-tokens 5
expect 0 '"text":null' -- "$gpt2" --json --max-new-tokens 5
expect 0 "matches expected_tokens.json" -- "$tmp/gpt2-text"
expect 0 "matches expected_tokens.json" -- "$tmp/whisper-text"
# field NAME: the comma-separated integers of the JSON array NAME in the one-line JSON on stdin
field() { sed -n "s/.*\"$1\":\[\([0-9,]*\)\].*/\1/p"; }
by_text=$("$gen" "$tmp/gpt2-text" --prompt "Hello, world!" --max-new-tokens 8 --json)
by_legacy=$("$gen" "$tmp/gpt2-legacy" --prompt "Hello, world!" --max-new-tokens 8 --json)
prompt=$(printf '%s' "$by_text" | field prompt)
by_ids=$("$gen" "$tmp/gpt2-text" --prompt-ids "$prompt" --max-new-tokens 8 --json)
tokens=$(printf '%s' "$by_text" | field tokens)
if [ -z "$prompt" ] || [ -z "$tokens" ] || [ "$tokens" != "$(printf '%s' "$by_ids" | field tokens)" ] ||
  [ "$prompt,$tokens" != "$(printf '%s' "$by_legacy" | field prompt),$(printf '%s' "$by_legacy" | field tokens)" ]; then
  echo "FAIL: --prompt (prompt $prompt, tokens $tokens) differs from --prompt-ids or the legacy files:"
  printf '    %s\n' "$by_ids" "$by_legacy" | cut -c1-300
  failures=$((failures + 1))
else
  echo "ok: --prompt is fed as its ids ($prompt), from tokenizer.json and vocab.json + merges.txt alike"
fi
expect 2 "gpt2-tiny-random: no tokenizer: neither tokenizer.json nor vocab.json and merges.txt" -- "$gpt2" --prompt "Hello"
expect 2 "prompt-ids/--prompt are for decoder-only models" -- "$tmp/whisper-text" --prompt "Hello"
printf '{"model": {"type": "BPE"' > "$tmp/gpt2-text/tokenizer.json"
expect 2 "gpt2-text/tokenizer.json: invalid JSON" -- "$tmp/gpt2-text" --max-new-tokens 2
expect 0 "^([0-9]+ ){2}$" -- "$tmp/gpt2-text" --max-new-tokens 2 --ids

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
