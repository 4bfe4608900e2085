#!/bin/sh
# kiln-transcribe end to end on the committed random Whisper: the tokens, prompts and segment
# times of transformers' references (models/whisper-tiny-random/expected_transcripts.json),
# the srt/vtt/txt formats, int8 and bfloat16 weights, any audio file, a cut one (a warning; an error with --strict-audio),
# and exit status 2 with one clear line for a missing model file, an unreadable audio file or
# an unknown language.
#   kiln_transcribe_test.sh KILN_TRANSCRIBE KILN_JSON_CHECK SOURCE_DIR
set -u
tr=$1
check=$2
src=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
whisper="$src/models/whisper-tiny-random"

expect() {
  want=$1
  pattern=$2
  shift 3
  out=$("$tr" "$@" 2>&1)
  got=$?
  if [ "$got" -ne "$want" ] || ! printf '%s' "$out" | grep -Eq "$pattern"; then
    echo "FAIL: kiln-transcribe $* -> status $got (want $want), output:"
    printf '%s\n' "$out" | sed 's/^/    /'
    failures=$((failures + 1))
  else
    echo "ok: kiln-transcribe $* -> $got"
  fi
}

# JSON output checked with kiln-json-check: transcribe ARGS -- CHECKS (ARGS without spaces).
json() {
  args=""
  while [ "$1" != "--" ]; do args="$args $1"; shift; done
  shift
  # shellcheck disable=SC2086
  if ! "$tr" $args --format json >"$tmp/out.json" 2>"$tmp/err"; then
    echo "FAIL: kiln-transcribe$args --format json exited non-zero:"; cat "$tmp/err"
    failures=$((failures + 1))
    return
  fi
  if "$check" "$tmp/out.json" "$@"; then
    echo "ok: kiln-transcribe$args --format json"
  else
    echo "FAIL: kiln-transcribe$args --format json"
    failures=$((failures + 1))
  fi
}

# Greedy English: prompt <|startoftranscript|><|en|><|transcribe|><|notimestamps|>.
json "$whisper" "$whisper/sample.wav" --language en --beams 1 --max-new-tokens 40 -- \
  prompt/0=482 prompt/1=483 prompt/2=494 prompt/3=498 tokens/0=18 tokens/1=330 tokens/2=429 \
  segments#=1 language=en encoder_runs=1
# Int8 weights (per-column int8, activations quantized per row): the random model's first
# tokens are float's; a bad precision is a usage error.
json "$whisper" "$whisper/sample.wav" --language en --beams 1 --max-new-tokens 40 --weights int8 -- \
  prompt/0=482 prompt/3=498 tokens/0=18 tokens/1=330 tokens/2=429 segments#=1 encoder_runs=1
json "$whisper" "$whisper/sample.wav" --language en --beams 1 --max-new-tokens 40 --weights bf16 -- \
  prompt/0=482 tokens/0=18
expect 2 "weights takes f32, bf16, f16 or int8" -- "$whisper" "$whisper/sample.wav" --weights f8
# Language detection (transformers detects Korean on this random model); German translation.
json "$whisper" "$whisper/sample.wav" --task transcribe --beams 1 --max-new-tokens 40 -- \
  prompt/1=488 language=ko tokens/0=32
json "$whisper" "$whisper/sample.wav" --language german --task translate --beams 1 --max-new-tokens 40 -- \
  prompt/1=485 prompt/2=493 tokens/0=330
# Timestamps: three segments, the last from a second pass over the window.
json "$whisper" "$whisper/sample.wav" --language en --timestamps --beams 1 --max-new-tokens 40 -- \
  prompt#=3 segments#=3 segments/0/start=0.08 segments/0/end=10.26 segments/2/end=40.22 \
  encoder_runs=2
# Beam search.
json "$whisper" "$whisper/sample.wav" --language en --beams 3 --max-new-tokens 40 -- \
  tokens/0=37 tokens/1=175 tokens/2=330
