#!/usr/bin/env bash
# minimind-eval tokenize on a Hugging Face tokenizer.json gives the ids of Hugging Face's Rust
# `tokenizers` library (tests/tokenizer, pinned by its lockfile), record for record: MiniMind's
# tokenizer (both generations, tests/data/minimind-tokenizer) and a small GPT-2-style one
# made for the test (tests/data/tiny-bpe: "a b" merges, added tokens of both passes) over a
# corpus that mixes scripts, emoji, code, digits, runs of spaces, tabs, newlines, odd whitespace and every
# added token inside text (tests/data/tokenizer-corpus.jsonl), and over 2,000 records of the
# shipped corpus. Then --decode turns the ids back into each record's text, byte for byte.
# Usage: tokenizer_exact.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
BUILD=$(realpath "$1")
SRC=$(realpath "$2")
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
EVAL="$BUILD/app/minimind-eval"
REF="$SRC/tests/tokenizer"
if ! command -v npm > /dev/null; then
  echo "tokenizer tests skipped: no npm" >&2
  exit 0
fi
# The binding's prebuilt library is an optional dependency of the package (one per platform):
# npm ci installs the one for this machine.
npm ci --ignore-scripts --no-audit --no-fund --prefix "$REF" > "$WORK/npm.log" 2>&1 ||
  { cat "$WORK/npm.log" >&2; exit 1; }
head -2000 "$SRC/data/austen.jsonl" > "$WORK/austen.jsonl"
# tiny-bpe with added tokens whose texts are already vocabulary pieces ("ing", and "Emma<"
# again), each at a stated id that the library does not give it: the library keeps the
# vocabulary's id, and the next new token takes the next free id.
mkdir -p "$WORK/tiny-bpe-dup"
python3 - "$SRC/tests/data/tiny-bpe/tokenizer.json" "$WORK/tiny-bpe-dup/tokenizer.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1], encoding="utf-8"))
assert "ing" in j["model"]["vocab"]
flags = {"single_word": False, "lstrip": False, "rstrip": False, "normalized": True,
         "special": False}
j["added_tokens"] += [dict(id=562, content="ing", **flags), dict(id=563, content="Emma<", **flags),
                      dict(id=564, content="<dup>", **flags)]
json.dump(j, open(sys.argv[2], "w", encoding="utf-8"), ensure_ascii=False)
PY
want_size=$(node "$REF/reference_ids.js" "$WORK/tiny-bpe-dup/tokenizer.json" --vocab-size)
[ "$want_size" = 563 ] || { echo "the library's vocabulary has $want_size tokens, not 563" >&2; exit 1; }
# 563 ids (0-562): an id past them is named, not decoded to nothing as the library does.
echo "563" > "$WORK/out-of-range.txt"
if "$EVAL" tokenize --tokenizer "$WORK/tiny-bpe-dup/tokenizer.json" --data "$WORK/out-of-range.txt" \
  --decode > "$WORK/oor.log" 2>&1; then
  echo "decoding id 563 did not fail" >&2; exit 1
fi
grep -q "id 563 is outside the vocabulary (0-562)" "$WORK/oor.log" || { cat "$WORK/oor.log" >&2; exit 1; }
python3 -c 'import json; print(json.dumps({"text": "<dup> singing Emma<"}))' > "$WORK/dup.jsonl"
node "$REF/reference_ids.js" "$WORK/tiny-bpe-dup/tokenizer.json" "$WORK/dup.jsonl" > "$WORK/dup-want.txt"
"$EVAL" tokenize --tokenizer "$WORK/tiny-bpe-dup/tokenizer.json" --data "$WORK/dup.jsonl" > "$WORK/dup-got.txt"
cmp -s "$WORK/dup-want.txt" "$WORK/dup-got.txt" ||
  { echo "added tokens on vocabulary pieces: want $(cat "$WORK/dup-want.txt"), got $(cat "$WORK/dup-got.txt")" >&2; exit 1; }
