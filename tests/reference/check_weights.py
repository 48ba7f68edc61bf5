#!/usr/bin/python3
"""Round trip: loads a weights file written by the C++ code into the reference model with
load_state_dict(strict=True) and checks the loss it gives on the stored batch.

Usage: /usr/bin/python3 check_weights.py CASE.pt WEIGHTS.pth EXPECTED_LOSS
Exit code 0 when |loss - EXPECTED_LOSS| <= 1e-5.
"""
import os
import sys

import torch
import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from minimind_ref import MiniMindConfig, MiniMindForCausalLM  # noqa: E402


def main():
    case_path, weights_path, expected = sys.argv[1], sys.argv[2], float(sys.argv[3])
    torch.set_num_threads(1)
    case = torch.load(case_path)
    cfg = MiniMindConfig(**yaml.safe_load(case["config_yaml"])["model"])
    model = MiniMindForCausalLM(cfg)
    state = torch.load(weights_path)
    model.load_state_dict(state, strict=True)  # raises on any missing/unexpected name
    model.eval()
    with torch.no_grad():
        _, loss, _, _, _ = model(case["input_ids"], case["labels"])
    diff = abs(loss.item() - expected)
    print(f"python loss {loss.item():.8f}, C++ loss {expected:.8f}, |diff| {diff:.2e}")
    sys.exit(0 if diff <= 1e-5 else 1)


if __name__ == "__main__":
    main()
