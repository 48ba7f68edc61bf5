# Compares two training run directories (tests/dist_*.sh): final weights, per-step train
# losses, eval losses and (MoE) per-step expert counts and selection bias.
#   compare_runs.py RUN_A RUN_B TOLERANCE LABEL [STEPS (12; evaluations every 6)]
import json, sys, torch
a, b, tol, label = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
steps = int(sys.argv[5]) if len(sys.argv) > 5 else 12
def final(run):
    import glob
    return sorted(glob.glob(run + "/checkpoints/step_*/model.pth"))[-1]
wa, wb = torch.load(final(a)), torch.load(final(b))
assert wa.keys() == wb.keys(), "parameter names differ"
dw = max((wa[k] - wb[k]).abs().max().item() for k in wa)
def lines(run, name):
    return [json.loads(l) for l in open(f"{run}/{name}")]
def losses(run, split, key):
    return [(m["step"], m[key]) for m in lines(run, "metrics.jsonl") if m["split"] == split]
la, lb = losses(a, "train", "loss"), losses(b, "train", "loss")
assert [s for s, _ in la] == [s for s, _ in lb] and len(la) == steps, (la, lb)
dl = max(abs(x - y) for (_, x), (_, y) in zip(la, lb))
va, vb = losses(a, "eval", "val_loss"), losses(b, "eval", "val_loss")
assert len(va) == len(vb) == steps // 6 + 1, (va, vb)
dv = max(abs(x - y) for (_, x), (_, y) in zip(va, vb))
# counts and (bias update on) the selection bias after each step
ca = [(r["step"], r["layer"], r["split"], r["counts"], r.get("bias")) for r in lines(a, "expert_load.jsonl")]
cb = [(r["step"], r["layer"], r["split"], r["counts"], r.get("bias")) for r in lines(b, "expert_load.jsonl")]
if any(k.endswith("e_score_correction_bias") for k in wa):
    assert any(any(x != 0 for x in r[4]) for r in ca if r[4]), "the bias never moved"
print(f"{label}: max |weight diff| {dw:.3g}, max |train loss diff| {dl:.3g}, "
      f"max |val loss diff| {dv:.3g}, {len(ca)} expert-count records, tolerance {tol:g}")
# Training counts drive the bias update and the aux terms: equal. An evaluation routes with
# weights that agree only to ~1e-6, so a token whose two best experts score within that
# may go the other way (seen: 1 of 960 tokens at step 12 with OpenBLAS's Haswell kernels,
# none with SkylakeX); at most one token per record may move, and then the val loss, a
# mean over the tokens, gets 10x the tolerance.
assert len(ca) == len(cb) and all(x[:3] == y[:3] for x, y in zip(ca, cb)), "records differ"
assert [r[:4] for r in ca if r[2] == "train"] == [r[:4] for r in cb if r[2] == "train"], \
    "training expert counts differ"
# The sign rule's bias moves in whole steps of its rate (equal); quantile balancing's is solved
# from the scores, so it carries their float rounding (within the tolerance).
db = max([abs(p - q) for x, y in zip(ca, cb) if x[4] and y[4] for p, q in zip(x[4], y[4])] or [0])
assert all((x[4] is None) == (y[4] is None) for x, y in zip(ca, cb)) and db <= tol, \
    f"selection bias differs by {db:.3g}"
if any(r[4] for r in ca):
    print(f"{label}: max |selection bias diff| {db:.3g} (tolerance {tol:g})")
moved = [(x[0], x[1], x[3], y[3]) for x, y in zip(ca, cb) if x[2] != "train" and x != y]
assert all(sum(abs(p - q) for p, q in zip(m[2], m[3])) <= 2 for m in moved), f"eval counts differ: {moved}"
if moved:
    print(f"{label}: eval routing of one token flipped (step, layer, counts): {moved}")
assert dw <= tol and dl <= tol and dv <= (10 * tol if moved else tol), "difference above tolerance"
