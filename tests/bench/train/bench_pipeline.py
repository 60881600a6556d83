#!/usr/bin/python3
"""Pipeline-training bubble benchmark (not a test): the measured bubble of each schedule next to
its formula, evaluated with the measured action times of the same run.

Model: a GPT-2-style decoder (hidden 256, 4 heads, --layers 8, vocab 256, seq 64; a small vocab so
the head does not make the last stage much longer than the others), exported with a dynamic batch
axis and trained with AdamW on one global batch of --batch sequences. Each configuration runs

    hp launch RECIPE --inputs BATCH --trace t.json --threads 1 --steps N     (mpirun, p ranks)

with the layers split evenly over p [[stages]]. From the trace (one row per rank: every F, B, W
action as "compute" and the wait for its input as "wait"), per step after the warm-up:

    span     from the first action's start on any rank to the last action's end on any rank (the
             optimizer step and the loss all-reduce after it are not the schedule's)
    busy     each rank's summed compute, averaged over the ranks
    measured bubble = 1 - busy / span
    formula  1F1B and GPipe: (p-1)(F+B) / (m(F+B) + (p-1)(F+B)) = (p-1)/(m+p-1)
             ZB-H1: (p-1)(F+B-2W) / (m(F+B+W) + (p-1)(F+B-2W)), with F, B, W the mean measured
             action times (B and W apart), 0 when W > (F+B)/2
             ZB-V (two chunks per rank, 2p virtual stages): 0

Each rank wants one core: with more ranks than free cores (p = 4 on a two-core machine) ranks
share cores and the action times stretch while others compute; the figure then measures that too.

    tests/bench/train/bench_pipeline.py [BUILD_DIR] [--steps 4] [--warmup 1] [--batch 8]
        [--configs 2:1f1b:4,2:zb-h1:4,2:zbv:4,2:1f1b:8,2:zb-h1:8,2:zbv:8,4:1f1b:8,4:zb-h1:8]

Env: HP_BENCH_DIR (model cache; default ${XDG_CACHE_HOME:-~/.cache}/hp-bench/train).
"""
import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_train as bt  # noqa: E402

HIDDEN, HEADS, VOCAB, SEQ = 256, 4, 256, 64


def prepare(cache, batch, layers):
    key = hashlib.sha256(open(__file__, "rb").read() + f"{batch} {layers}".encode()).hexdigest()
    d = os.path.join(cache, f"gpt-pipeline-{key[:16]}")
    if os.path.exists(os.path.join(d, "model.onnx")):
        return d
    print(f"generating the benchmark model into {d} ...", file=sys.stderr)
    tmp = d + ".tmp"
    os.makedirs(os.path.join(tmp, "inputs"), exist_ok=True)
    torch.manual_seed(0)
    model = bt.models.Gpt2(vocab=VOCAB, hidden=HIDDEN, heads=HEADS, layers=layers,
                           max_seq=SEQ).train()
    spec = bt.models.Spec(lambda: model, "tokens", "cross_entropy", "input_ids", seq=SEQ)
    bt.models.export(spec, model, os.path.join(tmp, "model.onnx"), 2, dynamic=True)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (batch, SEQ + 1), generator=g)
    bt.save_batch(os.path.join(tmp, "inputs"), ids[:, :-1], ids[:, 1:])
    os.rename(tmp, d)
    return d


def stages(layers, p):
    bounds = [layers * k // p for k in range(p + 1)]
    span = lambda lo, hi: f"{lo}-{hi}" if hi > lo else f"{lo}"  # noqa: E731
    return [span(bounds[k], bounds[k + 1] - 1) for k in range(p)]


def run(hp, d, work, a, p, schedule, m):
    tag = f"p{p}-{schedule}-m{m}"
    recipe = os.path.join(work, f"{tag}.toml")
    train = {"loss": "cross_entropy", "logits": bt.models.OUTPUT, "labels": "labels",
             "optimizer": "adamw", "lr": bt.LR, "betas": list(bt.BETAS), "eps": 1e-8,
             "weight_decay": bt.WD, "clip_norm": 1.0, "steps": a.steps, "frozen": []}
    chunks = 2 if schedule == "zbv" else 1
    bt.run_training.write_recipe(recipe, os.path.join(d, "model.onnx"), train,
                                 {"batch": a.batch}, stages(a.layers, p * chunks),
                                 parallel={"pp": p, "schedule": schedule, "micro_batches": m})
    trace = os.path.join(work, f"{tag}.trace.json")
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    r = subprocess.run([hp, "launch", recipe, "--inputs", os.path.join(d, "inputs"), "--trace",
                        trace, "--threads", "1", "--steps", str(a.steps), "--run-dir",
                        os.path.join(work, f"run-{tag}")] + root, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"hp launch failed (exit {r.returncode}):\n{r.stdout}{r.stderr}")
    with open(trace) as f:
        events = [e for e in json.load(f)["traceEvents"]
                  if e.get("ph") == "X" and e.get("cat") in ("compute", "wait")]
    rows = []
    for step in range(a.warmup + 1, a.steps + 1):
        compute = [e for e in events if e["cat"] == "compute"
                   and e["name"].split(" ")[-1].split(".")[0] == str(step)]
        start = min(e["ts"] for e in compute)
        span = max(e["ts"] + e["dur"] for e in compute) - start
        busy = statistics.mean(sum(e["dur"] for e in compute if e["pid"] == r)
                               for r in range(p))
        mean = lambda k: statistics.mean([e["dur"] for e in compute  # noqa: E731
                                          if e["name"].startswith(k + " ")] or [0])
        f_, b_, w_ = mean("F"), mean("B"), mean("W")
        if schedule == "zb-h1":
            idle = max(0.0, (p - 1) * (f_ + b_ - 2 * w_))  # W longer than (F+B)/2 fills it
            formula = idle / (m * (f_ + b_ + w_) + idle)
        elif schedule == "zbv":
            formula = 0.0  # zero bubble when F, B and W take as long as each other
        else:
            formula = (p - 1) / (m + p - 1)
        rows.append((1 - busy / span, formula, span / 1e6, f_ / 1e3, b_ / 1e3, w_ / 1e3))
    med = [statistics.median(r[i] for r in rows) for i in range(6)]
    return tag, med


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build", nargs="?", default=os.path.join(bt.ROOT, "build"))
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--configs",
                    default="2:1f1b:4,2:zb-h1:4,2:zbv:4,2:1f1b:8,2:zb-h1:8,2:zbv:8,4:1f1b:8,"
                    "4:zb-h1:8")
    a = ap.parse_args()
    hp = os.path.join(a.build, "bin", "hp")
    cache = os.environ.get("HP_BENCH_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "hp-bench", "train")
    d = prepare(cache, a.batch, a.layers)
    print(f"model {d}/model.onnx, global batch {a.batch} x {SEQ}, {a.layers} layers, "
          f"{os.cpu_count()} cores")
    print(f"{'config':18} {'bubble':>8} {'formula':>8} {'step s':>8} {'F ms':>7} {'B ms':>7} "
          f"{'W ms':>7}")
    with tempfile.TemporaryDirectory(dir=os.environ.get("HP_BENCH_KEEP")) as work:
        for c in a.configs.split(","):
            p, schedule, m = c.split(":")
            tag, (bubble, formula, span, f_, b_, w_) = run(hp, d, work, a, int(p), schedule,
                                                           int(m))
            print(f"{tag:18} {bubble:8.3f} {formula:8.3f} {span:8.3f} {f_:7.1f} {b_:7.1f} "
                  f"{w_:7.1f}", flush=True)


if __name__ == "__main__":
    main()
