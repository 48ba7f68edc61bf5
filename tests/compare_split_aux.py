# Compares a run of one rank with batch 2B against one of two ranks with batch B each, with
# MiniMind's aux loss, which each rank computes on its own rows (as MiniMind under DDP): not
# the aux term of the 2B rows together. So step 1 (same weights) has equal LM loss and
# expert counts, and the loss curves stay within 1e-4 (the batch-split term; 3e-4 measured
# with coefficient 0.01).
#   compare_split_aux.py RUN_1x2B RUN_2xB LABEL
import json, sys
def train(run):
    return [m for m in map(json.loads, open(run + "/metrics.jsonl")) if m["split"] == "train"]
def step1_counts(run):
    return [r["counts"] for r in map(json.loads, open(run + "/expert_load.jsonl"))
            if r["split"] == "train" and r["step"] == 1]
a, b = train(sys.argv[1]), train(sys.argv[2])
d1 = abs(a[0]["lm_loss"] - b[0]["lm_loss"])
d = max(abs(x["loss"] - y["loss"]) for x, y in zip(a, b))
ca, cb = step1_counts(sys.argv[1]), step1_counts(sys.argv[2])
print(f"{sys.argv[3]}: step 1 |lm loss diff| {d1:.3g} (tolerance 1e-5), counts {ca} vs {cb}; "
      f"max |train loss diff| over {len(a)} steps {d:.3g} (tolerance 1e-4)")
assert len(a) == len(b) == 12 and d1 <= 1e-5 and ca == cb and d <= 1e-4
