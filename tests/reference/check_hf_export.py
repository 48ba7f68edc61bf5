"""Reads a Hugging Face directory written by minimind-export without its code: parses
model.safetensors with the standard library and numpy (header, dtypes, offsets), builds
the PyTorch reference model from config.json, loads the tensors by name (strict), and
compares its logits with ours.

Usage: check_hf_export.py DIR OURS.pt   (OURS.pt: [ids [1, T], logits [1, T, V]], torch.load)
Exit 1 on any problem. Run with /usr/bin/python3 (Debian's torch).
"""
import json
import os
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from minimind_ref import MiniMindConfig, MiniMindForCausalLM  # noqa: E402

TOL = 1e-5
SIZES = {"F32": 4, "F16": 2, "BF16": 2}


def read_safetensors(path):
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    header.pop("__metadata__", None)
    tensors, end_of_last = {}, 0
    for name, info in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        dtype, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
        if dtype not in SIZES:
            sys.exit(f"{name}: dtype {dtype}")
        count = int(np.prod(shape)) if shape else 1
        if end - begin != count * SIZES[dtype]:
            sys.exit(f"{name}: {end - begin} bytes for shape {shape} of {dtype}")
        if begin != end_of_last:
            sys.exit(f"{name}: starts at {begin}, the previous tensor ended at {end_of_last}")
        end_of_last = end
        raw = body[begin:end]
        if dtype == "F32":
            a = np.frombuffer(raw, dtype="<f4")
        elif dtype == "F16":
            a = np.frombuffer(raw, dtype="<f2").astype(np.float32)
        else:  # bfloat16: the high half of a float32
            a = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        tensors[name] = torch.from_numpy(a.reshape(shape).copy())
    if end_of_last != len(body):
        sys.exit(f"{len(body) - end_of_last} bytes after the last tensor")
    return tensors


def main():
    out, ours_path = sys.argv[1], sys.argv[2]
    cfg = json.load(open(os.path.join(out, "config.json")))
    keys = dict(hidden_size=cfg["hidden_size"], num_hidden_layers=cfg["num_hidden_layers"],
                num_attention_heads=cfg["num_attention_heads"],
                num_key_value_heads=cfg["num_key_value_heads"], vocab_size=cfg["vocab_size"],
                max_position_embeddings=cfg["max_position_embeddings"],
                rope_theta=cfg["rope_theta"], rms_norm_eps=cfg["rms_norm_eps"],
                intermediate_size=cfg["intermediate_size"],
                tie_word_embeddings=cfg["tie_word_embeddings"])
    if cfg["head_dim"] != cfg["hidden_size"] // cfg["num_attention_heads"]:
        sys.exit("head_dim is not hidden_size / num_attention_heads")
    if cfg["model_type"] == "qwen3_moe":
        keys.update(use_moe=True, num_experts=cfg["num_experts"],
                    num_experts_per_tok=cfg["num_experts_per_tok"],
                    moe_intermediate_size=cfg["moe_intermediate_size"],
                    norm_topk_prob=cfg["norm_topk_prob"])
    model = MiniMindForCausalLM(MiniMindConfig(**keys))
    state = read_safetensors(os.path.join(out, "model.safetensors"))
    if cfg["tie_word_embeddings"]:
        if "lm_head.weight" in state:
            sys.exit("lm_head.weight is written although the embeddings are tied")
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    model.load_state_dict(state, strict=True)
    model.eval()
    ids, logits = torch.load(ours_path)
    with torch.no_grad():
        ref = model(ids)[0]
    diff = (ref - logits).abs().max().item()
    print(f"{out}: {len(state)} tensors, logits over {ids.shape[1]} positions within {diff:.3g}")
    sys.exit(0 if diff <= TOL else 1)


main()
