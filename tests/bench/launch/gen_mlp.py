#!/usr/bin/env python3
"""Writes the GEMM-heavy model of the launch benchmark: a stack of transformer-style MLP blocks
(LayerNorm, Linear hidden->4*hidden, GELU, Linear 4*hidden->hidden, residual) exported by PyTorch with
dynamic batch/seq dims, plus one input tensor (input_0.pb). Tensor parallelism splits every block into a
column- and a row-parallel GEMM with one AllReduce, so TP=2 halves the FLOPs per rank.

    gen_mlp.py OUT_DIR [--hidden 1024] [--blocks 4] [--batch 4] [--seq 128]
"""
import argparse
import os

import numpy as np
import onnx
import torch
from onnx import numpy_helper


class Block(torch.nn.Module):
    def __init__(self, h):
        super().__init__()
        self.ln = torch.nn.LayerNorm(h)
        self.up = torch.nn.Linear(h, 4 * h)
        self.down = torch.nn.Linear(4 * h, h)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.ln(x))))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    a = ap.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[Block(a.hidden) for _ in range(a.blocks)]).eval()
    x = torch.randn(a.batch, a.seq, a.hidden)
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "mlp.onnx")
    torch.onnx.export(model, (x,), path, input_names=["x"], output_names=["y"], opset_version=17,
                      dynamic_axes={"x": {0: "batch", 1: "seq"}, "y": {0: "batch", 1: "seq"}})
    onnx.checker.check_model(onnx.load(path))
    t = numpy_helper.from_array(x.numpy().astype(np.float32), "x")
    os.makedirs(os.path.join(a.out, "inputs"), exist_ok=True)
    with open(os.path.join(a.out, "inputs", "input_0.pb"), "wb") as f:
        f.write(t.SerializeToString())


if __name__ == "__main__":
    main()
