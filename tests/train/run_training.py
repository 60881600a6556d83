#!/usr/bin/python3
"""End-to-end training test: `hp launch` trains users' exports as PyTorch trains them.

For each model of models.py and each optimizer variant of reference.py, the model is exported for
training, torch runs 5 steps on one fixed batch (reference.py), and

    hp launch RECIPE --inputs BATCH_DIR --metrics m.jsonl --save-model out.onnx

runs the same 5 steps from the same weights (exports with a dynamic batch axis, as users export;
AdamW also on a fully static export). Each step's loss must be torch's within 1e-4 (relative), the
gradient norm within 1e-3, and every trained tensor w must satisfy
||w_hp - w_torch|| < 1% of ||w_torch_final - w_torch_initial|| over its elements that have a
gradient (reference.dead_elements: attention's key bias has none, and AdamW turns its float32 noise
into full steps of random sign); buffers listed in [train].frozen must come back unchanged. A model
that fails is diagnosed: its forward alone against torch's, then each step-1 gradient (read back
from one SGD step with lr 1). Then:

- recompute: AdamW at batch 64 (dynamic and static exports) with the stage's recompute = "full"
  gives torch's losses too and, when hp reports its peak memory (a metrics key or a "peak" figure
  on its console), a lower peak than the same run with recompute = "none";
- token stream: a byte-level GPT-2 (and the MoE) trained 200 steps on a uint16 token file made from
  the GPL-3 text Debian ships must lower its loss (mean of the last 20 steps below the first 20's by
  0.7 nats; torch drops about 1.4 on the same setup), and 100 steps + --resume for 100 more must
  reproduce the 200-step run's losses for steps 101..200 exactly and save byte-identical weights;
- bad inputs: a logits name that is no graph output, labels of the wrong dtype or shape, missing
  labels exit 3 (bad input) with a message naming the culprit, while the same recipe with good
  labels trains.

Usage: run_training.py HP_BINARY WORK_DIR [--models a,b] [--variants v,w] [--no-stream] [--no-bad]
                       [--stream-models gpt2,moe]
Exit status 0 when everything holds, 1 when something does not, 77 (CTest's skip) when this Python
has no torch/onnx or the hp given has no training (`hp launch --help` lacks --save-model). The
table lists each run's worst loss / gradient-norm / weight error; train.log in WORK_DIR has every
command with its output.
"""
import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time

try:
    import numpy as np
    import onnx
    import torch
    from onnx import numpy_helper

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import models  # noqa: E402
    import reference  # noqa: E402
except ImportError as e:  # python3-torch / python3-onnx missing: say so, do not pass
    print(f"skipped: {e} (packaging/install-deps.sh installs python3-torch and python3-onnx)")
    sys.exit(77)

LOSS_RTOL = 1e-4
NORM_RTOL = 1e-3
WEIGHT_FRACTION = 0.01
# Batch-norm running statistics against bn_buffers' replay of torch's activations: they follow the
# weights, which agree to WEIGHT_FRACTION of an update, so they agree far closer than that.
BUFFER_RTOL = 1e-4
METRIC_KEYS = ("step", "loss", "grad_norm", "lr", "seconds", "tokens_per_second")
GPL = "/usr/share/common-licenses/GPL-3"
STREAM_STEPS, STREAM_DROP = 200, 0.7
RECOMPUTE_BATCH = 64


# What hp cannot train yet, each with the error it must fail with: such a row reads "xfail" and
# does not fail the test; failing any other way, or passing ("XPASS"), does, so this list shrinks
# as hp learns and never hides a new failure. (label regex, error regex, why)
KNOWN_FAILURES = [
    # Empty since hp binds the data's dims before autodiff, recompute clones keep their shapes and
    # ScatterElements has a gradient. An entry reads, e.g.:
    # (r"^moe-scatter ", r"\(ScatterElements\): no gradient rule", "no ScatterElements rule"),
]


class Failure(Exception):
    pass


class Skip(Exception):
    pass


