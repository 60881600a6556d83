#!/usr/bin/python3
"""End-to-end data-parallel training test: several ranks train what one rank (and PyTorch) trains.

For each model of models.py (exported for training with a dynamic batch axis, as users export), torch
runs 5 AdamW steps with gradient clipping on one fixed batch of 4 (reference.py), and

    hp launch RECIPE --inputs BATCH_DIR --metrics m.jsonl --save-model out.onnx

trains the same 5 steps with the recipe's [parallel] set to each layout below, every rank taking its
rows of the batch. Each step's loss must be torch's within 1e-4 (relative), the gradient norm
within 1e-3, and the saved weights within 1% of torch's update (run_training.compare):

    dp=2 (mpirun)                       plain data parallelism, gradients all-reduced
    dp=2 optimizer_shard 1/2 (--simulate) and 3 (mpirun)
    dp=4 optimizer_shard 2, shard_group 2 (--simulate): HSDP, one row per rank
    dp=2 and dp=4 HSDP at optimizer_shard 3 in 50 KiB buckets (--simulate): the parameters
                                        gathered for each use (tid 3 of the trace)
    tp=2 (--simulate, and mpirun)       each rank trains hp shard's partition of the recipe
    tp=4 (--simulate)                   (Llama's two kv heads: k/v projections replicated)
    dp=2 x tp=2 (--simulate), and with optimizer_shard 2 (mpirun)
    dp=2 x ep=2 (mpirun, --simulate), dp=4 x ep=2 and x ep=4 (--simulate): the MoE's experts shared
                                        out (expert_parallel.h); also the scatter-routed MoE
    dp=2 x ep=2 optimizer_shard 1 (mpirun), dp=4 x ep=2 optimizer_shard 2 (--simulate) and 3
                                        (mpirun): ZeRO over the shared weights' and the experts'
                                        groups, buckets reduced while the backward runs; at 3
                                        the experts held in shards over their two ranks too
    dp=4 x ep=2 and x ep=4 with shard_group 2 (--simulate; ZeRO-3 over mpirun): HSDP beside
                                        expert parallelism
    the MoE as Mixtral's loop (moe-loop: dp=2 x ep=2 over mpirun, dp=4 x ep=2 and x ep=4, and
    ZeRO-3) and as a sum of gated experts (moe-sum: dp=2 x ep=2, dp=4 x ep=2), --simulate: each
                                        layer's rows all-gathered, its partial sums
                                        reduce-scattered (the trace must hold hp.ReduceScatter)

Then, on the GPT-2 export: `hp verify RECIPE --inputs BATCH --steps 3` of a dp=2 ZeRO-1 recipe over
mpirun must report every loss and weight ok; 3 steps at dp=2 with optimizer_shard 2 and --checkpoint, resumed for 2
more at one rank, at dp=4 HSDP and at dp=2 ZeRO-3, must equal the uninterrupted 5 (losses and
weights as above), and so must 3 at dp=4 HSDP ZeRO-3 resumed at one rank and at dp=2 ZeRO-1 (and
ZeRO-3's peak must be below ZeRO-2's);
the same from tp=2 (to one rank and tp=2), from dp2 x tp2 ZeRO-1 over 4 ranks (a sharded
checkpoint: to tp=4, one rank and dp2 ZeRO-2; then a flipped byte and a missing rank's files are
refused naming the tensor) and from dp2 x ep2 ZeRO-1 (to one rank, dp4 x ep4, dp4 x ep2 ZeRO-2
and dp=2);
`hp verify` of a dp2 x ep2 MoE recipe; expert parallelism refused (exit 3) on a model without
expert layers and where ep does not divide the experts; and a rank killed (SIGKILL) in the middle of a long mpirun training on a token stream must end the
job within 20 s with a non-zero exit, leaving the last checkpoint complete (a resume from it
trains).

Usage: run_distributed.py HP_BINARY WORK_DIR [--models a,b] [--layouts t,u] [--checks a,b]
                          [--no-faults] [--simulate-only]
Exit status 0 when everything holds, 1 when something does not, 77 (CTest's skip) without torch.
"""
import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time

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

