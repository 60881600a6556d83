#!/usr/bin/python3
"""Writes the omni-modal example's ONNX modules and its PyTorch reference (recipes/omni-modal.toml).

Run with Debian's interpreter (python3-torch 1.13, python3-onnx) from the repository root:

    /usr/bin/python3 recipes/omni-modal/gen_omni_modal.py

The example is the process-group layout of the HyperParallel paper's Listing 1: a text encoder and an
image encoder on two ranks each (data parallel: each rank serves half of the requests), an audio
encoder on one CPU rank, a fusion module on one rank and a scheduler rank that feeds the requests and
collects the results. Each encoder is a small but real network:

  text.onnx    tokens i64 [2,16]      -> token + position embedding, one pre-norm transformer block
                                         (2 heads, GELU MLP), mean over tokens  -> text_emb  f32 [2,32]
  image.onnx   image f32 [2,3,16,16]  -> 4x4 conv patch embedding (ViT style), one transformer block,
                                         mean over patches                      -> image_emb f32 [2,32]
  audio.onnx   audio f32 [4,20,32]    -> two 1-D convolutions over a 20-band spectrogram of 32 frames,
               (batch, mels, frames)     GELU, mean over time                   -> audio_emb f32 [4,32]
  fusion.onnx  text_emb, image_emb, audio_emb [4,32] each -> concatenated, a GELU MLP -> logits [4,10]

Batch dims are fixed: a module declares the rows one rank serves (4 requests in all; 2 per text and
image rank). omni.onnx is the same network end to end on one rank (the recipe's `model`). The reference
is computed by the PyTorch modules themselves, not by any ONNX runtime: requests/input_K.pb (tokens,
image, audio) and expected/output_0.pb (logits), in the ONNX backend-test layout `hp launch` reads.
Weights come from a fixed seed, so rerunning rewrites identical files.
"""
import os

import numpy as np
import onnx
import torch
from onnx import numpy_helper
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
BATCH, DP = 4, 2          # requests in all; ranks of the text and image groups
VOCAB, SEQ, DIM, HEADS = 64, 16, 32, 2
IMAGE, PATCH = 16, 4
MELS, FRAMES = 20, 32
CLASSES = 10


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x):
        b, t, d = x.shape
        h = self.heads
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (y.reshape(b, t, h, d // h).transpose(1, 2) for y in (q, k, v))
        a = torch.softmax(q @ k.transpose(2, 3) / (d // h) ** 0.5, dim=-1) @ v
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class TextEncoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok, self.pos = nn.Embedding(VOCAB, DIM), nn.Parameter(torch.randn(SEQ, DIM) * 0.1)
        self.block, self.ln = Block(DIM, HEADS), nn.LayerNorm(DIM)

    def forward(self, tokens):
        return self.ln(self.block(self.tok(tokens) + self.pos)).mean(dim=1)


class ImageEncoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.patch = nn.Conv2d(3, DIM, PATCH, stride=PATCH)
        self.pos = nn.Parameter(torch.randn((IMAGE // PATCH) ** 2, DIM) * 0.1)
        self.block, self.ln = Block(DIM, HEADS), nn.LayerNorm(DIM)

    def forward(self, image):
        x = self.patch(image).flatten(2).transpose(1, 2) + self.pos
        return self.ln(self.block(x)).mean(dim=1)


class AudioEncoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv1d(MELS, DIM, 3, padding=1)
        self.conv2 = nn.Conv1d(DIM, DIM, 3, stride=2, padding=1)
        self.act = nn.GELU()

    def forward(self, audio):
        return self.act(self.conv2(self.act(self.conv1(audio)))).mean(dim=2)


class Fusion(nn.Module):
    def __init__(self):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(3 * DIM, 64), nn.GELU(), nn.Linear(64, CLASSES))

    def forward(self, text_emb, image_emb, audio_emb):
        return self.mlp(torch.cat([text_emb, image_emb, audio_emb], dim=1))


class Omni(nn.Module):
    """The whole job on one rank: the recipe's `model`, and what the MPMD run must reproduce."""

    def __init__(self, text, image, audio, fusion):
        super().__init__()
        self.text, self.image, self.audio, self.fusion = text, image, audio, fusion

    def forward(self, tokens, image, audio):
        return self.fusion(self.text(tokens), self.image(image), self.audio(audio))


def export(module, args, names, outputs, file):
    path = os.path.join(HERE, file)
    torch.onnx.export(module, args, path, input_names=names, output_names=outputs, opset_version=17,
                      do_constant_folding=True)
    onnx.checker.check_model(onnx.load(path))


def write_tensor(path, name, array):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    t = numpy_helper.from_array(array, name)
    with open(path, "wb") as f:
        f.write(t.SerializeToString())


def main():
    torch.manual_seed(0)
    text, image, audio, fusion = TextEncoder(), ImageEncoder(), AudioEncoder(), Fusion()
    omni = Omni(text, image, audio, fusion).eval()
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ), dtype=torch.int64)
    images = torch.randn(BATCH, 3, IMAGE, IMAGE)
    spectra = torch.randn(BATCH, MELS, FRAMES)
    per = BATCH // DP
    emb = torch.zeros(BATCH, DIM)
    with torch.no_grad():
        export(text, (tokens[:per],), ["tokens"], ["text_emb"], "text.onnx")
        export(image, (images[:per],), ["image"], ["image_emb"], "image.onnx")
        export(audio, (spectra,), ["audio"], ["audio_emb"], "audio.onnx")
        export(fusion, (emb, emb, emb), ["text_emb", "image_emb", "audio_emb"], ["logits"], "fusion.onnx")
        export(omni, (tokens, images, spectra), ["tokens", "image", "audio"], ["logits"], "omni.onnx")
        logits = omni(tokens, images, spectra)
    for k, (name, x) in enumerate([("tokens", tokens), ("image", images), ("audio", spectra)]):
        write_tensor(os.path.join(HERE, "requests", f"input_{k}.pb"), name, x.numpy())
    write_tensor(os.path.join(HERE, "expected", "output_0.pb"), "logits", logits.numpy())
    print("logits[0] =", logits[0].numpy())


if __name__ == "__main__":
    main()
