#!/usr/bin/env bash
# Starts N ranks of a command on this machine with torchrun's variables (RANK, WORLD_SIZE,
# LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT), the way
# `torchrun --no_python --nproc_per_node N` would (Debian's torchrun crashes at start with
# Python 3.11, see docs/distributed.md).
#   scripts/launch-local.sh N COMMAND [ARGS...]
#   e.g. scripts/launch-local.sh 2 minimind-train --config moe.yaml --out runs/moe-2ranks
# MASTER_PORT defaults to 29500. Rank 0 prints to the terminal; ranks 1.. print only warnings
# and errors. Ctrl-C (or SIGTERM) is passed to every rank, which stop together at the end of
# the current step and checkpoint. If one rank fails, the others are stopped. The exit code
# is the first non-zero one of any rank, else 0.
set -uo pipefail
if [ $# -lt 2 ] || ! [[ $1 =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: $0 N COMMAND [ARGS...]   (N ranks on this machine)" >&2
  exit 2
fi
N=$1
shift
export WORLD_SIZE=$N LOCAL_WORLD_SIZE=$N MASTER_ADDR=127.0.0.1 MASTER_PORT=${MASTER_PORT:-29500}

pids=()
for ((r = 0; r < N; r++)); do
  RANK=$r LOCAL_RANK=$r "$@" &
  pids+=($!)
done

forward() { kill -s "$1" "${pids[@]}" 2>/dev/null; }
trap 'forward INT' INT
trap 'forward TERM' TERM

# Wait for the ranks one by one as they end; the first failure stops the rest (they would
# otherwise wait for it until run.dist_timeout).
status=0
declare -A running
for p in "${pids[@]}"; do running[$p]=1; done
while [ ${#running[@]} -gt 0 ]; do
  done_pid=
  wait -n -p done_pid "${!running[@]}"
  rc=$?
  # `wait -n` also returns when a trapped signal arrives; no rank has ended then.
  [ -z "${done_pid:-}" ] && continue
  unset "running[$done_pid]"
  if [ "$rc" -ne 0 ] && [ "$status" -eq 0 ]; then
    status=$rc
    [ "$rc" -ne 130 ] && [ "$rc" -ne 143 ] && forward TERM
  fi
done
exit "$status"