# --- running hp ----------------------------------------------------------------------------------
def run(cmd, log, timeout=300):
    t = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        rc, out = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:
        rc, out = 124, f"timed out after {timeout} s: {e}"
    log.write(f"$ {' '.join(cmd)}  # rc={rc} {time.time() - t:.1f}s\n{out}\n")
    log.flush()
    return rc, out


def first_error(out):
    lines = [l for l in out.splitlines() if "error" in l.lower()]
    return (lines[0] if lines else out.strip().splitlines()[-1] if out.strip() else "")[:300]


def toml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a TOML basic string is a JSON string for these names
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(v)


def write_recipe(path, model, train, dims, layers=None, recompute="none", workload=None,
                 parallel=None, cluster=None, ranks_per_node=1):
    """A one-rank recipe on the local-cpu preset (dp = tp = pp = 1) with a [train] table; `layers`
    (a "0-N" range) adds the single [[stages]] entry that carries `recompute`, a list of ranges one
    [[stages]] entry per range (pipeline stages, run_distributed.py); a [workload] sets
    micro_batch_size to its global_batch (hp verify checks they agree); `parallel` overrides
    [parallel] keys (dp, optimizer_shard, shard_group: run_distributed.py). `cluster` names
    another cluster (a preset or a file, e.g. `hp devices --measure --cluster-out`'s) with
    `ranks_per_node` ranks a node."""
    lines = ["[recipe]", "version = 1", f"name = {toml_value(os.path.basename(path)[:-5])}",
             f"model = {toml_value(os.path.relpath(model, os.path.dirname(path)))}",
             f"cluster = {toml_value(cluster or 'local-cpu')}"]
    par = dict({"dp": 1, "tp": 1, "pp": 1}, **(parallel or {}))
    # local-cpu has one rank per node: as many nodes as ranks (hp verify checks they agree).
    ranks = par['dp'] * par['tp'] * par['pp']
    lines += [f"nodes = {max(1, ranks // ranks_per_node)}", "", "[model]",
              f"dims = {toml_value(dims)}", "", "[parallel]"]
    lines += [f"{k} = {toml_value(v)}" for k, v in par.items()]
    if workload:
        per = par["dp"] * par.get("micro_batches", 1)
        lines += [f"micro_batch_size = {workload['global_batch'] // per}"]
    lines += [""]
    for index, stage in enumerate([] if layers is None else
                                  layers if isinstance(layers, list) else [layers]):
        lines += ["[[stages]]", f"index = {index}", f"layers = {toml_value(stage)}",
                  f"recompute = {toml_value(recompute)}", ""]
    if workload:
        lines += ["[workload]"] + [f"{k} = {toml_value(v)}" for k, v in workload.items()] + [""]
    lines += ["[train]"] + [f"{k} = {toml_value(v)}" for k, v in train.items()]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def launch(hp, recipe, args, log, timeout=300):
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    return run([hp, "launch", recipe, "--threads", "1"] + args + root, log, timeout)


def read_metrics(path, first=1, count=None):
    """The metrics file's steps, checked: every key present and finite, steps first, first+1, ..."""
    if not os.path.exists(path):
        raise Failure(f"no metrics file {path}")
    with open(path) as f:
        rows = [json.loads(l) for l in f if l.strip()]
    for i, r in enumerate(rows):
        missing = [k for k in METRIC_KEYS if k not in r]
        if missing:
            raise Failure(f"metrics line {i + 1} lacks {missing}: {r}")
        if r["step"] != first + i:
            raise Failure(f"metrics line {i + 1} has step {r['step']}, expected {first + i}")
        if not all(math.isfinite(float(r[k])) for k in METRIC_KEYS):
            raise Failure(f"metrics line {i + 1} is not finite: {r}")
    if count is not None and len(rows) != count:
        raise Failure(f"{len(rows)} metrics lines, expected {count}")
    return rows


def initializers(path):
    return {i.name: numpy_helper.to_array(i) for i in onnx.load(path).graph.initializer}