LAYOUTS = [
    ("dp2", {"dp": 2}, "mpirun"),
    ("dp2-zero1", {"dp": 2, "optimizer_shard": 1}, "simulate"),
    ("dp2-zero2", {"dp": 2, "optimizer_shard": 2}, "simulate"),
    ("dp2-zero3", {"dp": 2, "optimizer_shard": 3}, "mpirun"),
    ("dp4-hsdp2", {"dp": 4, "optimizer_shard": 2, "shard_group": 2}, "simulate"),
    # ZeRO-3 in buckets of 50 KiB: these models' parameters gathered for each use in many parts
    ("dp2-zero3-buckets", {"dp": 2, "optimizer_shard": 3, "bucket_mb": 0.05}, "simulate"),
    ("dp4-hsdp2-zero3", {"dp": 4, "optimizer_shard": 3, "shard_group": 2, "bucket_mb": 0.05},
     "simulate"),
    # ... gathered once a step, kept from the forward's use to the end of the backward
    ("dp2-zero3-step", {"dp": 2, "optimizer_shard": 3, "bucket_mb": 0.05,
                        "zero3_gather": "per-step"}, "simulate"),
    ("tp2", {"tp": 2}, "simulate"),
    ("tp2", {"tp": 2}, "mpirun"),
    ("tp4", {"tp": 4}, "simulate"),
    ("dp2xtp2", {"dp": 2, "tp": 2}, "simulate"),
    ("dp2xtp2-zero2", {"dp": 2, "tp": 2, "optimizer_shard": 2}, "mpirun"),
    # FSDP with tensor parallelism: each member's slices sharded over its data-parallel peers
    ("dp2xtp2-zero3", {"dp": 2, "tp": 2, "optimizer_shard": 3, "bucket_mb": 0.05}, "simulate"),
]
# Expert parallelism, for the models with expert layers: the experts shared out over groups of ep
# data-parallel ranks (dp4-ep2: two groups, each expert held by two ranks).
EP_LAYOUTS = [
    ("dp2-ep2", {"dp": 2, "expert_parallel": 2}, "mpirun"),
    ("dp2-ep2", {"dp": 2, "expert_parallel": 2}, "simulate"),
    # The all-gather dispatch the routed one replaces (both compute what the export computes).
    ("dp2-ep2-gather", {"dp": 2, "expert_parallel": 2, "expert_dispatch": "gather"}, "simulate"),
    ("dp4-ep2", {"dp": 4, "expert_parallel": 2}, "simulate"),
    ("dp4-ep4", {"dp": 4, "expert_parallel": 4}, "simulate"),
    ("dp2-ep2-zero1", {"dp": 2, "expert_parallel": 2, "optimizer_shard": 1}, "mpirun"),
    ("dp4-ep2-zero2", {"dp": 4, "expert_parallel": 2, "optimizer_shard": 2}, "simulate"),
    ("dp4-ep2-zero3", {"dp": 4, "expert_parallel": 2, "optimizer_shard": 3}, "mpirun"),
    # The shared weights in 2 KiB buckets: gathered for each use in several parts
    ("dp4-ep2-zero3-buckets",
     {"dp": 4, "expert_parallel": 2, "optimizer_shard": 3, "bucket_mb": 0.002}, "simulate"),
    ("dp4-ep2-hsdp2", {"dp": 4, "expert_parallel": 2, "optimizer_shard": 2, "shard_group": 2},
     "simulate"),
    ("dp4-ep4-hsdp2", {"dp": 4, "expert_parallel": 4, "optimizer_shard": 2, "shard_group": 2},
     "simulate"),
    ("dp4-ep2-hsdp2-zero3",
     {"dp": 4, "expert_parallel": 2, "optimizer_shard": 3, "shard_group": 2}, "mpirun"),
]
EXPERT_MODELS = {"moe", "moe-scatter", "moe-loop", "moe-sum"}
VARIANT = "adamw-clip"


def train(hp, recipe, how, args, log, timeout=300):
    extra = ["--simulate"] if how == "simulate" else []
    return rt.launch(hp, recipe, extra + args, log, timeout)


