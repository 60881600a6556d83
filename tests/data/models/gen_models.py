#!/usr/bin/python3
"""Generates the ONNX test models of libs/model and their expected-value sidecars.

Run with Debian's interpreter (it has python3-torch and python3-onnx):

    /usr/bin/python3 tests/data/models/gen_models.py [OUT_DIR]

Each model is a tiny PyTorch module exported with torch.onnx.export (dynamic batch/seq axes, so the
graph has symbolic dims and the exporter's usual Shape/Gather/Unsqueeze/Concat clutter). Constant
folding is off so that the initializers are exactly the module's parameters (folding would add
folded constants and a transposed copy of a tied embedding as extra float initializers). The one
exception, masked-gpt2, keeps torch's default folding on purpose to test tied-copy detection.

Next to every <name>.onnx goes <name>.json with values computed here, independently of hp:
  parameters    sum of numel over the torch module's parameters (tied weights once)
  matmul_flops  sum of 2*M*N*K over every matmul/einsum/conv written out from the config at `dims`
  blocks        number of repeated blocks (the config's layer count)
  dims          the dim bindings the expected FLOPs are computed at

The generated files are committed test data; rerun this script only when changing a model.
"""
import json
import math
import os
import sys

import onnx
import torch
import torch.nn as nn
import torch.nn.functional as F
from onnx import TensorProto, helper

torch.manual_seed(0)
OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))


def n_params(module):
    return sum(p.numel() for p in module.parameters())


def export(module, args, name, input_names, dynamic_axes, opset, expected, fold=False, dedup=()):
    """Exports, checks that the initializers are the module's parameters, writes the sidecar.
    With fold=True (torch's default) the exporter constant-folds, which for a tied embedding adds a
    transposed copy of it as a separate initializer: `dedup` lists such copies' element counts."""
    path = os.path.join(OUT, name + ".onnx")
    module.eval()
    # Trained weights are all distinct; freshly initialised LayerNorm weights are not, and the
    # exporter would then share the identical ones through Identity nodes.
    with torch.no_grad():
        for p in module.parameters():
            p.uniform_(-0.1, 0.1)
    torch.onnx.export(module, args, path, input_names=input_names, output_names=["output"],
                      dynamic_axes=dynamic_axes, opset_version=opset, do_constant_folding=fold)
    m = onnx.load(path)
    init_params = sum(math.prod(t.dims) for t in m.graph.initializer
                      if t.data_type in (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE))
    assert init_params - sum(dedup) == expected["parameters"], (name, init_params, expected["parameters"])
    expected["opset"] = opset
    with open(os.path.join(OUT, name + ".json"), "w") as f:
        json.dump(expected, f, indent=2, sort_keys=True)
        f.write("\n")
    print(f"{name}: {os.path.getsize(path)} bytes, {expected}")
    return path


# ---------------------------------------------------------------- GPT-2 style
class GPTBlock(nn.Module):
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
        x = x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))
        return x