def peak_bytes(rows, out):
    """hp's peak memory from a metrics key named like peak*bytes or its console's "peak ... <unit>"
    line; None when it reports neither."""
    for r in reversed(rows):
        for k, v in r.items():
            if "peak" in k and isinstance(v, (int, float)):
                return float(v)
    units = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "KB": 1e3, "MB": 1e6, "GB": 1e9}
    m = re.search(r"peak[^\n0-9]*([0-9.]+)\s*(GiB|MiB|KiB|GB|MB|KB|B)\b", out, re.IGNORECASE)
    return float(m.group(1)) * units[m.group(2)] if m else None


# --- the fixed-batch comparison --------------------------------------------------------------------
def compare(ref, rows, saved):
    """Returns (detail, worst weight fraction); raises Failure naming the first step / tensor off."""
    worst_loss = 0.0
    for r, want in zip(rows, ref.losses):
        rel = abs(r["loss"] - want) / max(abs(want), 1e-12)
        worst_loss = max(worst_loss, rel)
        if rel > LOSS_RTOL:
            raise Failure(f"step {r['step']}: loss {r['loss']:.7g}, torch {want:.7g} "
                          f"(rel {rel:.2e})")
    worst_norm = 0.0
    for r, want in zip(rows, ref.grad_norms):
        rel = abs(r["grad_norm"] - want) / max(want, 1e-12)
        worst_norm = max(worst_norm, rel)
        if rel > NORM_RTOL:
            raise Failure(f"step {r['step']}: grad_norm {r['grad_norm']:.7g}, torch {want:.7g} "
                          f"(rel {rel:.2e}; the loss agreed, so a gradient is off)")
        if abs(r["lr"] - ref.train["lr"]) > 1e-12 * ref.train["lr"]:
            raise Failure(f"step {r['step']}: lr {r['lr']}, recipe {ref.train['lr']}")
    got = initializers(saved)
    want_names = set(initializers(ref.model))
    if set(got) != want_names:
        raise Failure(f"saved model's initializers differ: missing {sorted(want_names - set(got))}, "
                      f"extra {sorted(set(got) - want_names)}")
    worst, worst_name, dead_count = 0.0, "", 0
    for name, final in ref.final.items():
        w = got[name]
        if w.shape != final.shape or w.dtype != final.dtype:
            raise Failure(f"{name}: saved {w.dtype}{list(w.shape)}, torch {final.dtype}"
                          f"{list(final.shape)}")
        live = ~ref.dead.get(name, np.zeros(final.shape, bool))
        dead_count += int((~live).sum())
        moved = np.linalg.norm((final - ref.init[name]).astype(np.float64)[live])
        err = np.linalg.norm((w - final).astype(np.float64)[live])
        if moved == 0:  # torch left it alone (no gradient reaches it): hp must too
            if err != 0:
                raise Failure(f"{name}: torch did not change it, hp moved it by {err:.3g}")
            continue
        frac = err / moved
        if frac > worst:
            worst, worst_name = frac, name
    if worst >= WEIGHT_FRACTION:
        raise Failure(f"weight {worst_name}: ||hp - torch|| = {worst:.2%} of torch's update")
    for name in ref.exported.frozen:
        if name in ref.buffers:  # batch-norm statistics: the forward updates them
            want = ref.buffers[name]
            err = float(np.max(np.abs(got[name].astype(np.float64) - want)))
            if err > BUFFER_RTOL * max(float(np.max(np.abs(want))), 1e-6):
                raise Failure(f"buffer {name}: off by {err:.3g} (max |value| "
                              f"{float(np.max(np.abs(want))):.3g})")
        elif not np.array_equal(got[name], initializers(ref.model)[name]):
            raise Failure(f"frozen buffer {name} changed")
    dead = f" ({dead_count} elements without gradient skipped)" if dead_count else ""
    return (f"loss rel {worst_loss:.1e}  grad_norm rel {worst_norm:.1e}{dead}",
            (worst, worst_name))


