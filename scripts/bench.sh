#!/usr/bin/env bash
# Benchmark: C++ (minimind-bench) and the PyTorch reference (tests/reference/bench.py) on
# the bench config in one run, alternating: the reference at both of its good thread settings
# (the C++ side's: torch 1 thread + OpenBLAS on all cores; and MiniMind's own: torch on all
# cores), each on the C++ side's malloc, and the C++ speed against the better of the two for
# each preset, in fp32 and in bf16 (the reference under torch.autocast).
# Usage: scripts/bench.sh [THREADS] [STEPS] [REPEATS]
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=${1:-$(nproc)}
STEPS=${2:-12}
REPEATS=${3:-3}
bash scripts/build.sh >/dev/null
OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT
# The reference gets the OpenBLAS kernels the C++ side runs with: minimind-bench sets
# OPENBLAS_CORETYPE when OpenBLAS does not know the CPU (blas_check.h), and a PyTorch user at
# their best would set it too.
# The C++ programs' malloc (tcmalloc, docs/performance.md "Memory allocator") for the
# reference too, preloaded into Python: a PyTorch user at their best picks the allocator, and
# on glibc's defaults every step of the reference faulted in its activations anew (~2.5x
# slower, 2026-12-01).
TCMALLOC=$(ldd ./build/app/minimind-bench | awk '/libtcmalloc/ {print $3}')
[ -n "$TCMALLOC" ] || { echo "bench.sh: minimind-bench does not link tcmalloc" >&2; exit 1; }
SAME_MALLOC=(LD_PRELOAD="$TCMALLOC")
# Each repeat runs every side once, in turn: C++ in fp32 (run.matmul auto) and in bf16, the
# reference in fp32 and in bf16 autocast, each at both thread settings.
for preset in dense moe-top1 moe-top2; do
  for r in $(seq 1 "$REPEATS"); do
    for precision in fp32 bf16; do
      ./build/app/minimind-bench --preset "$preset" --threads "$THREADS" --steps "$STEPS" \
        --precision "$precision" --json >> "$OUT"
    done
    CORE=$(tail -1 "$OUT" | /usr/bin/python3 -c 'import json, sys; print(json.load(sys.stdin)["blas_core"])')
    for precision in fp32 bf16; do
      env "${SAME_MALLOC[@]}" OPENBLAS_CORETYPE="$CORE" \
        /usr/bin/python3 tests/reference/bench.py "$preset" "$THREADS" "$STEPS" 3 same "$precision" >> "$OUT"
      env "${SAME_MALLOC[@]}" OPENBLAS_CORETYPE="$CORE" \
        /usr/bin/python3 tests/reference/bench.py "$preset" "$THREADS" "$STEPS" 3 minimind \
        "$precision" >> "$OUT"
    done
  done
done
/usr/bin/python3 - "$OUT" "$THREADS" "$REPEATS" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
for r in rows:
    r.setdefault("precision", "fp32")
cpp = [r for r in rows if r["impl"] == "cpp"]
cpp_malloc = ", ".join(sorted({r["allocator"] for r in cpp}))
print(f"bench config: hidden 256, 4 layers, 8 heads, 2 kv heads, vocab 6400, seq 256, batch 8; "
      f"{sys.argv[2]} threads; median of {sys.argv[3]} runs (each the median of its steps), spread = min-max of the run medians")
print(f"malloc: C++ {cpp_malloc}, the reference the same (LD_PRELOAD)")
print("OpenBLAS kernels: " + ", ".join(sorted({f"{r['impl']} {r['blas_core']}" for r in rows})))
print("C++ fp32 products on: " + ", ".join(sorted({r["matmul"] for r in cpp if r["precision"] == "fp32"})))
# MFU of every row against one peak per precision: the best product of the machine as
# minimind-bench measured it (per core x cores, any backend), the same for both sides.
peak = {p: statistics.median(r["peak_fp32_gflops" if p == "fp32" else "peak_bf16_gflops"] for r in cpp)
        for p in ("fp32", "bf16")}
print(f"CPU {cpp[0]['cpu']}: {cpp[0]['cpu_flags']}; MFU against the fp32 peak {peak['fp32']:.0f} GFLOP/s "
      f"and the bf16 peak {peak['bf16']:.0f} GFLOP/s")
for r in rows:
    r["mfu"] = r["mfu"] * r["peak_gflops"] / peak[r["precision"]]
print(f"{'preset':9} {'impl':16} {'prec':4} {'tok/s':>7} {'spread':>12} {'step ms':>8} {'fwd':>6} {'bwd':>6} {'opt':>6} {'RSS MB':>7} {'MFU':>6} {'gen tok/s':>9}")
res = {}
for preset in ["dense", "moe-top1", "moe-top2"]:
    for precision in ["fp32", "bf16"]:
        for impl in ["cpp", "pytorch", "pytorch-minimind"]:
            rs = [r for r in rows if r["preset"] == preset and r["impl"] == impl and r["precision"] == precision]
            med = lambda k: statistics.median(r[k] for r in rs)
            tok = [r["tok_s"] for r in rs]
            res[(preset, impl, precision)] = med("tok_s")
            gen = med("gen_tok_s") if rs[0]["gen_tok_s"] is not None else None
            print(f"{preset:9} {impl:16} {precision:4} {med('tok_s'):7.0f} {min(tok):5.0f}-{max(tok):<6.0f} {med('step_ms'):8.0f} "
                  f"{med('fwd_ms'):6.0f} {med('bwd_ms'):6.0f} {med('opt_ms'):6.0f} {max(r['peak_rss_mb'] for r in rs):7.0f} "
                  f"{100 * med('mfu'):5.1f}% {('%9.0f' % gen) if gen else '      n/a'}")
for preset in ["dense", "moe-top1", "moe-top2"]:
    for precision in ["fp32", "bf16"]:
        best = max(["pytorch", "pytorch-minimind"], key=lambda impl: res[(preset, impl, precision)])
        print(f"{preset} {precision}: C++ / PyTorch at its best ({'torch 1 thread + OpenBLAS all cores' if best == 'pytorch' else 'MiniMind threads'}) "
              f"= {res[(preset, 'cpp', precision)] / res[(preset, best, precision)]:.2f}x")
    print(f"{preset}: C++ bf16 / C++ fp32 = {res[(preset, 'cpp', 'bf16')] / res[(preset, 'cpp', 'fp32')]:.2f}x")
print(f"MoE top-1 step / dense step (C++ fp32) = {res[('dense', 'cpp', 'fp32')] / res[('moe-top1', 'cpp', 'fp32')]:.2f}")
PY
