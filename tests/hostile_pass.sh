#!/usr/bin/env bash
# The hostile pass of issue 44, each case with the real programs: the tool deletes only what
# it wrote, outputs are regular files or its own directories, a replaced export goes from
# old to new in one step, ranks that disagree stop, damaged or diverged weights are errors,
# inputs that never end are refused, and pages and traces never replace a user's file. Runs
# as any user (a FIFO stands in for a device node; as root a real character device is tried
# as well).
# Usage: hostile_pass.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
BUILD=$1
SRC=$2
TRAIN=$BUILD/app/minimind-train
EVAL=$BUILD/app/minimind-eval
EXPORT=$BUILD/app/minimind-export
PY=/usr/bin/python3
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
export MASTER_PORT=$((20000 + $$ % 20000))
export MINIMIND_CONSOLE_WIDTH=0  # one line per message: the checks grep them (as under ctest)

fail() { echo "FAIL: $*" >&2; exit 1; }
# expect_error LOG PATTERN COMMAND...: the command exits 1 and its output holds PATTERN.
expect_error() {
  local log=$1 pattern=$2
  shift 2
  local rc=0
  timeout 120 "$@" > "$log" 2>&1 || rc=$?
  [ "$rc" -eq 1 ] || { cat "$log" >&2; fail "'$*' exited $rc, not 1"; }
  grep -aq -- "$pattern" "$log" || { cat "$log" >&2; fail "'$*' did not say: $pattern"; }
  grep -q "unexpected error" "$log" && { cat "$log" >&2; fail "'$*': unexpected error"; }
  echo "refused: $* -> $(grep -a -m1 "error" "$log" | sed 's/^[0-9:]* //' | cut -c1-110)"
}

head -n 300 "$SRC/data/austen.jsonl" > corpus.jsonl
cat > tiny.yaml <<YAML
run: {name: tiny, seed: 3, threads: 1, matmul: openblas, dist_timeout: 60}
model: {hidden_size: 64, num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2,
        vocab_size: 512, max_position_embeddings: 256, use_moe: true, num_experts: 4,
        norm_topk_prob: false}
data: {train: "$WORK/corpus.jsonl", cache_dir: "$WORK/cache", max_seq_len: 64, val_fraction: 0.05}
train: {batch_size: 8, max_steps: 6, warmup_steps: 0, learning_rate: 2.0e-3, eval_interval: 6,
        checkpoint_interval: 3, keep_checkpoints: 2}
log: {interval: 3}
YAML
"$TRAIN" --config tiny.yaml --out base > base.log 2>&1 || { cat base.log; fail "the base run"; }
CKPT=$(ls -d base/checkpoints/step_* | tail -1)

# 1. run.name is a name; a directory of other files is never used, emptied or marked.
mkdir -p s/w && echo x > s/w/p.txt
(cd s/w && expect_error ../../name.log "run.name.*other than . and .." \
  "$TRAIN" --config ../../tiny.yaml --set run.name=.. --overwrite)
for flags in "" "--overwrite"; do
  (cd s/w && expect_error ../../foreign.log "is not a run directory: it holds p.txt" \
    "$TRAIN" --config ../../tiny.yaml --out . $flags)
done
[ "$(ls -A s/w)" = "p.txt" ] || fail "the foreign directory changed: $(ls -A s/w)"
cp -r base own && echo mine > own/notes.txt
(cd own && expect_error ../cwd.log "is the working directory" \
  "$TRAIN" --config ../tiny.yaml --out . --overwrite)
"$TRAIN" --config tiny.yaml --out own --overwrite --set train.max_steps=3 > own.log 2>&1 ||
  { cat own.log; fail "--overwrite of a run"; }
[ "$(cat own/notes.txt)" = mine ] || fail "--overwrite deleted a file the run did not write"
grep -q "also holds notes.txt, not written by a run: left as it is" own.log ||
  fail "--overwrite did not say what it left"
cp base/tokenizer.model own/tok.model
expect_error tokin.log "holds '.*own/tok.model', the input being read" \
  "$TRAIN" --config tiny.yaml --out own --overwrite --set data.tokenizer="$WORK/own/tok.model"

