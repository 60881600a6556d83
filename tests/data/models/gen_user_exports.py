#!/usr/bin/python3
"""Generates ONNX models exported the way users export them, with their reference inputs/outputs.

Run with Debian's interpreter (it has python3-torch and python3-onnx):

    /usr/bin/python3 tests/data/models/gen_user_exports.py [OUT_DIR]

gen_models.py writes modules shaped for hp's tests (uniform random weights, no constant folding).
The modules here are written as a user writes them and exported with torch.onnx.export's defaults
(constant folding on, weights left at their initial values where a user leaves them), so the files
carry what real exports carry:

  user-llama-*  Llama-style decoders, opset 17: RMSNorm (weights at their init of ones, so the
                exporter shares equal ones between layers through Identity nodes), SwiGLU, RoPE
                computed in forward from torch.arange/cos/sin with rotate_half, a causal mask built
                in forward (torch.triu / masked_fill), GQA by repeat_interleave or by
                expand+reshape of the k/v heads. Variants with dynamic batch and seq axes (whose
                intermediate shapes the exporter names unk__N) and one with static axes.
                With dynamic axes torch 1.13 writes repeat_interleave as a Loop over sequences
                whose body reshapes each head with [0, -1, 0, 0] on a 5-D tensor: the result is
                [b, 16, 2, 12] per head instead of [b, 2, 12, 16], so user-llama-ri is an export
                that no runtime can run (its q @ k^T MatMul gets incompatible shapes); hp must say
                so, by node, instead of listing unk__N dims.
  user-moe      a 2-layer mixture of experts: LayerNorms left at init (the exporter dedups the
                second layer's onto the first's through Identity nodes), top-k routing with
                torch.topk and a softmax gate, experts as an nn.ModuleList of MLPs combined by
                mask-multiply (each expert's output weighted by its gate, zero off the top k), and
                attention with an einsum and a masked_fill causal mask. Exported with static axes:
                the exporter then folds layer 0's mask into a Constant but, having lost track of
                shapes after the einsum, leaves layer 1's as Shape -> ConstantOfShape, so the two
                layers differ in more than their weights' names.
  user-moe-scatter  the same with Mixtral-style routing (torch.where, index_select, index_add_)
                and dynamic axes: the experts' token counts come from NonZero, decided by the
                data, which hp must name as such.
  user-moe-stack    the same with every expert run on every token, stacked (torch.stack), and
                the top-k outputs gathered (torch.gather): what expert parallelism routes.

Next to every <name>.onnx goes <name>.json (config, dims, blocks, parameters of the torch module,
matmul_flops written out from the config at dims, and the Identity-aliased initializers of the
export) and <name>.io/test_data_set_0 with input_K.pb and
output_0.pb: PyTorch's output for fixed random inputs, which `hp launch` must match within 1e-4.
The generated files are committed test data; rerun this script only when changing a model.
"""
import json
import math
import os
import sys

import numpy as np
import onnx
import torch
import torch.nn as nn
import torch.nn.functional as F
from onnx import numpy_helper

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))


# ---------------------------------------------------------------- Llama, as users write it
class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        var = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(var + self.eps))


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


