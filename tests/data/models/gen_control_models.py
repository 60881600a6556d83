#!/usr/bin/python3
"""Exports the recurrent and control-flow test models and their PyTorch reference outputs.

Run with Debian's interpreter (python3-torch 1.13, python3-onnx):

    /usr/bin/python3 tests/data/models/gen_control_models.py

Writes <name>.onnx and <name>.io/test_data_set_0/{input,output}_K.pb (ONNX backend-test layout) for

- tiny-lstm: a 2-layer bidirectional nn.LSTM (batch_first) and a linear head: ONNX LSTM nodes in
  both directions, with the Transpose/Reshape glue the exporter puts between layers;
- tiny-gru: a 1-layer nn.GRU fed its initial hidden state as an input, returning output and h_n;
- tiny-loop: a torch.jit.script'ed module whose loop count is an input and whose branch depends on
  the data: ONNX Loop (a body reading the outer Linear's weights) and If;
- tiny-seq: a scripted module that splits its input into a list, maps a Linear over the list and
  concatenates it again: SplitToSequence, SequenceEmpty, SequenceLength, a Loop with SequenceAt and
  SequenceInsert, ConcatFromSequence (the list pattern of scripted and dynamic-shape exports).

tests/unit/job/models_test.cpp runs each through hp's executor and compares with these outputs
within 1e-4 absolute.
"""
import os
from typing import List

import numpy as np
import onnx
import torch
from onnx import numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))


class TinyLSTM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = torch.nn.LSTM(6, 8, num_layers=2, bidirectional=True, batch_first=True)
        self.head = torch.nn.Linear(16, 3)

    def forward(self, x):
        y, _ = self.rnn(x)
        return self.head(y)


class TinyGRU(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = torch.nn.GRU(5, 7)

    def forward(self, x, h0):
        return self.rnn(x, h0)


class TinyLoop(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x, n):
        h = x
        for _ in range(int(n)):
            h = torch.tanh(self.lin(h)) + h * 0.5
        if bool(h.sum() > 0):
            h = h * 2.0
        else:
            h = h - 1.0
        return h


class TinySeq(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(2, 2)

    def forward(self, x):
        parts = torch.split(x, 2, dim=1)
        outs: List[torch.Tensor] = []
        for p in parts:
            outs.append(torch.relu(self.lin(p)))
        return torch.cat(outs, dim=1)


def write(path, array):
    with open(path, "wb") as f:
        f.write(numpy_helper.from_array(np.array(array, order="C")).SerializeToString())


def export(name, module, inputs, input_names, output_names, script=False):
    module.eval()
    m = torch.jit.script(module) if script else module
    with torch.no_grad():
        outputs = m(*inputs)
    if isinstance(outputs, torch.Tensor):
        outputs = (outputs,)
    torch.onnx.export(m, tuple(inputs), os.path.join(HERE, name + ".onnx"), opset_version=14,
                      input_names=input_names, output_names=output_names)
    onnx.checker.check_model(onnx.load(os.path.join(HERE, name + ".onnx")))
    d = os.path.join(HERE, name + ".io", "test_data_set_0")
    os.makedirs(d, exist_ok=True)
    for k, t in enumerate(inputs):
        write(os.path.join(d, "input_%d.pb" % k), t.numpy())
    for k, t in enumerate(outputs):
        write(os.path.join(d, "output_%d.pb" % k), t.detach().numpy())


def main():
    g = torch.Generator().manual_seed(1234)
    torch.manual_seed(7)
    export("tiny-lstm", TinyLSTM(), [torch.randn(2, 5, 6, generator=g)], ["x"], ["y"])
    torch.manual_seed(8)
    export("tiny-gru", TinyGRU(), [torch.randn(4, 3, 5, generator=g), torch.randn(1, 3, 7, generator=g)],
           ["x", "h0"], ["y", "h_n"])
    torch.manual_seed(9)
    export("tiny-loop", TinyLoop(), [torch.randn(2, 4, generator=g), torch.tensor(3, dtype=torch.int64)],
           ["x", "n"], ["y"], script=True)
    torch.manual_seed(10)
    export("tiny-seq", TinySeq(), [torch.randn(3, 6, generator=g)], ["x"], ["y"], script=True)


if __name__ == "__main__":
    main()