def stage_layers(hp, model, dims, work, log):
    """The layer range hp's planner finds in the model (recompute needs a [[stages]] entry naming
    every layer): from `hp plan` on one rank."""
    out = os.path.join(work, "plan.toml")
    cmd = [hp, "plan", model, "--cluster", "local-cpu", "--nodes", "1", "--global-batch",
           str(dims["batch"]), "--dtype", "fp32", "-o", out]
    rc, text = run(cmd, log)
    if rc != 0:
        raise Failure(f"hp plan exit {rc}: {first_error(text)}")
    m = re.search(r'^layers\s*=\s*"([0-9]+-[0-9]+|[0-9]+)"', open(out).read(), re.MULTILINE)
    if not m:
        raise Failure(f"no layers in {out}")
    return m.group(1)


def fixed_batch(hp, work, name, variant, log, recompute=None, batch=models.BATCH, dynamic=True):
    """One model x variant (recompute: None, "none" or "full", the [[stages]] entry's policy; None
    writes no [[stages]]): returns (row text, peak bytes or None when hp does not report it).
    Raises Skip for recompute on a model without repeated blocks."""
    d = os.path.join(work, f"{name}-{variant}-b{batch}" + (f"-{recompute}" if recompute else "")
                     + ("" if dynamic else "-static"))
    shutil.rmtree(d, ignore_errors=True)
    ref = reference.make(name, variant, d, batch=batch, dynamic=dynamic)
    dims = {"batch": batch}
    layers = stage_layers(hp, ref.model, dims, d, log) if recompute else None
    if layers is not None and "-" not in layers:
        # No repeated blocks: the planner calls the whole model layer 0 and the trainer finds no
        # block to recompute; recomputing the only "layer" would keep as much alive anyway.
        raise Skip(f"the planner finds one layer ({layers}) in the model: nothing to recompute")
    recipe = os.path.join(d, "train.toml")
    write_recipe(recipe, ref.model, ref.train, dims, layers, recompute or "none")
    metrics, saved = os.path.join(d, "metrics.jsonl"), os.path.join(d, "trained.onnx")
    rc, out = launch(hp, recipe, ["--inputs", ref.inputs, "--metrics", metrics, "--save-model",
                                  saved], log)
    if rc != 0:
        raise Failure(f"hp launch exit {rc}: {first_error(out)}")
    rows = read_metrics(metrics, 1, reference.STEPS)
    detail, (worst, worst_name) = compare(ref, rows, saved)
    peak = peak_bytes(rows, out)
    return f"{detail}  weights {worst:.1e} of the update ({worst_name or 'all exact'})", peak


