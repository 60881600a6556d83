#!/usr/bin/python3
"""ZeRO levels under pipeline parallelism (not a test): dp=2 x pp=2 (4 ranks over mpirun, 1 thread
each) at optimizer_shard 2, 3 and 3 with zero3_gather = "per-step", same run.

Model: bench_dp.py's GPT-style model (dynamic batch), its layers split in two [[stages]] at the
middle of the range `hp plan` finds, 1F1B over --micro micro-batches of a global batch of --batch,
AdamW. For each level: the median step after the first, the lead rank's (stage 0) executor peak
(`peak_bytes` of --metrics: its largest part's peak plus the micro-batch tensors held between
actions) and the loss, which must be the same. At level 3 a stage's parameters live in shards over
its two replicas and are gathered for every part's uses of every micro-batch (docs/training.md,
"ZeRO-3 with pipeline stages"), so the peak falls by about the stage's parameters and the step pays
2m gathers of them; per-step gathers each bucket once a step and keeps it to the step's end (the
peak then counts the kept buckets too).

    tests/bench/train/bench_pp_zero.py [BUILD_DIR] [--steps 4] [--batch 8] [--micro 4]

Env: HP_BENCH_DIR (model cache; default ${XDG_CACHE_HOME:-~/.cache}/hp-bench/train).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_dp  # noqa: E402
import bench_train as bt  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build", nargs="?", default=os.path.join(bt.ROOT, "build"))
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--micro", type=int, default=4)
    a = ap.parse_args()
    hp = os.path.join(a.build, "bin", "hp")
    cache = os.environ.get("HP_BENCH_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "hp-bench", "train")
    d = bench_dp.prepare(cache, a.batch)
    model = os.path.join(d, "model.onnx")
    with tempfile.TemporaryDirectory() as work, open(os.path.join(work, "log"), "w") as log:
        dims = {"batch": a.batch}
        first, last = map(int, bt.run_training.stage_layers(hp, model, dims, work, log).split("-"))
        mid = (first + last + 1) // 2
        stages = [f"{first}-{mid - 1}", f"{mid}-{last}"]
        train = {"loss": "cross_entropy", "logits": bt.models.OUTPUT, "labels": "labels",
                 "optimizer": "adamw", "lr": bt.LR, "betas": list(bt.BETAS), "eps": 1e-8,
                 "weight_decay": bt.WD, "clip_norm": 1.0, "steps": a.steps, "frozen": []}
        print(f"model {model}, stages {stages}, global batch {a.batch} in {a.micro} micro-batches, "
              f"{os.cpu_count()} cores")
        root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
        for zero, gather in ((2, None), (3, None), (3, "per-step")):
            name = f"zero{zero}" + (f"-{gather}" if gather else "")
            parallel = {"dp": 2, "pp": 2, "optimizer_shard": zero, "schedule": "1f1b",
                        "micro_batches": a.micro}
            if gather:
                parallel["zero3_gather"] = gather
            recipe = os.path.join(work, f"{name}.toml")
            bt.run_training.write_recipe(recipe, model, train, dims, stages, parallel=parallel)
            metrics = os.path.join(work, f"{name}.jsonl")
            p = subprocess.run([hp, "launch", recipe, "--inputs", os.path.join(d, "inputs"),
                                "--metrics", metrics, "--threads", "1", "--run-dir",
                                os.path.join(work, f"run-{name}")] + root,
                               capture_output=True, text=True)
            if p.returncode != 0:
                sys.exit(f"hp launch failed (exit {p.returncode}):\n{p.stdout}{p.stderr}")
            rows = [json.loads(line) for line in open(metrics) if line.strip()]
            step = statistics.median(r["seconds"] for r in rows[1:])
            peak = max(r["peak_bytes"] for r in rows) / 2**20
            held = [line.split("] ", 1)[-1] for line in p.stdout.splitlines() if "ZeRO-3" in line]
            print(f"optimizer_shard {zero}{' ' + gather if gather else ''}: {step:.3f} s/step  "
                  f"stage 0 peak {peak:.1f} MiB  loss {rows[-1]['loss']:.5f}" +
                  "".join(f"  ({h})" for h in held))


if __name__ == "__main__":
    main()
