#!/usr/bin/python3
"""PyTorch's training run that hp's must reproduce: autograd + torch.optim on one fixed batch.

`make(name, variant, out_dir)` builds models.MODELS[name] (seed 0), exports it for training, draws one
batch (seed 1) and runs STEPS steps of the variant's optimizer, recording each step's loss (the
forward before the update, as a PyTorch loop prints it) and gradient norm (before clipping). It
writes into out_dir:

    model.onnx               the export (initial weights)
    inputs/input_K.pb        the batch, one TensorProto per graph input, named after it, and `labels`
    expected.npz             losses, grad_norms, and init/<onnx name>, final/<onnx name> per parameter,
                             dead/<onnx name>: elements without a gradient (dead_elements)

and returns a Reference holding the same plus the [train] settings the recipe must carry.

Usage (by hand): reference.py OUT_DIR [--models a,b] [--variants v,w] prints each run's losses.
"""
import argparse
import dataclasses
import os
import sys

import numpy as np
import onnx
import torch
import torch.nn as nn
from onnx import numpy_helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402

STEPS = 5


@dataclasses.dataclass
class Variant:
    optimizer: str       # adamw | sgd
    lr: float
    betas: tuple = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    momentum: float = 0.0
    clip: float = 0.0    # > 0: max_norm = clip x the first step's gradient norm (so clipping happens)


# Non-default betas / decay so a trainer that ignores the recipe's values does not match by luck.
VARIANTS = {
    "adamw": Variant("adamw", 2e-3, betas=(0.9, 0.95), weight_decay=0.05),
    "sgd": Variant("sgd", 0.05, momentum=0.9, weight_decay=0.01),
    "adamw-clip": Variant("adamw", 2e-3, betas=(0.9, 0.95), weight_decay=0.05, clip=0.1),
    "sgd-clip": Variant("sgd", 0.05, momentum=0.9, weight_decay=0.01, clip=0.1),
}


@dataclasses.dataclass
class Reference:
    model: str
    inputs: str
    exported: models.Exported
    train: dict              # the recipe's [train] table
    losses: list
    grad_norms: list
    init: dict               # onnx initializer name -> array
    final: dict
    dead: dict               # name -> bool mask of elements with no gradient (dead_elements)
    buffers: dict = dataclasses.field(default_factory=dict)  # batch-norm statistics (bn_buffers)


def optimizer(v, params):
    if v.optimizer == "sgd":
        return torch.optim.SGD(params, lr=v.lr, momentum=v.momentum, weight_decay=v.weight_decay)
    return torch.optim.AdamW(params, lr=v.lr, betas=v.betas, eps=v.eps,
                             weight_decay=v.weight_decay)


