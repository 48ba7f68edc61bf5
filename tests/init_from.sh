#!/usr/bin/env bash
# train.init_from end to end: a run started from another run's weights begins where that
# one ended (its step-0 validation loss is the source's last, bit for bit, with a fresh
# optimizer and step count), keeps the source's tokenizer, records the source in state.json,
# events.jsonl, inspect and the report, and resumes after it stopped; a dense run upcycled
# into experts keeps its function (train.init_mode: upcycle), fine-grained experts too
# with the output scaling. Bad sources are refused
# before the run directory is touched.
# Usage: init_from.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
BUILD=$(realpath "$1")
SRC=$(realpath "$2")
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export MINIMIND_CONSOLE_WIDTH=0
TRAIN="$BUILD/app/minimind-train"
EVAL="$BUILD/app/minimind-eval"
cd "$WORK"
head -n 300 "$SRC/data/austen.jsonl" > corpus.jsonl
cat > tiny.yaml <<YAML
run: {name: tiny, seed: 3, threads: 1}
model: {hidden_size: 64, num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2,
        vocab_size: 512, max_position_embeddings: 256, use_moe: true, num_experts: 4,
        norm_topk_prob: false}
data: {train: corpus.jsonl, cache_dir: cache, max_seq_len: 64, val_fraction: 0.05}
train: {batch_size: 8, accumulation_steps: 1, max_steps: 6, warmup_steps: 1,
        learning_rate: 2.0e-3, eval_interval: 3, checkpoint_interval: 3, keep_checkpoints: 2}
log: {interval: 1}
YAML
fail() { echo "FAIL: $*" >&2; exit 1; }
# expect_refusal NAME MESSAGE ARGS...: exit 1, MESSAGE in stderr.
expect_refusal() {
  local name=$1 message=$2
  shift 2
  if "$TRAIN" --config tiny.yaml "$@" > "$name.log" 2>&1; then fail "$name: accepted"; fi
  grep -q -- "$message" "$name.log" || { cat "$name.log" >&2; fail "$name: no '$message'"; }
}
val_losses() {  # step val_loss of a run's evaluations
  python3 -c '
import json, sys
for line in open(sys.argv[1]):
    j = json.loads(line)
    if j.get("split") == "eval":
        print(j["step"], repr(j["val_loss"]))' "$1/metrics.jsonl"
}

"$TRAIN" --config tiny.yaml --out a > a.log 2>&1 || { cat a.log >&2; fail "run a"; }
"$TRAIN" --config tiny.yaml --out b --set train.init_from=a --set train.max_steps=3 > b.log 2>&1 ||
  { cat b.log >&2; fail "run b"; }
a_last=$(val_losses a | tail -1 | cut -d' ' -f2)
b_first=$(val_losses b | sed -n 1p)
[ "$b_first" = "0 $a_last" ] || fail "b's step-0 validation loss '$b_first' is not a's last '$a_last'"
cmp -s a/tokenizer.model b/tokenizer.model || fail "b does not use a's tokenizer"
python3 - <<'PY' || exit 1
import glob, json
state = json.load(open(sorted(glob.glob("b/checkpoints/step_*/state.json"))[-1]))
i = state.get("init_from")
assert i and i["path"] == "a" and i["step"] == 6 and len(i["content_key"]) == 32, i
assert i["weights"].endswith("a/checkpoints/step_00000006/model.pth"), i
ev = [json.loads(l) for l in open("b/events.jsonl")]
assert any(e["event"] == "init_from" and e["content_key"] == i["content_key"] for e in ev), ev
print("init_from recorded:", i)
# The training behind the weights: a's tokens and FLOPs (its metrics' running total, which is
# tokens x the per-token cost in its flops event).
am = [json.loads(l) for l in open("a/metrics.jsonl")]
a_last = [r for r in am if r["step"] == 6][-1]
a_flops = [e for e in map(json.loads, open("a/events.jsonl")) if e["event"] == "flops"][-1]
assert a_last["flops"] == a_last["tokens"] * a_flops["per_token"], (a_last, a_flops)
parts = sum(a_flops[k] for k in ("attention_projections", "attention_scores", "feed_forward",
                                  "shared_experts", "router", "lm_head"))