class GPT(nn.Module):
    def __init__(self, vocab, pos, h, heads, layers, tied):
        super().__init__()
        self.wte = nn.Embedding(vocab, h)
        self.wpe = nn.Embedding(pos, h)
        self.h = nn.ModuleList([GPTBlock(h, heads) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(h)
        self.lm_head = nn.Linear(h, vocab, bias=False)
        if tied:
            self.lm_head.weight = self.wte.weight

    def forward(self, idx):
        t = idx.size(1)
        pos = torch.arange(0, t, dtype=torch.long).unsqueeze(0)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def gpt_matmul_flops(b, s, h, layers, vocab):
    per_layer = (2 * b * s * h * 3 * h          # qkv projection
                 + 2 * b * s * s * h            # q @ k^T (all heads)
                 + 2 * b * s * s * h            # att @ v
                 + 2 * b * s * h * h            # output projection
                 + 2 * b * s * h * 4 * h        # fc
                 + 2 * b * s * 4 * h * h)       # mlp projection
    return layers * per_layer + 2 * b * s * h * vocab


def gen_gpt2(name="tiny-gpt2", vocab=256, pos=64, h=32, heads=4, layers=4, tied=True):
    m = GPT(vocab, pos, h, heads, layers, tied)
    b, s = 2, 16
    exp = {"parameters": n_params(m), "blocks": layers, "dims": {"batch": b, "seq": s},
           "matmul_flops": gpt_matmul_flops(b, s, h, layers, vocab),
           "config": {"vocab": vocab, "pos": pos, "hidden": h, "heads": heads, "layers": layers,
                      "tied": tied}}
    idx = torch.randint(0, vocab, (b, s))
    return export(m, (idx,), name, ["input_ids"], {"input_ids": {0: "batch", 1: "seq"}}, 17, exp)


class MaskedGPT(GPT):
    """GPT-2 with an attention_mask input, turned into an additive mask once and read by every
    layer (as Hugging Face models do): a side input that must not hide the layer boundaries."""

    def forward(self, idx, attention_mask):
        t = idx.size(1)
        pos = torch.arange(0, t, dtype=torch.long).unsqueeze(0)
        x = self.wte(idx) + self.wpe(pos)
        add = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * -10000.0
        for blk in self.h:
            b, tt, c = x.size()
            q, k, v = blk.c_attn(blk.ln_1(x)).split(c, dim=2)
            hd = c // blk.heads
            q = q.view(b, tt, blk.heads, hd).transpose(1, 2)
            k = k.view(b, tt, blk.heads, hd).transpose(1, 2)
            v = v.view(b, tt, blk.heads, hd).transpose(1, 2)
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd)) + add
            y = (F.softmax(att, dim=-1) @ v).transpose(1, 2).contiguous().view(b, tt, c)
            x = x + blk.c_proj(y)
            x = x + blk.mlp_proj(F.gelu(blk.c_fc(blk.ln_2(x))))
        return self.lm_head(self.ln_f(x))


def gen_gpt2_masked(name="masked-gpt2", vocab=256, pos=64, h=32, heads=4, layers=2):
    """Two layers only (a mask read by just two layers is the hard case), exported with torch's
    default constant folding, so the tied head is a folded transposed copy of the embedding."""
    m = MaskedGPT(vocab, pos, h, heads, layers, tied=True)
    b, s = 2, 16
    exp = {"parameters": n_params(m), "blocks": layers, "dims": {"batch": b, "seq": s},
           "matmul_flops": gpt_matmul_flops(b, s, h, layers, vocab),
           "config": {"vocab": vocab, "pos": pos, "hidden": h, "heads": heads, "layers": layers,
                      "tied": True, "constant_folding": True}}
    idx = torch.randint(0, vocab, (b, s))
    mask = torch.ones(b, s, dtype=torch.long)
    return export(m, (idx, mask), name, ["input_ids", "attention_mask"],
                  {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}}, 17, exp,
                  fold=True, dedup=(vocab * h,))


# ---------------------------------------------------------------- Llama style
class RMSNorm(nn.Module):
    def __init__(self, h, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(h))

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


