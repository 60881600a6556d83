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
import os

import sys

import torch
from onnx import numpy_helper

# The GPT-2 block stack of the repo's test models (same module, so the benchmark runs what the
# correctness tests check); only the sizes differ.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "data", "models"))
from gen_models import GPT  # noqa: E402


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
    m = GPT(a.vocab, max(a.seq, 128), a.hidden, a.heads, a.layers, tied=True).eval()
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
