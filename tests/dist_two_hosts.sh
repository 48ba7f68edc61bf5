#!/usr/bin/env bash
# Two ranks on two "hosts": each rank in a network namespace of its own, joined by a veth
# pair (10.77.N.1 and .2), Gloo bound to the veth (GLOO_SOCKET_IFNAME), each rank with its
# own working directory, copy of the corpus and data.cache_dir, nothing shared but the
# network. 2 ranks x batch 4 must train as 1 rank x batch 8 (weights, losses, expert counts
# within 1e-5, as tests/dist_two_ranks.sh checks on loopback). Needs root for the
# namespaces: skipped (exit 77, counted by ctest as skipped) otherwise.
# Usage: dist_two_hosts.sh MINIMIND_TRAIN SOURCE_DIR
set -euo pipefail
BIN=$1
SRC=$2
PY=/usr/bin/python3
if [ "$(id -u)" -ne 0 ] || ! command -v ip > /dev/null; then
  echo "SKIPPED: two hosts need root and iproute2 for network namespaces"
  exit 77
fi
WORK=$(mktemp -d)
TAG=mm$$
NET=$((1 + $$ % 250))
cleanup() {
  ip netns del "${TAG}a" 2> /dev/null || true
  ip netns del "${TAG}b" 2> /dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
ip netns add "${TAG}a"
ip netns add "${TAG}b"
ip link add "${TAG}x" type veth peer name "${TAG}y"
ip link set "${TAG}x" netns "${TAG}a"
ip link set "${TAG}y" netns "${TAG}b"
ip -n "${TAG}a" addr add "10.77.$NET.1/24" dev "${TAG}x"
ip -n "${TAG}b" addr add "10.77.$NET.2/24" dev "${TAG}y"
for h in a b; do
  ip -n "$TAG$h" link set lo up
done
ip -n "${TAG}a" link set "${TAG}x" up
ip -n "${TAG}b" link set "${TAG}y" up

# Each host: its own directory, corpus copy (at another path) and cache.
config() {  # DIR: the host's config, its data paths inside DIR
  mkdir -p "$1"
  head -n 300 "$SRC/data/austen.jsonl" > "$1/corpus.jsonl"
  cat > "$1/moe.yaml" <<YAML
run: {name: hosts, seed: 5, threads: 1, dist_timeout: 60, matmul: openblas}
model: {hidden_size: 64, num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2,
        vocab_size: 512, max_position_embeddings: 256, use_moe: true, num_experts: 4,
        norm_topk_prob: false, router_aux_loss_coef: 0.0}
data: {train: "$1/corpus.jsonl", cache_dir: "$1/cache", max_seq_len: 64, val_fraction: 0.05}
train: {batch_size: 8, accumulation_steps: 2, max_steps: 12, learning_rate: 2.0e-3,
        eps: 1.0e-6, eval_interval: 6, checkpoint_interval: 6, keep_checkpoints: 1}
log: {interval: 1}
YAML
}
config "$WORK/hostA"
config "$WORK/hostB"
config "$WORK/single"
(cd "$WORK/single" && "$BIN" --config moe.yaml --out run-1x8 > run-1x8.log 2>&1) ||
  { cat "$WORK/single/run-1x8.log"; exit 1; }

PORT=$((20000 + $$ % 20000))
rank() {  # R HOST NS IFACE
  (cd "$WORK/$2" && ip netns exec "$3" env WORLD_SIZE=2 RANK="$1" LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 \
    MASTER_ADDR="10.77.$NET.1" MASTER_PORT=$PORT GLOO_SOCKET_IFNAME="$4" \
    "$BIN" --config moe.yaml --out run-2x4 --set train.batch_size=4 > "rank$1.log" 2>&1)
}
rank 0 hostA "${TAG}a" "${TAG}x" &
r0=$!
rank 1 hostB "${TAG}b" "${TAG}y" &
r1=$!
s0=0 s1=0
wait $r0 || s0=$?
wait $r1 || s1=$?
if [ $s0 -ne 0 ] || [ $s1 -ne 0 ]; then
  cat "$WORK/hostA/rank0.log" "$WORK/hostB/rank1.log" >&2
  echo "FAIL: the two hosts' ranks exited $s0 and $s1" >&2
  exit 1
fi
grep -q "2 ranks: all-reduce" "$WORK/hostA/rank0.log" || { echo "FAIL: no all-reduce line" >&2; exit 1; }
# Rank 1 wrote nothing of the run on its host (rank 0 writes the run directory); it
# prepared its own data in its own cache.
[ ! -e "$WORK/hostB/run-2x4/checkpoints" ] || { echo "FAIL: rank 1 wrote checkpoints" >&2; exit 1; }
[ -n "$(ls "$WORK/hostB/cache")" ] || { echo "FAIL: rank 1 had no cache of its own" >&2; exit 1; }
"$PY" "$SRC/tests/compare_runs.py" "$WORK/single/run-1x8" "$WORK/hostA/run-2x4" 1e-5 \
  "two hosts (network namespaces, veth) 2x4 vs 1x8"
