#!/usr/bin/python3
"""The PyTorch reference (minimind_ref.py: MiniMind's own code path) on the bench config,
measured like minimind-bench: median step time over the measured steps, fwd/bwd/optimizer
split, peak RSS, MFU against an fp32 matmul peak measured in this process.

Usage: bench.py PRESET THREADS [STEPS] [WARMUP] [POLICY] [PRECISION] [LABEL]   (one JSON line)
POLICY, the threads:
  "same" (default): the C++ side's setting, torch 1 intra-op thread, OpenBLAS THREADS;
  "blas1": torch THREADS intra-op threads, OpenBLAS 1 (as OPENBLAS_NUM_THREADS=1);
  "minimind": what MiniMind's scripts get, torch THREADS and OpenBLAS's own default of one
  thread per core.
PRECISION "fp32" (default) or "bf16": the forward under torch.autocast("cpu",
dtype=torch.bfloat16), as a PyTorch user trains in bf16 on a CPU. The malloc and the OpenBLAS
kernels are the environment's (LD_PRELOAD, MALLOC_*_, OPENBLAS_CORETYPE: set before Python
starts; scripts/bench.sh tries each); LABEL names them in the JSON ("setting").
"""
import contextlib
import ctypes
import json
import os
import resource
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from minimind_ref import MiniMindConfig, MiniMindForCausalLM  # noqa: E402


def set_blas_threads(n):
    try:
        ctypes.CDLL("libopenblas.so.0").openblas_set_num_threads(n)
    except OSError:
        pass


def blas_core():
    try:
        lib = ctypes.CDLL("libopenblas.so.0")
        lib.openblas_get_corename.restype = ctypes.c_char_p
        return lib.openblas_get_corename().decode()
    except OSError:
        return ""


def peak_gflops(n=1536):
    # Into a preallocated output: with glibc's default thresholds `a @ b` would map and
    # fault in a fresh 9 MB result each time, and the peak would include that.
    a, b, c = torch.randn(n, n), torch.randn(n, n), torch.empty(n, n)
    torch.mm(a, b, out=c)
    best = 1e30
    for _ in range(5):
        t = time.perf_counter()
        torch.mm(a, b, out=c)
        best = min(best, time.perf_counter() - t)
    return 2 * n ** 3 / best / 1e9


def main():
    preset, threads = sys.argv[1], int(sys.argv[2])
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 12
    warmup = int(sys.argv[4]) if len(sys.argv) > 4 else 3
    policy = sys.argv[5] if len(sys.argv) > 5 else "same"
    precision = sys.argv[6] if len(sys.argv) > 6 else "fp32"
    label = sys.argv[7] if len(sys.argv) > 7 else ""
    autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if precision == "bf16" \
        else contextlib.nullcontext
    if policy not in ("same", "blas1", "minimind"):
        sys.exit(f"bench.py: unknown POLICY {policy!r}")
    set_blas_threads(threads)
    peak = peak_gflops()
    if policy == "blas1":
        set_blas_threads(1)
    torch.set_num_threads(1 if policy == "same" else threads)
    cfg = MiniMindConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
                         vocab_size=6400, max_position_embeddings=32768, use_moe=preset != "dense",
                         num_experts=4, num_experts_per_tok=2 if preset == "moe-top2" else 1,
                         norm_topk_prob=False)
    torch.manual_seed(0)
    model = MiniMindForCausalLM(cfg)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=5e-4)
    ids = torch.randint(3, cfg.vocab_size, (8, 256))
    fwd, bwd, optim, total = [], [], [], []
    for s in range(warmup + steps):
        t0 = time.perf_counter()
        with autocast():
            _, loss, aux, _, _ = model(ids, ids)
            loss = loss + aux
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        t3 = time.perf_counter()
        if s >= warmup:
            fwd.append(t1 - t0), bwd.append(t2 - t1), optim.append(t3 - t2), total.append(t3 - t0)

    def median(v):
        v = sorted(v)
        return v[len(v) // 2] if len(v) % 2 else 0.5 * (v[len(v) // 2 - 1] + v[len(v) // 2])

    step = median(total)
    rates = [8 * 256 / t for t in total]
    H, d, L, V = 256, 32, 4, 6400
    attn = H * 8 * d * 2 + H * 2 * d * 2
    ffn = (cfg.num_experts_per_tok * 3 * H * cfg.moe_intermediate_size + H * 4) if cfg.use_moe \
        else 3 * H * cfg.intermediate_size
    flops = 6 * (L * (attn + ffn) + H * V) + 12 * L * 256 * 8 * d
    tok_s = 8 * 256 / step
    print(json.dumps({
        "impl": "pytorch" if policy == "same" else "pytorch-" + policy, "preset": preset, "precision": precision, "threads": threads, "tok_s": round(tok_s, 1),
        "tok_s_min": round(min(rates), 1), "tok_s_max": round(max(rates), 1), "step_ms": round(1e3 * step, 1),
        "fwd_ms": round(1e3 * median(fwd), 1), "bwd_ms": round(1e3 * median(bwd), 1),
        "opt_ms": round(1e3 * median(optim), 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "mfu": round(tok_s * flops / (peak * 1e9), 4), "peak_gflops": round(peak, 1), "gen_tok_s": None,
        "blas_core": blas_core(), "policy": policy,
        "setting": label, "torch_threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
