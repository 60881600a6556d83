#!/usr/bin/python3
"""Generates the executor benchmark's small CNN and one input, with PyTorch's ONNX exporter.

    /usr/bin/python3 tests/bench/executor/gen_bench_cnn.py OUT_DIR [--channels 32 --blocks 4 ...]

Writes OUT_DIR/cnn-bench.onnx, OUT_DIR/cnn-bench.io/input_0.pb (float32 images, batch x 3 x size x
size), the same images raw in input.f32 (for the ONNX Runtime driver) and PyTorch's logits in
output_0.pb. The model is a ResNet-style stack: a 3x3 conv stem with BatchNorm and ReLU, then residual
basic blocks (conv-BN-ReLU, conv-BN, add the block's input, ReLU), global average pooling and a
linear classifier. It is exported the way users export a vision model: eval mode (so BatchNorm is an
inference-mode BatchNormalization node), a dynamic batch axis, torch's default constant folding.
"""
import argparse
import os

import torch
from torch import nn
from onnx import numpy_helper


class Block(nn.Module):
    def __init__(self, ch):
        super().__init__()
        self.conv1 = nn.Conv2d(ch, ch, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(ch)
        self.conv2 = nn.Conv2d(ch, ch, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(ch)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + x)


class Net(nn.Module):
    def __init__(self, ch, blocks, classes):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, ch, 3, padding=1, bias=False), nn.BatchNorm2d(ch),
                                  nn.ReLU())
        self.blocks = nn.Sequential(*[Block(ch) for _ in range(blocks)])
        self.head = nn.Linear(ch, classes)

    def forward(self, x):
        y = self.blocks(self.stem(x))
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(y, 1), 1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--channels", type=int, default=32)
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--size", type=int, default=32)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--classes", type=int, default=10)
    a = ap.parse_args()
    torch.manual_seed(0)
    m = Net(a.channels, a.blocks, a.classes)
    # Running statistics as after training (fresh ones are 0 and 1, which would make BatchNorm an
    # identity up to its affine part and hide a wrong fold).
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, nn.BatchNorm2d):
                mod.running_mean.uniform_(-0.5, 0.5)
                mod.running_var.uniform_(0.5, 2.0)
                mod.weight.uniform_(0.5, 1.5)
                mod.bias.uniform_(-0.2, 0.2)
    m.eval()
    x = torch.randn(a.batch, 3, a.size, a.size)
    os.makedirs(os.path.join(a.out, "cnn-bench.io"), exist_ok=True)
    path = os.path.join(a.out, "cnn-bench.onnx")
    torch.onnx.export(m, (x,), path, input_names=["images"], output_names=["logits"],
                      dynamic_axes={"images": {0: "batch"}, "logits": {0: "batch"}}, opset_version=17)
    with open(os.path.join(a.out, "cnn-bench.io", "input_0.pb"), "wb") as f:
        f.write(numpy_helper.from_array(x.numpy(), "images").SerializeToString())
    # The same images as raw little-endian float32 for the ONNX Runtime driver (no protobuf in node).
    with open(os.path.join(a.out, "cnn-bench.io", "input.f32"), "wb") as f:
        f.write(x.numpy().astype("<f4").tobytes())
    with torch.no_grad():
        out = m(x).numpy()
    with open(os.path.join(a.out, "cnn-bench.io", "output_0.pb"), "wb") as f:
        f.write(numpy_helper.from_array(out, "logits").SerializeToString())
    print(path)


if __name__ == "__main__":
    main()