assert abs(parts - a_flops["per_token"]) <= 1e-9 * parts, a_flops
assert i["source_tokens"] == a_last["tokens"] and i["source_flops"] == a_last["flops"], i
ib = [e for e in ev if e["event"] == "init_from"][-1]
assert ib["source_tokens"] == a_last["tokens"] and ib["source_flops"] == a_last["flops"], ib
print(f"a: {a_last['tokens']} tokens, {a_last['flops']:.4g} FLOPs ({a_flops['per_token']:.4g} per token)")
PY
"$EVAL" compare a b --out ab.html > /dev/null 2>&1 || fail "compare a b"
grep -q "Validation loss against training FLOPs" ab.html || fail "compare has no FLOPs chart"
"$EVAL" inspect b | grep -q "started from weights from a (step 6" || fail "inspect does not say"
grep -q "Started from weights from a (step 6" b/report.html || fail "the report does not say"

# Resumed after it stopped: the checkpoint's weights, the same init_from allowed.
"$TRAIN" --config tiny.yaml --out b --set train.init_from=a --set train.max_steps=6 --resume \
  > b2.log 2>&1 || { cat b2.log >&2; fail "resuming b"; }
grep -q "resuming b/checkpoints/step_00000003" b2.log || fail "b did not resume"

# Refused before anything is written.
expect_refusal resume "--resume and train.init_from ('b') together" --out a --resume \
  --set train.init_from=b
expect_refusal own "is inside this run's own directory" --out a --overwrite \
  --set train.init_from=a/checkpoints/step_00000006
[ -d a/checkpoints/step_00000006 ] || fail "refusing to start from its own output deleted it"
expect_refusal shape "train.init_from (--set train.init_from=a): weights in .* do not match the model config" \
  --out c --set train.init_from=a --set model.hidden_size=32 --set model.num_attention_heads=2 \
  --set model.num_key_value_heads=1
expect_refusal bare "brings no tokenizer and data.tokenizer is empty" --out c \
  --set train.init_from=a/checkpoints/step_00000006/model.pth
expect_refusal missing "checkpoint 'nowhere' does not exist" --out c --set train.init_from=nowhere
cp -r a/checkpoints/step_00000006 corrupt
truncate -s $(( $(stat -c %s corrupt/model.pth) / 2 )) corrupt/model.pth
expect_refusal corrupt "train.init_from (--set train.init_from=corrupt): 'corrupt/model.pth' is damaged" \
  --out c --set train.init_from=corrupt
expect_refusal vocab "has 6400 pieces but model.vocab_size is 512" --out c \
  --set train.init_from=a --set data.tokenizer="$SRC/tests/data/minimind-tokenizer/tokenizer.json"
# Another tokenizer of the same size than the weights': refused naming both files, unless
# train.init_other_tokenizer says it is meant; the weights' own (a copy) is fine.
"$TRAIN" --config tiny.yaml --out other-tok --set data.train="$SRC/data/austen.jsonl" \
  --set train.max_steps=2 > other-tok.log 2>&1 || { cat other-tok.log >&2; fail "other-tok run"; }
expect_refusal othertok "is another tokenizer than '.*a/tokenizer.model', the one the weights of train.init_from" \
  --out c --set train.init_from=a --set data.tokenizer=other-tok/tokenizer.model
"$TRAIN" --config tiny.yaml --out c --set train.init_from=a --set data.tokenizer=other-tok/tokenizer.model \
  --set train.init_other_tokenizer=true --set train.max_steps=2 > othertok-ok.log 2>&1 ||
  { cat othertok-ok.log >&2; fail "init_other_tokenizer: true was refused"; }