# 2, 4. An HF export never replaces the working directory, the run it reads or other files.
mkdir v && echo keep > v/mine.txt
(cd v && expect_error ../dot.log "is the working directory" \
  "$EXPORT" ../base --format hf --out . --overwrite)
[ "$(ls -A v)" = "mine.txt" ] || fail "--out . changed the working directory"
"$EXPORT" base --format hf --out hf/ > hf.log 2>&1 || { cat hf.log; fail "--out DIR/"; }
"$EXPORT" base --format hf --out hf/ --overwrite > hf.log 2>&1 || { cat hf.log; fail "--out DIR/ again"; }
grep -q "wrote hf/ " hf.log || fail "the trailing slash doubled: $(cat hf.log)"
echo notes > hf/README.md
expect_error foreignhf.log "holds README.md, which minimind-export did not write" \
  "$EXPORT" base --format hf --out hf --overwrite
[ -f hf/README.md ] && [ -f hf/model.safetensors ] || fail "a refused export changed hf/"
expect_error runhf.log "holds '.*model.pth', the input being read" \
  "$EXPORT" base --format hf --out base --overwrite
[ -d "$CKPT" ] && [ -f base/metrics.jsonl ] || fail "the run was replaced by its export"
expect_error inckpt.log "lies in the checkpoint being read" \
  "$EXPORT" base --format gguf --out "$CKPT/x.gguf"
echo "not gguf" > notes.gguf
expect_error notgguf.log "is not a GGUF file, so --overwrite leaves it" \
  "$EXPORT" base --format gguf --out notes.gguf --overwrite

# 3. Device nodes, FIFOs and directories are never replaced by a file.
mkfifo fifo
nodes=(fifo)
if [ "$(id -u)" -eq 0 ]; then mknod null c 1 3 && nodes+=(null); fi
for node in "${nodes[@]}"; do
  kind=$(stat -c %F "$node")
  expect_error node.log "is a .*, not a regular file" "$EXPORT" base --format gguf --out "$node" --overwrite
  expect_error node.log "is a .*, not a regular file" "$EVAL" compare base own --out "$node"
  expect_error node.log "is a .*, not a regular file" "$EVAL" analyze base --out "$node"
  [ "$(stat -c %F "$node")" = "$kind" ] || fail "$node was replaced: $(stat -c %F "$node")"
done
expect_error gslash.log "ends in '/'" "$EXPORT" base --format gguf --out g/

# 5. Replacing is atomic end to end: kill -9 while an export is being written leaves the
# old export whole; the next export removes the temporary. Two exports at once: one wins.
# The export is stopped (SIGSTOP) as soon as its temporary appears, so the kill lands while
# the temporary exists; an attempt where the export finished first does not count, and at
# least one of them must land.
kills=""
for format in hf gguf; do
  out=kill.$format
  "$EXPORT" base --format "$format" --out "$out" > /dev/null 2>&1
  landed=0
  for attempt in 1 2 3 4 5 6; do
    "$EXPORT" base --format "$format" --out "$out" --overwrite > /dev/null 2>&1 &
    pid=$!
    seen=0
    for _ in $(seq 1 4000); do
      if compgen -G "$out.tmp.*" > /dev/null; then kill -STOP $pid 2> /dev/null && seen=1; break; fi
      sleep 0.002
    done
    # Stopped with its temporary on disk: the kill lands mid-write.
    [ "$seen" = 1 ] && [ "$(ps -o stat= -p $pid 2> /dev/null | cut -c1)" = T ] &&
      compgen -G "$out.tmp.*" > /dev/null && landed=$((landed + 1))
    kill -9 $pid 2> /dev/null || true
    wait $pid 2> /dev/null || true
    if [ "$format" = hf ]; then
      [ -f "$out/model.safetensors" ] && [ -f "$out/config.json" ] || fail "a killed export left no $out"
    else
      [ "$(head -c 4 "$out")" = GGUF ] || fail "a killed export left no $out"
    fi
    [ "$landed" -ge 2 ] && break
  done
  [ "$landed" -ge 1 ] || fail "no kill landed while the $format export's temporary existed"
  kills="$kills $format $landed of $attempt,"
  "$EXPORT" base --format "$format" --out "$out" --overwrite > /dev/null 2>&1
  ! compgen -G "$out.tmp.*" > /dev/null || fail "stale temporaries of $out stayed: $(ls -d "$out".tmp.*)"