def first_grad_norm(name, x, y):
    model = models.build(name)
    models.loss_fn(models.MODELS[name], model(x), y).backward()
    return float(torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf")))


def bn_buffers(model):
    """The running statistics of every BatchNorm module of `model` as ONNX's BatchNormalization
    updates them in training mode, followed through the forwards that come: running = (1 - m) *
    running + m * batch statistic, the variance's the biased one (ReduceMean of squares; PyTorch's own
    running_var uses the unbiased one, which an export cannot carry). Returns (name -> float64
    tensor, updated in place by forward hooks; the hooks' handles)."""
    stats, hooks = {}, []
    for mname, mod in model.named_modules():
        if not isinstance(mod, nn.modules.batchnorm._BatchNorm):
            continue
        mean, var = f"{mname}.running_mean", f"{mname}.running_var"
        stats[mean] = mod.running_mean.detach().double().clone()
        stats[var] = mod.running_var.detach().double().clone()

        def hook(mod, inp, out, mean=mean, var=var):
            x = inp[0].detach().double()
            dims = [0] + list(range(2, x.dim()))
            m = mod.momentum
            stats[mean] = (1 - m) * stats[mean] + m * x.mean(dims)
            stats[var] = (1 - m) * stats[var] + m * x.var(dims, unbiased=False)
        hooks.append(mod.register_forward_hook(hook))
    return stats, hooks


def train(name, model, v, x, y, steps, max_norm):
    """Returns losses, gradient norms, which elements got a gradient, and bn_buffers' statistics."""
    spec = models.MODELS[name]
    stats, hooks = bn_buffers(model)
    opt = optimizer(v, model.parameters())
    losses, norms = [], []
    noise = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = models.loss_fn(spec, model(x), y)
        loss.backward()
        for n, p in model.named_parameters():
            noise[n] = torch.maximum(noise[n], p.grad.abs())
        # clip_grad_norm_ returns the norm before clipping (inf max_norm: just the norm).
        norms.append(float(torch.nn.utils.clip_grad_norm_(
            model.parameters(), max_norm if max_norm > 0 else float("inf"))))
        losses.append(float(loss))
        opt.step()
    for h in hooks:
        h.remove()
    for n, b in model.named_buffers():  # the mean is updated alike in both: a check of the hooks
        if n.endswith("running_mean") and not torch.allclose(b.double(), stats[n], atol=1e-6):
            raise RuntimeError(f"{name}: {n} followed by the hooks differs from PyTorch's")
    return (losses, norms, {n: (g > 0).numpy() for n, g in noise.items()},
            {n: t.float().numpy() for n, t in stats.items()})


def dead_elements(name, init, v, x, y, steps, max_norm):
    """Elements whose gradient is zero in exact arithmetic at every step (the key bias of attention:
    softmax ignores a shift shared by all keys). In float32 their gradient is rounding noise, which
    AdamW's g / sqrt(v) turns into full-size steps of either sign, so no two correct trainers agree
    on them. Found by repeating the run in float64, where that noise is 1e-9 times smaller: an
    element is dead when its |gradient| stays below 1e-9 x its tensor's largest at every step (make()
    keeps only those whose float32 gradient was not exactly zero: exact zeros are deterministic)."""
    model = models.build(name).double()
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(torch.from_numpy(init[n]).double())
    opt = optimizer(v, model.parameters())
    peak = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
    scale = {n: 0.0 for n in peak}
    xd = x if not x.is_floating_point() else x.double()
    yd = y if not y.is_floating_point() else y.double()
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        models.loss_fn(models.MODELS[name], model(xd), yd).backward()
        for n, p in model.named_parameters():
            peak[n] = torch.maximum(peak[n], p.grad.abs())
            scale[n] = max(scale[n], float(p.grad.abs().max()))
        if max_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        opt.step()
    return {n: (peak[n] <= 1e-9 * scale[n]).numpy() for n in peak if scale[n] > 0}


def save_inputs(spec, x, y, d):
    os.makedirs(d, exist_ok=True)
    onnx.save_tensor(numpy_helper.from_array(x.numpy(), spec.input_name),
                     os.path.join(d, "input_0.pb"))
    onnx.save_tensor(numpy_helper.from_array(y.numpy(), "labels"), os.path.join(d, "input_1.pb"))


def train_table(name, v, max_norm, frozen, steps=STEPS):
    t = {"loss": models.MODELS[name].loss, "logits": models.OUTPUT, "labels": "labels",
         "optimizer": v.optimizer, "lr": v.lr, "weight_decay": v.weight_decay,
         "clip_norm": max_norm, "steps": steps, "frozen": frozen}
    if v.optimizer == "adamw":
        t.update(betas=list(v.betas), eps=v.eps)
    else:
        t.update(momentum=v.momentum)
    return t


def make(name, variant, out_dir, steps=STEPS, batch=models.BATCH, dynamic=True):
    spec, v = models.MODELS[name], VARIANTS[variant]
    os.makedirs(out_dir, exist_ok=True)
    model = models.build(name)
    path = os.path.join(out_dir, "model.onnx")
    exported = models.export(spec, model, path, batch, dynamic)
    # The export ran a forward; in TRAINING mode nothing it does changes state (no dropout, no
    # batch-norm statistics), but read the initial weights back from the file to be sure both sides
    # start from the same bits.
    init = {i.name: numpy_helper.to_array(i).copy() for i in onnx.load(path).graph.initializer
            if i.name in exported.params}
    with torch.no_grad():
        for n, p in model.named_parameters():
            if not np.array_equal(p.numpy(), init[n]):
                raise RuntimeError(f"{name}: {n} in the export differs from the module's")
    g = torch.Generator().manual_seed(1)
    x, y = models.example(spec, batch, g)
    save_inputs(spec, x, y, os.path.join(out_dir, "inputs"))
    max_norm = 0.0
    if v.clip:
        max_norm = float(f"{v.clip * first_grad_norm(name, x, y):.3g}")
    losses, norms, touched, buffers = train(name, model, v, x, y, steps, max_norm)
    if max_norm and norms[0] <= max_norm:
        raise RuntimeError(f"{name}/{variant}: max_norm {max_norm} does not clip (norms {norms})")
    final = {n: p.detach().numpy().copy() for n, p in model.named_parameters()}
    # Exact zeros (an embedding row no token reads) are deterministic and stay compared.
    dead = {n: m & touched[n] for n, m in dead_elements(name, init, v, x, y, steps, max_norm).items()}
    np.savez(os.path.join(out_dir, "expected.npz"), losses=np.array(losses),
             grad_norms=np.array(norms), **{f"init/{k}": a for k, a in init.items()},
             **{f"final/{k}": a for k, a in final.items()},
             **{f"dead/{k}": a for k, a in dead.items()},
             **{f"buffers/{k}": a for k, a in buffers.items()})
    return Reference(path, os.path.join(out_dir, "inputs"), exported,
                     train_table(name, v, max_norm, exported.frozen, steps), losses, norms, init,
                     final, dead, buffers)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--models", default=",".join(models.MODELS))
    ap.add_argument("--variants", default=",".join(VARIANTS))
    a = ap.parse_args()
    for name in a.models.split(","):
        for variant in a.variants.split(","):
            r = make(name, variant, os.path.join(a.out, f"{name}-{variant}"))
            print(f"{name:12} {variant:11} clip={r.train['clip_norm']:<8g} losses "
                  + " ".join(f"{l:.5f}" for l in r.losses))


if __name__ == "__main__":
    main()
