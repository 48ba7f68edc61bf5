#!/usr/bin/env bash
# Benchmark: C++ (minimind-bench) against the PyTorch reference (tests/reference/bench.py,
# MiniMind's own code path) on the bench config, in fp32 and in bf16 (the reference under
# torch.autocast), with the reference at its best.
#
# "At its best": every setting that helps PyTorch on this CPU, tried once each (the sweep):
#   threads  - torch 1 intra-op thread + OpenBLAS on every core ("same", the C++ side's);
#              torch on every core + OpenBLAS 1 thread ("blas1", OPENBLAS_NUM_THREADS=1);
#              MiniMind's scripts' default, torch and OpenBLAS on every core ("minimind");
#   malloc   - tcmalloc (preloaded, the C++ programs' own), or glibc's with its mmap and trim
#              thresholds raised (without either, every step faulted its activations in anew);
#   kernels  - OpenBLAS's kernels from the environment (OPENBLAS_CORETYPE), and on an AVX-512
#              CPU its AVX-512 ones (SkylakeX) as well.
# Then, for each preset and precision, the best setting of the sweep and the C++ side are
# measured REPEATS times alternating, and the ratio is taken between their medians.
#
# Usage: scripts/bench.sh [THREADS [STEPS [REPEATS]]]
#   PRESETS="dense moe-top1"  the presets (default: dense moe-top1 moe-top2)
#   MINIMIND_BENCH=path       a built minimind-bench to use (default: build, then build/app's)
#   BENCH_LOG=file            keep every JSON line there
#   BENCH_SWEEP=file          take the sweep from an earlier run's BENCH_LOG instead of running it
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=${1:-$(nproc)}
STEPS=${2:-8}
REPEATS=${3:-3}
PRESETS=${PRESETS:-dense moe-top1 moe-top2}
if [ -z "${MINIMIND_BENCH:-}" ]; then
  bash scripts/build.sh >/dev/null
  MINIMIND_BENCH=./build/app/minimind-bench
fi
OUT=${BENCH_LOG:-$(mktemp)}
[ -n "${BENCH_LOG:-}" ] || trap 'rm -f "$OUT"' EXIT
: > "$OUT"
PY=/usr/bin/python3
TCMALLOC=$(ldd "$MINIMIND_BENCH" | awk '/libtcmalloc/ {print $3}')
[ -n "$TCMALLOC" ] || { echo "bench.sh: minimind-bench does not link tcmalloc" >&2; exit 1; }
GLIBC_RAISED=(MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=4294967296
              MALLOC_TOP_PAD_=268435456)
# The environment's kernels: what OpenBLAS loaded in minimind-bench (it sets OPENBLAS_CORETYPE
# itself where OpenBLAS does not know the CPU: util/blas_check.h).
LOADED=$("$MINIMIND_BENCH" --matmul-peaks | $PY -c 'import json,sys; print([p["kernel"] for p in json.load(sys.stdin) if p["backend"] == "openblas"][0])')
KERNELS=("$LOADED")
if grep -qw avx512f /proc/cpuinfo && [ "$LOADED" != SkylakeX ]; then KERNELS+=(SkylakeX); fi
# bf16 only where the CPU has bf16 instructions: elsewhere minimind-bench refuses bf16 (oneDNN
# would emulate it) and PyTorch's autocast would time the emulation.
PRECISIONS=(fp32 bf16)
if ! grep -qwE 'avx512_bf16|amx_bf16' /proc/cpuinfo; then
  PRECISIONS=(fp32)
  echo "bench.sh: this CPU has no bf16 instructions (avx512_bf16, amx_bf16): fp32 only" >&2
fi

reference() {  # PRESET PRECISION POLICY MALLOC KERNELS
  local env=(OPENBLAS_CORETYPE="$5")
  if [ "$4" = tcmalloc ]; then env+=(LD_PRELOAD="$TCMALLOC"); else env+=("${GLIBC_RAISED[@]}"); fi
  env "${env[@]}" $PY tests/reference/bench.py "$1" "$THREADS" "$STEPS" 2 "$3" "$2" \
    "$3 $4 $5" | sed 's/^{/{"phase": "'"$PHASE"'", /' >> "$OUT"
}
cpp() {  # PRESET PRECISION
  "$MINIMIND_BENCH" --preset "$1" --threads "$THREADS" --steps "$STEPS" --warmup 2 \
    --precision "$2" --json | sed 's/^{/{"phase": "'"$PHASE"'", /' >> "$OUT"
}

