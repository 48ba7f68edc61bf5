#!/usr/bin/env bash
# Every program computes by the plan its keys give (compute_plan.h), and says so in its own
# output: `--set run.matmul=openblas` and, where the CPU has bf16 instructions,
# `--set run.precision=bf16` change the plan line and the JSON of minimind-train (train.log,
# state.json), minimind-eval (loss --json, generate) and minimind-bench (--json, --variant
# table), against the same command without them; minimind-export (no products) prints the
# checkpoint's plan. Without bf16 instructions, bf16 is refused naming run.precision, and the
# bf16 checks run on emulated bf16 (run.bf16_emulation), so that they run on every machine.
# Usage: compute_plan_programs.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
BUILD=$(realpath "$1")
SRC=$(realpath "$2")
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
export MINIMIND_CONSOLE_WIDTH=0  # one line per message, for grep
fail() { echo "FAIL: $*" >&2; exit 1; }
has_bf16=0
grep -qwE 'avx512_bf16|amx_bf16' /proc/cpuinfo && has_bf16=1
# bf16 as every bf16 check below asks for it: emulated where the CPU has no bf16 instructions.
BF16=(--set run.precision=bf16)
[ "$has_bf16" = 1 ] || BF16+=(--set run.bf16_emulation=true)
head -300 "$SRC/data/austen.jsonl" > corpus.jsonl
cat > tiny.yaml <<'EOF'
run: {name: tiny, threads: 2}
model: {hidden_size: 32, num_hidden_layers: 2, num_attention_heads: 2, num_key_value_heads: 1,
        vocab_size: 512, max_position_embeddings: 128, use_moe: true, num_experts: 4,
        num_experts_per_tok: 2}
data: {train: corpus.jsonl, max_seq_len: 32, val_fraction: 0.05}
train: {batch_size: 4, max_steps: 2, eval_interval: 2, checkpoint_interval: 2}
log: {interval: 1}
EOF
json_field() {  # FILE KEY...: the value at that path of the file's (last) JSON line
  python3 -c 'import json,sys
j = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
for k in sys.argv[2:]: j = j[k]
print(j)' "$@"
}
plan_of() {  # RUN: the compute plan its last checkpoint stored, "PRECISION MATMUL"
  local state
  state=$(ls -d "$1"/checkpoints/step_* | tail -1)/state.json
  python3 -c 'import json,sys; p = json.load(open(sys.argv[1]))["plan"]; print(p["precision"], p["matmul"])' "$state"
}

# --- minimind-train
"$BUILD/app/minimind-train" --config tiny.yaml --out base > /dev/null 2>&1 || fail "train base"
"$BUILD/app/minimind-train" --config tiny.yaml --out blas --set run.matmul=openblas > /dev/null 2>&1 ||
  fail "train openblas"
grep -q "compute plan: matrix products in fp32 on OpenBLAS (run.matmul: openblas)" blas/train.log ||
  fail "train: no OpenBLAS plan line in train.log"
[ "$(plan_of blas)" = "fp32 openblas" ] || fail "train: state.json plan $(plan_of blas)"
base_plan=$(plan_of base)
grep -q "compute plan: matrix products in fp32 on .* (run.matmul: auto, " base/train.log ||
  fail "train: the default plan line does not say run.matmul auto"
if [ "$has_bf16" = 0 ]; then
  if "$BUILD/app/minimind-train" --config tiny.yaml --out bf16 --set run.precision=bf16 > bf16.err 2>&1; then
    fail "train: bf16 accepted on a CPU without bf16 instructions"
  fi
  grep -q "run.precision is bf16" bf16.err || fail "train: the bf16 refusal does not name run.precision"
  rm -rf bf16
fi
"$BUILD/app/minimind-train" --config tiny.yaml --out bf16 "${BF16[@]}" > /dev/null 2>&1 ||
  fail "train bf16"
grep -q "compute plan: matrix products in bf16 on oneDNN" bf16/train.log || fail "train: no bf16 plan"
[ "${base_plan%% *}" = fp32 ] && [ "$(plan_of bf16)" = "bf16 ${base_plan#* }" ] ||
  fail "train: plans $base_plan / $(plan_of bf16)"

