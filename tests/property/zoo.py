#!/usr/bin/python3
"""Model families written the way users write them, exported the way users export them.

Each family is a small PyTorch module in the idiom its users use (nn.MultiheadAttention with an
additive causal mask, hand-written attention, a Llama block with RoPE and grouped-query attention,
a top-k MoE, the same written as Mixtral's routing loop, a ViT, a CNN, an LSTM), nothing shaped for hp: default initialisation (so the exporter
deduplicates equal LayerNorm weights through Identity nodes), torch.onnx.export's default constant
folding, opset 17. `export(family, out_dir, dynamic)` writes <family>[-static].onnx and the torch
reference: <name>.io/input_K.pb and output_0.pb at the batch the chain test runs.
"""
import math
import os

import onnx
import torch
import torch.nn as nn
import torch.nn.functional as F
from onnx import numpy_helper

VOCAB, HIDDEN, HEADS, LAYERS, SEQ = 64, 32, 4, 4, 8


class MhaBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(HIDDEN)
        self.attn = nn.MultiheadAttention(HIDDEN, HEADS, batch_first=True)
        self.ln2 = nn.LayerNorm(HIDDEN)
        self.mlp = nn.Sequential(nn.Linear(HIDDEN, 4 * HIDDEN), nn.GELU(), nn.Linear(4 * HIDDEN, HIDDEN))

    def forward(self, x, mask):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class GptMha(nn.Module):
    """GPT with nn.MultiheadAttention(batch_first=True) and an additive causal mask."""

    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, HIDDEN)
        self.pos = nn.Embedding(64, HIDDEN)
        self.blocks = nn.ModuleList(MhaBlock() for _ in range(LAYERS))
        self.ln = nn.LayerNorm(HIDDEN)
        self.head = nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, ids):
        t = ids.shape[1]
        mask = torch.triu(torch.full((t, t), float("-inf")), diagonal=1)
        x = self.tok(ids) + self.pos(torch.arange(t))
        for b in self.blocks:
            x = b(x, mask)
        return self.head(self.ln(x))


class HandAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(HIDDEN, 3 * HIDDEN)
        self.proj = nn.Linear(HIDDEN, HIDDEN)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q = q.view(b, t, HEADS, c // HEADS).transpose(1, 2)
        k = k.view(b, t, HEADS, c // HEADS).transpose(1, 2)
        v = v.view(b, t, HEADS, c // HEADS).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(c // HEADS)
        causal = torch.tril(torch.ones(t, t, dtype=torch.bool))
        att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        return self.proj((att @ v).transpose(1, 2).contiguous().view(b, t, c))


class HandBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(HIDDEN), nn.LayerNorm(HIDDEN)
        self.attn = HandAttention()
        self.fc, self.out = nn.Linear(HIDDEN, 4 * HIDDEN), nn.Linear(4 * HIDDEN, HIDDEN)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GptHand(nn.Module):
    """nanoGPT-style: hand-written causal attention, tied embedding."""

    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, HIDDEN)
        self.pos = nn.Embedding(64, HIDDEN)
        self.blocks = nn.ModuleList(HandBlock() for _ in range(LAYERS))
        self.ln = nn.LayerNorm(HIDDEN)
        self.head = nn.Linear(HIDDEN, VOCAB, bias=False)
        self.head.weight = self.tok.weight

    def forward(self, ids):
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1]))
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln(x))


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def repeat_kv(x, n_rep):
    """Hugging Face Llama's GQA expansion (modeling_llama.repeat_kv). torch 1.13 exports
    repeat_interleave on the head dim to a Reshape that interleaves the wrong axes, wrong in every
    runtime, so a Llama written with it cannot be checked against torch."""
    b, kv, s, d = x.shape
    return x[:, :, None, :, :].expand(b, kv, n_rep, s, d).reshape(b, kv * n_rep, s, d)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class LlamaBlock(nn.Module):
    KV = 2

    def __init__(self):
        super().__init__()
        self.hd = HIDDEN // HEADS
        self.norm1, self.norm2 = RMSNorm(HIDDEN), RMSNorm(HIDDEN)
        self.q = nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.k = nn.Linear(HIDDEN, self.KV * self.hd, bias=False)
        self.v = nn.Linear(HIDDEN, self.KV * self.hd, bias=False)
        self.o = nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.gate = nn.Linear(HIDDEN, 2 * HIDDEN, bias=False)
        self.up = nn.Linear(HIDDEN, 2 * HIDDEN, bias=False)
        self.down = nn.Linear(2 * HIDDEN, HIDDEN, bias=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        h = self.norm1(x)
        q = self.q(h).view(b, t, HEADS, self.hd).transpose(1, 2)
        k = self.k(h).view(b, t, self.KV, self.hd).transpose(1, 2)
        v = self.v(h).view(b, t, self.KV, self.hd).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = repeat_kv(k, HEADS // self.KV), repeat_kv(v, HEADS // self.KV)
        att = (q @ k.transpose(2, 3)) / math.sqrt(self.hd)
        att = att + torch.full((t, t), float("-inf")).triu(1)
        y = (att.softmax(-1) @ v).transpose(1, 2).reshape(b, t, HIDDEN)
        x = x + self.o(y)
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(nn.Module):
    """Llama: RMSNorm, RoPE from arange in the forward, GQA through repeat_kv, SwiGLU."""

    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, HIDDEN)
        self.blocks = nn.ModuleList(LlamaBlock() for _ in range(LAYERS))
        self.norm = RMSNorm(HIDDEN)
        self.head = nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, ids):
        t = ids.shape[1]
        hd = HIDDEN // HEADS
        inv = 1.0 / (10000 ** (torch.arange(0, hd, 2).float() / hd))
        freqs = torch.outer(torch.arange(t).float(), inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos()[None, None], emb.sin()[None, None]
        x = self.tok(ids)
        for b in self.blocks:
            x = b(x, cos, sin)
        return self.head(self.norm(x))


class MoeLayer(nn.Module):
    E, K = 4, 2

    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(HIDDEN)
        self.router = nn.Linear(HIDDEN, self.E, bias=False)
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(HIDDEN, 2 * HIDDEN), nn.ReLU(), nn.Linear(2 * HIDDEN, HIDDEN))
            for _ in range(self.E))

    def forward(self, x):
        h = self.ln(x)
        weights, idx = torch.topk(self.router(h).softmax(-1), self.K, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True)
        y = torch.zeros_like(h)
        for e, expert in enumerate(self.experts):
            gate = (weights * (idx == e).to(h.dtype)).sum(-1, keepdim=True)
            y = y + gate * expert(h)
        return x + y


