#!/usr/bin/python3
"""Writes tests/data/train/optim_reference.json: torch.optim's AdamW and SGD (with
clip_grad_norm_ and a warm-up + cosine learning rate) run for 5 steps on small fixed tensors, for
optimizer_test.cpp to compare hp's optimizer with.

Run with Debian's torch (python3-torch): /usr/bin/python3 tests/unit/train/make_optim_reference.py
Gradients are drawn here and stored, so the C++ test needs no torch random generator.
"""
import json
import math
import os
import sys

import torch

STEPS = 5
SHAPES = [[3, 4], [5], [2, 1, 3]]


def cosine_lr(lr, min_lr, warmup, total, step):
    """nanoGPT's get_lr, step 1-based (the formula optimizer.h states)."""
    if warmup > 0 and step <= warmup:
        return lr * step / warmup
    if total <= warmup:
        return lr
    p = min(1.0, (step - warmup) / (total - warmup))
    return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * p))


def run_case(name, config, grad_scale, gen):
    params0 = [torch.randn(s, generator=gen, dtype=torch.float32) for s in SHAPES]
    grads = [[torch.randn(s, generator=gen, dtype=torch.float32) * grad_scale for s in SHAPES]
             for _ in range(STEPS)]
    params = [torch.nn.Parameter(p.clone()) for p in params0]
    if config["kind"] == "adamw":
        opt = torch.optim.AdamW(params, lr=config["lr"], betas=(config["beta1"], config["beta2"]),
                                eps=config["eps"], weight_decay=config["weight_decay"],
                                foreach=False)
    else:
        opt = torch.optim.SGD(params, lr=config["lr"], momentum=config["momentum"],
                              weight_decay=config["weight_decay"], foreach=False)
    steps = []
    for k in range(STEPS):
        for p, g in zip(params, grads[k]):
            p.grad = g.clone()
        norm = torch.nn.utils.clip_grad_norm_(params, config["clip_norm"]) if config[
            "clip_norm"] > 0 else torch.norm(torch.stack([torch.norm(g) for g in grads[k]]))
        lr = config["lr"]
        if config["schedule"] == "cosine":
            lr = cosine_lr(config["lr"], config["min_lr"], config["warmup_steps"],
                           config["total_steps"], k + 1)
        for group in opt.param_groups:
            group["lr"] = lr
        opt.step()
        step = {"grad_norm": float(norm), "lr": lr,
                "params": [p.detach().flatten().tolist() for p in params]}
        if config["kind"] == "adamw":
            step["exp_avg"] = [opt.state[p]["exp_avg"].flatten().tolist() for p in params]
            step["exp_avg_sq"] = [opt.state[p]["exp_avg_sq"].flatten().tolist() for p in params]
        elif config["momentum"] != 0:
            step["exp_avg"] = [opt.state[p]["momentum_buffer"].flatten().tolist() for p in params]
        steps.append(step)
    return {"name": name, "config": config, "shapes": SHAPES,
            "params0": [p.flatten().tolist() for p in params0],
            "grads": [[g.flatten().tolist() for g in gs] for gs in grads], "steps": steps}


def main():
    gen = torch.Generator().manual_seed(1234)
    base = {"lr": 1e-2, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.1,
            "momentum": 0.0, "clip_norm": 0.0, "schedule": "constant", "warmup_steps": 0,
            "total_steps": 0, "min_lr": 0.0}
    cases = [
        run_case("adamw", dict(base, kind="adamw"), 1.0, gen),
        # Gradients ~10x larger than the clip threshold: every step is clipped.
        run_case("adamw_clip_cosine",
                 dict(base, kind="adamw", lr=3e-2, beta2=0.95, eps=1e-6, clip_norm=1.0,
                      schedule="cosine", warmup_steps=2, total_steps=5, min_lr=3e-3), 4.0, gen),
        run_case("sgd_momentum_clip",
                 dict(base, kind="sgd", lr=5e-2, momentum=0.9, weight_decay=0.01, clip_norm=2.0),
                 1.5, gen),
        run_case("sgd_plain", dict(base, kind="sgd", lr=0.1, weight_decay=0.0), 1.0, gen),
    ]
    out = {"generator": "tests/unit/train/make_optim_reference.py",
           "torch": torch.__version__, "cases": cases}
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(here, "..", "..", "data", "train", "optim_reference.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=None, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {os.path.normpath(path)}", file=sys.stderr)


if __name__ == "__main__":
    main()