# --- diagnosis of a mismatch ---------------------------------------------------------------------
def diagnose(hp, work, name, log):
    """Where hp and torch part: the forward (hp launch MODEL.onnx, inference, against torch's logits),
    then every gradient of step 1, read back from one plain SGD step with lr 1 (w' = w - g).
    Returns a line naming the first tensor off, in the model's forward order."""
    d = os.path.join(work, f"{name}-diagnose")
    shutil.rmtree(d, ignore_errors=True)
    ref = reference.make(name, "adamw", d, steps=1)
    spec = models.MODELS[name]
    x = numpy_helper.to_array(onnx.load_tensor(os.path.join(ref.inputs, "input_0.pb"))).copy()
    y = numpy_helper.to_array(onnx.load_tensor(os.path.join(ref.inputs, "input_1.pb"))).copy()
    fwd_in, fwd_out = os.path.join(d, "forward-in"), os.path.join(d, "forward-out")
    os.makedirs(fwd_in)
    shutil.copy(os.path.join(ref.inputs, "input_0.pb"), fwd_in)
    model = models.build(name)
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(torch.from_numpy(ref.init[n]))
        want = model(torch.from_numpy(x)).numpy()
    rc, out = run([hp, "launch", ref.model, "--inputs", fwd_in, "--outputs", fwd_out, "--backend",
                   "cpu", "--threads", "1"], log)
    if rc != 0:
        return f"forward alone fails in hp (exit {rc}: {first_error(out)})"
    got = numpy_helper.to_array(onnx.load_tensor(os.path.join(fwd_out, "output_0.pb")))
    err = float(np.max(np.abs(got.astype(np.float64) - want)))
    if got.shape != want.shape or err > 1e-4:
        return f"the forward differs from torch's (max abs {err:.3g}): a forward kernel, not autodiff"
    model.zero_grad()
    models.loss_fn(spec, model(torch.from_numpy(x)), torch.from_numpy(y)).backward()
    grads = {n: p.grad.numpy() for n, p in model.named_parameters()}
    train = reference.train_table(name, reference.Variant("sgd", 1.0), 0.0, ref.exported.frozen, 1)
    recipe, saved = os.path.join(d, "sgd.toml"), os.path.join(d, "sgd.onnx")
    write_recipe(recipe, ref.model, train, {"batch": models.BATCH})
    rc, out = launch(hp, recipe, ["--inputs", ref.inputs, "--save-model", saved], log)
    if rc != 0:
        return f"forward ok; one SGD step fails (exit {rc}: {first_error(out)})"
    w = initializers(saved)
    order = [i.name for i in onnx.load(ref.model).graph.initializer]
    bad = []
    for n in sorted(grads, key=lambda k: order.index(k) if k in order else len(order)):
        g_hp = (ref.init[n] - w[n]).astype(np.float64)
        g = grads[n].astype(np.float64)
        rel = np.linalg.norm(g_hp - g) / max(np.linalg.norm(g), 1e-12)
        if rel > 1e-3:
            bad.append(f"{n} (rel {rel:.2g})")
    if not bad:
        return "forward and step-1 gradients agree with torch: the optimizer or a later step differs"
    return f"forward ok; gradients off for {len(bad)}/{len(grads)}: " + ", ".join(bad[:6])


# --- token stream ------------------------------------------------------------------------------
def stream(hp, work, log, which):
    d = os.path.join(work, f"stream-{which}")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    data = np.frombuffer(open(GPL, "rb").read(), dtype=np.uint8).astype("<u2")
    tokens = os.path.join(d, "tokens.bin")
    data.tofile(tokens)
    spec = models.STREAM[which]
    torch.manual_seed(0)
    model = spec.make().train()
    exported = models.export(spec, model, os.path.join(d, "model.onnx"))
    batch = models.BATCH
    train = reference.train_table("gpt2", reference.Variant("adamw", 3e-3, betas=(0.9, 0.95),
                                                            weight_decay=0.01),
                                  0.0, exported.frozen, STREAM_STEPS)
    train["seed"] = 0
    recipe = os.path.join(d, "train.toml")
    write_recipe(recipe, exported.path, train, {"batch": batch},
                 workload={"mode": "train", "dtype": "fp32", "optimizer": "adamw",
                           "global_batch": batch, "seq": spec.seq})

    def go(tag, steps, extra):
        m, s = os.path.join(d, f"{tag}.jsonl"), os.path.join(d, f"{tag}.onnx")
        rc, out = launch(hp, recipe, ["--data", tokens, "--token-bytes", "2", "--steps",
                                      str(steps), "--seed", "0", "--metrics", m, "--save-model", s,
                                      "--checkpoint", os.path.join(d, f"ckpt-{tag}"),
                                      "--checkpoint-every", "50"] + extra, log, timeout=600)
        if rc != 0:
            raise Failure(f"{tag}: hp launch exit {rc}: {first_error(out)}")
        return m, s

    full_m, full_s = go("full", STREAM_STEPS, [])
    full = read_metrics(full_m, 1, STREAM_STEPS)
    losses = [r["loss"] for r in full]
    first, last = float(np.mean(losses[:20])), float(np.mean(losses[-20:]))
    if not last < first - STREAM_DROP:
        raise Failure(f"loss did not fall: mean of steps 1-20 {first:.3f}, 181-200 {last:.3f}")
    half = STREAM_STEPS // 2
    go("half", half, [])
    # --steps counts this run's steps: a resume from step 100 runs 101..200 with --steps 100.
    res_m, res_s = go("resumed", STREAM_STEPS - half, ["--resume", os.path.join(d, "ckpt-half")])
    resumed = read_metrics(res_m, half + 1, STREAM_STEPS - half)
    for a, b in zip(full[half:], resumed):
        if a["loss"] != b["loss"]:
            raise Failure(f"resumed step {b['step']}: loss {b['loss']!r}, uninterrupted "
                          f"{a['loss']!r}")
    w_full, w_res = initializers(full_s), initializers(res_s)
    for n, a in w_full.items():
        if n not in w_res or a.tobytes() != w_res[n].tobytes():
            raise Failure(f"resumed run's weight {n} differs from the uninterrupted run's")
    return f"loss {first:.3f} -> {last:.3f}; resume 100+100 == 200 (losses, weights)"