class MixtralLayer(MoeLayer):
    """The same experts combined as transformers' MixtralSparseMoeBlock does: each expert runs on
    the rows routed to it (torch.where on the one-hot routing), its weighted output added back with
    index_add_ into torch.zeros((n, d)); the rows an expert gets are known only when it runs."""

    def forward(self, x):
        b, s, d = x.shape
        h = self.ln(x).reshape(-1, d)
        weights, idx = torch.topk(self.router(h).softmax(-1), self.K, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True)
        y = torch.zeros((b * s, d), dtype=h.dtype)
        mask = F.one_hot(idx, self.E).permute(2, 1, 0)  # [E, K, n]
        for e, expert in enumerate(self.experts):
            slot, rows = torch.where(mask[e])
            picked = h[None, rows].reshape(-1, d)
            y.index_add_(0, rows, expert(picked) * weights[rows, slot, None])
        return x + y.reshape(b, s, d)


class Moe(nn.Module):
    """Top-2 MoE with a softmax router; experts combined by mask-multiply (dense), or as
    Mixtral's loop (`layer`)."""

    def __init__(self, layer=MoeLayer):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, HIDDEN)
        self.layers = nn.ModuleList(layer() for _ in range(LAYERS))
        self.head = nn.Linear(HIDDEN, VOCAB)

    def forward(self, ids):
        x = self.tok(ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


class Vit(nn.Module):
    """ViT: Conv2d patches, a class token, nn.TransformerEncoder (batch_first), a linear head."""

    def __init__(self):
        super().__init__()
        self.patch = nn.Conv2d(3, HIDDEN, 4, stride=4)
        self.cls = nn.Parameter(torch.randn(1, 1, HIDDEN) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, 17, HIDDEN) * 0.02)
        layer = nn.TransformerEncoderLayer(HIDDEN, HEADS, 2 * HIDDEN, dropout=0.0, batch_first=True,
                                           norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.head = nn.Linear(HIDDEN, 10)

    def forward(self, img):
        x = self.patch(img).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        return self.head(self.encoder(x)[:, 0])


class Cnn(nn.Module):
    """A small ResNet-like CNN: conv-bn-relu stages with residuals, global average pool."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.stages = nn.ModuleList(
            nn.Sequential(nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                          nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16))
            for _ in range(LAYERS))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, 10)

    def forward(self, img):
        x = self.stem(img)
        for s in self.stages:
            x = F.relu(x + s(x))
        return self.fc(self.pool(x).flatten(1))


class Lstm(nn.Module):
    """Embedding, a 2-layer nn.LSTM (batch_first), a linear head over every step."""

    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, HIDDEN)
        self.lstm = nn.LSTM(HIDDEN, HIDDEN, num_layers=2, batch_first=True)
        self.head = nn.Linear(HIDDEN, VOCAB)

    def forward(self, ids):
        return self.head(self.lstm(self.tok(ids))[0])


FAMILIES = {
    "gpt-mha": (GptMha, "tokens"),
    "gpt-hand": (GptHand, "tokens"),
    "llama": (Llama, "tokens"),
    "moe": (Moe, "tokens"),
    "mixtral": (lambda: Moe(MixtralLayer), "tokens"),
    "vit": (Vit, "image"),
    "cnn": (Cnn, "image"),
    "lstm": (Lstm, "tokens"),
}


def example(kind, batch, seq, g):
    if kind == "image":
        return torch.randn(batch, 3, 16, 16, generator=g)
    return torch.randint(0, VOCAB, (batch, seq), generator=g)


def export(family, out_dir, dynamic, batch):
    """Exports `family`; returns the .onnx path. The reference runs at `batch`; a dynamic export is
    traced at another batch so nothing of the run's batch is baked into the graph."""
    cls, kind = FAMILIES[family]
    torch.manual_seed(0)
    model = cls().eval()
    name = family + ("" if dynamic else "-static")
    path = os.path.join(out_dir, name + ".onnx")
    g = torch.Generator().manual_seed(1)
    x = example(kind, batch, SEQ, g)
    trace = example(kind, batch + 1, SEQ + 2, g) if dynamic else x
    input_name = "ids" if kind == "tokens" else "image"
    axes = None
    if dynamic:
        dims = {0: "batch", 1: "seq"} if kind == "tokens" else {0: "batch"}
        axes = {input_name: dims, "output": dims}
    torch.onnx.export(model, (trace,), path, input_names=[input_name], output_names=["output"],
                      dynamic_axes=axes, opset_version=17)
    with torch.no_grad():
        y = model(x)
    io = os.path.join(out_dir, name + ".io")
    os.makedirs(io, exist_ok=True)
    onnx.save_tensor(numpy_helper.from_array(x.numpy(), input_name), os.path.join(io, "input_0.pb"))
    onnx.save_tensor(numpy_helper.from_array(y.numpy(), "output"), os.path.join(io, "output_0.pb"))
    return path
