#!/usr/bin/env bash
# Chat fine-tuning speed: tokens per second that are text (not padding), SFT rows padded as
# MiniMind pads them against packed ones (data.sft_packing), and a pretraining row of the
# same size (every token text) beside them, on the shipped chat corpus, fp32 and bf16, at the
# shipped SFT preset's size (sft.yaml: moe.yaml's model, rows of 256, batch 16) and at
# MiniMind-3-MoE's (hidden 768, rows of 768 as MiniMind's SFT, batch 4). Each variant is a
# short minimind-train run (random weights: speed does not depend on them, no evaluation);
# its figure is the second log interval's (the first holds the warm-up). The variants
# alternate, round after round, so the machine's drift hits them alike; the table gives each
# one's median over the rounds. Both sizes tokenise with MiniMind's tokenizer.json (vocab
# 6400, as the presets' models).
# Usage: scripts/bench-sft.sh [OUT [ROUNDS [STEPS]]]
#   (default bench-sft/, 3 rounds, 8 steps a run; SIZES="sft minimind-3-moe" and
#   PRECISIONS="fp32 bf16" choose what runs)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-bench-sft}
ROUNDS=${2:-3}
STEPS=${3:-8}
SIZES=${SIZES:-sft minimind-3-moe}
PRECISIONS=${PRECISIONS:-fp32 bf16}
TRAIN=./build/app/minimind-train
[ -x "$TRAIN" ] || { echo "bench-sft: build first (scripts/build.sh)" >&2; exit 1; }
TOKENIZER=$PWD/tests/data/minimind-tokenizer/tokenizer.json
mkdir -p "$OUT/runs"
RESULTS="$OUT/results.jsonl"
: >"$RESULTS"

size_sets() {  # the config and its settings for a size
  case "$1" in
    sft) echo "configs/sft.yaml" ;;
    minimind-3-moe) echo "configs/minimind-3-moe.yaml data.max_seq_len=768 train.batch_size=4 train.accumulation_steps=1" ;;
    *) echo "bench-sft: unknown size '$1'" >&2; exit 2 ;;
  esac
}
variant_sets() {
  case "$1" in
    padded) echo "data.mode=sft data.train=$PWD/data/austen-chat.jsonl" ;;
    packed) echo "data.mode=sft data.sft_packing=true data.train=$PWD/data/austen-chat.jsonl" ;;
    pretraining) echo "data.mode=pack data.train=$PWD/data/austen.jsonl" ;;
  esac
}

for round in $(seq 1 "$ROUNDS"); do
  for size in $SIZES; do
    read -r config size_rest <<<"$(size_sets "$size")"
    for precision in $PRECISIONS; do
      for variant in padded packed pretraining; do
        sets=()
        for s in $size_rest $(variant_sets "$variant") data.tokenizer=$TOKENIZER \
          data.val= data.val_fraction=0 train.max_steps=$STEPS log.interval=$((STEPS / 2)) \
          train.warmup_steps=0 train.checkpoint_interval=1000000 run.precision=$precision; do
          sets+=(--set "$s")
        done
        run="$OUT/runs/$size-$precision-$variant"
        "$TRAIN" --config "$config" "${sets[@]}" --out "$run" --overwrite >"$run.log" 2>&1 ||
          { echo "bench-sft: $size $precision $variant failed (see $run.log)" >&2; exit 1; }
        python3 - "$run/metrics.jsonl" "$size" "$precision" "$variant" "$round" >>"$RESULTS" <<'EOF'
import json, sys
path, size, precision, variant, rnd = sys.argv[1:]
train = [json.loads(l) for l in open(path) if '"split":"train"' in l.replace(" ", "")]
last = train[-1]  # the second interval: no warm-up step in it
real = last.get("real_tok_per_s") or last["tok_per_s"]
print(json.dumps({"size": size, "precision": precision, "variant": variant, "round": int(rnd),
                  "tok_per_s": last["tok_per_s"], "real_tok_per_s": real}))
EOF
        tail -1 "$RESULTS" >&2
      done
    done
  done
done

python3 - "$RESULTS" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
keys = sorted({(r["size"], r["precision"]) for r in rows}, key=lambda k: (k[0] != "sft", k[1]))
med = lambda s, p, v, f: statistics.median(r[f] for r in rows
                                            if (r["size"], r["precision"], r["variant"]) == (s, p, v))
print("| size | precision | padded: tok/s (text) | packed: tok/s (text) | text tok/s packed / padded "
      "| pretraining tok/s | packed step / pretraining step, per text token |")
print("|---|---|---|---|---|---|---|")
for s, p in keys:
    pad_all, pad_real = med(s, p, "padded", "tok_per_s"), med(s, p, "padded", "real_tok_per_s")
    pk_all, pk_real = med(s, p, "packed", "tok_per_s"), med(s, p, "packed", "real_tok_per_s")
    pre = med(s, p, "pretraining", "tok_per_s")
    print(f"| {s} | {p} | {pad_all:.0f} ({pad_real:.0f}) | {pk_all:.0f} ({pk_real:.0f}) "
          f"| {pk_real / pad_real:.2f}x | {pre:.0f} | {pre / pk_real:.2f} |")
EOF
