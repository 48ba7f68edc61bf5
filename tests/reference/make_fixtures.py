#!/usr/bin/python3
"""Writes the parity fixtures the C++ tests compare against.

For each case: a MiniMind-format weights file (<case>.weights.pth, as MiniMind's
torch.save of a state dict) and <case>.pt with the config (YAML text), the inputs, and the
reference results: logits, LM loss, aux loss, z-loss, expert counts, every parameter
gradient of (LM loss + aux loss + z-loss), and the losses and final weights of 5 AdamW steps
(lr 5e-4, clip 1.0).

The balancing-lab cases (lab_*) take each optimizer step over two micro-batches
(accumulation 2: the global aux scope and the bias update depend on it), and also store the
capacity keep masks and the selection bias after the steps. torch's generator is seeded
with SEED_FORWARD right before the first forward and before the steps (the random router
draws from it), as the C++ test does.

Usage: /usr/bin/python3 make_fixtures.py OUT_DIR
"""
import contextlib
import os
import sys

import torch
import yaml
from torch.overrides import TorchFunctionMode

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from minimind_ref import MiniMindConfig, MiniMindForCausalLM  # noqa: E402
import routing_analysis_ref  # noqa: E402

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
    # Chat fine-tuning (train_full_sft.py): rows of conversations labelled by MiniMind's
    # generate_labels; the vocabulary holds the ids of MiniMind's tokenizer that mark answers.
    "moe_sft_train": (dict(MOE, vocab_size=1400, num_experts_per_tok=1, norm_topk_prob=True),
                      "train", "sft"),
}

# The balancing lab: each method of configs/balancing-methods.txt at k = 1 and k = 2
# (tests/test_parity.cpp derives the same names), then what that list cannot say: the other
# drop policy, the bias with softmax scores, a shared expert of its own width, and the
# presets' combinations.
TOP1 = dict(MOE, num_experts_per_tok=1, norm_topk_prob=False)
TOP2 = dict(MOE, num_experts_per_tok=2, norm_topk_prob=True)
METHODS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "configs",
                       "balancing-methods.txt")


def yaml_scalar(text):
    for parse in (int, float):
        try:
            return parse(text)
        except ValueError:
            pass
    return text


def method_cases(path):
    """name -> model keys for each method: lab_<name>_top1 and _top2, or lab_<name> alone
    when the method sets num_experts_per_tok; the baseline (no overrides) has the moe_* cases."""
    cases = {}
    for line in open(path):
        fields = line.split("#", 1)[0].split()
        if len(fields) < 2:
            continue
        stem = "lab_" + fields[0].replace("-", "_").replace(".", "_")
        keys = {}
        for assignment in fields[1:]:
            key, value = assignment.split("=", 1)
            section, name = key.split(".", 1)
            assert section == "model", f"{path}: {key}: parity cases set model keys only"
            keys[name] = yaml_scalar(value)
        if "num_experts_per_tok" in keys:
            cases[stem] = dict(TOP1, **keys)
        else:
            cases[stem + "_top1"] = dict(TOP1, **keys)
            cases[stem + "_top2"] = dict(TOP2, **keys)
    return cases


LAB = method_cases(METHODS)
LAB.update({
    "lab_capacity_position_top1": dict(TOP1, capacity_factor=1.0, capacity_drop_policy="position"),
    "lab_capacity_position_top2": dict(TOP2, capacity_factor=1.25, capacity_drop_policy="position"),
    "lab_bias_softmax_top2": dict(TOP2, router_bias_update_rate=0.01),
    "lab_shared_width_top2": dict(TOP2, n_shared_experts=2, shared_expert_intermediate_size=80),
    # quantile balancing over DeepSeek-V4's scores (exact, as unbounded scores need) with
    # Megatron #5349's EMA, and over softmax scores; a random hash table
    "lab_quantile_v4_ema_top2": dict(TOP2, router_aux_loss_coef=0, scoring_func="sqrtsoftplus",
                                     router_bias_rule="quantile",
                                     qb_estimator="exact", qb_ema=0.5),
    "lab_quantile_softmax_top2": dict(TOP2, router_aux_loss_coef=0, router_bias_rule="quantile"),
    "lab_hash_random_top2": dict(TOP2, hash_layers=1, hash_table="random"),
    # configs/moe-switch.yaml, moe-deepseek.yaml and minimind2-moe.yaml at fixture size
    "lab_switch": dict(TOP1, capacity_factor=1.25, router_z_loss_coef=1e-3, router_aux_loss_coef=1e-2),
    "lab_deepseek": dict(MOE, num_experts=16, num_experts_per_tok=4, moe_intermediate_size=32,
                         n_shared_experts=1, scoring_func="sigmoid", router_bias_update_rate=1e-3,
                         aux_loss_scope="sequence", router_aux_loss_coef=1e-4),
    "lab_minimind2": dict(TOP2, n_shared_experts=1, aux_loss_scope="sequence",
                          router_aux_loss_coef=0.01),
})
CASES.update({name: (keys, "train", "lab") for name, keys in LAB.items()})
SEED_FORWARD = 7

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


