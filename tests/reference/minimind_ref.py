"""Reference MiniMind-3 in PyTorch, written from the facts in docs/minimind-spec.md.

It follows MiniMind's own code path (masked per-expert loop, repeat_kv, explicit
attention), so the C++ implementation is checked against the straightforward form.
Run with /usr/bin/python3 (Debian's torch 1.13, the same libtorch_cpu as the C++ build).
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class MiniMindConfig:
    """MiniMind's config fields and defaults (model section of our YAML)."""

    DEFAULTS = dict(
        hidden_size=768, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4,
        vocab_size=6400, max_position_embeddings=32768, rope_theta=1e6, rms_norm_eps=1e-6,
        hidden_act="silu", intermediate_size=None, dropout=0.0, tie_word_embeddings=True,
        use_moe=False, num_experts=4, num_experts_per_tok=1, moe_intermediate_size=None,
        norm_topk_prob=True, router_aux_loss_coef=5e-4,
        # the balancing lab (docs/moe-routing.md, "Balancing methods, exactly")
        aux_loss_scope="batch", router_z_loss_coef=0.0, scoring_func="softmax",
        router_bias_update_rate=0.0, capacity_factor=0.0, capacity_drop_policy="probs",
        n_shared_experts=0, shared_expert_intermediate_size=None, router="learned",
        routed_scaling_factor=1.0, router_importance_loss_coef=0.0,
        router_bias_rule="sign", qb_estimator="histogram", qb_num_bins=1000, qb_ema=0.0,
        hash_layers=0, hash_table="round_robin",
    )

    def __init__(self, **kw):
        unknown = set(kw) - set(self.DEFAULTS)
        if unknown:
            raise ValueError(f"unknown model keys: {sorted(unknown)}")
        for k, v in {**self.DEFAULTS, **kw}.items():
            setattr(self, k, v)
        if self.intermediate_size is None:
            self.intermediate_size = math.ceil(self.hidden_size * math.pi / 64) * 64
        if self.moe_intermediate_size is None:
            self.moe_intermediate_size = self.intermediate_size
        if self.shared_expert_intermediate_size is None:
            self.shared_expert_intermediate_size = self.moe_intermediate_size
        self.head_dim = self.hidden_size // self.num_attention_heads


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        return (self.weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps))).type_as(x)


def precompute_rope(dim, end, theta):
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: dim // 2].float() / dim))
    t = torch.arange(end)
    freqs = torch.outer(t, freqs).float()
    cos = torch.cat([torch.cos(freqs), torch.cos(freqs)], dim=-1)
    sin = torch.cat([torch.sin(freqs), torch.sin(freqs)], dim=-1)
    return cos, sin


