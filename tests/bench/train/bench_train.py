#!/usr/bin/python3
"""Training benchmark (not a test): hp's training step against PyTorch's on the same GPT, same run.

Model: a GPT-2-style decoder (tests/train/models.py's Gpt2: nn.MultiheadAttention, GELU MLP,
LayerNorm, tied lm head) with hidden 512, 8 heads, 6 layers, vocab 8192, trained on batch 4 x seq 128
with AdamW. For --threads 1 and 2 it prints

    hp's median training step       `hp launch RECIPE --inputs ... --metrics m.jsonl --threads T`,
                                    median of the metrics' `seconds` after the warm-up steps
    PyTorch eager forward           torch.set_num_threads(T), the same model's forward (no_grad)
    PyTorch eager training step     forward + backward + torch.optim.AdamW.step()

and the ratios hp_step / torch_step and hp_step / torch_forward.

ONNX Runtime is not the reference here: onnxruntime-training is not installable on this machine (no
Debian package, PyPI unreachable), and the onnxruntime-node package tests/bench/executor drives runs
inference only. PyTorch eager (Debian's python3-torch 1.13) is the baseline. Its GEMMs go through
the system libblas.so.3 (BLAS_INFO=generic): the netlib reference BLAS unless libopenblas0 is
installed, which makes torch several times slower than a pip wheel with MKL. The script prints which
library that is, so a ratio is read against the right baseline.

    tests/bench/train/bench_train.py [BUILD_DIR] [--steps 8] [--warmup 2] [--threads 1,2]

Env: HP_BENCH_DIR (model cache; default ${XDG_CACHE_HOME:-~/.cache}/hp-bench/train). The exported
model (about 100 MB) is generated there, never committed.
"""
import argparse
import hashlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx import numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "train"))
import models  # noqa: E402
import run_training  # noqa: E402

HIDDEN, HEADS, LAYERS, VOCAB, SEQ, BATCH = 512, 8, 6, 8192, 128, 4
LR, BETAS, WD = 3e-4, (0.9, 0.95), 0.1


def make_model():
    torch.manual_seed(0)
    return models.Gpt2(vocab=VOCAB, hidden=HIDDEN, heads=HEADS, layers=LAYERS, max_seq=SEQ).train()


def spec():
    return models.Spec(make_model, "tokens", "cross_entropy", "input_ids", seq=SEQ)


def prepare(cache):
    """Exports the model and one batch into cache/<key>/ once; returns that directory."""
    src = b"".join(open(os.path.join(ROOT, "tests", "train", f), "rb").read()
                   for f in ("models.py",)) + open(__file__, "rb").read()
    d = os.path.join(cache, "gpt-" + hashlib.sha256(src).hexdigest()[:16])
    if os.path.exists(os.path.join(d, "model.onnx")):
        return d
    print(f"generating the benchmark model into {d} ...", file=sys.stderr)
    tmp = d + ".tmp"
    os.makedirs(os.path.join(tmp, "inputs"), exist_ok=True)
    # Static shapes: the benchmark runs one batch size, and this times the step, not shape handling.
    models.export(spec(), make_model(), os.path.join(tmp, "model.onnx"), BATCH, dynamic=False)
    x, y = batch()
    onnx.save_tensor(numpy_helper.from_array(x.numpy(), "input_ids"),
                     os.path.join(tmp, "inputs", "input_0.pb"))
    onnx.save_tensor(numpy_helper.from_array(y.numpy(), "labels"),
                     os.path.join(tmp, "inputs", "input_1.pb"))
    os.rename(tmp, d)
    return d


def batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g)
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()


def hp_step(hp, d, threads, steps, warmup, work):
    recipe = os.path.join(work, f"bench-{threads}.toml")
    train = {"loss": "cross_entropy", "logits": models.OUTPUT, "labels": "labels",
             "optimizer": "adamw", "lr": LR, "betas": list(BETAS), "eps": 1e-8,
             "weight_decay": WD, "clip_norm": 0.0, "steps": steps, "frozen": []}
    run_training.write_recipe(recipe, os.path.join(d, "model.onnx"), train, {"batch": BATCH})
    metrics = os.path.join(work, f"m-{threads}.jsonl")
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    p = subprocess.run([hp, "launch", recipe, "--inputs", os.path.join(d, "inputs"), "--metrics",
                        metrics, "--threads", str(threads), "--steps", str(steps)] + root,
                       capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"hp launch failed (exit {p.returncode}):\n{p.stdout}{p.stderr}")
    rows = [json.loads(l) for l in open(metrics) if l.strip()]
    return statistics.median(r["seconds"] for r in rows[warmup:]), rows[-1]["loss"]


def torch_times(threads, steps, warmup):
    torch.set_num_threads(threads)
    model = make_model()
    x, y = batch()
    fwd = []
    with torch.no_grad():
        for i in range(steps):
            t = time.perf_counter()
            model(x)
            fwd.append(time.perf_counter() - t)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=1e-8, weight_decay=WD)
    step = []
    for i in range(steps):
        t = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1))
        loss.backward()
        opt.step()
        step.append(time.perf_counter() - t)
    return statistics.median(fwd[warmup:]), statistics.median(step[warmup:]), float(loss)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build", nargs="?", default=os.path.join(ROOT, "build"))
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", default="1,2")
    a = ap.parse_args()
    hp = os.path.join(a.build, "bin", "hp")
    if not os.access(hp, os.X_OK):
        sys.exit(f"bench_train.py: {hp} not built")
    cache = os.environ.get("HP_BENCH_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "hp-bench", "train")
    d = prepare(cache)
    blas = os.path.realpath("/usr/lib/x86_64-linux-gnu/libblas.so.3")
    info = re.search(r"BLAS_INFO=(\w+)", torch.__config__.show())
    print(f"torch {torch.__version__}, BLAS_INFO={info.group(1) if info else '?'}, libblas.so.3 -> "
          f"{blas}")
    print(f"GPT hidden {HIDDEN}, {HEADS} heads, {LAYERS} layers, vocab {VOCAB}, batch {BATCH} x seq "
          f"{SEQ}, AdamW; medians of {a.steps - a.warmup} steps after {a.warmup} warm-up")
    print(f"{'threads':>7} {'hp_step_s':>10} {'torch_fwd_s':>12} {'torch_step_s':>13} "
          f"{'hp/torch_step':>14} {'hp/torch_fwd':>13} {'hp_loss':>8} {'torch_loss':>10}")
    with tempfile.TemporaryDirectory() as work:
        for t in (int(s) for s in a.threads.split(",")):
            hp_s, hp_loss = hp_step(hp, d, t, a.steps, a.warmup, work)
            fwd_s, step_s, loss = torch_times(t, a.steps, a.warmup)
            print(f"{t:>7} {hp_s:>10.4f} {fwd_s:>12.4f} {step_s:>13.4f} {hp_s / step_s:>14.2f} "
                  f"{hp_s / fwd_s:>13.2f} {hp_loss:>8.4f} {loss:>10.4f}", flush=True)


if __name__ == "__main__":
    main()