cp a/tokenizer.model own-copy.model
"$TRAIN" --config tiny.yaml --out c --overwrite --set train.init_from=a --set data.tokenizer=own-copy.model \
  --set train.max_steps=2 > owncopy.log 2>&1 || { cat owncopy.log >&2; fail "a copy of the weights' tokenizer was refused"; }
rm -rf c
# Upcycling: a dense run's feed-forward into every expert. With renormalised top-k weights
# the experts' weighted sum is the dense output again, so the upcycled model's step-0
# validation loss is the dense model's last (to 1e-5: the weights sum to 1 in float).
"$TRAIN" --config tiny.yaml --out dense --set model.use_moe=false > dense.log 2>&1 ||
  { cat dense.log >&2; fail "dense run"; }
dense_last=$(val_losses dense | tail -1 | cut -d' ' -f2)
for k in 1 2; do
  "$TRAIN" --config tiny.yaml --out up$k --set train.init_from=dense --set train.init_mode=upcycle \
    --set model.norm_topk_prob=true --set model.num_experts_per_tok=$k --set train.max_steps=3 \
    > up$k.log 2>&1 || { cat up$k.log >&2; fail "upcycled run top-$k"; }
  up_first=$(val_losses up$k | sed -n 1p | cut -d' ' -f2)
  python3 -c "import sys; d = abs(float(sys.argv[1]) - float(sys.argv[2])); \
print(f'upcycled top-$k step 0: {float(sys.argv[2]):.7f}, dense {float(sys.argv[1]):.7f}, |diff| {d:.1e}'); \
sys.exit(d > 1e-5)" "$dense_last" "$up_first" || fail "upcycling top-$k changed the function"
done
grep -q "upcycled: every expert a copy" up1.log || fail "the log does not say it upcycled"
# Into a model with a selection bias (quantile balancing): the bias, like the router, is not
# in the dense source and starts at 0; the function is still the dense one.
"$TRAIN" --config tiny.yaml --out upqb --set train.init_from=dense --set train.init_mode=upcycle \
  --set model.norm_topk_prob=true --set model.num_experts_per_tok=2 --set model.scoring_func=sigmoid \
  --set model.router_aux_loss_coef=0 --set model.router_bias_rule=quantile --set train.max_steps=2 \
  > upqb.log 2>&1 || { cat upqb.log >&2; fail "upcycled run with quantile balancing"; }
python3 -c "import sys; d = abs(float(sys.argv[1]) - float(sys.argv[2])); \
print(f'upcycled top-2 with a selection bias step 0: |diff| {d:.1e}'); \
sys.exit(d > 1e-5)" "$dense_last" "$(val_losses upqb | sed -n 1p | cut -d' ' -f2)" ||
  fail "upcycling with a selection bias changed the function"
grep -q "step 0 computes the dense model's function" up1.log || fail "no 'function kept' line"
# Fine-grained experts (He et al. 2024): 4 experts of 128 units cut from the dense 256 (G 2,
# two virtual groups); top-2 picks a whole group, and with the scaling the slices add up to
# the dense output again: the same step-0 loss to 1e-5.
"$TRAIN" --config tiny.yaml --out fine --set train.init_from=dense --set train.init_mode=upcycle \
  --set model.moe_intermediate_size=128 --set model.num_experts_per_tok=2 \
  --set model.norm_topk_prob=true --set train.upcycle_scaling=true --set train.max_steps=2 \
  > fine.log 2>&1 || { cat fine.log >&2; fail "fine-grained upcycled run"; }
grep -q "every expert a 1/2 slice of its layer's dense feed-forward, down_proj scaled by 2" fine.log ||
  fail "no fine-grained line"
python3 -c "import sys; d = abs(float(sys.argv[1]) - float(sys.argv[2])); \
print(f'fine-grained G 2 top-2 step 0: {float(sys.argv[2]):.7f}, |diff| {d:.1e}'); \
sys.exit(d > 1e-5)" "$dense_last" "$(val_losses fine | sed -n 1p | cut -d' ' -f2)" ||
  fail "fine-grained upcycling changed the function"