class LlamaBlock(nn.Module):
    def __init__(self, h, heads, kv_heads, ffn):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, h // heads
        self.input_layernorm = RMSNorm(h)
        self.q_proj = nn.Linear(h, heads * self.hd, bias=False)
        self.k_proj = nn.Linear(h, kv_heads * self.hd, bias=False)
        self.v_proj = nn.Linear(h, kv_heads * self.hd, bias=False)
        self.o_proj = nn.Linear(heads * self.hd, h, bias=False)
        self.post_attention_layernorm = RMSNorm(h)
        self.gate_proj = nn.Linear(h, ffn, bias=False)
        self.up_proj = nn.Linear(h, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, h, bias=False)

    def repeat_kv(self, x):
        b, kvh, t, hd = x.shape
        rep = self.heads // self.kv_heads
        return x[:, :, None, :, :].expand(b, kvh, rep, t, hd).reshape(b, kvh * rep, t, hd)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        y = self.input_layernorm(x)
        q = self.q_proj(y).view(b, t, self.heads, self.hd).transpose(1, 2)
        k = self.k_proj(y).view(b, t, self.kv_heads, self.hd).transpose(1, 2)
        v = self.v_proj(y).view(b, t, self.kv_heads, self.hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k, v = self.repeat_kv(k), self.repeat_kv(v)
        att = (q @ k.transpose(2, 3)) / math.sqrt(self.hd)
        mask = torch.triu(torch.full((t, t), float("-inf")), diagonal=1)
        att = F.softmax(att + mask, dim=-1)
        o = (att @ v).transpose(1, 2).reshape(b, t, self.heads * self.hd)
        x = x + self.o_proj(o)
        y = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(y)) * self.up_proj(y))


class Llama(nn.Module):
    def __init__(self, vocab, h, heads, kv_heads, ffn, layers):
        super().__init__()
        self.hd = h // heads
        self.embed_tokens = nn.Embedding(vocab, h)
        self.layers = nn.ModuleList([LlamaBlock(h, heads, kv_heads, ffn) for _ in range(layers)])
        self.norm = RMSNorm(h)
        self.lm_head = nn.Linear(h, vocab, bias=False)

    def forward(self, idx):
        t = idx.shape[1]
        inv_freq = 1.0 / (10000 ** (torch.arange(0, self.hd, 2, dtype=torch.float32) / self.hd))
        freqs = torch.arange(t, dtype=torch.float32)[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        x = self.embed_tokens(idx)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.norm(x))


def gen_llama(name="tiny-llama", vocab=256, h=64, heads=4, kv_heads=2, ffn=128, layers=3):
    m = Llama(vocab, h, heads, kv_heads, ffn, layers)
    b, s = 2, 16
    hd = h // heads
    per_layer = (2 * b * s * h * heads * hd            # q
                 + 2 * 2 * b * s * h * kv_heads * hd   # k, v
                 + 2 * b * heads * s * s * hd          # q @ k^T
                 + 2 * b * heads * s * s * hd          # att @ v
                 + 2 * b * s * heads * hd * h          # o
                 + 3 * 2 * b * s * h * ffn)            # gate, up, down
    exp = {"parameters": n_params(m), "blocks": layers, "dims": {"batch": b, "seq": s},
           "matmul_flops": layers * per_layer + 2 * b * s * h * vocab,
           "config": {"vocab": vocab, "hidden": h, "heads": heads, "kv_heads": kv_heads,
                      "ffn": ffn, "layers": layers}}
    idx = torch.randint(0, vocab, (b, s))
    return export(m, (idx,), name, ["input_ids"], {"input_ids": {0: "batch", 1: "seq"}}, 14, exp)


# ---------------------------------------------------------------- ViT
class ViTBlock(nn.Module):
    def __init__(self, h, heads):
        super().__init__()
        self.heads, self.hd = heads, h // heads
        self.norm1 = nn.LayerNorm(h)
        self.qkv = nn.Linear(h, 3 * h)
        self.proj = nn.Linear(h, h)
        self.norm2 = nn.LayerNorm(h)
        self.fc1 = nn.Linear(h, 2 * h)
        self.fc2 = nn.Linear(2 * h, h)

    def forward(self, x):
        b, n, c = x.shape
        qkv = self.qkv(self.norm1(x)).reshape(b, n, 3, self.heads, self.hd).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        att = F.softmax((q @ k.transpose(-2, -1)) * self.hd ** -0.5, dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, n, c))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class ViT(nn.Module):
    def __init__(self, img, patch, chans, h, heads, layers, classes):
        super().__init__()
        self.patch_embed = nn.Conv2d(chans, h, kernel_size=patch, stride=patch)
        n = (img // patch) ** 2
        self.cls_token = nn.Parameter(torch.zeros(1, 1, h))
        self.pos_embed = nn.Parameter(torch.randn(1, n + 1, h) * 0.02)
        self.blocks = nn.ModuleList([ViTBlock(h, heads) for _ in range(layers)])
        self.norm = nn.LayerNorm(h)
        self.head = nn.Linear(h, classes)

    def forward(self, img):
        x = self.patch_embed(img).flatten(2).transpose(1, 2)
        x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1) + self.pos_embed
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x)[:, 0])


