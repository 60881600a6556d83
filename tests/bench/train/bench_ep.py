#!/usr/bin/python3
"""Expert-parallel training benchmark (not a test): the routed dispatch against the all-gather one,
same run.

Model: tests/train/models.py's MoE (a softmax router, torch.topk, torch.stack of a ModuleList of
experts, the chosen experts' outputs gathered), larger: vocab 2048, hidden 256, 2 layers of 8 experts of 256 -> 1024 -> 256 (GELU),
sequence 64, global batch --batch, AdamW. Every configuration runs `hp launch RECIPE --inputs BATCH
--metrics m.jsonl --threads 1` for --steps steps; the figure is the median step after --warmup:

    one rank, 1 thread                       the baseline: the export, every expert on every token
    dp=2 x ep=2, all-gather dispatch         each rank runs its 4 experts on both ranks' tokens
    dp=2 x ep=2, routed dispatch             each rank runs its 4 experts on the tokens routed to them

and prints speedup = baseline / configuration, the expert-parallel collectives' share of a step
(ep_comm_seconds: the dispatch and combine of forward and backward, all exposed), and the plan's
prediction of each step on this machine (`hp devices --measure`; the planner counts a ModuleList's
experts at k/E of their FLOPs under expert parallelism, all of them at one rank). With top-2 of 8
experts a routed expert sees a quarter of the tokens on average, so the experts' work per rank is
an eighth of the one-rank step's (half the experts, a quarter of the rows) where the all-gather
dispatch leaves half.

With --combine where the same experts are written as Hugging Face's Mixtral block writes them
(each expert on the rows torch.where routes to it, index_add_ back into zeros): the export already
runs each expert on its routed rows only, so the one-rank baseline is sparse, and the comparison is

    dp=2                                     every rank holds every expert
    dp=2 x ep=2, summed                      each rank its 4 experts, run on both ranks' rows
                                             (all-gathered), the partial sums reduce-scattered

    tests/bench/train/bench_ep.py [BUILD_DIR] [--steps 6] [--warmup 2] [--batch 8]
                                  [--combine stack|where]

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

VOCAB, HIDDEN, FFN, EXPERTS, TOP, LAYERS, SEQ = 2048, 256, 1024, 8, 2, 2, 64


def make_model(combine="stack"):
    torch.manual_seed(0)
    return bt.models.Moe(vocab=VOCAB, hidden=HIDDEN, layers=LAYERS, ffn=FFN, experts=EXPERTS,
                         top_k=TOP, combine=combine).train()


def prepare(cache, batch, combine):
    key = hashlib.sha256(open(__file__, "rb").read() + open(bt.models.__file__, "rb").read()
                         + f"{batch} {combine}".encode()).hexdigest()[:16]
    d = os.path.join(cache, f"moe-{key}")
    if os.path.exists(os.path.join(d, "model.onnx")):
        return d
    print(f"generating the benchmark model into {d} ...", file=sys.stderr)
    tmp = d + ".tmp"
    os.makedirs(os.path.join(tmp, "inputs"), exist_ok=True)
    spec = bt.models.Spec(lambda: make_model(combine), "tokens", "cross_entropy", "input_ids",
                          seq=SEQ)
    bt.models.export(spec, make_model(combine), os.path.join(tmp, "model.onnx"), 2, dynamic=True)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (batch, SEQ + 1), generator=g)
    bt.save_batch(os.path.join(tmp, "inputs"), ids[:, :-1], ids[:, 1:])
    os.rename(tmp, d)
    return d


def run(hp, d, work, batch, steps, warmup, tag, parallel, cluster):
    recipe = os.path.join(work, f"{tag}.toml")
    train = {"loss": "cross_entropy", "logits": bt.models.OUTPUT, "labels": "labels",
             "optimizer": "adamw", "lr": bt.LR, "betas": list(bt.BETAS), "eps": 1e-8,
             "weight_decay": bt.WD, "clip_norm": 1.0, "steps": steps, "frozen": []}
    bt.run_training.write_recipe(recipe, os.path.join(d, "model.onnx"), train, {"batch": batch},
                                 parallel=parallel, cluster=cluster,
                                 ranks_per_node=parallel.get("dp", 1))
    metrics = os.path.join(work, f"{tag}.jsonl")
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    p = subprocess.run([hp, "launch", recipe, "--inputs", os.path.join(d, "inputs"), "--metrics",
                        metrics, "--threads", "1", "--steps", str(steps)] + root
                       + (["--run-dir", os.path.join(work, f"run-{tag}")] if parallel else []),
                       capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"hp launch failed (exit {p.returncode}):\n{p.stdout}{p.stderr}")
    rows = [json.loads(line) for line in open(metrics) if line.strip()][warmup:]
    med = lambda k: statistics.median(r.get(k, 0.0) for r in rows)  # noqa: E731
    routed = [line for line in p.stdout.splitlines() if line.startswith("expert layers:")]
    plan = bt.plan_prediction(p.stdout)
    routed.append(f"plan {plan:.3f} s (measured/predicted {med('seconds') / plan:.2f})" if plan
                  else "no plan prediction")
    return med("seconds"), med("ep_comm_seconds"), rows[-1]["loss"], routed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build", nargs="?", default=os.path.join(bt.ROOT, "build"))
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--combine", choices=("stack", "where"), default="stack")
    a = ap.parse_args()
    hp = os.path.join(a.build, "bin", "hp")
    cache = os.environ.get("HP_BENCH_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "hp-bench", "train")
    d = prepare(cache, a.batch, a.combine)
    print(f"model {d}/model.onnx ({EXPERTS} experts, top-{TOP}, {LAYERS} layers, "
          f"{a.combine}), global batch "
          f"{a.batch} x {SEQ}, {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory() as work:
        one = bt.measured_cluster(hp, work, show=False)  # clusters of this machine's ranks
        two = bt.measured_cluster(hp, work, ranks=2, show=False)
        base, _, base_loss, notes = run(hp, d, work, a.batch, a.steps, a.warmup, "one", {}, one)
        print(f"{'one rank, 1 thread':36} {base:8.3f} s/step  loss {base_loss:.5f}  {notes[-1]}")
        configs = [(f"dp=2 x ep=2, {how} dispatch", f"ep-{how}",
                    {"dp": 2, "expert_parallel": 2, "expert_dispatch": how})
                   for how in ("gather", "routed")]
        if a.combine == "where":
            configs = [("dp=2", "dp2", {"dp": 2}),
                       ("dp=2 x ep=2, summed", "ep-summed", {"dp": 2, "expert_parallel": 2})]
        for label, tag, parallel in configs:
            t, comm, loss, routed = run(hp, d, work, a.batch, a.steps, a.warmup, tag, parallel,
                                        two)
            print(f"{label:36} {t:8.3f} s/step  speedup {base / t:4.2f}x  "
                  f"ep collectives {comm:.3f} s ({100 * comm / t:.0f}%)  loss {loss:.5f}"
                  + f"  {routed[-1]}" + (f"  [{routed[0]}]" if len(routed) > 1 else ""))


if __name__ == "__main__":
    main()