# MiniMind's tokenizer's ids of "<|im_start|>assistant\n", "<|im_end|>\n" and
# "<|im_start|>user\n" (tests/test_parity.cpp takes the first two from the tokenizer itself).
ANSWER_OPEN, ANSWER_CLOSE, USER_OPEN = [1, 1388, 570, 811, 234], [2, 234], [1, 832, 311, 234]


def generate_labels(ids, max_len):
    """MiniMind's SFTDataset.generate_labels: each answer, from after its header through its
    closing pair (or the row's end), labelled with its own ids; the rest -100."""
    labels = [-100] * len(ids)
    i = 0
    while i < len(ids):
        if ids[i:i + len(ANSWER_OPEN)] == ANSWER_OPEN:
            start = i + len(ANSWER_OPEN)
            end = start
            while end < len(ids):
                if ids[end:end + len(ANSWER_CLOSE)] == ANSWER_CLOSE:
                    break
                end += 1
            for j in range(start, min(end + len(ANSWER_CLOSE), max_len)):
                labels[j] = ids[j]
            i = end + len(ANSWER_CLOSE) if end < len(ids) else len(ids)
        else:
            i += 1
    return labels


def sft_batch(gen, vocab, seq_len):
    """SFTDataset rows of made-up conversations (words drawn from ids >= 3, so none is a
    marker): two turns that fit, one cut inside its answer, a short one; right-padded with 0."""
    def words(n):
        return torch.randint(3, vocab, (n,), generator=gen).tolist()
    turn = lambda q, a: USER_OPEN + words(q) + ANSWER_CLOSE + ANSWER_OPEN + words(a) + ANSWER_CLOSE
    convs = [turn(5, 6) + turn(3, 4), USER_OPEN + words(8) + ANSWER_CLOSE + ANSWER_OPEN + words(60),
             turn(2, 3)]
    ids = torch.zeros(len(convs), seq_len, dtype=torch.long)
    labels = torch.full((len(convs), seq_len), -100, dtype=torch.long)
    for r, conv in enumerate(convs):
        row = (conv + [0] * seq_len)[:seq_len]
        ids[r] = torch.tensor(row)
        labels[r] = torch.tensor(generate_labels(row, seq_len))
    return ids, labels


def make_idle_expert(model):
    # Logits of experts 0 and 1 are +-c*(u.x) and expert 3's is 0: one of the first two
    # always scores >= expert 3, so top-1 never picks it.
    with torch.no_grad():
        for layer in model.model.layers:
            w = layer.mlp.gate.weight
            u = w[0].clone() * 10
            w[0], w[1], w[3] = u, -u, 0.0


def router_grad_by_source(model, micro):
    """Per MoE layer [||d LM / d W_gate||, ||d (aux + z) / d W_gate||] of one optimizer step
    over the micro-batches (each loss / A), each differentiated on its own."""
    gates = [l.mlp.gate.weight for l in model.model.layers if hasattr(l.mlp, "gate")]
    lm = [torch.zeros_like(g) for g in gates]
    bal = [torch.zeros_like(g) for g in gates]
    step = {"counts": None, "tokens": 0.0}
    for m_ids, m_labels in micro:
        _, loss, aux, z, _ = model(m_ids, m_labels, step)
        g_lm = torch.autograd.grad(loss / len(micro), gates, retain_graph=True, allow_unused=True)
        balance = (aux + z) / len(micro)
        # No balancing loss (coefficients 0): its gradient is zero.
        g_bal = (torch.autograd.grad(balance, gates, allow_unused=True) if balance.requires_grad
                 else [None] * len(gates))
        for i in range(len(gates)):
            if g_lm[i] is not None:
                lm[i] += g_lm[i]
            if g_bal[i] is not None:
                bal[i] += g_bal[i]
    return torch.tensor([[a.norm().item(), b.norm().item()] for a, b in zip(lm, bal)],
                        dtype=torch.float64)