def gen_vit(name="tiny-vit", img=32, patch=8, chans=3, h=32, heads=4, layers=3, classes=10):
    m = ViT(img, patch, chans, h, heads, layers, classes)
    b = 2
    n = (img // patch) ** 2 + 1
    per_layer = (2 * b * n * h * 3 * h + 2 * 2 * b * n * n * h + 2 * b * n * h * h
                 + 2 * b * n * h * 2 * h + 2 * b * n * 2 * h * h)
    conv = 2 * b * h * (img // patch) ** 2 * chans * patch * patch
    exp = {"parameters": n_params(m), "blocks": layers, "dims": {"batch": b},
           "matmul_flops": conv + layers * per_layer + 2 * b * h * classes,
           "config": {"image": img, "patch": patch, "hidden": h, "heads": heads, "layers": layers,
                      "classes": classes}}
    x = torch.randn(b, chans, img, img)
    return export(m, (x,), name, ["pixels"], {"pixels": {0: "batch"}}, 17, exp)


# ---------------------------------------------------------------- MLP
class MLP(nn.Module):
    def __init__(self, d_in, h, layers, d_out):
        super().__init__()
        self.inp = nn.Linear(d_in, h)
        self.layers = nn.ModuleList([nn.Linear(h, h) for _ in range(layers)])
        self.out = nn.Linear(h, d_out)

    def forward(self, x):
        x = F.relu(self.inp(x))
        for layer in self.layers:
            x = F.relu(layer(x))
        return self.out(x)


def gen_mlp(name="tiny-mlp", d_in=32, h=64, layers=4, d_out=10):
    m = MLP(d_in, h, layers, d_out)
    b = 8
    exp = {"parameters": n_params(m), "blocks": layers, "dims": {"batch": b},
           "matmul_flops": 2 * b * d_in * h + layers * 2 * b * h * h + 2 * b * h * d_out,
           "config": {"in": d_in, "hidden": h, "layers": layers, "out": d_out}}
    return export(m, (torch.randn(b, d_in),), name, ["x"], {"x": {0: "batch"}}, 14, exp)


# ---------------------------------------------------------------- dense MoE
class MoEBlock(nn.Module):
    """Pre-norm residual block with a dense mixture of experts: every expert runs on every token
    (Einsum over a stacked expert weight), and a TopK router's softmaxed scores weight the
    experts' outputs (zero for experts outside a token's top k)."""

    def __init__(self, h, ffn, experts, top_k):
        super().__init__()
        self.e, self.k = experts, top_k
        self.norm = nn.LayerNorm(h)
        self.router = nn.Linear(h, experts, bias=False)
        self.w_in = nn.Parameter(torch.randn(experts, h, ffn) * 0.02)
        self.w_out = nn.Parameter(torch.randn(experts, ffn, h) * 0.02)

    def forward(self, x):
        y = self.norm(x)
        vals, idx = torch.topk(self.router(y), self.k, dim=-1)
        onehot = (idx.unsqueeze(-1) == torch.arange(self.e)).to(y.dtype)     # b s k e
        gate = (F.softmax(vals, dim=-1).unsqueeze(-1) * onehot).sum(-2)     # b s e
        hid = F.relu(torch.einsum("bsh,ehf->bsef", y, self.w_in))
        out = torch.einsum("bsef,efh->bseh", hid, self.w_out)
        return x + torch.einsum("bseh,bse->bsh", out, gate)


class MoE(nn.Module):
    def __init__(self, vocab, h, ffn, experts, top_k, layers):
        super().__init__()
        self.embed = nn.Embedding(vocab, h)
        self.blocks = nn.ModuleList([MoEBlock(h, ffn, experts, top_k) for _ in range(layers)])
        self.norm = nn.LayerNorm(h)
        self.head = nn.Linear(h, vocab, bias=False)

    def forward(self, idx):
        x = self.embed(idx)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x))


