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

The reference is ONNX Runtime's forward of the same exported model on the same batch (the
onnxruntime-node package tests/bench/executor drives, installed with npm into the cache dir: a
benchmark peer only), in the same run: a step costs about 3x the forward's FLOPs, so hp/ort_fwd near 3
means hp's step runs its GEMMs as fast as ORT runs the forward. PyTorch eager (Debian's python3-torch
1.13) is the second baseline (--no-torch skips it). Its GEMMs go through
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
    save_batch(os.path.join(tmp, "inputs"), *batch())
    os.rename(tmp, d)
    return d


def save_batch(inputs, x, y):
    """The token ids and their labels as hp launch --inputs reads them (input_0.pb, input_1.pb)."""
    onnx.save_tensor(numpy_helper.from_array(x.contiguous().numpy(), "input_ids"),
                     os.path.join(inputs, "input_0.pb"))
    onnx.save_tensor(numpy_helper.from_array(y.contiguous().numpy(), "labels"),
                     os.path.join(inputs, "input_1.pb"))


def batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g)
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()


def measured_cluster(hp, work, threads=1, ranks=1, show=True):
    """`hp devices --measure` for `ranks` ranks of `threads` threads: a cluster file of this
    machine's measured GEMM rate and copy bandwidth, for the plan's prediction beside the measured
    step."""
    out = os.path.join(work, f"measured-{ranks}x{threads}.toml")
    p = subprocess.run([hp, "devices", "--measure", "--ranks", str(ranks), "--threads",
                        str(threads), "--cluster-out", out], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"hp devices --measure failed (exit {p.returncode}):\n{p.stdout}{p.stderr}")
    if show:
        print(p.stdout.strip())
    return out


def plan_prediction(stdout):
    """The plan's prediction of a training step that hp launch printed (s), or None."""
    m = re.search(r"plan's prediction: ([0-9.]+) s per training step", stdout)
    return float(m.group(1)) if m else None


def predicted_on(hp, d, cluster, work):
    """The plan's prediction of the step on `cluster` (hp launch prints it after a 1-step run)."""
    recipe = os.path.join(work, "predict.toml")
    train = {"loss": "cross_entropy", "logits": models.OUTPUT, "labels": "labels",
             "optimizer": "adamw", "lr": LR, "steps": 1, "frozen": []}
    run_training.write_recipe(recipe, os.path.join(d, "model.onnx"), train, {"batch": BATCH},
                              cluster=cluster)
    p = subprocess.run([hp, "launch", recipe, "--inputs", os.path.join(d, "inputs"), "--steps",
                        "1"], capture_output=True, text=True)
    return plan_prediction(p.stdout)


def hp_step(hp, d, threads, steps, warmup, work):
    recipe = os.path.join(work, f"bench-{threads}.toml")
    train = {"loss": "cross_entropy", "logits": models.OUTPUT, "labels": "labels",
             "optimizer": "adamw", "lr": LR, "betas": list(BETAS), "eps": 1e-8,
             "weight_decay": WD, "clip_norm": 0.0, "steps": steps, "frozen": []}
    # The recipe's cluster is this machine measured at this thread count, so the plan's prediction
    # that hp launch prints is on measured figures (the local-cpu preset's table one is below).
    run_training.write_recipe(recipe, os.path.join(d, "model.onnx"), train, {"batch": BATCH},
                              cluster=measured_cluster(hp, work, threads))
    metrics = os.path.join(work, f"m-{threads}.jsonl")
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    p = subprocess.run([hp, "launch", recipe, "--inputs", os.path.join(d, "inputs"), "--metrics",
                        metrics, "--threads", str(threads), "--steps", str(steps)] + root,
                       capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"hp launch failed (exit {p.returncode}):\n{p.stdout}{p.stderr}")
    rows = [json.loads(l) for l in open(metrics) if l.strip()]
    peak = max(r.get("peak_bytes", 0) for r in rows)
    # hp launch prints the plan's prediction for the same recipe (hp plan's cost model on the
    # recipe's cluster, the measured one).
    PREDICTED[threads] = plan_prediction(p.stdout)
    return statistics.median(r["seconds"] for r in rows[warmup:]), rows[-1]["loss"], peak


PREDICTED = {}  # threads -> hp launch's "plan's prediction" of the step, seconds
MEASURED = {}  # threads -> hp's measured median step, seconds