PHASE=sweep
if [ -n "${BENCH_SWEEP:-}" ]; then
  grep '"phase": "sweep"' "$BENCH_SWEEP" >> "$OUT"
else
for preset in $PRESETS; do
  for precision in "${PRECISIONS[@]}"; do
    for policy in same blas1 minimind; do
      for malloc in tcmalloc glibc; do
        for kernels in "${KERNELS[@]}"; do
          reference "$preset" "$precision" "$policy" "$malloc" "$kernels"
        done
      done
    done
  done
done
fi
PHASE=final
for preset in $PRESETS; do
  for precision in "${PRECISIONS[@]}"; do
    read -r policy malloc kernels < <($PY - "$OUT" "$preset" "$precision" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
best = max((r for r in rows if r["impl"] != "cpp" and r["preset"] == sys.argv[2]
            and r["precision"] == sys.argv[3]), key=lambda r: r["tok_s"])
print(best["setting"])
PY
)
    for r in $(seq 1 "$REPEATS"); do
      cpp "$preset" "$precision"
      reference "$preset" "$precision" "$policy" "$malloc" "$kernels"
    done
  done
done

$PY - "$OUT" "$THREADS" "$REPEATS" "$STEPS" "${PRECISIONS[*]}" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
precisions = sys.argv[5].split()
cpp = [r for r in rows if r["impl"] == "cpp"]
presets = list(dict.fromkeys(r["preset"] for r in rows))
print(f"bench config: hidden 256, 4 layers, 8 heads, 2 kv heads, vocab 6400, seq 256, batch 8; "
      f"{sys.argv[2]} threads; {sys.argv[4]} measured steps per run (their median)")
print(f"CPU {cpp[0]['cpu']}: {cpp[0]['cpu_flags']}; C++: {cpp[0]['allocator']}, fp32 products on "
      + ", ".join(sorted({r['matmul'] for r in cpp if r['precision'] == 'fp32'}))
      + f", OpenBLAS {cpp[0]['blas_core']}")
print("\nThe sweep: the reference once under each setting (threads, malloc, OpenBLAS kernels), tok/s")
sweep = [r for r in rows if r["phase"] == "sweep"]
settings = list(dict.fromkeys(r["setting"] for r in sweep))
print("| setting | " + " | ".join(f"{p} {q}" for p in presets for q in precisions) + " |")
print("|---|" + "---:|" * (len(precisions) * len(presets)))
for s in settings:
    cells = []
    for p in presets:
        for q in precisions:
            v = [r["tok_s"] for r in sweep if r["setting"] == s and r["preset"] == p and r["precision"] == q]
            cells.append(f"{v[0]:.0f}" if v else "")
    print(f"| {s} | " + " | ".join(cells) + " |")
print(f"\nAlternating, {sys.argv[3]} runs each: medians (min-max), tok/s; MFU against the peak of "
      "the run's precision that minimind-bench measured")
peak = {q: statistics.median(r["peak_fp32_gflops" if q == "fp32" else "peak_bf16_gflops"] for r in cpp)
        for q in precisions}
print("| preset | precision | C++ tok/s | C++ MFU | PyTorch at its best | its setting | C++ / PyTorch |")
print("|---|---|---:|---:|---:|---|---:|")
final = [r for r in rows if r["phase"] == "final"]
res = {}
for p in presets:
    for q in precisions:
        c = [r for r in final if r["impl"] == "cpp" and r["preset"] == p and r["precision"] == q]
        t = [r for r in final if r["impl"] != "cpp" and r["preset"] == p and r["precision"] == q]
        ct, tt = statistics.median(r["tok_s"] for r in c), statistics.median(r["tok_s"] for r in t)
        mfu = statistics.median(r["model_gflops"] for r in c) / peak[q]
        res[(p, q)] = ct
        print(f"| {p} | {q} | {ct:.0f} ({min(r['tok_s'] for r in c):.0f}-{max(r['tok_s'] for r in c):.0f}) "
              f"| {100 * mfu:.1f} % | {tt:.0f} ({min(r['tok_s'] for r in t):.0f}-{max(r['tok_s'] for r in t):.0f}) "
              f"| {t[0]['setting']} | {ct / tt:.2f}x |")
for p in presets if "bf16" in precisions else []:
    print(f"{p}: C++ bf16 / C++ fp32 = {res[(p, 'bf16')] / res[(p, 'fp32')]:.2f}x")
PY