def layout_run(hp, d, ref, tag, parallel, how, log, summed=False):
    """One layout's 5 steps against torch's. `summed`: the model's expert layers are loops adding
    each expert's rows into a sum, run on all-gathered rows and reduce-scattered back."""
    tag = f"{tag}-{how}"
    recipe = os.path.join(d, f"{tag}.toml")
    rt.write_recipe(recipe, ref.model, ref.train, {"batch": models.BATCH}, parallel=parallel)
    metrics, saved = os.path.join(d, f"{tag}.jsonl"), os.path.join(d, f"{tag}.onnx")
    trace = os.path.join(d, f"{tag}.trace.json")
    rc, out = train(hp, recipe, how, ["--inputs", ref.inputs, "--metrics", metrics,
                                      "--save-model", saved, "--trace", trace, "--run-dir",
                                      os.path.join(d, f"run-{tag}")], log)
    if rc != 0:
        raise rt.Failure(f"hp launch exit {rc}: {rt.first_error(out)}")
    # ZeRO-3 under expert parallelism: where two ranks of a shard group hold each expert, the
    # experts are sharded over them too, not only the shared weights over the group.
    ep = parallel.get("expert_parallel", 1)
    if parallel.get("optimizer_shard") == 3 and ep > 1 and \
            parallel.get("shard_group", parallel["dp"]) > ep and \
            "ZeRO-3: the experts held in shards" not in out:
        raise rt.Failure("ZeRO-3 does not hold the experts in shards: no such line in the output")
    rows = rt.read_metrics(metrics, 1, reference.STEPS)
    detail, (worst, name) = rt.compare(ref, rows, saved)
    # Buckets reduced during the backward, on the communication thread: also where ep = dp, whose
    # backward runs the experts' collectives over the same ranks (on another channel).
    # ZeRO-3: parameters (under expert parallelism, the shared ones) gathered for their uses.
    gathers = parallel.get("optimizer_shard") == 3
    counted, ops = check_trace(trace, parallel.get("dp", 1) * parallel.get("tp", 1),
                               "dp" in parallel, gathers)
    routed = ""
    if parallel.get("expert_parallel", 1) > 1:
        # Both expert models' gates keep only the top-k pairs: routed unless asked to gather.
        want = parallel.get("expert_dispatch", "routed") == "routed" and not summed
        if summed and "hp.ReduceScatter" not in ops:
            raise rt.Failure("trace: the loop's partial sums are not reduce-scattered")
        if ("hp.Dispatch" in ops) != want or ("hp.AllGather" in ops) == want:
            raise rt.Failure(f"trace: the expert dispatch is not {'routed' if want else 'gather'}"
                             f" (hp ops: {sorted(o for o in ops if o and o.startswith('hp.'))})")
        routed = "  summed" if summed else "  routed" if want else "  all-gathered"
    return (f"{detail}  weights {worst:.1e} of the update ({name or 'all exact'})" +
            (f"  {counted} gathers a step" if gathers else "") + routed)


def check_trace(path, ranks, buckets_expected=True, gathers_expected=False):
    """--trace: one Chrome trace with every rank's steps, the gradient model's nodes, (data
    parallelism) its gradient buckets and (ZeRO-3) its parameter gathers, parts merged. Returns the
    gathers of a step (0 when none are expected) and the ops of the nodes the ranks ran."""
    with open(path) as f:
        events = [e for e in json.load(f)["traceEvents"] if e["ph"] == "X"]
    per_step = 0
    for r in range(ranks):
        gathers = [e for e in events if e["pid"] == r and e["tid"] == 3]
        if gathers_expected:
            # Every bucket at least once a step (the forward's use; the backward's too where a
            # bucket is read far apart), and the same number on every rank (collectives).
            if not gathers or len(gathers) % reference.STEPS or (per_step and
                                                                  len(gathers) != per_step * reference.STEPS):
                raise rt.Failure(f"trace: rank {r} has {len(gathers)} parameter gathers over "
                                 f"{reference.STEPS} steps")
            per_step = len(gathers) // reference.STEPS
        elif gathers:
            raise rt.Failure(f"trace: rank {r} gathers parameters without ZeRO-3")
        steps = [e for e in events if e["pid"] == r and e["name"].startswith("forward+backward")]
        buckets = [e for e in events if e["pid"] == r and e["tid"] == 1]
        if len(steps) != reference.STEPS or (buckets_expected and not buckets):
            raise rt.Failure(f"trace: rank {r} has {len(steps)} steps and {len(buckets)} bucket "
                             "reductions")
        if any(e["dur"] < 0 for e in events):
            raise rt.Failure("trace: an event of negative duration")
        # The gradient model's nodes, each inside one of the rank's forward+backward spans.
        nodes = [e for e in events if e["pid"] == r and e["tid"] == 2]
        inside = [n for n in nodes if any(s["ts"] <= n["ts"] and n["ts"] + n["dur"] <=
                                          s["ts"] + s["dur"] + 1 for s in steps)]
        if not nodes or len(inside) != len(nodes) or not all("op" in n.get("args", {})
                                                             for n in nodes):
            raise rt.Failure(f"trace: rank {r} has {len(nodes)} node events, {len(inside)} of "
                             "them inside a step, or one without its op")
    parts = [p for p in os.listdir(os.path.dirname(path)) if ".trace.json.rank-" in p]
    if parts:
        raise rt.Failure(f"trace: part files left behind: {parts}")
    return per_step, {e.get("args", {}).get("op") for e in events if e["tid"] == 2}


def control_tp(hp, work, log):
    """The scripted refinement model (an ONNX Loop and If reading weights from the outer graph) at
    tp=2: hp shard keeps what the subgraphs read whole, and training equals torch's. (Its
    conditions read the whole batch, so under dp each rank would branch on its own rows, as DDP
    does, and torch's single-process numbers would not apply.)"""
    d = os.path.join(work, "control")
    shutil.rmtree(d, ignore_errors=True)
    ref = reference.make("control", VARIANT, d)
    return layout_run(hp, d, ref, "tp2", {"tp": 2}, "simulate", log)