def gen_moe(name="tiny-moe", vocab=128, h=32, ffn=64, experts=4, top_k=2, layers=3):
    m = MoE(vocab, h, ffn, experts, top_k, layers)
    b, s = 2, 8
    per_layer = (2 * b * s * h * experts          # router
                 + 2 * b * s * h * experts * ffn  # bsh,ehf->bsef
                 + 2 * b * s * experts * ffn * h  # bsef,efh->bseh
                 + 2 * b * s * experts * h)       # bseh,bse->bsh
    exp = {"parameters": n_params(m), "blocks": layers, "dims": {"batch": b, "seq": s},
           "matmul_flops": layers * per_layer + 2 * b * s * h * vocab,
           "config": {"vocab": vocab, "hidden": h, "ffn": ffn, "experts": experts, "top_k": top_k,
                      "layers": layers}}
    idx = torch.randint(0, vocab, (b, s))
    return export(m, (idx,), name, ["input_ids"], {"input_ids": {0: "batch", 1: "seq"}}, 14, exp)


# ---------------------------------------------------------------- anonymous names
def anonymize(src, name):
    """Renames every node, tensor and initializer to meaningless ids and drops doc strings, so
    layer discovery cannot lean on names."""
    m = onnx.load(os.path.join(OUT, src + ".onnx"))
    g = m.graph
    keep = {i.name for i in g.input} | {o.name for o in g.output}
    mapping = {}

    def rn(t):
        if not t or t in keep:
            return t
        if t not in mapping:
            mapping[t] = f"t{len(mapping)}"
        return mapping[t]

    for n in g.node:
        n.name = ""
        n.doc_string = ""
        n.input[:] = [rn(t) for t in n.input]
        n.output[:] = [rn(t) for t in n.output]
    for t in g.initializer:
        t.name = rn(t.name)
    for v in g.value_info:
        v.name = rn(v.name)
    g.name = "anonymous"
    m.producer_name = ""
    m.doc_string = ""
    onnx.save(m, os.path.join(OUT, name + ".onnx"))
    with open(os.path.join(OUT, src + ".json")) as f:
        exp = json.load(f)
    exp["anonymous_of"] = src
    with open(os.path.join(OUT, name + ".json"), "w") as f:
        json.dump(exp, f, indent=2, sort_keys=True)
        f.write("\n")
    print(f"{name}: anonymised {src}")


