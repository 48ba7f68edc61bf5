"""Decodes a run's TensorBoard event files with classes protoc builds from
tests/reference/tensorboard/event.proto (Debian's protobuf-compiler and python3-protobuf),
checks the TFRecord framing (CRC-32C computed here), and compares every value with the
run's metrics.jsonl and expert_load.jsonl.

Usage: check_tfevents.py RUN_DIR [RESUMED_AT]   Exit 1 on any difference.
"""
import glob
import importlib
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

RUN = sys.argv[1]
RESUMED_AT = int(sys.argv[2]) if len(sys.argv) > 2 else None
HERE = os.path.dirname(os.path.abspath(__file__))
out = tempfile.mkdtemp()
subprocess.run(["protoc", f"--proto_path={HERE}/tensorboard", f"--python_out={out}",
                "event.proto"], check=True)
sys.path.insert(0, out)
pb = importlib.import_module("event_pb2")

errors = []


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def records(path):
    data = open(path, "rb").read()
    at = 0
    while at < len(data):
        head = data[at:at + 8]
        (n,) = struct.unpack("<Q", head)
        (crc_len,) = struct.unpack("<I", data[at + 8:at + 12])
        body = data[at + 12:at + 12 + n]
        (crc_body,) = struct.unpack("<I", data[at + 12 + n:at + 16 + n])
        if crc_len != masked(head):
            errors.append(f"{path}@{at}: length CRC")
        if crc_body != masked(body):
            errors.append(f"{path}@{at}: data CRC")
        at += 16 + n
        event = pb.Event()
        event.ParseFromString(body)
        yield event


files = sorted(glob.glob(os.path.join(RUN, "tensorboard", "*tfevents*")))
events = []  # (file index, event)
for i, f in enumerate(files):
    evs = list(records(f))
    if not evs or evs[0].WhichOneof("what") != "file_version" or evs[0].file_version != "brain.Event:2":
        errors.append(f"{f}: the first event is not file_version brain.Event:2")
    events += [(i, e) for e in evs[1:]]
files_by_time = sorted(range(len(files)), key=lambda i: list(records(files[i]))[0].wall_time)
if RESUMED_AT is not None:
    if len(files) != 2:
        errors.append(f"{len(files)} event files, expected 2 (one per start)")
    else:
        second = [e for i, e in events if i == files_by_time[1]]
        if not second or second[0].WhichOneof("what") != "session_log" or \
                second[0].session_log.status != pb.SessionLog.START or second[0].step != RESUMED_AT:
            errors.append(f"the resumed file does not start with SessionLog START at {RESUMED_AT}")

# What TensorBoard shows: later files win for the steps a resume trained again.
values = {}  # (tag, step) -> value, or the histogram
for i in files_by_time:
    for fi, e in events:
        if fi != i or e.WhichOneof("what") != "summary":
            continue
        for v in e.summary.value:
            values[(v.tag, e.step)] = v.histo if v.WhichOneof("value") == "histo" else v.simple_value


def close(a, b, what):
    if not math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-6):  # the events hold float32
        errors.append(f"{what}: event {a} against log {b}")


metrics = [json.loads(l) for l in open(os.path.join(RUN, "metrics.jsonl"))]
loads = [json.loads(l) for l in open(os.path.join(RUN, "expert_load.jsonl"))]
train = [m for m in metrics if m["split"] == "train"]
checked = 0
previous = 0
for m in train:
    s = m["step"]
    for tag, key in [("train/loss", "loss"), ("train/lm_loss", "lm_loss"),
                     ("train/aux_loss", "aux_loss"), ("train/lr", "lr"),
                     ("train/grad_norm", "grad_norm"), ("train/tokens_per_s", "tok_per_s")]:
        if (tag, s) not in values:
            errors.append(f"{tag} missing at step {s}")
        else:
            close(values[(tag, s)], m[key], f"{tag} step {s}")
            checked += 1
    # Per layer: the expert load summed over the interval's steps.
    layers = sorted({r["layer"] for r in loads if r["split"] == "train"})
    for l in layers:
        counts = None
        for r in loads:
            if r["split"] == "train" and r["layer"] == l and previous < r["step"] <= s:
                counts = r["counts"] if counts is None else [a + b for a, b in zip(counts, r["counts"])]
        h = values.get((f"layer{l}/expert_load", s))
        if h is None or counts is None:
            errors.append(f"layer{l}/expert_load missing at step {s}")
            continue
        if [int(b) for b in h.bucket] != counts:
            errors.append(f"layer{l} step {s}: histogram {list(h.bucket)} against counts {counts}")
        if list(h.bucket_limit) != [e + 0.5 for e in range(len(counts))] or h.num != sum(counts):
            errors.append(f"layer{l} step {s}: bucket limits or num")
        mean = sum(counts) / len(counts)
        close(values[(f"layer{l}/max_vio", s)], (max(counts) - mean) / mean, f"layer{l} max_vio {s}")
        close(values[(f"layer{l}/max_share", s)], max(counts) / sum(counts), f"layer{l} share {s}")
        close(values[(f"layer{l}/dead_experts", s)], sum(c == 0 for c in counts), f"layer{l} dead {s}")
        checked += 4
        grad = [r for r in loads if r["split"] == "train" and r["layer"] == l and r["step"] == s]
        if grad and grad[0].get("grad_lm") is not None:
            close(values[(f"layer{l}/grad_lm", s)], grad[0]["grad_lm"], f"layer{l} grad_lm {s}")
            checked += 1
    previous = s
for m in [m for m in metrics if m["split"] == "eval"]:
    close(values.get(("eval/loss", m["step"]), float("nan")), m["val_loss"], f"eval loss {m['step']}")
    close(values.get(("eval/perplexity", m["step"]), float("nan")), m["val_ppl"], f"eval ppl {m['step']}")
    checked += 2

for e in errors[:20]:
    print("FAIL: " + e)
print(f"tensorboard: {len(files)} files, {len(events)} events, {checked} values checked, "
      f"{len(errors)} problems")
sys.exit(1 if errors or checked == 0 else 0)