def verified(hp, work, log, parallel=None, name="gpt2"):
    """`hp verify` of a dp=2 ZeRO-1 (or `parallel`) training recipe over mpirun: 3 steps against
    one rank."""
    tag = "-".join(f"{k}{v}" for k, v in (parallel or {}).items())
    d = os.path.join(work, "verify" if parallel is None else f"verify-{name}-{tag}")
    shutil.rmtree(d, ignore_errors=True)
    ref = reference.make(name, VARIANT, d)
    recipe = os.path.join(d, "verify.toml")
    rt.write_recipe(recipe, ref.model, ref.train, {"batch": models.BATCH},
                    parallel=parallel or {"dp": 2, "optimizer_shard": 1})
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    rc, out = rt.run([hp, "verify", recipe, "--inputs", ref.inputs, "--steps", "3", "--threads",
                      "1"] + root, log)
    if rc != 0:
        raise rt.Failure(f"hp verify exit {rc}: {rt.first_error(out)}")
    checks = [line for line in out.splitlines() if ": max abs error" in line]
    if len(checks) < 4 or any(not line.endswith(": ok") for line in checks):
        raise rt.Failure(f"hp verify's report is not all ok: {checks[:5]}")
    return f"{len(checks)} checks ok (3 losses, {len(checks) - 3} weights)"


def checkpoint_then_resume(hp, d, name, first, targets, log):
    """3 steps of `name` at the `first` layout over mpirun (at one rank: {}) with --checkpoint, then 2 more resumed
    from that checkpoint at each of `targets` ([(tag, parallel, how)]): each must give the 5 steps
    torch ran. Returns one "tag: loss rel ..." per target."""
    ref = reference.make(name, VARIANT, d)
    recipe = os.path.join(d, "first.toml")
    rt.write_recipe(recipe, ref.model, ref.train, {"batch": models.BATCH}, parallel=first)
    ckpt, m1 = os.path.join(d, "ckpt"), os.path.join(d, "first.jsonl")
    run_dir = ["--run-dir", os.path.join(d, "run")] if first else []  # none at one rank
    rc, out = train(hp, recipe, "mpirun", ["--inputs", ref.inputs, "--steps", "3", "--metrics", m1,
                                           "--checkpoint", ckpt] + run_dir, log)
    if rc != 0:
        raise rt.Failure(f"{name} {first}, 3 steps: exit {rc}: {rt.first_error(out)}")
    head = rt.read_metrics(m1, 1, 3)
    details = []
    for tag, parallel, how in targets:
        recipe = os.path.join(d, f"{tag}.toml")
        rt.write_recipe(recipe, ref.model, ref.train, {"batch": models.BATCH}, parallel=parallel)
        m, s = os.path.join(d, f"{tag}.jsonl"), os.path.join(d, f"{tag}.onnx")
        rc, out = train(hp, recipe, how, ["--inputs", ref.inputs, "--steps", "2", "--resume", ckpt,
                                          "--metrics", m, "--save-model", s], log)
        if rc != 0:
            raise rt.Failure(f"{name} resume at {tag}: exit {rc}: {rt.first_error(out)}")
        detail, _ = rt.compare(ref, head + rt.read_metrics(m, 4, 2), s)
        details.append(f"{tag}: {detail.split('  ')[0]}")
    return details


def fresh(work, name):
    d = os.path.join(work, name)
    shutil.rmtree(d, ignore_errors=True)
    return d


def resharded(hp, work, log):
    """3 steps at dp2 x ZeRO-2, resumed for 2 at one rank and at dp4 HSDP: the 5 steps torch ran."""
    details = checkpoint_then_resume(
        hp, fresh(work, "reshard"), "gpt2", {"dp": 2, "optimizer_shard": 2},
        [("one-rank", {}, "one"),
         ("dp4-hsdp2", {"dp": 4, "optimizer_shard": 2, "shard_group": 2}, "simulate"),
         ("dp2-zero3", {"dp": 2, "optimizer_shard": 3, "bucket_mb": 0.05}, "simulate"),
         ("tp2", {"tp": 2}, "simulate")], log)
    return "dp2 zero2 x3 -> " + "; ".join(details)