# ---------------------------------------------------------------- 175B skeleton
def gen_gpt175b(name="gpt-175b-skeleton", layers=96, h=12288, heads=96, vocab=50257, pos=2048):
    """A GPT-3 175B forward graph written with onnx.helper. Weights are fp16 initializers whose
    data lives in an external file that is deliberately absent: planning needs only their dims."""
    data_file = name + ".weights"
    nodes, inits = [], []
    offset = [0]
    params = [0]

    def weight(wname, dims):
        t = TensorProto()
        t.name = wname
        t.data_type = TensorProto.FLOAT16
        t.dims.extend(dims)
        t.data_location = TensorProto.EXTERNAL
        length = math.prod(dims) * 2
        for k, v in (("location", data_file), ("offset", str(offset[0])), ("length", str(length))):
            e = t.external_data.add()
            e.key, e.value = k, v
        offset[0] += length
        params[0] += math.prod(dims)
        inits.append(t)
        return wname

    def const_i64(cname, values):
        inits.append(helper.make_tensor(cname, TensorProto.INT64, [len(values)], values))
        return cname

    def scalar(cname, value):
        """A Constant node (not an initializer, so it is no parameter)."""
        nodes.append(helper.make_node("Constant", [], [cname], name=cname + "/Constant",
                                      value=helper.make_tensor(cname + "/v", TensorProto.FLOAT16,
                                                               [], [value])))
        return cname

    def node(op, ins, outs, nname, **attrs):
        nodes.append(helper.make_node(op, ins, outs, name=nname, **attrs))
        return outs[0]

    hd = h // heads
    split_heads = const_i64("shape_heads", [0, 0, heads, hd])
    merge_heads = const_i64("shape_merge", [0, 0, h])
    tok = node("Gather", [weight("wte", [vocab, h]), "input_ids"], ["tok_emb"], "/wte/Gather")
    shp = node("Shape", ["input_ids"], ["ids_shape"], "/Shape")
    seq = node("Gather", [shp, const_i64("one", [1])], ["seq_len"], "/Gather_seq", axis=0)
    zero = helper.make_tensor("zero", TensorProto.INT64, [], [0])
    step = helper.make_tensor("step", TensorProto.INT64, [], [1])
    inits.extend([zero, step])
    seq_s = node("Squeeze", [seq, const_i64("ax0", [0])], ["seq_scalar"], "/Squeeze_seq")
    posr = node("Range", ["zero", seq_s, "step"], ["pos_ids"], "/Range")
    pe = node("Gather", [weight("wpe", [pos, h]), posr], ["pos_emb"], "/wpe/Gather")
    x = node("Add", [tok, pe], ["x_emb"], "/Add_emb")
    for i in range(layers):
        p = f"/h.{i}"
        w = f"h.{i}."

        def ln(inp, tag):
            return node("LayerNormalization", [inp, weight(w + tag + ".weight", [h]),
                                               weight(w + tag + ".bias", [h])],
                        [f"{p}/{tag}/out"], f"{p}/{tag}/LayerNormalization", axis=-1, epsilon=1e-5)

        def linear(inp, tag, din, dout):
            mm = node("MatMul", [inp, weight(w + tag + ".weight", [din, dout])],
                      [f"{p}/{tag}/mm"], f"{p}/{tag}/MatMul")
            return node("Add", [mm, weight(w + tag + ".bias", [dout])], [f"{p}/{tag}/out"],
                        f"{p}/{tag}/Add")

        y = ln(x, "ln_1")
        qkv = linear(y, "attn.c_attn", h, 3 * h)
        q, k, v = (f"{p}/attn/{c}" for c in "qkv")
        node("Split", [qkv, const_i64(f"{p}/split", [h, h, h])], [q, k, v], f"{p}/attn/Split",
             axis=2)
        heads_t = []
        for c, t in (("q", q), ("k", k), ("v", v)):
            r = node("Reshape", [t, split_heads], [f"{p}/attn/{c}_r"], f"{p}/attn/Reshape_{c}")
            perm = [0, 2, 3, 1] if c == "k" else [0, 2, 1, 3]
            heads_t.append(node("Transpose", [r], [f"{p}/attn/{c}_t"], f"{p}/attn/Transpose_{c}",
                                perm=perm))
        sc = node("MatMul", heads_t[:2], [f"{p}/attn/scores"], f"{p}/attn/MatMul_qk")
        sc = node("Mul", [sc, scalar(f"{p}/attn/scale", 1.0 / math.sqrt(hd))],
                  [f"{p}/attn/scaled"], f"{p}/attn/Mul")
        sm = node("Softmax", [sc], [f"{p}/attn/probs"], f"{p}/attn/Softmax", axis=-1)
        ctx = node("MatMul", [sm, heads_t[2]], [f"{p}/attn/ctx"], f"{p}/attn/MatMul_av")
        ctx = node("Transpose", [ctx], [f"{p}/attn/ctx_t"], f"{p}/attn/Transpose_ctx",
                   perm=[0, 2, 1, 3])
        ctx = node("Reshape", [ctx, merge_heads], [f"{p}/attn/merged"], f"{p}/attn/Reshape_ctx")
        a = linear(ctx, "attn.c_proj", h, h)
        x = node("Add", [x, a], [f"{p}/res1"], f"{p}/Add_1")
        y = ln(x, "ln_2")
        f1 = linear(y, "mlp.c_fc", h, 4 * h)
        # gelu(x) = 0.5 x (1 + erf(x / sqrt 2)), as PyTorch exports it before opset 20
        e = node("Div", [f1, scalar(f"{p}/mlp/sqrt2", math.sqrt(2.0))], [f"{p}/mlp/div"],
                 f"{p}/mlp/Div")
        e = node("Erf", [e], [f"{p}/mlp/erf"], f"{p}/mlp/Erf")
        e = node("Add", [e, scalar(f"{p}/mlp/one", 1.0)], [f"{p}/mlp/erf1"], f"{p}/mlp/Add_erf")
        e = node("Mul", [f1, e], [f"{p}/mlp/mul"], f"{p}/mlp/Mul")
        g = node("Mul", [e, scalar(f"{p}/mlp/half", 0.5)], [f"{p}/mlp/gelu"], f"{p}/mlp/Mul_half")
        f2 = linear(g, "mlp.c_proj", 4 * h, h)
        x = node("Add", [x, f2], [f"{p}/res2"], f"{p}/Add_2")
    y = node("LayerNormalization", [x, weight("ln_f.weight", [h]), weight("ln_f.bias", [h])],
             ["ln_f_out"], "/ln_f/LayerNormalization", axis=-1, epsilon=1e-5)
    wte_t = node("Transpose", ["wte"], ["wte_t"], "/lm_head/Transpose", perm=[1, 0])
    node("MatMul", [y, wte_t], ["logits"], "/lm_head/MatMul")

    graph = helper.make_graph(
        nodes, "gpt-175b",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT16, ["batch", "seq", vocab])],
        inits)
    model = helper.make_model(graph, producer_name="hp gen_models.py",
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = os.path.join(OUT, name + ".onnx")
    onnx.save(model, path)
    b, s = 1, 2048
    exp = {"parameters": params[0], "blocks": layers, "dims": {"batch": b, "seq": s},
           "matmul_flops": gpt_matmul_flops(b, s, h, layers, vocab),
           "missing_external_data": [data_file],
           "config": {"vocab": vocab, "pos": pos, "hidden": h, "heads": heads, "layers": layers}}
    with open(os.path.join(OUT, name + ".json"), "w") as f:
        json.dump(exp, f, indent=2, sort_keys=True)
        f.write("\n")
    print(f"{name}: {os.path.getsize(path)} bytes, {exp}")


GENERATORS = {
    "tiny-gpt2": gen_gpt2, "tiny-llama": gen_llama, "tiny-vit": gen_vit, "tiny-mlp": gen_mlp,
    "tiny-moe": gen_moe, "masked-gpt2": gen_gpt2_masked,
    "anon-gpt2": lambda: anonymize("tiny-gpt2", "anon-gpt2"),
    "anon-llama": lambda: anonymize("tiny-llama", "anon-llama"),
    "gpt-175b-skeleton": gen_gpt175b,
}

if __name__ == "__main__":
    # Usage: gen_models.py [OUT_DIR [NAME...]]  (all models when no names are given)
    os.makedirs(OUT, exist_ok=True)
    for name in sys.argv[2:] or GENERATORS:
        torch.manual_seed(0)
        GENERATORS[name]()
