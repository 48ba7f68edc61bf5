#!/usr/bin/python3
"""Writes the parity fixtures the C++ tests compare against.

For each case: a MiniMind-format weights file (<case>.weights.pth, as MiniMind's
torch.save of a state dict) and <case>.pt with the config (YAML text), the inputs, and the
reference results: logits, LM loss, aux loss, expert counts, every parameter gradient of
(LM loss + aux loss), and the losses and final weights of 5 AdamW steps (lr 5e-4, clip 1.0).

Usage: /usr/bin/python3 make_fixtures.py OUT_DIR
"""
import os
import sys

import torch
import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from minimind_ref import MiniMindConfig, MiniMindForCausalLM  # noqa: E402

BASE = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=256, max_position_embeddings=64)
MOE = dict(BASE, use_moe=True, num_experts=4, router_aux_loss_coef=0.1)

# name -> (model keys, mode, special setup)
CASES = {
    "dense_train": (BASE, "train", None),
    "dense_eval": (BASE, "eval", None),
    "dense_untied_train": (dict(BASE, tie_word_embeddings=False), "train", None),
    "moe_top1_norm_train": (dict(MOE, num_experts_per_tok=1, norm_topk_prob=True), "train", None),
    "moe_top1_norm_eval": (dict(MOE, num_experts_per_tok=1, norm_topk_prob=True), "eval", None),
    "moe_top1_nonorm_train": (dict(MOE, num_experts_per_tok=1, norm_topk_prob=False), "train", None),
    "moe_top1_nonorm_eval": (dict(MOE, num_experts_per_tok=1, norm_topk_prob=False), "eval", None),
    "moe_top2_norm_train": (dict(MOE, num_experts_per_tok=2, norm_topk_prob=True,
                                 moe_intermediate_size=96), "train", None),
    "moe_top2_norm_eval": (dict(MOE, num_experts_per_tok=2, norm_topk_prob=True,
                                moe_intermediate_size=96), "eval", None),
    "moe_top2_nonorm_train": (dict(MOE, num_experts_per_tok=2, norm_topk_prob=False), "train", None),
    "moe_top2_nonorm_eval": (dict(MOE, num_experts_per_tok=2, norm_topk_prob=False), "eval", None),
    # Expert 3 is never picked: its parameters must still get a (zero) gradient.
    "moe_top1_idle_expert_train": (dict(MOE, num_experts_per_tok=1, norm_topk_prob=False),
                                   "train", "idle_expert"),
}

STEPS, LR, CLIP = 5, 5e-4, 1.0


def padded_batch(gen, vocab, seq_len, lengths):
    """MiniMind PretrainDataset rows: [bos] + tokens + [eos], right-padded with 0;
    labels = ids with padding set to -100."""
    ids = torch.zeros(len(lengths), seq_len, dtype=torch.long)
    for r, n in enumerate(lengths):
        row = [1] + torch.randint(3, vocab, (n,), generator=gen).tolist() + [2]
        ids[r, : len(row)] = torch.tensor(row)
    labels = ids.clone()
    labels[ids == 0] = -100
    return ids, labels


def make_idle_expert(model):
    # Logits of experts 0 and 1 are +-c*(u.x) and expert 3's is 0: one of the first two
    # always scores >= expert 3, so top-1 never picks it.
    with torch.no_grad():
        for layer in model.model.layers:
            w = layer.mlp.gate.weight
            u = w[0].clone() * 10
            w[0], w[1], w[3] = u, -u, 0.0


def run_case(name, keys, mode, special, out_dir):
    torch.manual_seed(1234)
    cfg = MiniMindConfig(**keys)
    model = MiniMindForCausalLM(cfg)
    if special == "idle_expert":
        make_idle_expert(model)
    gen = torch.Generator().manual_seed(99)
    ids, labels = padded_batch(gen, cfg.vocab_size, 20, [18, 10, 5])

    weights = {k: v.clone() for k, v in model.state_dict().items()}
    torch.save(weights, os.path.join(out_dir, f"{name}.weights.pth"))
    if name == "dense_train":  # MiniMind ships fp16 weights files: test reading one
        torch.save({k: v.half() for k, v in weights.items()},
                   os.path.join(out_dir, "dense.weights.fp16.pth"))

    fixture = {"config_yaml": yaml.safe_dump({"model": keys, "data": {"max_seq_len": 32}}),
               "mode": mode,
               "input_ids": ids, "labels": labels}
    model.train(mode == "train")
    if mode == "eval":
        with torch.no_grad():
            logits, loss, aux, counts = model(ids, labels)
    else:
        logits, loss, aux, counts = model(ids, labels)
        (loss + aux).backward()
        fixture["grads"] = {n: p.grad.clone() for n, p in model.named_parameters()}
    fixture.update(logits=logits.detach(), loss=loss.detach(), aux_loss=aux.detach())
    if counts:
        fixture["counts"] = torch.stack(counts)

    if mode == "train":
        opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.999), eps=1e-8,
                                weight_decay=0.01)
        losses = []
        for _ in range(STEPS):
            opt.zero_grad(set_to_none=True)
            _, loss, aux, _ = model(ids, labels)
            total = loss + aux
            total.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
            opt.step()
            losses.append(total.item())
        fixture["step_losses"] = torch.tensor(losses, dtype=torch.float64)
        fixture["weights_after"] = {n: p.detach().clone() for n, p in model.named_parameters()}
    torch.save(fixture, os.path.join(out_dir, f"{name}.pt"))


def main():
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    torch.set_num_threads(1)  # with one thread C++ and Python results are reproducible
    for name, (keys, mode, special) in CASES.items():
        run_case(name, keys, mode, special, out_dir)
    with open(os.path.join(out_dir, "cases.txt"), "w") as f:
        f.write("\n".join(CASES) + "\n")
    print(f"wrote {len(CASES)} parity fixtures to {out_dir}")


if __name__ == "__main__":
    main()