def run_case(name, keys, mode, special, out_dir):
    torch.manual_seed(1234)
    cfg = MiniMindConfig(**keys)
    model = MiniMindForCausalLM(cfg)
    if special == "idle_expert":
        make_idle_expert(model)
    gen = torch.Generator().manual_seed(99)
    if special == "sft":
        ids, labels = sft_batch(gen, cfg.vocab_size, 40)
    else:
        ids, labels = padded_batch(gen, cfg.vocab_size, 20, [18, 10, 5])

    weights = {k: v.clone() for k, v in model.state_dict().items()}
    torch.save(weights, os.path.join(out_dir, f"{name}.weights.pth"))
    if name == "dense_train":  # MiniMind ships fp16 weights files: test reading one
        torch.save({k: v.half() for k, v in weights.items()},
                   os.path.join(out_dir, "dense.weights.fp16.pth"))

    fixture = {"config_yaml": yaml.safe_dump({"model": keys, "data": {"max_seq_len": 32}}),
               "mode": mode,
               "input_ids": ids, "labels": labels, "sft": special == "sft"}
    micro = [(ids, labels)]
    if special == "lab":  # a second micro-batch for the accumulated steps
        ids2, labels2 = padded_batch(gen, cfg.vocab_size, 20, [16, 12, 7])
        fixture.update(input_ids2=ids2, labels2=labels2)
        micro.append((ids2, labels2))
    model.train(mode == "train")
    torch.manual_seed(SEED_FORWARD)
    if mode == "eval":
        with torch.no_grad():
            logits, loss, aux, z, counts = model(ids, labels)
    else:
        logits, loss, aux, z, counts = model(ids, labels)
        (loss + aux + z).backward()
        fixture["grads"] = {n: p.grad.clone() for n, p in model.named_parameters()}
    fixture.update(logits=logits.detach(), loss=loss.detach(), aux_loss=aux.detach(),
                   z_loss=z.detach())
    if counts:
        fixture["counts"] = torch.stack(counts)
    if model.model.router:
        fixture["router_metrics"] = torch.stack(model.model.router)  # [L, 4]
    if model.model.keeps:
        keep = torch.stack(model.model.keeps)
        assert not keep.all(), f"{name}: no expert overflowed; the capacity case tests nothing"
        fixture["keep"] = keep

    if mode == "train" and model.model.router:
        fixture["router_grad"] = router_grad_by_source(model, micro)
    if mode == "train":
        opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.999), eps=1e-8,
                                weight_decay=0.01)
        moe = [l.mlp for l in model.model.layers if hasattr(l.mlp, "update_bias")]
        for m in moe:  # quantile balancing: the forwards above are not a step's
            m.qb_rows = []
        losses = []
        torch.manual_seed(SEED_FORWARD)
        for _ in range(STEPS):
            opt.zero_grad(set_to_none=True)
            step, total, step_counts = {"counts": None, "tokens": 0.0}, 0.0, None
            for m_ids, m_labels in micro:  # loss / A per micro-batch, as MiniMind accumulates
                _, loss, aux, z, counts = model(m_ids, m_labels, step)
                ((loss + aux + z) / len(micro)).backward()
                total += (loss + aux + z).item() / len(micro)
                c = torch.stack(counts) if counts else None
                step_counts = c if step_counts is None else step_counts + c
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
            opt.step()
            for layer, m in enumerate(moe):
                m.update_bias(step_counts[layer])
            losses.append(total)
        fixture["step_losses"] = torch.tensor(losses, dtype=torch.float64)
        fixture["weights_after"] = {n: p.detach().clone() for n, p in model.named_parameters()}
        biases = [m.gate.e_score_correction_bias.clone() for m in moe
                  if hasattr(m, "gate") and hasattr(m.gate, "e_score_correction_bias")]
        if biases:
            fixture["bias_after"] = torch.stack(biases)
    torch.save(fixture, os.path.join(out_dir, f"{name}.pt"))


# bf16 mixed precision against torch.autocast: these fp32 cases again, their weights and
# batch, the forward and backward under autocast("cpu", bfloat16).
BF16_CASES = ["dense_train", "moe_top1_norm_train", "moe_top2_norm_train", "lab_minimind2"]


IN_ROUTER = [False]


def fp32_route(route):
    """The router outside autocast (and outside Bf16Products): its logits, softmax and top-k
    in fp32, as the C++ bf16 path keeps them (routing must not move with bf16 rounding)."""
    def wrapped(self, x_flat, token_ids):
        IN_ROUTER[0] = True
        try:
            with torch.autocast("cpu", enabled=False):
                return route(self, x_flat.float(), token_ids)
        finally:
            IN_ROUTER[0] = False
    return wrapped