# MiniMind's top-1 without renormalisation: each output is scaled by its router probability
# (about 1/E); He et al.'s scaling (E / k) restores the output at tied scores, so its step-0
# loss is nearer the dense model's than the plain copy's.
for s in false true; do
  "$TRAIN" --config tiny.yaml --out top1$s --set train.init_from=dense --set train.init_mode=upcycle \
    --set train.upcycle_scaling=$s --set train.max_steps=2 > top1$s.log 2>&1 ||
    { cat top1$s.log >&2; fail "top-1 upcycled run (scaling $s)"; }
done
grep -q "step 0 computes another function than the dense model (measured: .*): the chosen experts' weights are not renormalised" \
  top1true.log || fail "no 'function changed' line"
python3 -c "import sys; d, a, b = map(float, sys.argv[1:]); \
print(f'top-1 unrenormalised step 0: dense {d:.5f}, copies {a:.5f}, scaled copies {b:.5f}'); \
sys.exit(not abs(b - d) < abs(a - d))" "$dense_last" "$(val_losses top1false | sed -n 1p | cut -d' ' -f2)" \
  "$(val_losses top1true | sed -n 1p | cut -d' ' -f2)" || fail "the scaling did not bring top-1 nearer"
"$TRAIN" --config tiny.yaml --out drop --set train.init_from=dense --set train.init_mode=upcycle \
  --set train.upcycle_drop=0.5 --set train.max_steps=2 > drop.log 2>&1 ||
  { cat drop.log >&2; fail "Drop-Upcycling run"; }
grep -q "with 128 of its 256 intermediate units redrawn (Drop-Upcycling, train.upcycle_drop 0.5)" drop.log ||
  fail "no Drop-Upcycling line"
# A ratio too small to redraw a unit redraws none and says so; 1 redraws them all.
for ratio in 1e-320 1; do
  "$TRAIN" --config tiny.yaml --out drop$ratio --set train.init_from=dense --set train.init_mode=upcycle \
    --set model.norm_topk_prob=true --set train.upcycle_drop=$ratio --set train.max_steps=2 \
    > drop$ratio.log 2>&1 || { cat drop$ratio.log >&2; fail "Drop-Upcycling $ratio"; }
done
grep -q "with 0 of its 256 intermediate units redrawn" drop1e-320.log || fail "1e-320 redrew units?"
grep -q "step 0 computes the dense model's function" drop1e-320.log || fail "no unit redrawn, yet another function"
grep -q "with 256 of its 256 intermediate units redrawn" drop1.log || fail "1 did not redraw all units"
# The claim each upcycled run records (preserves_function, from the model as built) against
# what its step-0 validation loss shows, router kind by router kind: a claimed dense function
# gives the dense loss to 1e-5; a denied one a loss that differs.
kinds=(
  "learned-top2 --set model.num_experts_per_tok=2 --set model.norm_topk_prob=true"
  "learned-top1-raw --set model.norm_topk_prob=false"
  "random --set model.router=random --set model.router_aux_loss_coef=0 --set model.num_experts_per_tok=2"
  "hash --set model.router=hash --set model.router_aux_loss_coef=0"
  "hash-layer --set model.hash_layers=1 --set model.num_experts_per_tok=2 --set model.norm_topk_prob=true"
  "hash-layer-fine --set model.hash_layers=1 --set model.moe_intermediate_size=128 --set model.num_experts_per_tok=2 --set model.norm_topk_prob=true --set train.upcycle_scaling=true"
  "capacity --set model.capacity_factor=0.5 --set model.num_experts_per_tok=2 --set model.norm_topk_prob=true"
)
for kind in "${kinds[@]}"; do
  read -r name sets <<< "$kind"
  # shellcheck disable=SC2086
  "$TRAIN" --config tiny.yaml --out kind-$name --set train.init_from=dense --set train.init_mode=upcycle \
    --set train.max_steps=2 $sets > kind-$name.log 2>&1 || { cat kind-$name.log >&2; fail "upcycled $name"; }
  python3 - "$dense_last" "$(val_losses kind-$name | sed -n 1p | cut -d' ' -f2)" kind-$name <<'PY' ||