# --- minimind-eval: the run's plan, and --set on it
"$BUILD/app/minimind-eval" loss blas --json > eval-blas.json 2> eval-blas.err || fail "eval"
[ "$(json_field eval-blas.json plan matmul)" = openblas ] || fail "eval: not the run's library"
"$BUILD/app/minimind-eval" loss blas --json --set run.matmul=onednn > eval-dnn.json 2>/dev/null ||
  fail "eval --set run.matmul=onednn"
[ "$(json_field eval-dnn.json plan matmul)" = onednn ] || fail "eval: --set run.matmul ignored"
"$BUILD/app/minimind-eval" generate base --prompt "It is" --max-new-tokens 3 --greedy \
  --set run.matmul=openblas --set run.threads=1 > /dev/null 2> gen.err || fail "eval generate"
grep -q "compute plan: matrix products in fp32 on OpenBLAS (run.matmul: openblas); 1 thread " gen.err ||
  fail "eval generate: the plan line does not follow --set"
if "$BUILD/app/minimind-eval" loss base --set model.hidden_size=64 > /dev/null 2> eval-model.err; then
  fail "eval: --set model.* accepted"
fi
grep -q "minimind-eval takes run.\* keys only" eval-model.err || fail "eval: --set model.* message"
# The same run in fp32 and in bf16: the products' rounding moves the loss, a little.
"$BUILD/app/minimind-eval" loss base --json > eval-base.json 2>/dev/null || fail "eval base"
"$BUILD/app/minimind-eval" loss base --json "${BF16[@]}" > eval-bf16.json 2>/dev/null ||
  fail "eval bf16"
[ "$(json_field eval-base.json plan precision)" = fp32 ] || fail "eval: base not in fp32"
[ "$(json_field eval-bf16.json plan precision)" = bf16 ] || fail "eval: --set run.precision ignored"
python3 -c 'import sys; a, b = map(float, sys.argv[1:]); d = abs(a - b)
print(f"eval of one run: fp32 loss {a:.7f}, bf16 {b:.7f}, |diff| {d:.1e}")
sys.exit(0 if 0 < d < 0.05 else 1)' "$(json_field eval-base.json loss)" "$(json_field eval-bf16.json loss)" ||
  fail "eval: bf16 gave the fp32 loss bit for bit, or one far from it"

# --- minimind-bench: the keys, the flags that spell them, and --variant
bench() { "$BUILD/app/minimind-bench" --preset moe-top1 --steps 1 --warmup 0 --json "$@" 2>/dev/null; }
bench > bench-default.json || fail "bench"
bench --set run.matmul=openblas > bench-blas.json || fail "bench openblas"
[ "$(json_field bench-blas.json matmul)" = openblas ] || fail "bench: --set run.matmul ignored"
[ "$(json_field bench-default.json plan matmul_reason)" != "run.matmul: openblas" ] ||
  fail "bench: the default is not run.matmul auto"
bench --matmul openblas > bench-flag.json || fail "bench --matmul"
[ "$(json_field bench-flag.json plan matmul)" = openblas ] || fail "bench: --matmul is not run.matmul"
bench "${BF16[@]}" > bench-bf16.json || fail "bench bf16"
[ "$(json_field bench-bf16.json precision)" = bf16 ] || fail "bench: --set run.precision ignored"
EMULATE=()
[ "$has_bf16" = 1 ] || EMULATE=(--bf16-emulation)
"$BUILD/app/minimind-bench" --preset dense --steps 1 --warmup 0 "${EMULATE[@]}" \
  --variant half:run.precision=bf16 --variant blas:run.matmul=openblas > variants.md 2>/dev/null ||
  fail "bench --variant"
grep -qE '^\| half \| bf16 ' variants.md || fail "bench: a variant's run.precision ignored"
grep -qE '^\| blas \| fp32 openblas ' variants.md || fail "bench: a variant's run.matmul ignored"

# --- minimind-export: no products; the plan line is the checkpoint's
"$BUILD/app/minimind-export" blas --format gguf --out model.gguf > /dev/null 2> export.err ||
  fail "export"
grep -q "compute plan: matrix products in fp32 on OpenBLAS (run.matmul: openblas)" export.err ||
  fail "export: no plan line"
echo "compute plans: every program follows run.precision / run.matmul (bf16 $([ "$has_bf16" = 1 ] && echo native || echo emulated))"