ing=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["model"]["vocab"]["ing"])' "$SRC/tests/data/tiny-bpe/tokenizer.json")
grep -qw "$ing" "$WORK/dup-got.txt" && grep -qw 562 "$WORK/dup-got.txt" ||
  { echo "'ing' ($ing) or '<dup>' (562) missing from $(cat "$WORK/dup-got.txt")" >&2; exit 1; }
echo "tiny-bpe-dup: added tokens on vocabulary pieces keep the vocabulary's ids (563 tokens; '<dup> singing Emma<' -> $(cat "$WORK/dup-got.txt"))"
fail=0
for tok in "$SRC/tests/data/minimind-tokenizer/tokenizer.json" \
  "$SRC/tests/data/minimind-tokenizer/minimind2/tokenizer.json" \
  "$SRC/tests/data/tiny-bpe/tokenizer.json" "$WORK/tiny-bpe-dup/tokenizer.json"; do
  for corpus in "$SRC/tests/data/tokenizer-corpus.jsonl" "$WORK/austen.jsonl"; do
    name="$(basename "$(dirname "$tok")")/$(basename "$corpus")"
    node "$REF/reference_ids.js" "$tok" "$corpus" > "$WORK/want.txt"
    "$EVAL" tokenize --tokenizer "$tok" --data "$corpus" > "$WORK/got.txt"
    python3 - "$WORK/want.txt" "$WORK/got.txt" "$corpus" "$name" <<'PY' || fail=1
import json, sys
want = open(sys.argv[1]).read().splitlines()
got = open(sys.argv[2]).read().splitlines()
texts = [json.loads(l)["text"] for l in open(sys.argv[3], encoding="utf-8") if l.strip()]
assert len(want) == len(texts), (len(want), len(texts))
bad = [i for i in range(len(texts)) if i >= len(got) or got[i] != want[i]]
ids = sum(len(w.split()) for w in want)
print(f"{sys.argv[4]}: {len(texts)} records, {ids} ids, {len(bad)} differ from the Rust library")
for i in bad[:5]:
    print(f"  record {i + 1} {texts[i][:60]!r}:\n    want {want[i][:200]}\n    got  {got[i][:200] if i < len(got) else '(missing)'}")
sys.exit(1 if bad or len(got) != len(want) else 0)
PY
    # Round trip: the ids decode to the record's text, and to the library's decoding.
    "$EVAL" tokenize --tokenizer "$tok" --data "$WORK/got.txt" --decode --json > "$WORK/back.jsonl"
    node "$REF/reference_ids.js" "$tok" "$WORK/got.txt" --decode > "$WORK/back-want.jsonl"
    python3 - "$WORK/back.jsonl" "$WORK/back-want.jsonl" "$name" <<'PY' || fail=1
import json, sys
got = [json.loads(l)["text"] for l in open(sys.argv[1], encoding="utf-8")]
want = [json.loads(l)["text"] for l in open(sys.argv[2], encoding="utf-8")]
bad = [i for i in range(len(want)) if i >= len(got) or got[i] != want[i]]
print(f"{sys.argv[3]}: decode equals the library's for {len(want) - len(bad)} of {len(want)}")
sys.exit(1 if bad or len(got) != len(want) else 0)
PY
    python3 - "$WORK/back.jsonl" "$corpus" "$name" <<'PY' || fail=1
import json, sys
back = [json.loads(l)["text"] for l in open(sys.argv[1], encoding="utf-8")]
texts = [json.loads(l)["text"] for l in open(sys.argv[2], encoding="utf-8") if l.strip()]
bad = [i for i in range(len(texts)) if back[i] != texts[i]]
print(f"{sys.argv[3]}: decode(encode(text)) == text for {len(texts) - len(bad)} of {len(texts)}")
sys.exit(1 if bad else 0)
PY
  done
done
exit "$fail"