import glob, json, sys
dense, first = float(sys.argv[1]), float(sys.argv[2])
state = json.load(open(sorted(glob.glob(sys.argv[3] + "/checkpoints/step_*/state.json"))[-1]))
claim = state["init_from"]["preserves_function"]
gap = state["init_from"]["output_gap"]
d = abs(first - dense)
print(f"{sys.argv[3]}: preserves_function {claim} (logit gap {gap:.1e}), step-0 |loss - dense| {d:.1e}")
sys.exit(0 if (d < 1e-5 if claim else d > 1e-7) else 1)
PY
    fail "the upcycled $name run's claim disagrees with its step-0 loss"
done
grep -q "step 0 computes another function than the dense model (measured: .*hash-routed layers" \
  kind-hash-layer-fine.log || fail "the fine-grained hash layer's line does not say why"
# The experts' similarity (expert_load.jsonl, log steps): the cosine of each pair of experts'
# flattened weights, recomputed here from the last checkpoint (same step) to 1e-9. Plain
# copies stay alike after 3 steps (0.98 here); Drop-Upcycling starts them apart.
/usr/bin/python3 - <<'PY' || fail "expert similarity"
import glob, itertools, json, torch
def logged(run):
    rows = [json.loads(l) for l in open(f"{run}/expert_load.jsonl")]
    rows = [r for r in rows if r["split"] == "train" and r.get("expert_similarity") is not None]
    last = max(r["step"] for r in rows)
    return {r["layer"]: r for r in rows if r["step"] == last}, last
for run in ("up1", "drop"):
    rows, step = logged(run)
    w = torch.load(f"{run}/checkpoints/step_{step:08d}/model.pth")
    for layer, r in rows.items():
        p = f"model.layers.{layer}.mlp.experts."
        v = [torch.cat([w[f"{p}{e}.{m}.weight"].double().flatten()
                        for m in ("gate_proj", "up_proj", "down_proj")]) for e in range(4)]
        want = [float(torch.dot(a, b) / (a.norm() * b.norm())) for a, b in itertools.combinations(v, 2)]
        got = r["expert_similarity"]
        assert max(abs(a - b) for a, b in zip(want, got)) < 1e-9, (run, layer, want, got)
        assert abs(r["expert_similarity_mean"] - sum(want) / 6) < 1e-9
        assert abs(r["expert_similarity_max"] - max(want)) < 1e-9
    mean = sum(r["expert_similarity_mean"] for r in rows.values()) / len(rows)
    print(f"{run}: step {step}, mean expert similarity {mean:.4f}")
    assert (mean > 0.95) if run == "up1" else (mean < 0.9), (run, mean)
PY
"$EVAL" inspect drop | grep -q "similarity .* (most alike pair" || fail "inspect shows no similarity"
grep -q "Expert similarity per layer" drop/report.html || fail "the report has no similarity chart"
# bf16 products: the upcycled top-2 model's step-0 loss equals the dense weights' in bf16
# (a plain copy) to 1e-4 (2.7e-7 measured: the experts' weighted sum rounds differently).
BF16=(--set run.precision=bf16 --set run.bf16_emulation=true --set train.max_steps=2)
"$TRAIN" --config tiny.yaml --out dense-bf16 --set model.use_moe=false --set train.init_from=dense \
  "${BF16[@]}" > dense-bf16.log 2>&1 || { cat dense-bf16.log >&2; fail "dense bf16 copy"; }