# --- bad input -----------------------------------------------------------------------------------
def bad_inputs(hp, work, log):
    """hp must refuse bad [train] inputs with exit 3 and a message naming the culprit, and run the
    same recipe with good inputs (the control: an exit 3 for another reason proves nothing). The MLP,
    the simplest model, trained with cross-entropy over its 8 outputs. Returns (rows, failures)."""
    d = os.path.join(work, "bad")
    shutil.rmtree(d, ignore_errors=True)
    ref = reference.make("mlp", "adamw", os.path.join(d, "ref"))
    spec = models.MODELS["mlp"]
    g = torch.Generator().manual_seed(1)
    x, _ = models.example(spec, models.BATCH, g)
    y = torch.randint(0, 8, (models.BATCH,), generator=g)
    ce = {"loss": "cross_entropy"}
    cases = [  # (what, [train] edits, (input, labels or None), expected exit, text it must name)
        ("good labels (control)", ce, (x, y), 0, ""),
        ("logits naming no output", dict(ce, logits="no_such_output"), (x, y), 3,
         "no_such_output"),
        ("labels of dtype float", ce, (x, y.float()), 3, "labels"),
        ("labels of dtype int32", ce, (x, y.int()), 3, "labels"),
        ("labels of the wrong shape", ce, (x, y.reshape(2, -1)), 3, "labels"),
        ("labels missing", ce, (x, None), 3, "labels"),
        ("mse target of the wrong shape", {"loss": "mse"}, (x, torch.zeros(models.BATCH, 3)), 3,
         "labels"),
        ("mse target of dtype int64", {"loss": "mse"}, (x, torch.zeros(models.BATCH, 8).long()),
         3, "labels"),
    ]
    rows, fails = [], 0
    for i, (what, edits, (xi, yi), want, needle) in enumerate(cases):
        cd = os.path.join(d, f"case{i}")
        os.makedirs(cd)
        inputs = os.path.join(cd, "inputs")
        if yi is None:
            os.makedirs(inputs)
            onnx.save_tensor(numpy_helper.from_array(xi.numpy(), spec.input_name),
                             os.path.join(inputs, "input_0.pb"))
        else:
            reference.save_inputs(spec, xi, yi, inputs)
        recipe = os.path.join(cd, "train.toml")
        write_recipe(recipe, ref.model, dict(ref.train, **edits), {"batch": models.BATCH})
        rc, out = launch(hp, recipe, ["--inputs", inputs, "--metrics",
                                      os.path.join(cd, "m.jsonl")], log)
        ok = rc == want and needle in out and "Traceback" not in out
        fails += not ok
        rows.append(f"{'ok' if ok else 'FAIL':8} bad input: {what:30} exit {rc} (want {want}): "
                    f"{first_error(out)}")
    return rows, fails