# An initial prompt as text.
"$tr" "$whisper" "$whisper/sample.wav" --language en --prompt "some words" --beams 1 --max-new-tokens 40 \
  --format json >"$tmp/prompt.json"
if "$check" "$tmp/prompt.json" prompt#=11 prompt/0=496 prompt/1=402 prompt/7=482 tokens/0=330; then
  echo "ok: kiln-transcribe --prompt 'some words'"
else
  echo "FAIL: kiln-transcribe --prompt 'some words'"
  failures=$((failures + 1))
fi
# Long form: 70 s of FLAC, window by window.
json "$whisper" "$whisper/long.flac" --language en --beams 1 --max-new-tokens 40 -- \
  segments/0/start=0.08 segments/0/end=25.34 tokens/0=503

expect 0 '^1$' -- "$whisper" "$whisper/sample.wav" --language en --timestamps --beams 1 --max-new-tokens 40 --format srt
expect 0 '00:00:00,080 --> 00:00:10,260' -- "$whisper" "$whisper/sample.wav" --language en --timestamps --beams 1 --max-new-tokens 40 --format srt
expect 0 'WEBVTT' -- "$whisper" "$whisper/sample.wav" --language en --timestamps --beams 1 --max-new-tokens 40 --format vtt
expect 0 '\[00:00:21.260 --> 00:00:23.580\]' -- "$whisper" "$whisper/sample.wav" --language en --timestamps --beams 1 --max-new-tokens 40
expect 0 'de' -- "$whisper" "$whisper/sample.wav" --language en --beams 1 --max-new-tokens 10

# Voice-activity filtering (models/vad-energy: speech where a window's energy is high): the
# sample's regions in JSON; a bad VAD model or option is exit 2 naming it.
json "$whisper" "$whisper/sample.wav" --language en --beams 1 --max-new-tokens 10 \
  --vad "$3/models/vad-energy/model.onnx" -- speech_regions/0/start=0
expect 2 'tiny-cnn/model.onnx: not a Silero VAD' -- "$whisper" "$whisper/sample.wav" --vad "$3/models/tiny-cnn/model.onnx"
expect 2 'vad-threshold' -- "$whisper" "$whisper/sample.wav" --vad "$3/models/vad-energy/model.onnx" --vad-threshold -1
expect 2 'vad takes audio' -- "$whisper" "$tmp/features.npy" --features --vad "$3/models/vad-energy/model.onnx"

# A file cut short: transcribed as far as it goes with a warning naming it; an error under
# --strict-audio.
head -c 40000 "$whisper/sample.wav" >"$tmp/cut.wav"
expect 0 'warning: .*cut.wav: truncated: the header gives 2.00 s of audio, the file holds 1.25 s' -- "$whisper" "$tmp/cut.wav" --language en --beams 1 --max-new-tokens 5
expect 2 'cut.wav: truncated' -- "$whisper" "$tmp/cut.wav" --language en --beams 1 --max-new-tokens 5 --strict-audio

# Errors: exit 2 and one line naming the problem.
expect 2 'missing.*not a folder|not a folder.*missing' -- "$tmp/missing" "$whisper/sample.wav"
expect 2 'nothing.wav' -- "$whisper" "$tmp/nothing.wav"
printf 'not audio at all' >"$tmp/garbage.mp3"
expect 2 'garbage.mp3' -- "$whisper" "$tmp/garbage.mp3"
expect 2 "unknown language 'xx'" -- "$whisper" "$whisper/sample.wav" --language xx
expect 2 'takes transcribe or translate' -- "$whisper" "$whisper/sample.wav" --task summarize
mkdir "$tmp/noenc" && cp "$whisper/config.json" "$whisper/generation_config.json" "$tmp/noenc/"
expect 2 'encoder_model.onnx: missing' -- "$tmp/noenc" "$whisper/sample.wav"
expect 2 'no audio file given' -- "$whisper"

if [ "$failures" -ne 0 ]; then
  echo "$failures failure(s)"
  exit 1
fi
echo "all kiln-transcribe checks passed"
