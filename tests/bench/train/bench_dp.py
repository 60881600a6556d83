#!/usr/bin/python3
"""Data- and tensor-parallel training benchmark (not a test): the speedup of dp or tp ranks over
one rank, same run.

Model: bench_train.py's GPT-2-style decoder (hidden 512, 8 heads, 6 layers, vocab 8192, seq 128),
exported with a dynamic batch axis, trained with AdamW on one global batch of --batch sequences.
Every configuration runs `hp launch RECIPE --inputs BATCH --metrics m.jsonl --threads 1` for --steps
steps; the figure is the median step of the metrics after the warm-up steps:

    one rank, 1 thread                  the baseline
    dp=2 over mpirun, 1 thread per rank optimizer_shard 0 (all-reduce), 1 and 2 (reduce-scatter);
                                        --zero 3 also gathers the parameters for each use
    tp=2 over mpirun, 1 thread per rank each rank trains hp shard's partition (--tp 2)

and prints speedup = baseline / configuration (ideal: dp or tp), the plan's prediction of each step
on this machine measured by `hp devices --measure` (the recipes' cluster), the share of a step spent in the
gradient reduction that is left after the backward (reduce_seconds; tp: the tensor-parallel
collectives, tp_comm_seconds, all exposed) and in the update
(update_seconds, which with ZeRO 1-2 includes the parameters' all-gather), and the executor's peak
(ZeRO-3 holds each bucket of parameters only during its uses). Each rank gets one core: on a
machine with fewer free cores than ranks the speedup measures the oversubscription, not hp.

    tests/bench/train/bench_dp.py [BUILD_DIR] [--steps 6] [--warmup 2] [--batch 8] [--zero 0,1,2]
                                  [--tp 2]   (an empty list skips that part) [--ceiling]

--ceiling also runs two independent one-rank jobs on half the batch each, at the same time: the
speedup dp=2 would reach with no communication at all, which bounds it on the machine at hand.

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


def prepare(cache, batch):
    key = hashlib.sha256(open(__file__, "rb").read() + open(bt.__file__, "rb").read()
                         + str(batch).encode()).hexdigest()[:16]
    d = os.path.join(cache, f"gpt-dynamic-{key}")
    if os.path.exists(os.path.join(d, "model.onnx")):
        return d
    print(f"generating the benchmark model into {d} ...", file=sys.stderr)
    tmp = d + ".tmp"
    os.makedirs(os.path.join(tmp, "inputs"), exist_ok=True)
    bt.models.export(bt.spec(), bt.make_model(), os.path.join(tmp, "model.onnx"), 2, dynamic=True)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, bt.VOCAB, (batch, bt.SEQ + 1), generator=g)
    bt.save_batch(os.path.join(tmp, "inputs"), ids[:, :-1], ids[:, 1:])
    os.rename(tmp, d)
    return d


def start(hp, d, work, batch, steps, parallel, tag=None, cluster=None):
    tag = tag or "-".join(f"{k}{v}" for k, v in parallel.items()) or "one"
    recipe = os.path.join(work, f"{tag}.toml")
    train = {"loss": "cross_entropy", "logits": bt.models.OUTPUT, "labels": "labels",
             "optimizer": "adamw", "lr": bt.LR, "betas": list(bt.BETAS), "eps": 1e-8,
             "weight_decay": bt.WD, "clip_norm": 1.0, "steps": steps, "frozen": []}
    ranks = 1
    for k in ("dp", "tp", "pp"):
        ranks *= parallel.get(k, 1)
    bt.run_training.write_recipe(recipe, os.path.join(d, "model.onnx"), train, {"batch": batch},
                                 parallel=parallel, cluster=cluster, ranks_per_node=ranks)
    metrics = os.path.join(work, f"{tag}.jsonl")
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    p = subprocess.Popen([hp, "launch", recipe, "--inputs",
                          os.path.join(d, "inputs"), "--metrics", metrics, "--threads", "1",
                          "--steps", str(steps)] + root
                         + (["--run-dir", os.path.join(work, f"run-{tag}")] if parallel else []),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return p, metrics


def finish(job, warmup):
    p, metrics = job
    out, _ = p.communicate()
    if p.returncode != 0:
        sys.exit(f"hp launch failed (exit {p.returncode}):\n{out}")
    rows = [json.loads(line) for line in open(metrics) if line.strip()][warmup:]
    med = lambda k: statistics.median(r.get(k, 0.0) for r in rows)  # noqa: E731
    PREDICTED[os.path.basename(metrics)[:-6]] = bt.plan_prediction(out)
    PEAK[os.path.basename(metrics)[:-6]] = max(r.get("peak_bytes", 0) for r in rows)
    return (med("seconds"), med("reduce_seconds") + med("tp_comm_seconds"), med("update_seconds"),
            rows[-1]["loss"])


PREDICTED = {}  # configuration tag -> the plan's prediction hp launch printed (s), or None
PEAK = {}  # configuration tag -> the first rank's executor peak (bytes): ZeRO-3 holds less


def run(hp, d, work, batch, steps, warmup, parallel, cluster=None):
    return finish(start(hp, d, work, batch, steps, parallel, cluster=cluster), warmup)


def prediction(tag, t):
    p = PREDICTED.get(tag)
    return f"  plan {p:.3f} s (measured/predicted {t / p:.2f})" if p else ""


def ceiling(hp, cache, work, batch, steps, warmup):
    """Two independent one-rank jobs on half the batch each, at the same time: what dp=2 would take
    with no communication at all, on this machine (shared memory bandwidth, caches, clocks)."""
    d = prepare(cache, batch // 2)
    jobs = [start(hp, d, work, batch // 2, steps, {}, tag=f"half{i}") for i in range(2)]
    return max(finish(j, warmup)[0] for j in jobs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build", nargs="?", default=os.path.join(bt.ROOT, "build"))
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--zero", default="0,1,2")
    ap.add_argument("--tp", default="2")
    ap.add_argument("--ceiling", action="store_true",
                    help="also run two one-rank jobs on half batches at once (dp=2 without comm)")
    a = ap.parse_args()
    hp = os.path.join(a.build, "bin", "hp")
    cache = os.environ.get("HP_BENCH_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "hp-bench", "train")
    d = prepare(cache, a.batch)
    print(f"model {d}/model.onnx, global batch {a.batch} x {bt.SEQ}, {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory() as work:
        one = bt.measured_cluster(hp, work, show=False)
        two = bt.measured_cluster(hp, work, ranks=2, show=False)
        base, _, base_upd, base_loss = run(hp, d, work, a.batch, a.steps, a.warmup, {}, one)
        print(f"{'one rank, 1 thread':34} {base:8.3f} s/step  (update {base_upd:.3f} s)  "
              f"loss {base_loss:.5f}{prediction('one', base)}")
        if a.ceiling:
            t = ceiling(hp, cache, work, a.batch, a.steps, a.warmup)
            print(f"{'2 x one rank, half batch, at once':34} {t:8.3f} s/step  speedup "
                  f"{base / t:4.2f}x  (no communication: this machine's ceiling for dp=2)")
        for z in [int(x) for x in a.zero.split(",") if x]:
            t, red, upd, loss = run(hp, d, work, a.batch, a.steps, a.warmup,
                                    {"dp": 2, "optimizer_shard": z}, two)
            print(f"{f'dp=2 zero {z} (mpirun, 1 thread each)':34} {t:8.3f} s/step  speedup "
                  f"{base / t:4.2f}x  reduction {red:.3f} s ({100 * red / t:.0f}%)  update "
                  f"{upd:.3f} s  peak {PEAK[f'dp2-optimizer_shard{z}'] / 2**20:.0f} MiB  "
                  f"loss {loss:.5f}{prediction(f'dp2-optimizer_shard{z}', t)}")
        for tp in [int(x) for x in a.tp.split(",") if x]:
            t, comm, upd, loss = run(hp, d, work, a.batch, a.steps, a.warmup, {"tp": tp},
                                     bt.measured_cluster(hp, work, ranks=tp, show=False))
            print(f"{f'tp={tp} (mpirun, 1 thread each)':34} {t:8.3f} s/step  speedup "
                  f"{base / t:4.2f}x  tp collectives {comm:.3f} s ({100 * comm / t:.0f}%)  update "
                  f"{upd:.3f} s  loss {loss:.5f}{prediction(f'tp{tp}', t)}")


if __name__ == "__main__":
    main()