"$TRAIN" --config tiny.yaml --out up-bf16 --set train.init_from=dense --set train.init_mode=upcycle \
  --set model.norm_topk_prob=true --set model.num_experts_per_tok=2 "${BF16[@]}" > up-bf16.log 2>&1 ||
  { cat up-bf16.log >&2; fail "upcycled bf16 run"; }
grep -q "matrix products in bf16" up-bf16.log || fail "the upcycled run is not bf16"
python3 -c "import sys; a, b = map(float, sys.argv[1:]); d = abs(a - b); \
print(f'bf16 step 0: dense {a:.5f}, upcycled top-2 {b:.5f}, |diff| {d:.1e}'); sys.exit(d > 1e-4)" \
  "$(val_losses dense-bf16 | sed -n 1p | cut -d' ' -f2)" "$(val_losses up-bf16 | sed -n 1p | cut -d' ' -f2)" ||
  fail "bf16 upcycling changed the function beyond bf16's resolution"
# Killed and resumed: an upcycled run (Drop-Upcycling draws from the generator) killed with
# SIGKILL resumes from its checkpoint to the losses of an uninterrupted one, bit for bit.
UP=(--set train.init_from=dense --set train.init_mode=upcycle --set train.upcycle_drop=0.5
    --set train.max_steps=40 --set train.checkpoint_interval=4 --set train.eval_interval=20)
"$TRAIN" --config tiny.yaml --out upfull "${UP[@]}" > upfull.log 2>&1 || { cat upfull.log >&2; fail "upfull"; }
"$TRAIN" --config tiny.yaml --out upkill "${UP[@]}" > upkill.log 2>&1 &
pid=$!
for _ in $(seq 1 1200); do [ -e upkill/checkpoints/step_00000008 ] && break; sleep 0.05; done
kill -9 "$pid"
wait "$pid" 2>/dev/null || true
[ ! -d upkill/checkpoints/step_00000040 ] || fail "the upcycled run finished before it was killed"
"$TRAIN" --config tiny.yaml --out upkill "${UP[@]}" --resume > upkill2.log 2>&1 ||
  { cat upkill2.log >&2; fail "resuming the upcycled run"; }
train_losses() { python3 -c '
import json, sys
print([(j["step"], j["loss"]) for j in map(json.loads, open(sys.argv[1])) if j["split"] == "train"])' \
  "$1/metrics.jsonl"; }
[ "$(train_losses upfull)" = "$(train_losses upkill)" ] ||
  fail "the killed upcycled run resumed to other losses"
echo "upcycled run killed at step $(grep -o 'resuming upkill/checkpoints/step_[0-9]*' upkill2.log | tail -c 9) resumed to the same 40 losses"
expect_refusal drop_alone "train.upcycle_drop .*needs train.init_mode: upcycle" --out c \
  --set train.upcycle_drop=0.5
expect_refusal moe_source "hold experts (model.layers.0.mlp.experts.0" --out c \
  --set train.init_from=a --set train.init_mode=upcycle
expect_refusal dense_target "this run's model is dense" --out c --set train.init_from=dense \
  --set train.init_mode=upcycle --set model.use_moe=false
expect_refusal no_source "upcycle needs train.init_from" --out c --set train.init_mode=upcycle
expect_refusal narrow "model.moe_intermediate_size is 96, which does not divide the dense model's intermediate_size 256" \
  --out c --set train.init_from=dense --set train.init_mode=upcycle --set model.moe_intermediate_size=96
expect_refusal groups "model.num_experts (6) is not a multiple of the 4 slices" --out c \
  --set train.init_from=dense --set train.init_mode=upcycle --set model.moe_intermediate_size=64 \
  --set model.num_experts=6
expect_refusal scaling_alone "train.upcycle_scaling .*needs train.init_mode: upcycle" --out c \
  --set train.upcycle_scaling=true
[ ! -e c ] || fail "a refused run left c/ behind"
echo "init_from: all checks passed"
