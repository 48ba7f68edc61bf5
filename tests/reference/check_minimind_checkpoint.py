#!/usr/bin/python3
"""A MiniMind checkpoint, end to end, against the reference model (minimind_ref.py).

make CONFIG.yaml OUT.pth SEED
    Writes a MiniMind-format .pth for the config's model section: the reference model with
    MiniMind's initialisation (seeded), saved as MiniMind's trainer saves it (fp16 tensors,
    the tied embedding under both names).
check CONFIG.yaml WEIGHTS.pth IDS.txt LOSS.json GEN.json
    IDS.txt: one document per line, its ids with [bos]/[eos] (minimind-eval tokenize
    --special); LOSS.json: minimind-eval loss --json on those documents; GEN.json:
    minimind-eval generate --greedy --json. Checks the loss (mean next-token cross-entropy
    over every document) to 2e-5 and the greedy continuation of GEN.json's prompt_ids id for
    id, and prints the smallest gap between the best and second-best logit on the way (how
    close a tie came).
Exit code 0 when both hold.
"""
import json
import os
import sys

import torch
import torch.nn.functional as F
import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from minimind_ref import MiniMindConfig, MiniMindForCausalLM  # noqa: E402


def model_of(config_path):
    with open(config_path) as f:
        cfg = MiniMindConfig(**yaml.safe_load(f)["model"])
    return MiniMindForCausalLM(cfg)


def make(config_path, out, seed):
    torch.manual_seed(seed)
    model = model_of(config_path)
    torch.save({k: v.half() for k, v in model.state_dict().items()}, out)


def check(config_path, weights, ids_path, loss_path, gen_path):
    model = model_of(config_path)
    state = {k: v.float() for k, v in torch.load(weights).items()}
    model.load_state_dict(state, strict=True)
    model.eval()
    docs = [[int(t) for t in line.split()] for line in open(ids_path) if line.strip()]
    want_loss = json.load(open(loss_path))["loss"]
    gen = json.load(open(gen_path))
    bad = 0
    with torch.no_grad():
        total, count = 0.0, 0
        for d in docs:
            logits = model(torch.tensor([d]))[0][0]  # [L, V]
            total += F.cross_entropy(logits[:-1].double(), torch.tensor(d[1:]),
                                     reduction="sum").item()
            count += len(d) - 1
        loss = total / count
        diff = abs(loss - want_loss)
        print(f"loss on {len(docs)} documents, {count} tokens: reference {loss:.7f}, "
              f"minimind-eval {want_loss:.7f}, |diff| {diff:.1e} (tolerance 2e-5)")
        bad += diff > 2e-5

        seq, ids, gap = list(gen["prompt_ids"]), [], float("inf")
        # One step more when minimind-eval stopped at eos: the reference must stop there too.
        for _ in range(len(gen["ids"]) + (gen["stop"] == "eos")):
            last = model(torch.tensor([seq]))[0][0, -1]  # [V]
            top = torch.topk(last, 2).values
            gap = min(gap, (top[0] - top[1]).item())
            nxt = int(last.argmax())
            if nxt == 2:  # eos: generation ends there
                break
            ids.append(nxt)
            seq.append(nxt)
        same = ids == gen["ids"]
        print(f"greedy continuation of {len(gen['prompt_ids'])} prompt ids: "
              f"{len(ids)} reference ids, {'equal to' if same else 'DIFFERENT from'} "
              f"minimind-eval's {len(gen['ids'])}; smallest top-2 logit gap {gap:.2e}")
        if not same:
            print(f"  reference     {ids}\n  minimind-eval {gen['ids']}")
            bad += 1
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif sys.argv[1] == "check":
        check(*sys.argv[2:7])
    else:
        sys.exit(f"unknown mode {sys.argv[1]}")