class Attention(nn.Module):
    def __init__(self, dim, n_heads, n_kv_heads, gqa):
        super().__init__()
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads
        self.head_dim = dim // n_heads
        self.gqa = gqa
        self.q_proj = nn.Linear(dim, n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(n_heads * self.head_dim, dim, bias=False)

    def repeat_kv(self, x):
        n_rep = self.n_heads // self.n_kv_heads
        if self.gqa == "repeat_interleave":
            return torch.repeat_interleave(x, n_rep, dim=1)
        # Hugging Face's repeat_kv: expand a new axis, then fold it into the heads.
        bsz, kvh, slen, hd = x.shape
        x = x[:, :, None, :, :].expand(bsz, kvh, n_rep, slen, hd)
        return x.reshape(bsz, kvh * n_rep, slen, hd)

    def forward(self, x, cos, sin, mask):
        bsz, seqlen, _ = x.size()
        q = self.q_proj(x).view(bsz, seqlen, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(bsz, seqlen, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(bsz, seqlen, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = self.repeat_kv(k)
        v = self.repeat_kv(v)
        scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(self.head_dim)
        scores = scores + mask
        probs = F.softmax(scores.float(), dim=-1).type_as(q)
        out = torch.matmul(probs, v)
        out = out.transpose(1, 2).contiguous().view(bsz, seqlen, -1)
        return self.o_proj(out)


class FeedForward(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, dim, n_heads, n_kv_heads, ffn, gqa):
        super().__init__()
        self.input_layernorm = RMSNorm(dim)
        self.self_attn = Attention(dim, n_heads, n_kv_heads, gqa)
        self.post_attention_layernorm = RMSNorm(dim)
        self.mlp = FeedForward(dim, ffn)

    def forward(self, x, cos, sin, mask):
        h = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        return h + self.mlp(self.post_attention_layernorm(h))


class LlamaForCausalLM(nn.Module):
    def __init__(self, vocab, dim, n_heads, n_kv_heads, ffn, n_layers, gqa, mask_style):
        super().__init__()
        self.head_dim = dim // n_heads
        self.mask_style = mask_style
        self.embed_tokens = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(
            [DecoderLayer(dim, n_heads, n_kv_heads, ffn, gqa) for _ in range(n_layers)])
        self.norm = RMSNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)

    def rope(self, seqlen, bsz):
        inv_freq = 1.0 / (10000 ** (torch.arange(0, self.head_dim, 2).float() / self.head_dim))
        t = torch.arange(seqlen, dtype=torch.float32)
        freqs = torch.outer(t, inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        # [1, 1, seq, head_dim], broadcast over batch and heads.
        return emb.cos()[None, None, :, :], emb.sin()[None, None, :, :]

    def causal_mask(self, seqlen, x):
        if self.mask_style == "masked_fill":
            ones = torch.ones(seqlen, seqlen, dtype=torch.bool)
            upper = torch.triu(ones, diagonal=1)
            mask = torch.zeros(seqlen, seqlen).masked_fill(upper, float("-inf"))
        else:
            mask = torch.full((seqlen, seqlen), float("-inf"))
            mask = torch.triu(mask, diagonal=1)
        return mask[None, None, :, :].to(x.dtype)

    def forward(self, input_ids):
        bsz, seqlen = input_ids.shape
        x = self.embed_tokens(input_ids)
        cos, sin = self.rope(seqlen, bsz)
        mask = self.causal_mask(seqlen, x)
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        return self.lm_head(self.norm(x))


# ---------------------------------------------------------------- MoE, as users write it
class Expert(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class SparseMoE(nn.Module):
    def __init__(self, dim, hidden, n_experts, top_k):
        super().__init__()
        self.top_k = top_k
        self.gate = nn.Linear(dim, n_experts, bias=False)
        self.experts = nn.ModuleList([Expert(dim, hidden) for _ in range(n_experts)])

    def forward(self, x):
        logits = self.gate(x)                                        # b s e
        weights, chosen = torch.topk(logits, self.top_k, dim=-1)     # b s k
        weights = F.softmax(weights, dim=-1)
        out = torch.zeros_like(x)
        for i, expert in enumerate(self.experts):
            # The gate of expert i for every token: its softmax weight where chosen, else 0.
            gate_i = (weights * (chosen == i).to(x.dtype)).sum(dim=-1, keepdim=True)
            out = out + gate_i * expert(x)
        return out


class ScatterMoE(nn.Module):
    """Mixtral-style routing: each expert runs on the tokens routed to it (torch.where, then
    index_select), and its weighted outputs are added back in place (index_add_)."""

    def __init__(self, dim, hidden, n_experts, top_k):
        super().__init__()
        self.top_k, self.n_experts = top_k, n_experts
        self.gate = nn.Linear(dim, n_experts, bias=False)
        self.experts = nn.ModuleList([Expert(dim, hidden) for _ in range(n_experts)])

    def forward(self, x):
        b, s, d = x.shape
        h = x.view(-1, d)
        probs = F.softmax(self.gate(h), dim=-1)
        weights, chosen = torch.topk(probs, self.top_k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        out = torch.zeros((b * s, d), dtype=x.dtype)
        mask = F.one_hot(chosen, num_classes=self.n_experts).permute(2, 1, 0)
        for i, expert in enumerate(self.experts):
            slot, token = torch.where(mask[i])
            y = expert(h.index_select(0, token)) * weights[token, slot, None]
            out.index_add_(0, token, y)
        return out.view(b, s, d)


class StackMoE(SparseMoE):
    """SparseMoE's experts, each run on every token and stacked with torch.stack, the top-k chosen
    with torch.gather: what hp's expert parallelism routes (docs/training.md)."""

    def forward(self, x):
        b, s, d = x.shape
        h = x.reshape(b * s, d)
        weights, chosen = torch.topk(F.softmax(self.gate(h), dim=-1), self.top_k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        outs = torch.stack([e(h) for e in self.experts], dim=1)  # tokens, experts, d
        picked = torch.gather(outs, 1, chosen.unsqueeze(-1).expand(b * s, self.top_k, d))
        return (weights.unsqueeze(-1) * picked).sum(1).reshape(b, s, d)


class SelfAttention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q = q.view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = k.view(b, s, self.heads, self.head_dim).transpose(1, 2)
        v = v.view(b, s, self.heads, self.head_dim).transpose(1, 2)
        att = torch.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(self.head_dim)
        causal = torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1)
        att = att.masked_fill(causal, float("-inf"))
        y = F.softmax(att, dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(b, s, -1))


class MoELayer(nn.Module):
    def __init__(self, dim, heads, hidden, n_experts, top_k, routing):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = SelfAttention(dim, heads)
        self.ln2 = nn.LayerNorm(dim)
        moe = {"mask": SparseMoE, "scatter": ScatterMoE, "stack": StackMoE}[routing]
        self.moe = moe(dim, hidden, n_experts, top_k)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.moe(self.ln2(x))


class MoEModel(nn.Module):
    def __init__(self, vocab, dim, heads, hidden, n_experts, top_k, n_layers, routing):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(
            [MoELayer(dim, heads, hidden, n_experts, top_k, routing) for _ in range(n_layers)])
        self.ln_f = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, input_ids):
        x = self.embed(input_ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.ln_f(x))


# ---------------------------------------------------------------- export and reference data
def n_params(module):
    return sum(p.numel() for p in module.parameters())


def identity_aliases(path):
    """Initializers the exporter shares through Identity nodes: {alias: source}."""
    m = onnx.load(path)
    inits = {t.name for t in m.graph.initializer}
    return {n.output[0]: n.input[0] for n in m.graph.node
            if n.op_type == "Identity" and n.input[0] in inits}


def export(name, module, ids, dynamic, config, dims, matmul_flops):
    module.eval()
    path = os.path.join(OUT, name + ".onnx")
    axes = {"input_ids": {0: "batch", 1: "seq"}, "logits": {0: "batch", 1: "seq"}} if dynamic else None
    torch.onnx.export(module, (ids,), path, input_names=["input_ids"], output_names=["logits"],
                      dynamic_axes=axes, opset_version=17)
    with torch.no_grad():
        out = module(ids)
    d = os.path.join(OUT, name + ".io", "test_data_set_0")
    os.makedirs(d, exist_ok=True)
    onnx.save_tensor(numpy_helper.from_array(ids.numpy(), "input_ids"), os.path.join(d, "input_0.pb"))
    onnx.save_tensor(numpy_helper.from_array(out.numpy().astype(np.float32), "logits"),
                     os.path.join(d, "output_0.pb"))
    aliases = identity_aliases(path)
    sidecar = {"config": config, "dims": dims, "parameters": n_params(module),
               "blocks": config["layers"], "opset": 17, "dynamic_axes": dynamic,
               "matmul_flops": matmul_flops,
               "identity_aliases": dict(sorted(aliases.items()))}
    with open(os.path.join(OUT, name + ".json"), "w") as f:
        json.dump(sidecar, f, indent=2, sort_keys=True)
        f.write("\n")
    print(f"{name}: {os.path.getsize(path)} bytes, {len(aliases)} Identity-aliased initializers")


def gen_llama(name, gqa, mask_style, dynamic, layers=2):
    torch.manual_seed(0)
    cfg = {"vocab": 128, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn": 96, "layers": layers,
           "gqa": gqa, "mask": mask_style}
    m = LlamaForCausalLM(cfg["vocab"], cfg["hidden"], cfg["heads"], cfg["kv_heads"], cfg["ffn"],
                         layers, gqa, mask_style)
    b, s = 2, 12
    h, hd, kvh, ffn = cfg["hidden"], cfg["hidden"] // cfg["heads"], cfg["kv_heads"], cfg["ffn"]
    per_layer = (2 * b * s * h * h                   # q
                 + 2 * 2 * b * s * h * kvh * hd      # k, v
                 + 2 * 2 * b * cfg["heads"] * s * s * hd  # q @ k^T, probs @ v
                 + 2 * b * s * h * h                 # o
                 + 3 * 2 * b * s * h * ffn)          # gate, up, down
    rope = 2 * s * (hd // 2)                         # torch.outer, exported as an Einsum
    flops = layers * per_layer + rope + 2 * b * s * h * cfg["vocab"]
    ids = torch.randint(0, cfg["vocab"], (b, s), generator=torch.Generator().manual_seed(1))
    export(name, m, ids, dynamic, cfg, {"batch": b, "seq": s}, flops)


def gen_moe(name="user-moe", routing="mask", dynamic=False, layers=2):
    torch.manual_seed(0)
    cfg = {"vocab": 96, "hidden": 32, "heads": 4, "ffn": 64, "experts": 4, "top_k": 2,
           "layers": layers, "routing": routing}
    m = MoEModel(cfg["vocab"], cfg["hidden"], cfg["heads"], cfg["ffn"], cfg["experts"],
                 cfg["top_k"], layers, routing)
    b, s = 2, 10
    h, hd, e, ffn = cfg["hidden"], cfg["hidden"] // cfg["heads"], cfg["experts"], cfg["ffn"]
    per_layer = (2 * b * s * h * 3 * h                  # qkv
                 + 2 * 2 * b * cfg["heads"] * s * s * hd  # einsum q k, probs @ v
                 + 2 * b * s * h * h                    # proj
                 + 2 * b * s * h * e                    # router
                 + e * 2 * 2 * b * s * h * ffn)         # every expert on every token (dense)
    flops = layers * per_layer + 2 * b * s * h * cfg["vocab"]
    if routing == "scatter":
        flops = None  # the experts' share depends on the routing, decided by the data
    ids = torch.randint(0, cfg["vocab"], (b, s), generator=torch.Generator().manual_seed(1))
    export(name, m, ids, dynamic, cfg, {"batch": b, "seq": s}, flops)


def main():
    gen_llama("user-llama-ri", "repeat_interleave", "masked_fill", dynamic=True)
    gen_llama("user-llama-expand", "expand", "triu", dynamic=True)
    gen_llama("user-llama-static", "expand", "masked_fill", dynamic=False)
    gen_moe()
    gen_moe("user-moe-scatter", routing="scatter", dynamic=True)
    gen_moe("user-moe-stack", routing="stack")


if __name__ == "__main__":
    main()