def ort_forward(d, threads, steps, warmup, cache):
    """ONNX Runtime's median forward (ms -> s) of the same exported model on the same batch, through
    tests/bench/executor/ort_bench.js and onnxruntime-node (installed into a cache dir with npm, a
    benchmark peer only). None when node/npm are missing."""
    ort_dir = os.environ.get("HP_BENCH_ORT_DIR") or os.path.join(cache, "ort")
    if not os.path.isdir(os.path.join(ort_dir, "node_modules", "onnxruntime-node")):
        os.makedirs(ort_dir, exist_ok=True)
        r = subprocess.run(["npm", "install", "--ignore-scripts", "--no-audit", "--no-fund",
                            "onnxruntime-node"], cwd=ort_dir, capture_output=True, text=True)
        if r.returncode != 0:
            print(f"onnxruntime-node not installed: {r.stderr.strip()[:200]}", file=sys.stderr)
            return None
    ids = os.path.join(d, "input_ids.i64")
    if not os.path.exists(ids):
        x, _ = batch()
        x.numpy().astype(np.int64).tofile(ids)
    js = os.path.join(ROOT, "tests", "bench", "executor", "ort_bench.js")
    r = subprocess.run(["node", js, os.path.join(d, "model.onnx"), ids, str(threads), str(warmup),
                        str(max(steps - warmup, 3)), str(BATCH), str(SEQ)],
                       capture_output=True, text=True,
                       env=dict(os.environ, NODE_PATH=os.path.join(ort_dir, "node_modules")))
    m = re.search(r"median_ms=([0-9.]+)", r.stdout)
    if not m:
        print(f"ort_bench.js failed: {(r.stdout + r.stderr).strip()[:300]}", file=sys.stderr)
    return float(m.group(1)) / 1000 if m else None


def predicted_peak(hp, d):
    """hp plan's predicted peak memory (bytes) for this model trained on one rank at this batch."""
    r = subprocess.run([hp, "plan", os.path.join(d, "model.onnx"), "--cluster", "local-cpu",
                        "--mode", "train", "--dtype", "fp32", "--optimizer", "adamw",
                        "--global-batch", str(BATCH), "--fix", "dp=1", "--fix", "tp=1", "--fix",
                        "pp=1", "--fix", "micro_batches=1", "--json"], capture_output=True, text=True)
    if r.returncode != 0:
        return None
    return json.loads(r.stdout)["best"]["predicted"]["peak_memory_bytes"]


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
    ap.add_argument("--no-torch", action="store_true",
                    help="skip the PyTorch baselines (slow with Debian's reference BLAS)")
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
    print(f"{'threads':>7} {'hp_step_s':>10} {'ort_fwd_s':>10} {'hp/ort_fwd':>11} "
          f"{'torch_fwd_s':>12} {'torch_step_s':>13} {'hp/torch_step':>14} {'hp_loss':>8} "
          f"{'torch_loss':>10}")
    peak = 0
    table = None
    with tempfile.TemporaryDirectory() as work:
        table = predicted_on(hp, d, "local-cpu", work)
        for t in (int(s) for s in a.threads.split(",")):
            hp_s, hp_loss, peak = hp_step(hp, d, t, a.steps, a.warmup, work)
            MEASURED[t] = hp_s
            ort_s = ort_forward(d, t, a.steps, a.warmup, cache)
            ort_txt = (f"{ort_s:>10.4f} {hp_s / ort_s:>11.2f}" if ort_s else f"{'-':>10} {'-':>11}")
            if a.no_torch:
                torch_txt = f"{'-':>12} {'-':>13} {'-':>14} {hp_loss:>8.4f} {'-':>10}"
            else:
                fwd_s, step_s, loss = torch_times(t, a.steps, a.warmup)
                torch_txt = (f"{fwd_s:>12.4f} {step_s:>13.4f} {hp_s / step_s:>14.2f} "
                             f"{hp_loss:>8.4f} {loss:>10.4f}")
            print(f"{t:>7} {hp_s:>10.4f} {ort_txt} {torch_txt}", flush=True)
    # Memory: what the executor measured (weights, gradients, activations) plus AdamW's two moments
    # (host tensors beside the weights), against hp plan's prediction for the same step.
    params = sum(int(np.prod(t.dims)) for t in onnx.load(os.path.join(d, "model.onnx"),
                                                            load_external_data=False).graph.initializer)
    measured = peak + 8 * params
    pred = predicted_peak(hp, d)
    if pred:
        print(f"peak memory: measured {measured / 2**20:.1f} MiB (executor {peak / 2**20:.1f} MiB + "
              f"AdamW moments {8 * params / 2**20:.1f} MiB), hp plan predicts {pred / 2**20:.1f} MiB: "
              f"measured/predicted {measured / pred:.3f}")
    for t, step in sorted(PREDICTED.items()):
        if step:
            print(f"step at {t} thread(s): the plan predicts {step:.4f} s on this machine measured "
                  f"(hp devices --measure --threads {t}): measured/predicted "
                  f"{MEASURED[t] / step:.2f}")
    if table:
        print(f"on the local-cpu preset (table figures) the plan predicts {table:.4f} s at any "
              f"thread count")


if __name__ == "__main__":
    main()