def zero3_resharded(hp, work, log):
    """3 steps at dp4 HSDP ZeRO-3 in 50 KiB buckets (mpirun: the parameters gathered for every
    use, the checkpoint's all-gathered once), resumed for 2 at one rank and at dp=2 ZeRO-1: the 5
    steps torch ran. Then ZeRO-3's executor peak is below ZeRO-2's on the same layout."""
    d = fresh(work, "reshard-zero3")
    details = checkpoint_then_resume(
        hp, d, "gpt2", {"dp": 4, "optimizer_shard": 3, "shard_group": 2, "bucket_mb": 0.05},
        [("one-rank", {}, "one"), ("dp2-zero1", {"dp": 2, "optimizer_shard": 1}, "simulate")],
        log)
    peaks = {}
    for tag in ("dp2-zero2-simulate", "dp2-zero3-buckets-simulate"):
        path = os.path.join(work, "gpt2", f"{tag}.jsonl")
        if not os.path.exists(path):  # --models without gpt2
            return "dp4 hsdp2 zero3 x3 -> " + "; ".join(details) + "; peaks not compared"
        with open(path) as f:
            peaks[tag] = max(json.loads(line)["peak_bytes"] for line in f if line.strip())
    zero2, zero3 = peaks["dp2-zero2-simulate"], peaks["dp2-zero3-buckets-simulate"]
    if not zero3 < zero2:
        raise rt.Failure(f"ZeRO-3's peak {zero3} B is not below ZeRO-2's {zero2} B at dp=2")
    return (f"dp4 hsdp2 zero3 x3 -> " + "; ".join(details) +
            f"; peak at dp=2: ZeRO-3 {zero3} B, ZeRO-2 {zero2} B")


def tp_resharded(hp, work, log):
    """3 steps at tp=2 (mpirun), resumed for 2 at one rank and at tp=2: the 5 steps torch ran."""
    d = fresh(work, "reshard-tp")
    details = []
    for name in ["gpt2", "mlp"]:  # a fused q|k|v and a tied embedding; partial Gemm biases
        details += [f"{name} {x}" for x in checkpoint_then_resume(
            hp, os.path.join(d, name), name, {"tp": 2},
            [("one-rank", {}, "one"), ("tp2", {"tp": 2}, "simulate")], log)]
    return "tp2 x3 -> " + "; ".join(details)


def fsdp_tp_resharded(hp, work, log):
    """FSDP with tensor parallelism on the MLP (row-parallel Gemm biases: partial addends, which
    ZeRO-3's gathers must hand the executor divided): 3 steps at dp2 x tp2 ZeRO-3 over mpirun,
    resumed for 2 at one rank and at tp=2; and a one-rank checkpoint resumed at dp2 x tp2 ZeRO-3.
    Each gives the 5 steps torch ran."""
    d = fresh(work, "reshard-fsdp-tp")
    fsdp_tp = {"dp": 2, "tp": 2, "optimizer_shard": 3, "bucket_mb": 0.05}
    details = checkpoint_then_resume(
        hp, os.path.join(d, "from-fsdp-tp"), "mlp", fsdp_tp,
        [("one-rank", {}, "one"), ("tp2", {"tp": 2}, "simulate")], log)
    details += checkpoint_then_resume(hp, os.path.join(d, "from-one"), "mlp", {},
                                      [("dp2xtp2-zero3", fsdp_tp, "simulate")], log)
    return "mlp dp2 x tp2 zero3 x3 -> " + "; ".join(details[:2]) + "; one rank x3 -> " + details[2]


def grid_resharded(hp, work, log):
    """3 steps at dp2 x tp2 with ZeRO-1 (4 ranks, mpirun): a sharded checkpoint, each rank's pieces
    only. Resumed for 2 at tp=4, at one rank and at dp2 x ZeRO-2: the 5 steps torch ran."""
    details = checkpoint_then_resume(
        hp, fresh(work, "reshard-grid"), "gpt2", {"dp": 2, "tp": 2, "optimizer_shard": 1},
        [("tp4", {"tp": 4}, "simulate"), ("one-rank", {}, "one"),
         ("dp2-zero2", {"dp": 2, "optimizer_shard": 2}, "simulate")], log)
    ckpt = os.path.join(work, "reshard-grid", "ckpt")
    files = sorted(f for f in os.listdir(ckpt) if f.startswith("rank-"))
    if files != [f"rank-{r:05}.{x}" for r in range(4) for x in ("bin", "json")]:
        raise rt.Failure(f"the sharded checkpoint's files: {files}")
    return "dp2 x tp2 zero1 x3 -> " + "; ".join(details)