done
echo "killed exports, landed mid-write:${kills%,}: the old output stayed whole; the next export removed the temporaries"
for round in 1 2 3; do
  "$EXPORT" base --format hf --out race --overwrite > race1.log 2>&1 & p1=$!
  "$EXPORT" base --format hf --out race --overwrite > race2.log 2>&1 & p2=$!
  r1=0 r2=0
  wait $p1 || r1=$?
  wait $p2 || r2=$?
  [ $r1 -eq 0 ] || [ $r2 -eq 0 ] || fail "two exports at once: neither won"
  for r in 1 2; do
    if ! grep -q "wrote race/" race$r.log; then
      grep -q "was written by another process while this one ran" race$r.log ||
        { cat race$r.log; fail "the losing export did not say why"; }
    fi
  done
  [ -f race/model.safetensors ] || fail "two exports at once left no output"
done
! compgen -G "race.tmp.*" > /dev/null || fail "a losing export left its temporary"
echo "two exports at once, three rounds: one won each time, a loser said why"

# 6. Ranks whose configs differ stop together, naming the keys, before anything is written.
for change in model.hidden_size=32 train.learning_rate=1 train.max_steps=9 run.seed=4; do
  key=${change%%=*}
  set +e
  ( export WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1
    RANK=0 LOCAL_RANK=0 timeout 60 "$TRAIN" --config tiny.yaml --out ranks > rank0.log 2>&1 &
    RANK=1 LOCAL_RANK=1 timeout 60 "$TRAIN" --config tiny.yaml --out ranks --set "$change" \
      > rank1.log 2>&1
    echo $? > rank1.rc
    wait $!; echo $? > rank0.rc )
  set -e
  for r in 0 1; do
    [ "$(cat rank$r.rc)" -eq 1 ] || { cat rank$r.log; fail "rank $r with $change exited $(cat rank$r.rc)"; }
    grep -q "the ranks' configs differ: $key" rank$r.log || { cat rank$r.log; fail "rank $r did not name $key"; }
  done
  [ ! -e ranks ] || fail "the run directory was made although the ranks differ ($change)"
  echo "rank 1 with $change: both ranks stopped: $(grep -o "the ranks' configs differ.*" rank1.log | cut -c1-80)"
done

