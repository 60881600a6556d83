#!/usr/bin/python3
"""End-to-end pipeline-parallel training test: two pipeline stages train what one rank (and PyTorch)
trains.

For each model of models.py with repeated blocks (GPT-2 with its head tied to the embedding, so the
tied weight lives on both stages; Llama; ViT; the MoE), torch runs 5 AdamW steps with gradient
clipping on one fixed batch of 4 (reference.py), and

    hp launch RECIPE --inputs BATCH_DIR --metrics m.jsonl --save-model out.onnx

trains the same 5 steps with pp = 2, the model's layers split in two [[stages]] (the range `hp plan`
finds, halved), under each schedule below. Each step's loss must be torch's within 1e-4 (relative),
the gradient norm within 1e-3, and the saved weights within 1% of torch's update
(run_training.compare):

    gpipe, 2 micro-batches (--simulate)      1f1b, 4 micro-batches (one row each, --simulate)
    zb-h1, 2 micro-batches (--simulate)      1f1b, 2 micro-batches (mpirun; GPT-2 only)

Then, on GPT-2: 3 steps at pp = 2 with --checkpoint resumed for 2 at one rank, and 3 steps at one
rank resumed for 2 at pp = 2 (zb-h1), must equal the uninterrupted 5; and malformed pipeline recipes
(micro-batches that do not divide the batch, overlapping or missing stages) must exit 3 with the
reason, and an interleaved schedule must be refused. `hp verify` of a pp = 2 zb-h1 recipe over
mpirun (and of the Mixtral loop at dp = 2 x pp = 2 x ep = 2) must report every loss and weight ok
against one rank. At m = 4, 1F1B's peak memory on the first
stage must be below GPipe's (fewer stashes held). On a token stream (--data), pp = 2 must give
one rank's losses for 4 steps, also when 2 steps are resumed from a pipeline checkpoint.

On the four-block GPT-2 and Llama (models.DEEP): pp = 4 under 1f1b (--simulate) and zb-h1 (mpirun,
4 ranks), pp = 3 under gpipe, and two chunks per rank on pp = 2 (four virtual stages) under ZB-V
(in process, and over mpirun) and interleaved 1F1B, with the same tolerances; 3 steps at dp = 2 x
pp = 2 with optimizer_shard 2 resumed for 2 at pp = 4 must equal the uninterrupted 5. Pipelines replicated over data-parallel ranks
(dp = 2 x pp = 2, 4 ranks) train every model under 1f1b in process (also with optimizer_shard 2 and
3) and GPT-2 under zb-h1 over mpirun (also with optimizer_shard 1 and 3), with the same tolerances;
ZeRO-3 (each stage's parameters sharded over its replicas, gathered in 50 KiB buckets for the uses of
every action) must show its gathers on every rank's trace, also on the four-block models under ZB-V
at dp = 2 (two chunks per rank) and on every model at dp = 2 x tp = 2 x pp = 2 under zb-h1, and a
dp = 2 x pp = 2 ZeRO-3 checkpoint resumes at one rank, a one-rank one at dp = 2 x pp = 2 ZeRO-3. Stages split
over tensor-parallel ranks (tp = 2 x pp = 2, 4 ranks, each training hp shard's partition of its
stage) train every model under 1f1b and zb-h1 in process and GPT-2 under gpipe over mpirun, and the
four-block models under ZB-V (in process and over mpirun) and interleaved 1F1B; a tp = 2 x pp = 2
checkpoint resumes at one rank, a pp = 2 one at tp = 2 x pp = 2, and 3 steps at dp = 2 x tp = 2 x pp = 2
(ZeRO-2) resumed for 2 at tp = 4 and at one rank equal the uninterrupted 5, as does a sharded
checkpoint of dp = 2 x tp = 2 (ZeRO-1) resumed at tp = 2 x pp = 2 (pipeline checkpoints are sharded
too: each rank writes its stage's pieces, docs/training.md). dp = 2 x tp = 2 x pp = 2 (8 ranks)
trains every model under 1f1b, and under zb-h1 with optimizer_shard 2, in process.

Expert parallelism inside the stages (--ep-models: the top-k MoE gathered and scattered, and
transformers' Mixtral loop, whose summed layers are split too): dp = 2 x pp = 2 x ep = 2 under 1f1b
in process and zb-h1 over mpirun, with ZeRO-3, and dp = 4 x pp = 2 x ep = 2 at ZeRO-2 (8 ranks),
each run saying it split both expert layers; the Mixtral loop also at tp = 2 x pp = 2 (its
data-dependent region whole on every rank); an ep x pp checkpoint resumes at one rank and at
dp = 2 x ep = 2, and the reverse.

Usage: run_pipeline.py HP_BINARY WORK_DIR [--models a,b] [--deep-models a,b] [--layouts tag,tag]
Exit status 0 when everything holds, 1 when something does not, 77 (CTest's skip) without torch.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

try:
    import numpy as np
    import torch

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import models  # noqa: E402
    import reference  # noqa: E402
    import run_training as rt  # noqa: E402
except ImportError as e:
    print(f"skipped: {e} (packaging/install-deps.sh installs python3-torch and python3-onnx)")
    sys.exit(77)

SCHEDULES = [
    ("gpipe-m2", {"schedule": "gpipe", "micro_batches": 2}, "simulate"),
    ("1f1b-m4", {"schedule": "1f1b", "micro_batches": 4}, "simulate"),
    ("zbh1-m2", {"schedule": "zb-h1", "micro_batches": 2}, "simulate"),
    ("1f1b-m2", {"schedule": "1f1b", "micro_batches": 2}, "mpirun"),
]
MPIRUN_MODELS = {"gpt2"}
# Pipelines replicated over data-parallel ranks (dp = 2 x pp = 2, 4 ranks): every model in process,
# GPT-2 over mpirun too.
DP_PP = [
    ("dp2xpp2-1f1b-m2", {"dp": 2, "schedule": "1f1b", "micro_batches": 2}, "simulate"),
    ("dp2xpp2-zbh1-m2", {"dp": 2, "schedule": "zb-h1", "micro_batches": 2}, "mpirun"),
    ("dp2xpp2-zero2-1f1b-m2", {"dp": 2, "optimizer_shard": 2, "schedule": "1f1b",
                               "micro_batches": 2}, "simulate"),
    ("dp2xpp2-zero1-zbh1-m2", {"dp": 2, "optimizer_shard": 1, "schedule": "zb-h1",
                               "micro_batches": 2}, "mpirun"),
    # ZeRO-3: each stage's parameters sharded over its replicas, gathered in 50 KiB buckets for
    # every part's uses of every micro-batch.
    ("dp2xpp2-zero3-1f1b-m2", {"dp": 2, "optimizer_shard": 3, "bucket_mb": 0.05,
                               "schedule": "1f1b", "micro_batches": 2}, "simulate"),
    ("dp2xpp2-zero3-zbh1-m2", {"dp": 2, "optimizer_shard": 3, "bucket_mb": 0.05,
                               "schedule": "zb-h1", "micro_batches": 2}, "mpirun"),
    # ... gathered once a step and kept to its end (zero3_gather = "per-step").
    ("dp2xpp2-zero3-step-1f1b-m2", {"dp": 2, "optimizer_shard": 3, "bucket_mb": 0.05,
                                    "zero3_gather": "per-step", "schedule": "1f1b",
                                    "micro_batches": 2}, "simulate"),
    ("dp2xpp2-zero3-step-zbh1-m2", {"dp": 2, "optimizer_shard": 3, "bucket_mb": 0.05,
                                    "zero3_gather": "per-step", "schedule": "zb-h1",
                                    "micro_batches": 2}, "mpirun"),
]
# Tensor x pipeline parallelism (tp = 2 x pp = 2, 4 ranks: each rank trains hp shard's partition of
# its stage): every model in process, GPT-2 over mpirun too.
TP_PP = [
    ("tp2xpp2-1f1b-m2", {"tp": 2, "schedule": "1f1b", "micro_batches": 2}, "simulate"),
    ("tp2xpp2-zbh1-m2", {"tp": 2, "schedule": "zb-h1", "micro_batches": 2}, "simulate"),
    ("tp2xpp2-gpipe-m2", {"tp": 2, "schedule": "gpipe", "micro_batches": 2}, "mpirun"),
    # All three: dp = 2 x tp = 2 x pp = 2, 8 ranks.
    ("dp2xtp2xpp2-1f1b-m2", {"dp": 2, "tp": 2, "schedule": "1f1b", "micro_batches": 2},
     "simulate"),
    ("dp2xtp2xpp2-zero2-zbh1", {"dp": 2, "tp": 2, "optimizer_shard": 2, "schedule": "zb-h1",
                                "micro_batches": 1}, "simulate"),
    ("dp2xtp2xpp2-zero3-zbh1", {"dp": 2, "tp": 2, "optimizer_shard": 3, "bucket_mb": 0.05,
                                "schedule": "zb-h1", "micro_batches": 2}, "simulate"),
]
# Expert parallelism inside the stages (the MoE exports only): each stage's data-parallel replicas
# share its experts out, two per expert group.
EP_PP = [
    ("dp2xpp2-ep2-1f1b-m2", {"dp": 2, "expert_parallel": 2, "schedule": "1f1b",
                             "micro_batches": 2}, "simulate"),
    ("dp2xpp2-ep2-zbh1-m2", {"dp": 2, "expert_parallel": 2, "schedule": "zb-h1",
                             "micro_batches": 2}, "mpirun"),
    ("dp2xpp2-ep2-zero3-1f1b-m2", {"dp": 2, "expert_parallel": 2, "optimizer_shard": 3,
                                   "bucket_mb": 0.05, "schedule": "1f1b", "micro_batches": 2},
     "simulate"),
    # 8 ranks: two expert groups per stage, each expert held by two replicas (ZeRO-2 over them).
    ("dp4xpp2-ep2-zero2-zbh1", {"dp": 4, "expert_parallel": 2, "optimizer_shard": 2,
                                "schedule": "zb-h1", "micro_batches": 1}, "simulate"),
]
# Mixtral's routing loop (NonZero-sized rows: hp shard runs that region whole on every rank) split
# over tensor-parallel stages, without expert parallelism.
LOOP_TP_PP = [
    ("tp2xpp2-1f1b-m2", {"tp": 2, "schedule": "1f1b", "micro_batches": 2}, "simulate"),
]
# Four-block models (models.DEEP) over more stages: (tag, stages, [parallel], how).
DEEP = [
    ("pp4-1f1b-m4", 4, {"schedule": "1f1b", "micro_batches": 4}, "simulate"),
    ("pp4-zbh1-m4", 4, {"schedule": "zb-h1", "micro_batches": 4}, "mpirun"),
    ("pp3-gpipe-m2", 3, {"schedule": "gpipe", "micro_batches": 2}, "simulate"),
    # Two model chunks per rank: four virtual stages on two ranks.
    ("zbv-p2-m2", 4, {"pp": 2, "schedule": "zbv", "micro_batches": 2}, "simulate"),
    ("zbv-p2-m4", 4, {"pp": 2, "schedule": "zbv", "micro_batches": 4}, "mpirun"),
    ("interleaved-p2-v2-m2", 4, {"pp": 2, "schedule": "interleaved", "virtual_stages": 2,
                                 "micro_batches": 2}, "simulate"),
    # ... and each stage's partition over tp = 2 (4 ranks).
    ("tp2-zbv-p2-m2", 4, {"tp": 2, "pp": 2, "schedule": "zbv", "micro_batches": 2}, "simulate"),
    ("tp2-zbv-p2-m4", 4, {"tp": 2, "pp": 2, "schedule": "zbv", "micro_batches": 4}, "mpirun"),
    ("tp2-interleaved-p2-v2-m2", 4, {"tp": 2, "pp": 2, "schedule": "interleaved",
                                     "virtual_stages": 2, "micro_batches": 2}, "simulate"),
    # ... and replicated over dp = 2 with ZeRO-3 (4 ranks, two chunks' parts gathering per rank).
    ("dp2-zbv-p2-m2-zero3", 4, {"dp": 2, "pp": 2, "schedule": "zbv", "micro_batches": 2,
                                "optimizer_shard": 3, "bucket_mb": 0.05}, "simulate"),
]
VARIANT = "adamw-clip"


def split_stages(hp, ref, d, log, n=2):
    """The planner's layer range of the model cut in n equal parts ("0-3", 2 -> "0-1", "2-3")."""
    layers = rt.stage_layers(hp, ref.model, {"batch": models.BATCH}, d, log)
    if "-" not in layers:
        raise rt.Skip(f"the planner finds one layer ({layers}): nothing to pipeline")
    a, b = map(int, layers.split("-"))
    if b - a + 1 < n:
        raise rt.Skip(f"the planner finds layers {layers}: too few for {n} stages")
    bounds = [a + (b - a + 1) * k // n for k in range(n + 1)]
    span = lambda lo, hi: f"{lo}-{hi}" if hi > lo else f"{lo}"  # noqa: E731
    return [span(bounds[k], bounds[k + 1] - 1) for k in range(n)]


def two_stages(hp, ref, d, log):
    return split_stages(hp, ref, d, log, 2)


def pp_recipe(path, ref, stages, extra):
    rt.write_recipe(path, ref.model, ref.train, {"batch": models.BATCH}, stages,
                    parallel=dict({"pp": len(stages)}, **extra))


def launch(hp, recipe, how, args, log):
    return rt.launch(hp, recipe, (["--simulate"] if how == "simulate" else []) + args, log)


def schedule_run(hp, d, ref, stages, tag, extra, how, log, expect=()):
    """`expect`: lines the run's output must hold (what it says it split)."""
    recipe = os.path.join(d, f"{tag}.toml")
    pp_recipe(recipe, ref, stages, extra)
    metrics, saved = os.path.join(d, f"{tag}.jsonl"), os.path.join(d, f"{tag}.onnx")
    trace = os.path.join(d, f"{tag}.trace.json")
    rc, out = launch(hp, recipe, how, ["--inputs", ref.inputs, "--metrics", metrics,
                                       "--save-model", saved, "--trace", trace, "--run-dir",
                                       os.path.join(d, f"run-{tag}")], log)
    if rc != 0:
        raise rt.Failure(f"hp launch exit {rc}: {rt.first_error(out)}")
    for line in expect:
        if line not in out:
            raise rt.Failure(f"the run does not say '{line}'")
    pp = extra.get("pp", len(stages))
    check_trace(trace, extra, pp * extra.get("tp", 1) * extra.get("dp", 1), len(stages) // pp)
    detail, (worst, name) = rt.compare(ref, rt.read_metrics(metrics, 1, reference.STEPS), saved)
    return f"{detail}  weights {worst:.1e} of the update ({name or 'all exact'})"


def check_trace(path, extra, ranks, chunks=1):
    """--trace: every rank's actions, F and B (and W for zb-h1 and zbv) once per step, micro-batch
    and model chunk; under ZeRO-3 the parameter gathers (tid 3), as many on every replica of a
    stage."""
    with open(path) as f:
        events = [e for e in json.load(f)["traceEvents"] if e["ph"] == "X"]
    if extra.get("optimizer_shard") == 3:
        gathers = [sum(1 for e in events if e["pid"] == r and e["tid"] == 3) for r in range(ranks)]
        if not all(gathers):
            raise rt.Failure(f"trace: ZeRO-3 gathers per rank {gathers}: some rank has none")
        # Per use, a bucket is gathered for each micro-batch's forward and backward; per step,
        # once a step. (Under expert parallelism two syncs number their buckets alike.)
        if "expert_parallel" not in extra:
            for r in range(ranks):
                times = {}
                for e in events:
                    if e["pid"] == r and e["tid"] == 3:
                        b = e.get("args", {}).get("bucket")
                        times[b] = times.get(b, 0) + 1
                per_step = extra.get("zero3_gather") == "per-step"
                if per_step and set(times.values()) != {reference.STEPS}:
                    raise rt.Failure(f"trace: rank {r} gathered buckets {times} times in "
                                     f"{reference.STEPS} steps, not once a step")
                if not per_step and max(times.values()) <= reference.STEPS:
                    raise rt.Failure(f"trace: rank {r} gathered each bucket at most once a step")
    m = extra["micro_batches"]
    kinds = "FBW" if extra["schedule"] in ("zb-h1", "zbv") else "FB"
    for rank in range(ranks):
        names = sorted(e["name"] for e in events if e["pid"] == rank and e["cat"] == "compute")
        want = sorted(f"{k} {s}.{i}" for k in kinds for s in range(1, reference.STEPS + 1)
                      for i in range(m) for _ in range(chunks))
        if names != want:
            raise rt.Failure(f"trace: rank {rank} has actions {names[:6]}..., want {want[:6]}...")


def resume_pair(hp, d, ref, tag, first, then, one, k, log):
    """3 steps of recipe `first` checkpointed, 2 more of `then` resumed from it (in process, or at
    one rank for `one`): against torch's uninterrupted 5. Returns the loss comparison."""
    ckpt = os.path.join(d, f"ckpt-{k}")
    m1, m2 = os.path.join(d, f"a{k}.jsonl"), os.path.join(d, f"b{k}.jsonl")
    saved = os.path.join(d, f"s{k}.onnx")
    how = lambda r: "one" if r == one else "simulate"  # noqa: E731
    rc, out = launch(hp, first, how(first), ["--inputs", ref.inputs, "--steps", "3",
                                             "--metrics", m1, "--checkpoint", ckpt], log)
    if rc != 0:
        raise rt.Failure(f"{tag}, first 3 steps: exit {rc}: {rt.first_error(out)}")
    rc, out = launch(hp, then, how(then), ["--inputs", ref.inputs, "--steps", "2", "--resume",
                                           ckpt, "--metrics", m2, "--save-model", saved], log)
    if rc != 0:
        raise rt.Failure(f"{tag}, resumed: exit {rc}: {rt.first_error(out)}")
    detail, _ = rt.compare(ref, rt.read_metrics(m1, 1, 3) + rt.read_metrics(m2, 4, 2), saved)
    return f"{tag}: {detail.split('  ')[0]}"


def resumed(hp, work, log):
    """3 steps at pp=2 resumed for 2 at one rank, and 3 at one rank resumed for 2 at pp=2; the other
    layouts below, among them a sharded dp2 x tp2 checkpoint resumed by a pipeline."""
    d = os.path.join(work, "resume")
    shutil.rmtree(d, ignore_errors=True)
    ref = reference.make("gpt2", VARIANT, d)
    stages = two_stages(hp, ref, d, log)
    pp, one = os.path.join(d, "pp.toml"), os.path.join(d, "one.toml")
    tppp, three, tp4, z3 = (os.path.join(d, f"{n}.toml") for n in ("tppp", "three", "tp4", "z3"))
    pp_recipe(pp, ref, stages, {"schedule": "zb-h1", "micro_batches": 2})
    pp_recipe(tppp, ref, stages, {"tp": 2, "schedule": "1f1b", "micro_batches": 2})
    pp_recipe(three, ref, stages, {"dp": 2, "tp": 2, "optimizer_shard": 2, "schedule": "1f1b",
                                   "micro_batches": 1})
    pp_recipe(z3, ref, stages, {"dp": 2, "optimizer_shard": 3, "bucket_mb": 0.05,
                                "schedule": "1f1b", "micro_batches": 2})
    rt.write_recipe(one, ref.model, ref.train, {"batch": models.BATCH})
    rt.write_recipe(tp4, ref.model, ref.train, {"batch": models.BATCH}, parallel={"tp": 4})
    dptp = os.path.join(d, "dptp.toml")  # writes a sharded checkpoint, each rank its pieces
    rt.write_recipe(dptp, ref.model, ref.train, {"batch": models.BATCH},
                    parallel={"dp": 2, "tp": 2, "optimizer_shard": 1})
    details = []
    for tag, first, then in [("pp2 -> one rank", pp, one), ("one rank -> pp2", one, pp),
                             ("tp2 x pp2 -> one rank", tppp, one),
                             ("pp2 -> tp2 x pp2", pp, tppp),
                             ("dp2 x tp2 x pp2 (zero 2) -> tp4", three, tp4),
                             ("dp2 x tp2 x pp2 (zero 2) -> one rank", three, one),
                             ("dp2 x tp2 (zero 1, sharded) -> tp2 x pp2", dptp, tppp),
                             ("dp2 x pp2 (zero 3) -> one rank", z3, one),
                             ("one rank -> dp2 x pp2 (zero 3)", one, z3)]:
        details.append(resume_pair(hp, d, ref, tag, first, then, one, len(details), log))
    return "; ".join(details)


def resumed_deep(hp, work, log):
    """3 steps at dp=2 x pp=2 with optimizer_shard 2 (zb-h1), checkpointed (the sharded optimizer
    state gathered), resumed for 2 at pp=4 (1f1b): the uninterrupted 5."""
    d = os.path.join(work, "resume-deep")
    shutil.rmtree(d, ignore_errors=True)
    ref = reference.make("gpt2-deep", VARIANT, d)
    four, two = os.path.join(d, "pp4.toml"), os.path.join(d, "dp2pp2.toml")
    pp_recipe(four, ref, split_stages(hp, ref, d, log, 4), {"schedule": "1f1b",
                                                             "micro_batches": 4})
    pp_recipe(two, ref, split_stages(hp, ref, d, log, 2), {"dp": 2, "optimizer_shard": 2,
                                                            "schedule": "zb-h1",
                                                            "micro_batches": 2})
    ckpt, m1, m2 = (os.path.join(d, n) for n in ("ckpt", "a.jsonl", "b.jsonl"))
    saved = os.path.join(d, "out.onnx")
    rc, out = launch(hp, two, "simulate", ["--inputs", ref.inputs, "--steps", "3", "--metrics",
                                           m1, "--checkpoint", ckpt], log)
    if rc != 0:
        raise rt.Failure(f"dp2 x pp2, first 3 steps: exit {rc}: {rt.first_error(out)}")
    rc, out = launch(hp, four, "simulate", ["--inputs", ref.inputs, "--steps", "2", "--resume",
                                            ckpt, "--metrics", m2, "--save-model", saved], log)
    if rc != 0:
        raise rt.Failure(f"pp4, resumed: exit {rc}: {rt.first_error(out)}")
    detail, _ = rt.compare(ref, rt.read_metrics(m1, 1, 3) + rt.read_metrics(m2, 4, 2), saved)
    return f"dp2 x pp2 (zero 2) -> pp4: {detail.split('  ')[0]}"


def resumed_experts(hp, work, log):
    """The MoE at dp=2 x pp=2 with its stages' experts shared out over ep=2: 3 steps checkpointed
    (ZeRO-2: each member's state gathered whole) resumed for 2 at one rank and at dp=2 x ep=2
    without stages, and the reverse from one rank and from a sharded dp=2 x ep=2 checkpoint: the
    uninterrupted 5."""
    d = os.path.join(work, "resume-ep")
    shutil.rmtree(d, ignore_errors=True)
    ref = reference.make("moe", VARIANT, d)
    stages = two_stages(hp, ref, d, log)
    eppp, one, ep = (os.path.join(d, f"{n}.toml") for n in ("eppp", "one", "ep"))
    pp_recipe(eppp, ref, stages, {"dp": 2, "expert_parallel": 2, "optimizer_shard": 2,
                                  "schedule": "1f1b", "micro_batches": 2})
    rt.write_recipe(one, ref.model, ref.train, {"batch": models.BATCH})
    rt.write_recipe(ep, ref.model, ref.train, {"batch": models.BATCH},
                    parallel={"dp": 2, "expert_parallel": 2, "optimizer_shard": 1})
    details = []
    for tag, first, then in [("dp2 x pp2 x ep2 -> one rank", eppp, one),
                             ("dp2 x pp2 x ep2 -> dp2 x ep2", eppp, ep),
                             ("one rank -> dp2 x pp2 x ep2", one, eppp),
                             ("dp2 x ep2 (sharded) -> dp2 x pp2 x ep2", ep, eppp)]:
        details.append(resume_pair(hp, d, ref, tag, first, then, one, len(details), log))
    return "; ".join(details)


def verified(hp, work, log):
    """`hp verify` of pp=2 zb-h1 training recipes over mpirun, 3 steps against one rank: GPT-2, and
    the Mixtral loop at dp=2 x pp=2 with its stages' experts shared out over ep=2."""
    d = os.path.join(work, "verify")
    shutil.rmtree(d, ignore_errors=True)
    details = []
    for name, extra, layout in [
            ("gpt2", {"schedule": "zb-h1", "micro_batches": 4},
             "pp=2, zb-h1 schedule, 4 micro-batches"),
            ("moe-loop", {"dp": 2, "expert_parallel": 2, "schedule": "zb-h1", "micro_batches": 2},
             "2 micro-batches, experts shared out over expert_parallel = 2")]:
        ref = reference.make(name, VARIANT, os.path.join(d, name), steps=1)
        recipe = os.path.join(d, name, "verify.toml")
        pp_recipe(recipe, ref, two_stages(hp, ref, os.path.join(d, name), log), extra)
        root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
        rc, out = rt.run([hp, "verify", recipe, "--inputs", ref.inputs, "--steps", "3",
                          "--threads", "1"] + root, log)
        if rc != 0:
            raise rt.Failure(f"{name}: hp verify exit {rc}: {rt.first_error(out)}")
        checks = [line for line in out.splitlines() if ": max abs error" in line]
        if len(checks) < 4 or any(not line.endswith(": ok") for line in checks):
            raise rt.Failure(f"{name}: hp verify's report is not all ok: {checks[:5]}")
        # The job is not the one-rank run again: micro-batches sum in another order.
        if all("max abs error 0," in line for line in checks):
            raise rt.Failure(f"{name}: hp verify found no difference at all: did the job run one rank?")
        if layout not in out:
            raise rt.Failure(f"{name}: hp verify does not name the layout ({layout})")
        details.append(f"{name}: {len(checks)} checks ok (3 losses, {len(checks) - 3} weights)")
    return "; ".join(details)


def memory(hp, work, log):
    """At m = 4 the first stage holds 4 micro-batches' stashes under GPipe, 2 under 1F1B: the
    metrics' peak_bytes (executor peak + tensors held between actions) must show it."""
    d = os.path.join(work, "memory")
    shutil.rmtree(d, ignore_errors=True)
    ref = reference.make("gpt2", VARIANT, d, steps=1)
    stages = two_stages(hp, ref, d, log)
    peaks = {}
    for schedule in ("gpipe", "1f1b"):
        recipe = os.path.join(d, f"{schedule}.toml")
        pp_recipe(recipe, ref, stages, {"schedule": schedule, "micro_batches": 4})
        m = os.path.join(d, f"{schedule}.jsonl")
        rc, out = launch(hp, recipe, "simulate", ["--inputs", ref.inputs, "--steps", "1",
                                                  "--metrics", m], log)
        if rc != 0:
            raise rt.Failure(f"{schedule}: exit {rc}: {rt.first_error(out)}")
        with open(m) as f:
            peaks[schedule] = json.loads(f.readline())["peak_bytes"]
    if not peaks["gpipe"] > peaks["1f1b"] > 0:
        raise rt.Failure(f"peak bytes gpipe {peaks['gpipe']}, 1f1b {peaks['1f1b']}: 1f1b should "
                         "hold fewer stashes")
    return f"stage 0 peak: gpipe {peaks['gpipe']} B, 1f1b {peaks['1f1b']} B at m = 4"


def token_stream(hp, work, log):
    """--data at pp=2 (1f1b, m=2): 4 steps, and 2 + 2 with a resume, give one rank's losses."""
    d = os.path.join(work, "stream")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    data = np.frombuffer(open(rt.GPL, "rb").read(), dtype=np.uint8).astype("<u2")
    tokens = os.path.join(d, "tokens.bin")
    data.tofile(tokens)
    spec = models.STREAM["gpt2"]
    torch.manual_seed(0)
    exported = models.export(spec, spec.make().train(), os.path.join(d, "model.onnx"))
    table = reference.train_table("gpt2", reference.Variant("adamw", 3e-3), 1.0, exported.frozen,
                                  4)
    workload = {"mode": "train", "dtype": "fp32", "optimizer": "adamw",
                "global_batch": models.BATCH, "seq": spec.seq}
    stages = two_stages(hp, reference.Reference(exported.path, *([None] * 8)), d, log)
    one, pp = os.path.join(d, "one.toml"), os.path.join(d, "pp.toml")
    rt.write_recipe(one, exported.path, table, {"batch": models.BATCH}, workload=workload)
    rt.write_recipe(pp, exported.path, table, {"batch": models.BATCH}, stages, workload=workload,
                    parallel={"pp": 2, "schedule": "1f1b", "micro_batches": 2})
    runs = {}
    for tag, recipe, how, args in [
            ("one", one, "one", ["--steps", "4"]), ("pp", pp, "simulate", ["--steps", "4"]),
            ("first", pp, "simulate", ["--steps", "2", "--checkpoint", os.path.join(d, "ck")]),
            ("then", pp, "simulate", ["--steps", "2", "--resume", os.path.join(d, "ck")])]:
        m = os.path.join(d, f"{tag}.jsonl")
        rc, out = launch(hp, recipe, how, ["--data", tokens, "--metrics", m] + args, log)
        if rc != 0:
            raise rt.Failure(f"--data {tag}: exit {rc}: {rt.first_error(out)}")
        with open(m) as f:
            runs[tag] = [json.loads(line)["loss"] for line in f if line.strip()]
    want = runs["one"]
    worst = 0.0
    for tag, got in [("pp", runs["pp"]), ("resumed", runs["first"] + runs["then"])]:
        if len(got) != len(want):
            raise rt.Failure(f"--data {tag}: {len(got)} steps, want {len(want)}")
        rel = max(abs(a - b) / abs(b) for a, b in zip(got, want))
        worst = max(worst, rel)
        if rel > 1e-5:
            raise rt.Failure(f"--data {tag}: losses {got} differ from one rank's {want}")
    if len(set(want)) < len(want):
        raise rt.Failure(f"--data: the losses {want} repeat: the batches did not change")
    return f"4 steps and 2 + 2 resumed equal one rank's losses (rel {worst:.1e})"


def malformed(hp, work, log):
    """Pipeline recipes hp cannot train: exit 3 (bad input) or 8 (not implemented), with why."""
    d = os.path.join(work, "malformed")
    shutil.rmtree(d, ignore_errors=True)
    ref = reference.make("gpt2", VARIANT, d, steps=1)
    stages = two_stages(hp, ref, d, log)
    cases = [
        ("micro-batches", stages, {"micro_batches": 3}, [], 3, "does not split into"),
        ("overlap", [stages[0], stages[0] + "-" + stages[1].split("-")[-1]], {}, [], 3,
         "is in stage 0 and stage 1"),
        ("one stage", [stages[0]], {"pp": 2}, [], 3, "stages but pp"),
        ("three stages, a layer twice", stages + [stages[1]], {"pp": 3}, [], 3, "is in stage"),
        ("interleaved, each layer twice", stages * 2,
         {"pp": 2, "schedule": "interleaved", "virtual_stages": 2}, [], None, ""),
    ]
    seen = []
    for tag, st, extra, args, code, text in cases:
        recipe = os.path.join(d, f"{tag.replace(' ', '-')}.toml")
        pp_recipe(recipe, ref, st, dict({"micro_batches": 2}, **extra))
        rc, out = launch(hp, recipe, "simulate",
                         (args or ["--inputs", ref.inputs]) + ["--steps", "1"], log)
        if code is None:  # refused one way or another, never trained
            if rc == 0:
                raise rt.Failure(f"{tag}: hp launch trained it")
            seen.append(f"{tag} {rc}")
            continue
        if rc != code or text not in out:
            raise rt.Failure(f"{tag}: exit {rc} (want {code} with '{text}'): "
                             f"{rt.first_error(out)}")
        seen.append(f"{tag} {rc}")
    return ", ".join(seen)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("hp")
    ap.add_argument("work")
    ap.add_argument("--models", default="gpt2,llama,vit,moe")
    ap.add_argument("--deep-models", default="gpt2-deep,llama-deep")
    ap.add_argument("--ep-models", default="moe,moe-scatter,moe-loop",
                    help="MoE exports trained with expert parallelism inside the stages")
    ap.add_argument("--layouts", help="only these layouts (comma-separated tags, e.g. "
                    "dp2xpp2-zero3-1f1b-m2); the cross-cutting checks are then left out")
    ap.add_argument("--skip", default="",
                    help="leave out runs whose label contains one of these (comma-separated; the "
                         "sanitizer builds' ctest leaves out some, for time)")
    a = ap.parse_args()
    only = set(a.layouts.split(",")) if a.layouts else None
    skipped = [x for x in a.skip.split(",") if x]
    help_text = subprocess.run([a.hp, "launch", "--help"], capture_output=True, text=True).stdout
    if "--simulate" not in help_text:
        print(f"skipped: {a.hp} launch has no --simulate")
        return 77
    os.makedirs(a.work, exist_ok=True)
    torch.set_num_threads(1)
    fails = 0

    def report(ok, label, detail):
        nonlocal fails
        fails += not ok
        print(f"{'ok' if ok else 'FAIL':8} {label:30} {detail}", flush=True)

    log_path = os.path.join(a.work, "pipeline.log")
    with open(log_path, "w") as log:
        for name in a.models.split(",") if a.models else []:
            d = os.path.join(a.work, name)
            shutil.rmtree(d, ignore_errors=True)
            ref = reference.make(name, VARIANT, d)
            try:
                stages = two_stages(a.hp, ref, d, log)
            except Exception as e:
                report(False, f"{name} stages", rt.describe(e))
                continue
            for tag, extra, how in SCHEDULES + DP_PP + TP_PP:
                if (how == "mpirun" and name not in MPIRUN_MODELS) or (only and tag not in only):
                    continue
                label = f"{name} {'' if tag[:2] in ('dp', 'tp') else 'pp2 '}{tag} ({how})"
                if any(x in label for x in skipped):
                    continue
                try:
                    report(True, label, schedule_run(a.hp, d, ref, stages, tag, extra, how, log))
                except Exception as e:
                    report(False, label, rt.describe(e))
        ep_tags = {t for t, _, _ in EP_PP + LOOP_TP_PP}
        for name in a.ep_models.split(",") if a.ep_models and not (only and not only & ep_tags) else []:
            d = os.path.join(a.work, f"{name}-ep")
            shutil.rmtree(d, ignore_errors=True)
            ref = reference.make(name, VARIANT, d)
            for tag, extra, how in EP_PP + (LOOP_TP_PP if name == "moe-loop" else []):
                label = f"{name} {tag} ({how})"
                if (only and tag not in only) or any(x in label for x in skipped):
                    continue
                # Both stages hold an expert layer; the Mixtral loop's are summed.
                expect = ["expert layers: ", " of 2 dispatched"] if "expert_parallel" in extra else []
                if name == "moe-loop" and expect:
                    expect.append("(2 of them a loop adding each expert's rows")
                try:
                    stages = two_stages(a.hp, ref, d, log)
                    report(True, label, schedule_run(a.hp, d, ref, stages, tag, extra, how, log,
                                                     expect))
                except Exception as e:
                    report(False, label, rt.describe(e))
        for name in a.deep_models.split(",") if a.deep_models else []:
            d = os.path.join(a.work, name)
            shutil.rmtree(d, ignore_errors=True)
            ref = reference.make(name, VARIANT, d)
            for tag, n, extra, how in DEEP:
                if only and tag not in only:
                    continue
                label = f"{name} {tag} ({how})"
                if any(x in label for x in skipped):
                    continue
                try:
                    stages = split_stages(a.hp, ref, d, log, n)
                    report(True, label, schedule_run(a.hp, d, ref, stages, tag, extra, how, log))
                except Exception as e:
                    report(False, label, rt.describe(e))
        for label, fn in [] if only else [("resume across layouts", resumed), ("token stream (--data)", token_stream),
                          ("resume dp2 x pp2 -> pp4", resumed_deep),
                          ("resume expert-parallel stages", resumed_experts),
                          ("hp verify (mpirun)", verified),
                          ("1f1b holds less than gpipe", memory), ("malformed recipes", malformed)]:
            try:
                report(True, label, fn(a.hp, a.work, log))
            except Exception as e:
                report(False, label, rt.describe(e))
    print(f"\n{fails} failing (log: {log_path})")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
