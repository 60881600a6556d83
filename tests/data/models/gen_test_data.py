#!/usr/bin/python3
"""Writes PyTorch reference inputs/outputs for the tiny test models (ONNX backend-test layout).

Run with Debian's interpreter (python3-torch, python3-onnx), after gen_models.py:

    /usr/bin/python3 tests/data/models/gen_test_data.py

For each model <name>.onnx this rebuilds the PyTorch module of gen_models.py from the config in
<name>.json, loads the weights from the ONNX initializers (by parameter name; the models are exported
without constant folding, so initializer names are the state_dict keys), runs it on fixed random
inputs and writes <name>.io/test_data_set_0/input_K.pb and output_0.pb. The executor's model tests
compare hp's outputs with these within 1e-4 absolute.
"""
import json
import os

import numpy as np
import onnx
import torch
from onnx import numpy_helper

import gen_models as gm

HERE = os.path.dirname(os.path.abspath(__file__))


def build(name, cfg):
    if name == "tiny-gpt2":
        return gm.GPT(cfg["vocab"], cfg["pos"], cfg["hidden"], cfg["heads"], cfg["layers"], cfg["tied"])
    if name == "tiny-llama":
        return gm.Llama(cfg["vocab"], cfg["hidden"], cfg["heads"], cfg["kv_heads"], cfg["ffn"], cfg["layers"])
    if name == "tiny-vit":
        return gm.ViT(cfg["image"], cfg["patch"], 3, cfg["hidden"], cfg["heads"], cfg["layers"], cfg["classes"])
    if name == "tiny-mlp":
        return gm.MLP(cfg["in"], cfg["hidden"], cfg["layers"], cfg["out"])
    if name == "tiny-moe":
        return gm.MoE(cfg["vocab"], cfg["hidden"], cfg["ffn"], cfg["experts"], cfg["top_k"], cfg["layers"])
    raise KeyError(name)


def inputs_for(name, cfg, g):
    if name == "tiny-vit":
        return [torch.randn(2, 3, cfg["image"], cfg["image"], generator=g)]
    if name == "tiny-mlp":
        return [torch.randn(3, cfg["in"], generator=g)]
    seq = 8 if name == "tiny-moe" else 12
    return [torch.randint(0, cfg["vocab"], (2, seq), generator=g)]


def main():
    for name in ["tiny-mlp", "tiny-gpt2", "tiny-llama", "tiny-vit", "tiny-moe"]:
        with open(os.path.join(HERE, name + ".json")) as f:
            cfg = json.load(f)["config"]
        model = onnx.load(os.path.join(HERE, name + ".onnx"))
        m = build(name, cfg)
        m.eval()
        weights = {t.name: torch.from_numpy(numpy_helper.to_array(t).copy()) for t in model.graph.initializer}
        state = m.state_dict()
        loaded = {k: weights[k] for k in state if k in weights}
        missing = [k for k in dict(m.named_parameters()) if k not in weights]
        assert not missing, (name, missing)
        m.load_state_dict(loaded, strict=False)
        g = torch.Generator().manual_seed(1)
        args = inputs_for(name, cfg, g)
        with torch.no_grad():
            out = m(*args)
        d = os.path.join(HERE, name + ".io", "test_data_set_0")
        os.makedirs(d, exist_ok=True)
        graph_inputs = [i.name for i in model.graph.input if i.name not in weights]
        for k, (iname, a) in enumerate(zip(graph_inputs, args)):
            onnx.save_tensor(numpy_helper.from_array(a.numpy(), iname), os.path.join(d, f"input_{k}.pb"))
        onnx.save_tensor(numpy_helper.from_array(out.numpy().astype(np.float32), "output"),
                         os.path.join(d, "output_0.pb"))
        print(f"{name}: inputs {[tuple(a.shape) for a in args]} -> output {tuple(out.shape)}")


if __name__ == "__main__":
    main()