def describe(e):
    return str(e) if isinstance(e, Failure) else f"{type(e).__name__}: {e}"[:300]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("hp")
    ap.add_argument("work")
    ap.add_argument("--models", default=",".join(n for n in models.MODELS
                                                 if n not in models.DEEP and n not in models.LOOP))
    ap.add_argument("--variants", default=",".join(reference.VARIANTS))
    ap.add_argument("--no-stream", action="store_true")
    ap.add_argument("--no-bad", action="store_true")
    ap.add_argument("--stream-models", default="gpt2,moe",
                    help="models trained on the token stream (of models.STREAM)")
    a = ap.parse_args()
    help_text = subprocess.run([a.hp, "launch", "--help"], capture_output=True, text=True).stdout
    if "--save-model" not in help_text:  # an hp from before training landed: nothing to test
        print(f"skipped: {a.hp} launch has no --save-model (no training in this hp)")
        return 77
    os.makedirs(a.work, exist_ok=True)
    torch.set_num_threads(1)
    fails = 0
    log_path = os.path.join(a.work, "train.log")

    def report(ok, label, detail):
        """Prints the row; returns whether it is an unexpected failure (worth a diagnosis)."""
        nonlocal fails
        status = "ok" if ok else "FAIL"
        for pattern, error, why in KNOWN_FAILURES:
            if re.search(pattern, label):
                if ok:
                    status, detail = "XPASS", f"{detail}  (listed as known: {why})"
                elif re.search(error, detail):
                    status, detail = "xfail", f"{why}: {detail}"
        fails += status in ("FAIL", "XPASS")
        print(f"{status:8} {label:35} {detail}", flush=True)
        return status == "FAIL"

    diagnosed = set()
    with open(log_path, "w") as log:
        for name in a.models.split(","):
            for variant in a.variants.split(","):
                try:
                    detail, _ = fixed_batch(a.hp, a.work, name, variant, log)
                    report(True, f"{name} {variant}", detail)
                except Exception as e:  # Failure, or hp wrote something unreadable
                    if report(False, f"{name} {variant}", describe(e)) and name not in diagnosed:
                        diagnosed.add(name)
                        try:
                            print(f"{'':8} {'':35} diagnosis: {diagnose(a.hp, a.work, name, log)}")
                        except Exception as e:
                            print(f"{'':8} {'':35} diagnosis failed: {describe(e)}")
            try:  # the same model exported with every shape static (no dynamic batch axis)
                detail, _ = fixed_batch(a.hp, a.work, name, "adamw", log, dynamic=False)
                report(True, f"{name} adamw static", detail)
            except Exception as e:
                report(False, f"{name} adamw static", describe(e))
            for dynamic in (True, False):  # at a batch whose activations outweigh hp's 0.1 MiB
                label = f"{name} adamw recompute" + ("" if dynamic else " static")
                if not models.MODELS[name].recompute:
                    print(f"{'skip':8} {label:35} {models.MODELS[name].recompute_why}", flush=True)
                    continue
                try:
                    _, base = fixed_batch(a.hp, a.work, name, "adamw", log, "none",
                                          RECOMPUTE_BATCH, dynamic)
                    detail, peak = fixed_batch(a.hp, a.work, name, "adamw", log, "full",
                                               RECOMPUTE_BATCH, dynamic)
                    if peak is None or base is None:
                        detail += "  (peak memory not reported: not compared)"
                    elif peak < base:
                        detail += f"  peak {peak / 2**20:.1f} MiB < {base / 2**20:.1f} MiB"
                    else:
                        raise Failure(f"recompute's peak {peak:.0f} B is not below {base:.0f} B")
                    report(True, label, detail)
                except Skip as e:
                    print(f"{'skip':8} {label:35} {e}", flush=True)
                    break
                except Exception as e:
                    report(False, label, describe(e))
        for which in ([] if a.no_stream else a.stream_models.split(",")):
            try:
                report(True, f"{which}-bytes token stream", stream(a.hp, a.work, log, which))
            except Exception as e:
                report(False, f"{which}-bytes token stream", describe(e))
        if not a.no_bad:
            rows, bad = bad_inputs(a.hp, a.work, log)
            print("\n".join(rows))
            fails += bad
    print(f"\n{fails} failing (log: {log_path})")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
