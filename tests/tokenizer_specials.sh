#!/usr/bin/env bash
# pad, bos and eos at other ids than MiniMind's, GPT-2's way (bos = eos = <|endoftext|>, id 0;
# pad <|im_end|>, id 2), named by a tokenizer_config.json beside a tokenizer.json
# (tests/data/tiny-bpe): a run trains on them in pad mode, keeps the names beside its copy
# of the file, and every later program uses them: tokenize --special, generate (the prompt
# opens with bos), and both exports declare them.
# Usage: tokenizer_specials.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
BUILD=$(realpath "$1")
SRC=$(realpath "$2")
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export MINIMIND_CONSOLE_WIDTH=0
cd "$WORK"
mkdir tok
cp "$SRC/tests/data/tiny-bpe/tokenizer.json" tok/
echo '{"pad_token": "<|im_end|>", "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"}' \
  > tok/tokenizer_config.json
"$BUILD/app/minimind-train" --config "$SRC/configs/moe.yaml" --out run \
  --set data.tokenizer=tok/tokenizer.json --set model.vocab_size=562 --set data.mode=pad \
  --set train.max_steps=2 --set train.warmup_steps=1 --set data.max_seq_len=64 \
  --set data.cache_dir=cache > train.log 2>&1 || { tail -20 train.log >&2; exit 1; }
rm -r tok  # from here on, only the run's own copy
"$BUILD/app/minimind-eval" tokenize run --text "Emma" --special > ids.txt
"$BUILD/app/minimind-eval" generate run --prompt "Emma" --greedy --max-new-tokens 3 --json \
  > gen.json 2> gen.log
"$BUILD/app/minimind-export" run --format gguf --out run.gguf > /dev/null 2>&1
"$BUILD/app/minimind-export" run --format hf --out hf > /dev/null 2>&1
/usr/bin/python3 - <<'PY'
import json, struct, sys
bad = []
names = json.load(open("run/tokenizer_config.json"))
if names != {"pad_token": "<|im_end|>", "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"}:
    bad.append(f"run/tokenizer_config.json holds {names}")
ids = open("ids.txt").read().split()
if ids[0] != "0" or ids[-1] != "0" or len(ids) < 3:
    bad.append(f"tokenize --special gave {ids}, not 0 ... 0")
gen = json.load(open("gen.json"))
if gen["prompt_ids"][0] != 0:
    bad.append(f"generate's prompt starts with {gen['prompt_ids'][0]}, not bos 0")
# GGUF metadata: key, type u32 (4), value.
data = open("run.gguf", "rb").read(1 << 20)
for key, want in [("bos_token_id", 0), ("eos_token_id", 0), ("padding_token_id", 2), ("eot_token_id", 0)]:
    k = f"tokenizer.ggml.{key}".encode()
    at = data.find(struct.pack("<Q", len(k)) + k) + 8 + len(k)
    typ, val = struct.unpack("<II", data[at:at + 8])
    if (typ, val) != (4, want):
        bad.append(f"GGUF {k.decode()} = {val} (type {typ}), want {want}")
cfg = json.load(open("hf/config.json"))
if (cfg["bos_token_id"], cfg["eos_token_id"], cfg["pad_token_id"]) != (0, 0, 2):
    bad.append(f"HF config.json ids {cfg['bos_token_id']}, {cfg['eos_token_id']}, {cfg['pad_token_id']}")
tc = json.load(open("hf/tokenizer_config.json"))
if (tc["bos_token"], tc["eos_token"], tc["pad_token"]) != ("<|endoftext|>", "<|endoftext|>", "<|im_end|>"):
    bad.append(f"HF tokenizer_config.json {tc}")
for b in bad:
    print("FAIL:", b)
print(f"specials at GPT-2's ids: {'ok' if not bad else f'{len(bad)} problems'} "
      "(run copy, tokenize, generate, GGUF, HF)")
sys.exit(1 if bad else 0)
PY