# 7. A damaged checkpoint file is an error naming it, in eval, export and resume.
cp -r base rot
ROT=$(ls -d rot/checkpoints/step_* | tail -1)
"$PY" - "$ROT/model.pth" <<'PY'
import os, sys
size = os.path.getsize(sys.argv[1])
with open(sys.argv[1], "r+b") as f:
    f.seek(size // 2)
    f.write(b"\xff" * 4096)
PY
expect_error rot.log "model.pth' is damaged: entry .*CRC-32 mismatch" "$EVAL" loss rot
expect_error rot.log "model.pth' is damaged" "$EXPORT" rot --format gguf --out rot.gguf
expect_error rot.log "model.pth' is damaged" "$TRAIN" --config tiny.yaml --out rot --resume \
  --set train.max_steps=9

# 8. Divergence is an error and never a checkpoint; a null figure in the logs is read back.
expect_error nan.log "non-finite .* not saved as a checkpoint\|non-finite loss" \
  "$TRAIN" --config tiny.yaml --out nan --set train.learning_rate=1e308 --set train.max_steps=1
[ ! -e nan/checkpoints ] || [ -z "$(ls nan/checkpoints)" ] || fail "a diverged model was saved"
cp -r base nulls
"$PY" - nulls/metrics.jsonl <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
for r in rows:
    if r["split"] == "eval":
        r["val_loss"] = None
        r["val_ppl"] = None
open(sys.argv[1], "w").write("".join(json.dumps(r) + "\n" for r in rows))
PY
"$EVAL" inspect nulls > inspect.log 2>&1 || { cat inspect.log; fail "inspect refused a null val_loss"; }
"$EVAL" report nulls > report.log 2>&1 || { cat report.log; fail "report refused a null val_loss"; }

# 9, 14. One document per config; --print-config reads back without a warning.
printf 'base: tiny.yaml\n---\nmodel: {hidden_size: 32}\n' > two.yaml
expect_error two.log "line 2: a second YAML document" "$TRAIN" --config two.yaml --print-config
"$TRAIN" --config moe.yaml --print-config > printed.yaml 2> /dev/null
"$TRAIN" --config printed.yaml --print-config > /dev/null 2> printed.log
[ ! -s printed.log ] || { cat printed.log; fail "--print-config's own output warns"; }

# 10. f16 cannot hold a weight beyond 65,504: refused, naming the tensor.
"$PY" - "$CKPT/model.pth" big.pth <<'PY'
import sys, torch
w = torch.load(sys.argv[1])
w["model.layers.0.self_attn.q_proj.weight"][0, 0] = 1.0e6
torch.save(w, sys.argv[2])
PY
"$TRAIN" --config tiny.yaml --print-config > tiny-resolved.yaml 2> /dev/null
expect_error f16.log "blk.0.attn_q.weight holds a value of magnitude 1e+06, beyond Half" \
  "$EXPORT" big.pth --config tiny-resolved.yaml --tokenizer base/tokenizer.model --format gguf \
  --out big.gguf --dtype f16
expect_error f16.log "model.layers.0.self_attn.q_proj.weight holds a value of magnitude" \
  "$EXPORT" big.pth --config tiny-resolved.yaml --tokenizer base/tokenizer.model --format hf \
  --out big-hf --dtype f16
"$EXPORT" big.pth --config tiny-resolved.yaml --tokenizer base/tokenizer.model --format gguf \
  --out big.gguf --dtype bf16 > /dev/null 2>&1 || fail "bf16 holds 1e6"

# 11. A --config that changes the checkpoint's model is refused in eval and export.
printf 'base: %s\nmodel: {norm_topk_prob: true}\n' "$WORK/tiny.yaml" > contra.yaml
expect_error contra.log "describes another model than the checkpoint's own config (model.norm_topk_prob: false -> true)" \
  "$EVAL" loss base --config contra.yaml
expect_error contra.log "describes another model" "$EXPORT" base --config contra.yaml --format gguf --out c.gguf

# 12. Inputs that never end or block are refused; a huge record is skipped, not held.
expect_error zero.log "corpus '/dev/zero' is a character device, not a JSONL file" "$EVAL" loss base --data /dev/zero
expect_error fifo.log "corpus 'fifo' is a FIFO, not a JSONL file" "$EVAL" loss base --data fifo
expect_error tokzero.log "tokenizer model '/dev/zero' is a character device, not a tokenizer file" \
  "$EVAL" loss base --data corpus.jsonl --tokenizer /dev/zero
expect_error null.log "corpus '/dev/null' is a character device, not a JSONL file" "$EVAL" analyze base --data /dev/null
"$PY" -c 'import json; print(json.dumps({"text": "a" * (50 << 20)})); print(json.dumps({"text": "It is a truth."}))' > huge.jsonl
/usr/bin/time -f "%M" -o huge.rss "$EVAL" loss base --data huge.jsonl > huge.log 2>&1 ||
  { cat huge.log; fail "a corpus with a huge record"; }
grep -q "huge.jsonl:1: record over 16 MiB; record skipped" huge.log || { cat huge.log; fail "no skip message"; }
rss_mb=$(( $(cat huge.rss) / 1024 ))
[ "$rss_mb" -lt 1500 ] || fail "a 50 MB record took $rss_mb MB"
echo "a 50 MB one-line record: skipped with a message, peak RSS $rss_mb MB"

# 13. Not a run: a plain message.
expect_error slash.log "'/' is neither a run directory" "$EVAL" loss /
# 15. A page or a trace never replaces a file of the user's (--profile used to empty it at
# start-up, compare and analyze to write over it).
echo notes > notes.txt
expect_error page.log "holds something other than a page minimind-eval writes" \
  "$EVAL" compare base own --out notes.txt
expect_error page.log "holds something other than a page minimind-eval writes" \
  "$EVAL" analyze base --out notes.txt
expect_error trace.log "holds something other than a trace minimind-bench writes" \
  "$BUILD/app/minimind-bench" --preset dense --steps 1 --warmup 0 --profile notes.txt
[ "$(cat notes.txt)" = notes ] || fail "notes.txt was changed"


# The hostile pass of issue 70.
# 16. A FIFO never blocks a reader: weights, configs, tokenizers and --decode's ids are
# refused at once (timeout 120 in expect_error turns a hang into a failure).
expect_error fifow.log "weights file 'fifo' is a FIFO, not a file written by torch.save" \
  "$TRAIN" --config tiny.yaml --out fifo-run --set train.init_from=fifo --set train.max_steps=2
[ ! -e fifo-run ] || fail "a refused init_from left a run directory"
expect_error fifow.log "'fifo' is a FIFO" "$EVAL" loss fifo --config tiny-resolved.yaml
expect_error fifow.log "'fifo' is a FIFO" "$EXPORT" fifo --config tiny-resolved.yaml \
  --tokenizer base/tokenizer.model --format gguf --out fifo.gguf
expect_error fifow.log "'fifo' is a FIFO" "$EVAL" tokenize base --data fifo --decode
expect_error fifow.log "'fifo' is a FIFO, not a YAML config file" "$TRAIN" --config fifo
expect_error fifow.log "tokenizer model 'fifo' is a FIFO" "$EVAL" loss base --tokenizer fifo
# 17. Sizes have bounds; the memory estimate refuses what cannot fit before anything is
# written, naming the keys; an allocation that fails anyway is "out of memory", not C++.
expect_error bins.log "model.qb_num_bins .*must be from 2 to 100000, got 2147483647" \
  "$TRAIN" --config tiny.yaml --out bins --set model.router_bias_rule=quantile \
  --set model.router_aux_loss_coef=0 --set model.num_experts_per_tok=2 --set model.qb_num_bins=2147483647
expect_error batch.log "the activations of a micro-batch of train.batch_size (1000000)" \
  "$TRAIN" --config tiny.yaml --out bins --set train.batch_size=1000000
[ ! -e bins ] || fail "a refused size left a run directory"
expect_error scale.log "model.routed_scaling_factor .*must be in \[0.001, 1000\], got 1e+308" \
  "$TRAIN" --config tiny.yaml --out bins --set model.routed_scaling_factor=1e308
grep -q "memory estimate .* GB" base.log || fail "the trainer does not print its memory estimate"
# 18. --decode reads in bounded blocks: a line of ids over 16 MiB, or output that cannot be
# written, stops with an error naming the line, never a shorter output with exit 0.
"$PY" -c 'import sys; sys.stdout.write("5 6\n" + "5 " * (10 << 20) + "\n5\n")' > longids.txt
expect_error longids.log "longids.txt:2: a line over 16 MiB of token ids" \
  "$EVAL" tokenize base --data longids.txt --decode
if "$EVAL" tokenize base --data corpus.jsonl > /dev/full 2> full.log; then fail "writing to /dev/full succeeded"; fi
grep -q "corpus.jsonl:1 failed (output closed or disk full?)" full.log || { cat full.log; fail "/dev/full: no line named"; }
echo "-- tokenize to /dev/full: $(grep -m1 error full.log | cut -c1-100)"
# 19. Resume of a run started from weights reads only its own checkpoint.
cp -r base src-gone
"$TRAIN" --config tiny.yaml --out from-gone --set train.init_from=src-gone --set train.max_steps=3 \
  --set train.checkpoint_interval=3 > gone.log 2>&1 || { cat gone.log; fail "a run from src-gone"; }
rm -rf src-gone
"$TRAIN" --config tiny.yaml --out from-gone --set train.init_from=src-gone --set train.max_steps=6 \
  --resume > gone2.log 2>&1 || { cat gone2.log; fail "resume needed the deleted source"; }
# 20. A copied hash table must be the one the config draws; a table of out-of-range experts
# is named; a text file, a BOM or a JSON array is said to be what it is.
"$TRAIN" --config tiny.yaml --out hashsrc --set model.hash_layers=1 --set model.hash_table=random \
  --set train.max_steps=2 > hashsrc.log 2>&1 || { cat hashsrc.log; fail "hash source run"; }
expect_error hash.log "the weights' hash table model.layers.0.mlp.gate.tid2eid is not the one model.hash_table: random with run.seed: 4 draws (their run had model.hash_table: random, run.seed: 3)" \
  "$TRAIN" --config tiny.yaml --out hashcopy --set train.init_from=hashsrc --set model.hash_layers=1 \
  --set model.hash_table=random --set run.seed=4
expect_error hash.log "is not the one model.hash_table: round_robin" \
  "$TRAIN" --config tiny.yaml --out hashcopy --set train.init_from=hashsrc --set model.hash_layers=1
[ ! -e hashcopy ] || fail "a refused hash table left a run directory"
HASHCKPT=$(ls -d hashsrc/checkpoints/step_* | tail -1)
"$PY" - "$HASHCKPT/model.pth" bad-table.pth <<'PY'
import sys, torch
w = torch.load(sys.argv[1])
w["model.layers.0.mlp.gate.tid2eid"][7, 0] = 99
torch.save(w, sys.argv[2])
PY
"$TRAIN" --config tiny.yaml --set model.hash_layers=1 --set model.hash_table=random --print-config \
  > hash-resolved.yaml 2> /dev/null
expect_error table.log "model.layers.0.mlp.gate.tid2eid holds expert id 99, outside the model's 4 experts" \
  "$EVAL" loss bad-table.pth --config hash-resolved.yaml --tokenizer hashsrc/tokenizer.model
echo "just some notes" > notes.pth
expect_error text.log "'notes.pth' is not a file written by torch.save: it does not begin as a zip archive (its first bytes are \"just some notes" \
  "$TRAIN" --config tiny.yaml --out textw --set train.init_from=notes.pth --set data.tokenizer=base/tokenizer.model
grep -q "checkpoint before it" text.log && fail "a text file was called a damaged checkpoint"
cp -r "$CKPT" nostate && rm nostate/state.json
expect_error nostate.log "checkpoint 'nostate' is incomplete (no state.json)" \
  "$TRAIN" --config tiny.yaml --out nostate-run --set train.init_from=nostate
grep -q "resume from the one before" nostate.log && fail "another run's checkpoint: told to resume from the one before"
TOKJSON="$SRC/tests/data/minimind-tokenizer/tokenizer.json"
printf '\xef\xbb\xbf' | cat - "$TOKJSON" > bom.json
expect_error bom.log "begins with a UTF-8 byte-order mark" "$EVAL" tokenize --tokenizer bom.json --text hi
echo '[]' > array.json
expect_error array.log "holds a JSON array, not a tokenizer.json" "$EVAL" tokenize --tokenizer array.json --text hi
mkdir -p tc && cp "$TOKJSON" tc/tokenizer.json
printf '{"pad_token": 5, "bos_token": [1], "eos_token": true}' > tc/tokenizer_config.json
expect_error tc.log "tokenizer_config.json': pad_token is JSON number (5), not a token's name" \
  "$EVAL" tokenize --tokenizer tc/tokenizer.json --text hi
# 21. eval's --tokenizer must be the run's own (or a copy of it).
"$TRAIN" --config tiny.yaml --out other --set run.seed=5 --set data.train="$SRC/data/austen.jsonl" \
  --set train.max_steps=1 > other.log 2>&1 || { cat other.log; fail "other run"; }
expect_error evaltok.log "--tokenizer 'other/tokenizer.model' is another tokenizer than the run's own" \
  "$EVAL" loss base --tokenizer other/tokenizer.model
cp base/tokenizer.model same.model
"$EVAL" loss base --tokenizer same.model > same.log 2>&1 || { cat same.log; fail "a copy of the run's tokenizer"; }
# 22. --profile: an empty path is refused; another program's trace is kept.
expect_error profile.log "--profile is empty" "$BUILD/app/minimind-bench" --preset dense --steps 1 --warmup 0 --profile ""
echo '[{"name": "a", "ph": "X"}, {"name": "my notes"}]' > theirs.json
expect_error profile.log "holds something other than a trace minimind-bench writes" \
  "$BUILD/app/minimind-bench" --preset dense --steps 1 --warmup 0 --profile theirs.json
[ "$(cat theirs.json)" = '[{"name": "a", "ph": "X"}, {"name": "my notes"}]' ] || fail "theirs.json changed"

echo "hostile pass: all cases held"
