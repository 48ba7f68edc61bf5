"""Reference computations of docs/moe-routing.md, "What did the experts learn?", written
the plain way with torch on the same choices the C++ test feeds to ProbeCounts: vocabulary
specialisation (per layer and per expert), domain shares, co-activation, layer-to-layer
flow, repeat rate and its chance level, router saturation and flip rate."""
import torch

MIN_OCCURRENCES = 10


def analysis(seqs, domains, n_domains, vocab, experts, k):
    """seqs: list of (ids [T], choices [L, T, k]); domains: the domain of each sequence."""
    L = seqs[0][1].shape[0]
    ids = torch.cat([s[0] for s in seqs])                       # [N]
    ch = torch.cat([s[1] for s in seqs], dim=1)                 # [L, N, k]
    dom = torch.cat([torch.full((len(s[0]),), d) for s, d in zip(seqs, domains)])
    out = {}
    onehot = torch.zeros(L, len(ids), experts, dtype=torch.float64)
    onehot.scatter_(2, ch, 1.0)                                 # [L, N, E]: e in TopK(t)
    n_v = torch.bincount(ids, minlength=vocab)
    spec_layer, spec_expert, counted = [], [], []
    for l in range(L):
        per_v = torch.zeros(vocab, experts, dtype=torch.float64).index_add_(0, ids, onehot[l])
        keep = n_v >= MIN_OCCURRENCES
        c_star, e_star = per_v.max(1)
        spec = c_star / n_v.clamp(min=1)
        spec_layer.append(spec[keep].mean().item())
        counted.append(int(keep.sum()))
        spec_expert.append([spec[keep & (e_star == e)].mean().item() if (keep & (e_star == e)).any()
                            else float("nan") for e in range(experts)])
    out["vocab_specialisation"] = torch.tensor(spec_layer, dtype=torch.float64)
    out["expert_specialisation"] = torch.tensor(spec_expert, dtype=torch.float64)
    out["vocab_counted"] = torch.tensor(counted)
    # Domain shares [L, D, E]
    out["domain_share"] = torch.stack([torch.stack([onehot[l][dom == d].mean(0) for d in range(n_domains)])
                                       for l in range(L)])
    # Co-activation P(b|a) [L, E, E]
    co = torch.einsum("lna,lnb->lab", onehot, onehot)
    out["coactivation"] = co / co.diagonal(dim1=1, dim2=2).clamp(min=1).unsqueeze(2)
    # Flow (top-1): [L-1, E, E]
    if k == 1:
        flows = []
        for l in range(L - 1):
            f = torch.zeros(experts, experts, dtype=torch.float64)
            f.index_put_((ch[l, :, 0], ch[l + 1, :, 0]), torch.ones(len(ids), dtype=torch.float64),
                         accumulate=True)
            flows.append(f / f.sum(1, keepdim=True).clamp(min=1))
        out["flow"] = torch.stack(flows)
    # Repeat rate within sequences, and k * sum q^2
    rep, pairs = torch.zeros(L, dtype=torch.float64), 0
    for s_ids, s_ch in seqs:
        oh = torch.zeros(L, len(s_ids), experts, dtype=torch.float64).scatter_(2, s_ch, 1.0)
        rep += (oh[:, :-1] * oh[:, 1:]).sum((1, 2)) / k
        pairs += len(s_ids) - 1
    out["repeat_rate"] = rep / pairs
    q = onehot.sum(1) / (len(ids) * k)                          # [L, E]
    out["repeat_chance"] = k * (q * q).sum(1)
    return out


def saturation(topk):
    """topk: [C, L, T, k] choices of C checkpoints (last = final). Per checkpoint the mean
    over layers of mean_t |K_c ∩ K_final| / k, and the flip rate against the one before."""
    C, L, T, k = topk.shape
    def agree(a, b):  # [L, T, k] x [L, T, k] -> [L]
        return (a.unsqueeze(3) == b.unsqueeze(2)).sum((1, 2, 3)).double() / (T * k)
    sat = torch.stack([agree(topk[c], topk[-1]).mean() for c in range(C)])
    flip = torch.stack([torch.tensor(0.0, dtype=torch.float64)] +
                       [1 - agree(topk[c], topk[c - 1]).mean() for c in range(1, C)])
    return sat, flip


def make_case(seed, vocab, experts, k, layers, n_domains):
    """Token-dependent but noisy choices, so every metric is away from its extremes."""
    g = torch.Generator().manual_seed(seed)
    seqs, domains = [], []
    for s in range(40):
        T = int(torch.randint(2, 60, (1,), generator=g))
        ids = torch.randint(0, vocab, (T,), generator=g)
        ch = torch.zeros(layers, T, k, dtype=torch.long)
        for l in range(layers):
            scores = torch.rand(T, experts, generator=g)
            scores[torch.arange(T), (ids * (l + 1)) % experts] += 0.4  # a preferred expert per id
            ch[l] = scores.topk(k, dim=1).indices
        seqs.append((ids, ch))
        domains.append(s % n_domains)
    return seqs, domains
