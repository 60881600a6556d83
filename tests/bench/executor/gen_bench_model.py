#!/usr/bin/python3
"""Generates the executor benchmark's GPT-style model and one input, with PyTorch's ONNX exporter.

    /usr/bin/python3 tests/bench/executor/gen_bench_model.py OUT_DIR [--hidden 512 --layers 6 ...]

Writes OUT_DIR/gpt-bench.onnx (about 50 MB of float32 weights at the default size, so it is generated
at benchmark time and never committed) OUT_DIR/gpt-bench.io/input_0.pb (int64 token ids, batch x seq),
the same ids raw in input_ids.i64 (for the ONNX Runtime driver) and PyTorch's logits in output_0.pb. The model is a GPT-2 block stack (pre-LayerNorm, fused qkv projection, causal softmax attention,
GELU MLP, tied lm_head) exported the way users export: dynamic batch/seq axes and torch's default
constant folding, so the graph carries the exporter's usual Shape/Gather/Concat shape arithmetic.
"""
import argparse
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from onnx import numpy_helper


class Block(nn.Module):
    def __init__(self, h, heads):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(h)
        self.c_attn = nn.Linear(h, 3 * h)
        self.c_proj = nn.Linear(h, h)
        self.ln_2 = nn.LayerNorm(h)
        self.c_fc = nn.Linear(h, 4 * h)
        self.mlp_proj = nn.Linear(4 * h, h)

    def forward(self, x):
        b, t, c = x.size()
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        hd = c // self.heads
        q = q.view(b, t, self.heads, hd).transpose(1, 2)
        k = k.view(b, t, self.heads, hd).transpose(1, 2)
        v = v.view(b, t, self.heads, hd).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        mask = torch.tril(torch.ones(t, t, dtype=torch.bool))
        att = att.masked_fill(~mask, float("-inf"))
        y = F.softmax(att, dim=-1) @ v
        y = y.transpose(1, 2).contiguous().view(b, t, c)
        x = x + self.c_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self, vocab, pos, h, heads, layers):
        super().__init__()
        self.wte = nn.Embedding(vocab, h)
        self.wpe = nn.Embedding(pos, h)
        self.h = nn.ModuleList([Block(h, heads) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(h)
        self.lm_head = nn.Linear(h, vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, idx):
        t = idx.size(1)
        pos = torch.arange(0, t, dtype=torch.long).unsqueeze(0)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    a = ap.parse_args()
    torch.manual_seed(0)
    m = GPT(a.vocab, max(a.seq, 128), a.hidden, a.heads, a.layers).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0.0, 0.02)
    idx = torch.randint(0, a.vocab, (a.batch, a.seq))
    os.makedirs(os.path.join(a.out, "gpt-bench.io"), exist_ok=True)
    path = os.path.join(a.out, "gpt-bench.onnx")
    torch.onnx.export(m, (idx,), path, input_names=["input_ids"], output_names=["logits"],
                      dynamic_axes={"input_ids": {0: "batch", 1: "seq"}, "logits": {0: "batch", 1: "seq"}},
                      opset_version=17)
    t = numpy_helper.from_array(idx.numpy(), "input_ids")
    with open(os.path.join(a.out, "gpt-bench.io", "input_0.pb"), "wb") as f:
        f.write(t.SerializeToString())
    # The same ids as raw little-endian int64 for the ONNX Runtime driver (no protobuf in node).
    with open(os.path.join(a.out, "gpt-bench.io", "input_ids.i64"), "wb") as f:
        f.write(idx.numpy().astype("<i8").tobytes())
    with torch.no_grad():
        out = m(idx).numpy()
    with open(os.path.join(a.out, "gpt-bench.io", "output_0.pb"), "wb") as f:
        f.write(numpy_helper.from_array(out, "logits").SerializeToString())
    print(path)


if __name__ == "__main__":
    main()