def damaged_refused(hp, work, log):
    """A sharded checkpoint with a flipped byte, or a rank's files missing, is refused (exit 3)
    with the tensor named, and nothing is trained."""
    src = os.path.join(work, "reshard-grid", "ckpt")
    if not os.path.isdir(src):
        raise rt.Failure("no sharded checkpoint to damage (the resharded resume failed)")
    d = fresh(work, "damaged")
    ref = reference.make("gpt2", VARIANT, d)
    recipe = os.path.join(d, "one.toml")
    rt.write_recipe(recipe, ref.model, ref.train, {"batch": models.BATCH})
    seen = []
    for case in ("flipped", "missing"):
        ckpt = os.path.join(d, case)
        shutil.copytree(src, ckpt)
        if case == "flipped":
            with open(os.path.join(ckpt, "rank-00001.bin"), "r+b") as f:
                f.seek(100)
                b = f.read(1)
                f.seek(100)
                f.write(bytes([b[0] ^ 0xFF]))
        else:
            for x in ("bin", "json"):
                os.remove(os.path.join(ckpt, f"rank-00003.{x}"))
            with open(os.path.join(ckpt, "state.json")) as f:
                state = json.load(f)
            state["ranks"] = 3  # as if rank 3 had never written: its slices are missing
            with open(os.path.join(ckpt, "state.json"), "w") as f:
                json.dump(state, f)
        m = os.path.join(d, f"{case}.jsonl")
        rc, out = rt.launch(hp, recipe, ["--inputs", ref.inputs, "--steps", "1", "--resume", ckpt,
                                         "--metrics", m], log)
        err = rt.first_error(out)
        want = "corrupt" if case == "flipped" else "incomplete"
        if rc != 3 or "tensor '" not in err or want not in err or os.path.exists(m):
            raise rt.Failure(f"{case} checkpoint: exit {rc}: {err}")
        seen.append(f"{case}: {err.split(': ', 1)[-1][:70]}")
    return "; ".join(seen)


def ep_resharded(hp, work, log):
    """3 steps of the MoE at dp2 x ep2 with ZeRO-1 (mpirun), resumed for 2 at one rank, at dp4 x ep4,
    at dp4 x ep2 ZeRO-2, at dp4 x ep2 ZeRO-3 and at plain dp=2: the 5 steps torch ran. The sharded
    checkpoint holds every expert and its whole optimizer state, written by its holder. Then a
    dp4 x ep2 ZeRO-3 checkpoint (the shared weights held in shards, gathered for the writers)
    resumed at one rank, and a one-rank checkpoint resumed at dp4 x ep2 ZeRO-3; Mixtral's loop at
    dp2 x ep2 ZeRO-2 resumed at one rank and at dp4 x ep2 ZeRO-3."""
    d = fresh(work, "reshard-ep")
    zero3 = {"dp": 4, "expert_parallel": 2, "optimizer_shard": 3, "bucket_mb": 0.02}
    details = checkpoint_then_resume(
        hp, os.path.join(d, "from-zero1"), "moe",
        {"dp": 2, "expert_parallel": 2, "optimizer_shard": 1},
        [("one-rank", {}, "one"), ("dp4-ep4", {"dp": 4, "expert_parallel": 4}, "simulate"),
         ("dp4-ep2-zero2", {"dp": 4, "expert_parallel": 2, "optimizer_shard": 2}, "simulate"),
         ("dp4-ep2-zero3", zero3, "simulate"), ("dp2", {"dp": 2}, "simulate")], log)
    from_zero3 = checkpoint_then_resume(hp, os.path.join(d, "from-zero3"), "moe", zero3,
                                        [("one-rank", {}, "one")], log)
    from_one = checkpoint_then_resume(hp, os.path.join(d, "from-one"), "moe", {},
                                      [("dp4-ep2-zero3", zero3, "simulate")], log)
    # Mixtral's loop (summed layers): its experts gathered by the same checkpoint paths.
    loop = checkpoint_then_resume(hp, os.path.join(d, "loop"), "moe-loop",
                                  {"dp": 2, "expert_parallel": 2, "optimizer_shard": 2},
                                  [("one-rank", {}, "one"),
                                   ("dp4-ep2-zero3", zero3, "simulate")], log)
    return ("dp2 x ep2 zero1 x3 -> " + "; ".join(details) + "; dp4 x ep2 zero3 x3 -> " +
            from_zero3[0] + "; one rank x3 -> " + from_one[0] +
            "; moe-loop dp2 x ep2 zero2 x3 -> " +
            "; ".join(loop))


