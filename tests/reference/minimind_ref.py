"""Reference MiniMind-3 in PyTorch, written from ../shared/docs/minimind-spec.md.

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
    """MiniMind's masked per-expert loop, kept as it is (the C++ uses a sorted dispatch)."""

    def __init__(self, c):
        super().__init__()
        self.c = c
        self.gate = nn.Linear(c.hidden_size, c.num_experts, bias=False)
        self.experts = nn.ModuleList([FeedForward(c, c.moe_intermediate_size) for _ in range(c.num_experts)])
        self.aux_loss = None
        self.topk_idx = None

    def forward(self, x):
        b, t, h = x.shape
        x_flat = x.view(-1, h)
        scores = F.softmax(self.gate(x_flat), dim=-1)
        topk_weight, topk_idx = torch.topk(scores, k=self.c.num_experts_per_tok, dim=-1, sorted=False)
        if self.c.norm_topk_prob:
            topk_weight = topk_weight / (topk_weight.sum(dim=-1, keepdim=True) + 1e-20)
        y = torch.zeros_like(x_flat)
        for i, expert in enumerate(self.experts):
            mask = topk_idx == i
            if mask.any():
                token_idx = mask.any(dim=-1).nonzero().flatten()
                weight = topk_weight[mask].view(-1, 1)
                y.index_add_(0, token_idx, (expert(x_flat[token_idx]) * weight).to(y.dtype))
            elif self.training:
                y[0, 0] += 0 * sum(p.sum() for p in expert.parameters())
        if self.training and self.c.router_aux_loss_coef > 0:
            load = F.one_hot(topk_idx, self.c.num_experts).float().mean(0)
            self.aux_loss = (load * scores.mean(0)).sum() * self.c.num_experts * self.c.router_aux_loss_coef
        else:
            self.aux_loss = scores.new_zeros(1).squeeze()
        self.topk_idx = topk_idx  # load counts are taken in MiniMindModel.forward
        return y.view(b, t, h)


class MiniMindBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.self_attn = Attention(c)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = MOEFeedForward(c) if c.use_moe else FeedForward(c)

    def forward(self, x, cos, sin):
        h = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return h + self.mlp(self.post_attention_layernorm(h))


class MiniMindModel(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.dropout = nn.Dropout(c.dropout)
        self.layers = nn.ModuleList([MiniMindBlock(c) for _ in range(c.num_hidden_layers)])
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        cos, sin = precompute_rope(c.head_dim, c.max_position_embeddings, c.rope_theta)
        self.register_buffer("freqs_cos", cos, persistent=False)
        self.register_buffer("freqs_sin", sin, persistent=False)

    def forward(self, input_ids):
        h = self.dropout(self.embed_tokens(input_ids))
        for layer in self.layers:
            h = layer(h, self.freqs_cos, self.freqs_sin)
        moe = [l.mlp for l in self.layers if isinstance(l.mlp, MOEFeedForward)]
        aux = sum([m.aux_loss for m in moe], h.new_zeros(1).squeeze())
        # Expert load over the real tokens: padding (id 0) is routed but not counted.
        real = (input_ids != 0).flatten()
        counts = [torch.bincount(m.topk_idx[real].flatten(), minlength=len(m.experts)) for m in moe]
        return self.norm(h), aux, counts


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

    def forward(self, input_ids, labels=None):
        h, aux, counts = self.model(input_ids)
        logits = self.lm_head(h)
        loss = None
        if labels is not None:
            v = logits.size(-1)
            loss = F.cross_entropy(logits[..., :-1, :].contiguous().view(-1, v),
                                   labels[..., 1:].contiguous().view(-1), ignore_index=-100)
        return logits, loss, aux, counts