class RoundInput(torch.autograd.Function):
    """Forward: x rounded to bf16 (kept as fp32 values). Backward: the gradient as it is."""
    @staticmethod
    def forward(ctx, x):
        return x.bfloat16().float()

    @staticmethod
    def backward(ctx, g):
        return g


class RoundGradient(torch.autograd.Function):
    """Forward: x as it is. Backward: the incoming gradient rounded to bf16."""
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g.bfloat16().float()


class Bf16Products(TorchFunctionMode):
    """The C++ tool's bf16 scheme written out in fp32: every product (linear, matmul) takes
    bf16-rounded inputs and accumulates in fp32 (a product of two bf16 values is exact in
    fp32), its backward rounds the incoming gradient before its two products; everything
    else, the router included, stays fp32."""
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if IN_ROUTER[0] or getattr(func, "__name__", "") not in ("linear", "matmul", "__matmul__"):
            return func(*args, **kwargs)
        a, b = RoundInput.apply(args[0]), RoundInput.apply(args[1])
        return RoundGradient.apply(func(a, b, *args[2:], **kwargs))


def bf16_case(name, out_dir):
    """bf16_<name>.pt: logits, losses, counts and gradients in fp32, in the C++ tool's bf16
    scheme ("scheme", Bf16Products) and under torch.autocast ("bf16")."""
    keys, _, _ = CASES[name]
    cfg = MiniMindConfig(**keys)
    fixture = {}
    for tag in ("fp32", "scheme", "bf16"):
        model = MiniMindForCausalLM(cfg)
        model.load_state_dict(torch.load(os.path.join(out_dir, f"{name}.weights.pth")))
        model.train()
        ref = torch.load(os.path.join(out_dir, f"{name}.pt"))
        ids, labels = ref["input_ids"], ref["labels"]
        torch.manual_seed(SEED_FORWARD)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=tag == "bf16"), \
                (Bf16Products() if tag == "scheme" else contextlib.nullcontext()):
            logits, loss, aux, z, counts = model(ids, labels)
        (loss + aux + z).backward()
        fixture[tag] = {"logits": logits.detach().float(), "loss": loss.detach().float(),
                        "aux_loss": aux.detach().float(), "z_loss": z.detach().float(),
                        "grads": {n: p.grad.float() for n, p in model.named_parameters()}}
        if counts:
            fixture[tag]["counts"] = torch.stack(counts)
    torch.save(fixture, os.path.join(out_dir, f"bf16_{name}.pt"))


def routing_analysis_fixture(out_dir):
    """routing_analysis.pt: random choices (k = 1 and k = 2) with the reference metrics,
    and checkpoints' choices with their saturation and flip rates."""
    fx = {}
    for k in (1, 2):
        vocab, experts, layers, n_domains = 24, 4, 3, 2
        seqs, domains = routing_analysis_ref.make_case(10 + k, vocab, experts, k, layers, n_domains)
        fx[f"k{k}_ids"] = [s[0] for s in seqs]
        fx[f"k{k}_choices"] = [s[1] for s in seqs]
        fx[f"k{k}_domains"] = torch.tensor(domains)
        fx[f"k{k}_ref"] = routing_analysis_ref.analysis(seqs, domains, n_domains, vocab, experts, k)
    g = torch.Generator().manual_seed(5)
    topk = torch.rand(4, 3, 200, 4, generator=g).topk(2, dim=3).indices  # [C, L, T, k]
    topk[-1] = topk[-2]  # the last two checkpoints agree: flip 0 there
    fx["sat_topk"] = topk
    fx["sat_ref"], fx["flip_ref"] = routing_analysis_ref.saturation(topk)
    torch.save(fx, os.path.join(out_dir, "routing_analysis.pt"))


def main():
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    torch.set_num_threads(1)  # with one thread C++ and Python results are reproducible
    for name, (keys, mode, special) in CASES.items():
        run_case(name, keys, mode, special, out_dir)
    from minimind_ref import MOEFeedForward  # noqa: E402
    MOEFeedForward.route = fp32_route(MOEFeedForward.route)
    for name in BF16_CASES:
        bf16_case(name, out_dir)
    routing_analysis_fixture(out_dir)
    with open(os.path.join(out_dir, "cases.txt"), "w") as f:
        f.write("\n".join(CASES) + "\n")
    print(f"wrote {len(CASES)} parity fixtures to {out_dir}")


if __name__ == "__main__":
    main()