def ep_refused(hp, work, log):
    """Expert parallelism where it cannot be: a model without expert layers, and ep not dividing
    the experts (the MoE has 4 per layer, ep = 3); each exit 3 naming why, before any step."""
    d = fresh(work, "ep-refused")
    seen = []
    for name, parallel, want in [("mlp", {"dp": 2, "expert_parallel": 2}, "has none"),
                                 ("moe", {"dp": 3, "expert_parallel": 3}, "do not split")]:
        ref = reference.make(name, VARIANT, os.path.join(d, name), steps=1, batch=6)
        recipe = os.path.join(d, name, "ep.toml")
        rt.write_recipe(recipe, ref.model, ref.train, {"batch": 6}, parallel=parallel)
        rc, out = train(hp, recipe, "simulate", ["--inputs", ref.inputs], log)
        if rc != 3 or want not in out or "step 1" in out:
            raise rt.Failure(f"{name} {parallel}: exit {rc}, expected 3 with '{want}': "
                             f"{rt.first_error(out)}")
        seen.append(f"{name}: {rt.first_error(out)[:60]}")
    return "; ".join(seen)


def killed_rank(hp, work, log):
    """SIGKILL one rank of a long mpirun training: the job ends fast and the checkpoint resumes."""
    d = os.path.join(work, "fault")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    data = np.frombuffer(open(rt.GPL, "rb").read(), dtype=np.uint8).astype("<u2")
    tokens = os.path.join(d, "tokens.bin")
    data.tofile(tokens)
    spec = models.STREAM["gpt2"]
    torch.manual_seed(0)
    exported = models.export(spec, spec.make().train(), os.path.join(d, "model.onnx"))
    table = reference.train_table("gpt2", reference.Variant("adamw", 3e-3), 0.0, exported.frozen,
                                  100000)
    recipe = os.path.join(d, "train.toml")
    rt.write_recipe(recipe, exported.path, table, {"batch": models.BATCH},
                    workload={"mode": "train", "dtype": "fp32", "optimizer": "adamw",
                              "global_batch": models.BATCH, "seq": spec.seq},
                    parallel={"dp": 2, "optimizer_shard": 1})
    ckpt = os.path.join(d, "ckpt")
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    cmd = [hp, "launch", recipe, "--threads", "1", "--data", tokens, "--checkpoint", ckpt,
           "--checkpoint-every", "20", "--log-every", "1000", "--run-dir",
           os.path.join(d, "run")] + root
    log.write("$ " + " ".join(cmd) + "\n")
    job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           start_new_session=True)
    try:
        deadline = time.time() + 120
        while not os.path.exists(os.path.join(ckpt, "state.json")) and time.time() < deadline:
            if job.poll() is not None:
                raise rt.Failure(f"the job ended before its first checkpoint: "
                                 f"{rt.first_error(job.stdout.read())}")
            time.sleep(0.2)
        time.sleep(1.0)
        ranks = subprocess.run(["pgrep", "-f", f"{recipe} --worker"], capture_output=True,
                               text=True).stdout.split()
        if not ranks:
            raise rt.Failure("no rank process found to kill")
        os.kill(int(ranks[-1]), signal.SIGKILL)
        killed = time.time()
        try:
            out, _ = job.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            raise rt.Failure("the job still runs 20 s after a rank was killed")
        took = time.time() - killed
        log.write(out)
        if job.returncode == 0:
            raise rt.Failure("the job exited 0 although a rank was killed")
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    # The checkpoint left behind is whole: one rank resumes from it for a step.
    one = os.path.join(d, "one.toml")
    rt.write_recipe(one, exported.path, table, {"batch": models.BATCH},
                    workload={"mode": "train", "dtype": "fp32", "optimizer": "adamw",
                              "global_batch": models.BATCH, "seq": spec.seq})
    m = os.path.join(d, "resumed.jsonl")
    rc, out2 = rt.launch(hp, one, ["--data", tokens, "--resume", ckpt, "--steps", "1",
                                   "--metrics", m], log)
    if rc != 0:
        raise rt.Failure(f"resume from the checkpoint left behind: exit {rc}: "
                         f"{rt.first_error(out2)}")
    with open(m) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    if len(rows) != 1 or rows[0]["step"] < 21 or not math.isfinite(rows[0]["loss"]):
        raise rt.Failure(f"the resumed run's metrics are not one step after step 20: {rows}")
    return (f"job ended {took:.1f} s after the kill (exit {job.returncode}); the checkpoint of "
            f"step {rows[0]['step'] - 1} resumes")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("hp")
    ap.add_argument("work")
    ap.add_argument("--models", default="gpt2,llama,mlp,vit,moe")
    ap.add_argument("--layouts", default="",
                    help="only these layouts (comma-separated tags, e.g. dp2xtp2-zero3); the "
                         "checks after them only as --checks names them")
    ap.add_argument("--checks", default=None,
                    help="only the checks after the layouts whose label contains one of these "
                         "(comma-separated, e.g. 'resume from ep'); default: all of them, or none "
                         "with --layouts")
    ap.add_argument("--skip", default="",
                    help="leave out runs whose label contains one of these (comma-separated; the "
                         "sanitizer builds' ctest leaves out some duplicates of what is checked "
                         "elsewhere, for time)")
    ap.add_argument("--no-faults", action="store_true")
    ap.add_argument("--simulate-only", action="store_true",
                    help="only the in-process layouts (how packaging/run-tests.sh runs them under "
                         "ThreadSanitizer, whose hp exits non-zero on a race)")
    a = ap.parse_args()
    help_text = subprocess.run([a.hp, "launch", "--help"], capture_output=True, text=True).stdout
    if "--simulate" not in help_text:
        print(f"skipped: {a.hp} launch has no --simulate (no data-parallel training in this hp)")
        return 77
    os.makedirs(a.work, exist_ok=True)
    torch.set_num_threads(1)
    fails = 0

    def report(ok, label, detail):
        nonlocal fails
        fails += not ok
        print(f"{'ok' if ok else 'FAIL':8} {label:30} {detail}", flush=True)

    def model_layouts(name, layouts, log):
        """torch's reference of `name`, then each of `layouts` ([(tag, parallel, how)]) on it."""
        d = os.path.join(a.work, name)
        shutil.rmtree(d, ignore_errors=True)
        ref = reference.make(name, VARIANT, d)
        for tag, parallel, how in layouts:
            try:
                report(True, f"{name} {tag} ({how})",
                       layout_run(a.hp, d, ref, tag, parallel, how, log, name in models.LOOP))
            except Exception as e:
                report(False, f"{name} {tag} ({how})", rt.describe(e))

    log_path = os.path.join(a.work, "distributed.log")
    with open(log_path, "w") as log:
        for name in a.models.split(","):
            model_layouts(name, [x for x in LAYOUTS + (EP_LAYOUTS if name in EXPERT_MODELS else [])
                                 if not (a.simulate_only and x[2] != "simulate") and
                                 not (a.layouts and x[0] not in a.layouts.split(","))], log)
        checks = a.checks.split(",") if a.checks is not None else (None if not a.layouts else [])
        skipped = [x for x in a.skip.split(",") if x]
        wanted = lambda label: ((checks is None or any(c in label for c in checks))  # noqa: E731
                                and not any(x in label for x in skipped))
        if a.simulate_only:
            print(f"\n{fails} failing (log: {log_path})")
            return 1 if fails else 0
        # The scatter-routed MoE (the same experts, a dense gate), and Mixtral's loop (each expert
        # on its rows, added back with index_add_), also at ZeRO-3 over mpirun.
        for name, layouts in [("moe-scatter", [("dp2-ep2", "simulate"),
                                                ("dp2-ep2-gather", "simulate"),
                                                ("dp4-ep2", "simulate")]),
                              ("moe-loop", [("dp2-ep2", "mpirun"), ("dp4-ep2", "simulate"),
                                            ("dp4-ep4", "simulate"),
                                            ("dp4-ep2-zero3-buckets", "simulate")]),
                              ("moe-sum", [("dp2-ep2", "simulate"), ("dp4-ep2", "simulate")])]:
            todo = [x for x in EP_LAYOUTS if (x[0], x[2]) in layouts and wanted(f"{name} {x[0]}")]
            if todo:
                model_layouts(name, todo, log)
        for label, fn in [("hp verify (mpirun)", verified),
                          ("hp verify tp=2 (mpirun)",
                           lambda h, w, lg: verified(h, w, lg, {"tp": 2})),
                          ("resharded resume", resharded),
                          ("ZeRO-3 resumed elsewhere; its memory", zero3_resharded),
                          ("resharded resume from tp=2", tp_resharded),
                          ("resharded resume from dp2 x tp2", grid_resharded),
                          ("FSDP x TP resumed elsewhere", fsdp_tp_resharded),
                          ("damaged sharded checkpoint refused", damaged_refused),
                          ("hp verify dp2 x ep2 (mpirun)",
                           lambda h, w, lg: verified(h, w, lg, {"dp": 2, "expert_parallel": 2},
                                                     "moe")),
                          ("hp verify Mixtral's loop at ep=2",
                           lambda h, w, lg: verified(h, w, lg, {"dp": 2, "expert_parallel": 2},
                                                     "moe-loop")),
                          ("resharded resume from ep=2", ep_resharded),
                          ("control flow at tp=2", control_tp),
                          ("expert parallelism refused", ep_refused)] + (
                [] if a.no_faults else [("rank killed mid-run", killed_rank)]):
            if not wanted(label):
                continue
            try:
                report(True, label, fn(a.hp, a.work, log))
            except Exception as e:
                report(False, label, rt.describe(e))
    print(f"\n{fails} failing (log: {log_path})")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