def rotate_half(x):
    return torch.cat((-x[..., x.shape[-1] // 2:], x[..., : x.shape[-1] // 2]), dim=-1)


def apply_rope(q, k, cos, sin):
    # q, k: [B, T, heads, d]; cos, sin: [T, d]
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def repeat_kv(x, n_rep):
    # [B, S, kv, d] -> [B, S, kv * n_rep, d]; query head j uses kv head j // n_rep
    if n_rep == 1:
        return x
    b, s, kv, d = x.shape
    return x[:, :, :, None, :].expand(b, s, kv, n_rep, d).reshape(b, s, kv * n_rep, d)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.q_proj = nn.Linear(c.hidden_size, self.n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, self.n_kv * self.head_dim, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, self.n_kv * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, c.hidden_size, bias=False)
        self.attn_dropout = nn.Dropout(c.dropout)
        self.resid_dropout = nn.Dropout(c.dropout)
        self.q_norm = RMSNorm(self.head_dim, c.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, c.rms_norm_eps)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.n_heads, self.head_dim)
        k = self.k_proj(x).view(b, t, self.n_kv, self.head_dim)
        v = self.v_proj(x).view(b, t, self.n_kv, self.head_dim)
        q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, k, cos[:t], sin[:t])
        rep = self.n_heads // self.n_kv
        q, k, v = q.transpose(1, 2), repeat_kv(k, rep).transpose(1, 2), repeat_kv(v, rep).transpose(1, 2)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        scores[:, :, :, -t:] += torch.triu(torch.full((t, t), float("-inf")), diagonal=1)
        scores = F.softmax(scores.float(), dim=-1).type_as(q)
        out = self.attn_dropout(scores) @ v
        out = out.transpose(1, 2).reshape(b, t, -1)
        return self.resid_dropout(self.o_proj(out))


class FeedForward(nn.Module):
    def __init__(self, c, intermediate_size=None):
        super().__init__()
        inter = intermediate_size or c.intermediate_size
        self.gate_proj = nn.Linear(c.hidden_size, inter, bias=False)
        self.down_proj = nn.Linear(inter, c.hidden_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, inter, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MOEFeedForward(nn.Module):
    """MiniMind's masked per-expert loop, kept as it is (the C++ uses a sorted dispatch),
    with each balancing method of the lab written out the plain way: capacity by a loop
    over each expert's assignments, sequence aux by per-row bincounts."""

    def __init__(self, c, layer=0):
        super().__init__()
        self.c = c
        # A hash-routed layer (DeepSeek-V4): a fixed table chooses, the gate only weighs.
        self.hash = c.router == "learned" and layer < c.hash_layers
        self.quantile = c.router_bias_rule == "quantile"
        if c.router == "learned":
            self.gate = nn.Linear(c.hidden_size, c.num_experts, bias=False)
            if self.hash:
                v, e, k = c.vocab_size, c.num_experts, c.num_experts_per_tok
                if c.hash_table == "random":  # torchtitan: the k largest of a uniform draw
                    table = torch.topk(torch.rand(v, e), k, dim=-1).indices
                else:  # Megatron: token t to experts t, t+1, ..., t+k-1 (mod E)
                    table = torch.tensor([[(t + j) % e for j in range(k)] for t in range(v)])
                self.gate.register_buffer("tid2eid", table)
            elif c.router_bias_update_rate > 0 or self.quantile:  # HF DeepSeek-V3's name
                self.gate.register_buffer("e_score_correction_bias", torch.zeros(c.num_experts))
        self.required = None  # quantile balancing: this forward's cutoff - score [N, E]
        self.qb_rows = []     # ... of the real tokens of the step's forwards
        self.experts = nn.ModuleList([FeedForward(c, c.moe_intermediate_size) for _ in range(c.num_experts)])
        if c.n_shared_experts > 0:  # MiniMind2-MoE's name
            self.shared_experts = nn.ModuleList(
                [FeedForward(c, c.shared_expert_intermediate_size) for _ in range(c.n_shared_experts)])
        self.aux_loss = self.z_loss = None
        self.topk_idx = self.keep = None
        self.global_parts = None  # (counts of all tokens [E], mean probs [E]) for the global scope

    def route(self, x_flat, token_ids):
        c, n, e, k = self.c, x_flat.shape[0], self.c.num_experts, self.c.num_experts_per_tok
        if c.router == "random":
            idx = torch.topk(torch.rand(n, e), k, dim=-1).indices
            return torch.full((n, k), 1.0 / k), idx, None, None
        if c.router == "hash":
            return torch.ones(n, 1), (token_ids % e).unsqueeze(1), None, None
        logits = self.gate(x_flat)
        if c.scoring_func in ("sigmoid", "sqrtsoftplus"):  # independent scores, DeepSeek-V3 / V4
            scores = torch.sigmoid(logits) if c.scoring_func == "sigmoid" else torch.sqrt(F.softplus(logits))
            probs = scores / scores.sum(dim=-1, keepdim=True)
        else:
            scores = probs = F.softmax(logits, dim=-1)
        self.required = None
        if self.hash:
            idx = self.gate.tid2eid[token_ids]
            weight = scores.gather(1, idx)
        elif self.quantile and self.training:
            # The (k+1)-th largest of score + bias is the token's cutoff; the first k choose.
            top = torch.topk(scores.detach() + self.gate.e_score_correction_bias, k + 1, dim=-1)
            idx = top.indices[:, :k]
            self.required = top.values[:, k:] - scores.detach()
            weight = scores.gather(1, idx)
        elif c.router_bias_update_rate > 0 or self.quantile:
            bias = self.gate.e_score_correction_bias
            idx = torch.topk(scores.detach() + bias, k, dim=-1, sorted=False).indices
            weight = scores.gather(1, idx)
        else:
            weight, idx = torch.topk(scores, k=k, dim=-1, sorted=False)
        if c.norm_topk_prob:
            weight = weight / (weight.sum(dim=-1, keepdim=True) + 1e-20)
        return weight * c.routed_scaling_factor, idx, probs, logits

    def quantile_bias(self, rows):
        c = self.c
        return quantile_bias_of(rows, self.gate.e_score_correction_bias, c.num_experts_per_tok,
                                c.qb_estimator, c.qb_num_bins, c.qb_ema)

    def capacity(self, weight, idx):
        """keep[n, j]: False for the (token, slot) assignments over an expert's capacity."""
        c, (n, k), e = self.c, idx.shape, self.c.num_experts
        keep = torch.ones(n, k, dtype=torch.bool)
        cap = math.ceil(c.capacity_factor * (k * n) / e)
        for i in range(e):
            slots = [(t, j) for t in range(n) for j in range(k) if idx[t, j] == i]
            if c.capacity_drop_policy == "probs":  # highest weight first; ties keep token order
                slots.sort(key=lambda s: -weight[s[0], s[1]].item())
            for t, j in slots[cap:]:
                keep[t, j] = False
        return keep

    def forward(self, x, token_ids):
        c, (b, t, h) = self.c, x.shape
        e = c.num_experts
        x_flat = x.view(-1, h)
        topk_weight, topk_idx, probs, logits = self.route(x_flat, token_ids)
        keep = self.capacity(topk_weight, topk_idx) if c.capacity_factor > 0 else None
        y = torch.zeros_like(x_flat)
        for i, expert in enumerate(self.experts):
            mask = topk_idx == i
            if keep is not None:
                mask = mask & keep
            if mask.any():
                token_idx = mask.any(dim=-1).nonzero().flatten()
                weight = topk_weight[mask].view(-1, 1)
                y.index_add_(0, token_idx, (expert(x_flat[token_idx]) * weight).to(y.dtype))
            elif self.training:
                y[0, 0] += 0 * sum(p.sum() for p in expert.parameters())
        for shared in getattr(self, "shared_experts", []):
            y = y + shared(x_flat)

        learned = probs is not None
        self.aux_loss = self.z_loss = x.new_zeros(())
        self.global_parts = None
        balance = self.training and learned and not self.hash  # no loss can move a table
        if balance and c.router_aux_loss_coef > 0:
            if c.aux_loss_scope == "sequence":
                k = c.num_experts_per_tok
                rows = topk_idx.view(b, t * k)
                ce = torch.stack([torch.bincount(rows[r], minlength=e).float() for r in range(b)])
                ce = ce / ((t * k) / e)
                p_seq = probs.view(b, t, e).mean(dim=1)
                self.aux_loss = (ce * p_seq).sum(dim=1).mean() * c.router_aux_loss_coef
            elif c.aux_loss_scope == "global":
                counts = torch.bincount(topk_idx.flatten(), minlength=e).double()
                self.global_parts = (counts, probs.mean(0))
            else:
                load = F.one_hot(topk_idx, e).float().mean(0)
                self.aux_loss = (load * probs.mean(0)).sum() * e * c.router_aux_loss_coef
        if balance and c.router_importance_loss_coef > 0:
            # Shazeer et al. 2017: CV² (population variance, tensor2tensor's CVSquared) of
            # each expert's summed gate values, 0 where a token did not choose it.
            imp = torch.stack([(topk_weight * (topk_idx == i)).sum() for i in range(e)])
            n = e + 1e-10
            mean = imp.sum() / n
            cv2 = ((imp - mean) ** 2).sum() / n / (mean ** 2 + 1e-10)
            self.aux_loss = self.aux_loss + c.router_importance_loss_coef * cv2
        if self.training and learned and c.router_z_loss_coef > 0:
            self.z_loss = c.router_z_loss_coef * torch.logsumexp(logits, dim=-1).pow(2).mean()
        self.topk_idx, self.keep = topk_idx, keep  # load counts are taken in MiniMindModel.forward
        self.probs = probs  # the router metrics read them (None without a learned router)
        return y.view(b, t, h)

    def update_bias(self, step_counts):
        """Aux-loss-free balancing (DeepSeek-V3): b_e += u * sign(mean(c) - c_e); or quantile
        balancing from the step's rows (qb_rows)."""
        if self.quantile and not self.hash:
            rows, self.qb_rows = torch.cat(self.qb_rows), []
            with torch.no_grad():
                self.gate.e_score_correction_bias.copy_(self.quantile_bias(rows))
        elif self.c.router_bias_update_rate > 0:
            with torch.no_grad():
                cnt = step_counts.float()
                self.gate.e_score_correction_bias += torch.sign(cnt.mean() - cnt) * self.c.router_bias_update_rate


def quantile_bias_of(rows, bias, k, estimator, bins, ema):
    """Quantile balancing from its definition, not from the C++ code's index arithmetic: per
    expert, the smallest bias that admits its balanced share q = N*k/E of the step's N rows
    r = cutoff - score (a token takes the expert when its r is at most the bias).

    exact: the smallest value v of the column with #(r <= v) >= q.
    histogram: the same question asked of torchtitan's binned counts (bins of equal width
    over [min b - 1, max b + 1], a value outside in the end bin), whose empirical CDF is drawn
    through the bin edges, straight between them: the first x (in bins from the lower edge)
    where that CDF reaches q. Then the EMA of Megatron #5349 and mean-centring."""
    n, e = rows.shape
    q = n * k / e
    new = []
    if estimator == "exact":
        for j in range(e):
            col = rows[:, j].tolist()
            new.append(min(v for v in col if sum(u <= v for u in col) >= q))
        new = torch.tensor(new, dtype=torch.float64)
        new = new - new.mean()
    else:
        lower, width = bias.min() - 1, (bias.max() - bias.min() + 2) / bins  # float32
        which = torch.floor((rows - lower) / width).clamp(0, bins - 1).long()  # torchtitan's bins
        for j in range(e):
            members = which[:, j].tolist()
            # cdf[i]: how many rows lie below edge i (in bins 0 .. i-1)
            cdf = [sum(m < i for m in members) for i in range(bins + 1)]
            x = next(i + (q - cdf[i]) / (cdf[i + 1] - cdf[i])
                     for i in range(bins) if cdf[i + 1] >= q and cdf[i + 1] > cdf[i])
            new.append(x)
        new = torch.tensor(new, dtype=torch.float64)
        new = (new - new.mean()) * width.item()
    if ema > 0:
        new = ema * bias.double() + (1 - ema) * new
    return (new - new.mean()).float()


def _check_quantile_vectors():
    """torchtitan's test_quantile_balance.py vectors (E = 4, 10 bins, bias 0, four equal
    tokens of one score row): k = 1 gives [-0.5, -0.1, 0.1, 0.5] and k = 2 (its newer case)
    [-0.55, -0.15, 0.25, 0.45]; the exact estimator on the same rows; Megatron #6637's
    recovery needs bounds of its own and is checked in C++ (test_balancing.cpp)."""
    scores = torch.tensor([[0.92, 0.68, 0.31, 0.07]] * 4)
    bias = torch.zeros(4)
    for k, want in ((1, [-0.5, -0.1, 0.1, 0.5]), (2, [-0.55, -0.15, 0.25, 0.45])):
        cutoff = torch.topk(scores + bias, k + 1, dim=-1).values[:, k:]
        rows = cutoff - scores
        got = quantile_bias_of(rows, bias, k, "histogram", 10, 0.0)
        assert torch.allclose(got.double(), torch.tensor(want, dtype=torch.float64), atol=1e-6), (k, got)
        # Four equal tokens: the exact share is the row itself, centred.
        exact = quantile_bias_of(rows, bias, k, "exact", 10, 0.0)
        assert torch.allclose(exact.double(), (rows[0] - rows[0].mean()).double(), atol=1e-6), (k, exact)


_check_quantile_vectors()


def router_metrics(p, idx):
    """docs/moe-routing.md, "Is the router learning?": token entropy, marginal entropy,
    routing information MI and confidence of probabilities p [T, E] with choices idx [T, k]."""
    p = p.detach().double()
    ln_e = math.log(p.shape[1])
    h_tok = -torch.xlogy(p, p).sum(1).mean() / ln_e
    pm = p.mean(0)
    h_m = -torch.xlogy(pm, pm).sum() / ln_e
    conf = p.gather(1, idx).sum(1).mean()
    return torch.stack([h_tok, h_m, h_m - h_tok, conf])


class MiniMindBlock(nn.Module):
    def __init__(self, c, layer=0):
        super().__init__()
        self.self_attn = Attention(c)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = MOEFeedForward(c, layer) if c.use_moe else FeedForward(c)

    def forward(self, x, cos, sin, token_ids):
        h = x + self.self_attn(self.input_layernorm(x), cos, sin)
        normed = self.post_attention_layernorm(h)
        return h + (self.mlp(normed, token_ids) if isinstance(self.mlp, MOEFeedForward) else self.mlp(normed))


class MiniMindModel(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.dropout = nn.Dropout(c.dropout)
        self.layers = nn.ModuleList([MiniMindBlock(c, i) for i in range(c.num_hidden_layers)])
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        cos, sin = precompute_rope(c.head_dim, c.max_position_embeddings, c.rope_theta)
        self.register_buffer("freqs_cos", cos, persistent=False)
        self.register_buffer("freqs_sin", sin, persistent=False)

    def forward(self, input_ids, step=None):
        """step: {"counts": [L, E] float64 or None, "tokens": float}, the optimizer step's
        running counts for the global aux scope (None: a step of this micro-batch alone)."""
        h = self.dropout(self.embed_tokens(input_ids))
        token_ids = input_ids.flatten()
        for layer in self.layers:
            h = layer(h, self.freqs_cos, self.freqs_sin, token_ids)
        moe = [l.mlp for l in self.layers if isinstance(l.mlp, MOEFeedForward)]
        layer_aux = [m.aux_loss for m in moe]
        parts = [m.global_parts for m in moe if m.global_parts is not None]
        if parts:
            step = step if step is not None else {"counts": None, "tokens": 0.0}
            counts = torch.stack([p[0] for p in parts])
            step["counts"] = counts if step["counts"] is None else step["counts"] + counts
            step["tokens"] += float(input_ids.numel())
            f = (step["counts"] / step["tokens"]).float()
            e, coef = moe[0].c.num_experts, moe[0].c.router_aux_loss_coef
            layer_aux = [(f[l] * parts[l][1]).sum() * e * coef for l in range(len(parts))]
        aux = sum(layer_aux, h.new_zeros(1).squeeze())
        z = sum([m.z_loss for m in moe], h.new_zeros(1).squeeze())
        # Expert load over the real tokens: padding (id 0) is routed but not counted.
        real = (input_ids != 0).flatten()
        for m in moe:
            if m.required is not None:
                m.qb_rows.append(m.required[real])
        counts = [torch.bincount(m.topk_idx[real].flatten(), minlength=len(m.experts)) for m in moe]
        self.keeps = [m.keep for m in moe if m.keep is not None]
        self.router = [router_metrics(m.probs[real], m.topk_idx[real]) for m in moe
                       if m.probs is not None]
        return self.norm(h), aux, z, counts


class MiniMindForCausalLM(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.config = c
        self.model = MiniMindModel(c)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        if c.tie_word_embeddings:
            self.model.embed_tokens.weight = self.lm_head.weight
        self.apply(self._init)

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)

    def forward(self, input_ids, labels=None, step=None):
        h, aux, z, counts = self.model(input_ids, step)
        logits = self.lm_head(h)
        loss = None
        if labels is not None:
            v = logits.size(-1)
            loss = F.cross_entropy(logits[..., :-1, :].contiguous().view(-1, v),
                                   labels[..., 1:].contiguous().view(-1), ignore_index=-100)
        return logits, loss, aux, z, counts
