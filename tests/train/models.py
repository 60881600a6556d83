#!/usr/bin/python3
"""Models users train, written the way they write them, exported for training the way hp reads them.

Each model is a tiny PyTorch module in its users' idiom: a GPT-2 (nn.MultiheadAttention with an
additive causal mask, GELU MLP, LayerNorm, lm head tied to the embedding), a Llama (RMSNorm written
out, RoPE from cos/sin buffers, grouped-query attention through repeat_kv's expand + reshape,
SwiGLU), an MLP regressor (mse), a ViT (Conv2d patches, class token, encoder blocks, a classifier)
a top-k MoE (softmax router, topk, expert outputs gathered by the chosen indices; the "scatter"
variant scatters the routing weights into a dense gate instead), a ResNet-style CNN (Conv2d and
BatchNorm2d in training mode, whose running statistics the forward updates, max pooling, a residual
block, global average pooling), a "zoo" of the layers beyond those (instance norm, PReLU,
transposed convolution, ELU, Hardswish, PixelShuffle, cumsum, logsumexp, amax), recurrent
language models (a 2-layer nn.LSTM, a bidirectional nn.GRU) and a refinement loop scripted with
torch.jit.script (a while loop the data stops and an if, exported as ONNX Loop and If).

`export(name, path)` writes the model in TRAINING mode (torch.onnx.TrainingMode.TRAINING, no constant
folding, opset 14, a dynamic batch axis): the parameters stay initializers named as in
named_parameters(), which is how the trained weights hp saves are matched to torch's. Buffers the
export stores as initializers (RoPE tables, masks) are listed in `Exported.frozen` for the recipe's
[train].frozen: hp must not train them, as torch does not.
"""
import dataclasses
import math

import onnx
import torch
import torch.nn as nn
import torch.nn.functional as F

OPSET = 14
VOCAB, HIDDEN, HEADS, LAYERS, SEQ, BATCH = 64, 32, 4, 2, 8, 4
IMAGE, PATCH, CLASSES = 8, 4, 10


# --- GPT-2 -------------------------------------------------------------------------------------
class GptBlock(nn.Module):
    def __init__(self, hidden, heads):
        super().__init__()
        self.ln_1 = nn.LayerNorm(hidden)
        self.attn = nn.MultiheadAttention(hidden, heads, dropout=0.0, batch_first=True)
        self.ln_2 = nn.LayerNorm(hidden)
        self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(),
                                 nn.Linear(4 * hidden, hidden))

    def forward(self, x, mask):
        h = self.ln_1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln_2(x))


class Gpt2(nn.Module):
    """GPT-2: token + learned position embeddings, pre-LN blocks, lm head tied to wte."""

    def __init__(self, vocab=VOCAB, hidden=HIDDEN, heads=HEADS, layers=LAYERS, max_seq=64):
        super().__init__()
        self.wte = nn.Embedding(vocab, hidden)
        self.wpe = nn.Embedding(max_seq, hidden)
        self.h = nn.ModuleList(GptBlock(hidden, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(hidden)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)
        self.lm_head.weight = self.wte.weight
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(m):  # GPT-2's: N(0, 0.02) weights, zero biases (logits start near uniform)
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, ids):
        t = ids.shape[1]
        mask = torch.triu(torch.full((t, t), float("-inf")), diagonal=1)
        x = self.wte(ids) + self.wpe(torch.arange(t))
        for b in self.h:
            x = b(x, mask)
        return self.lm_head(self.ln_f(x))


# --- Llama -------------------------------------------------------------------------------------
class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def repeat_kv(x, n_rep):
    """Hugging Face Llama's GQA expansion: expand a new axis, then fold it into the heads."""
    b, kv, s, d = x.shape
    return x[:, :, None, :, :].expand(b, kv, n_rep, s, d).reshape(b, kv * n_rep, s, d)


class LlamaBlock(nn.Module):
    KV = 2

    def __init__(self):
        super().__init__()
        self.hd = HIDDEN // HEADS
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(HIDDEN), RMSNorm(HIDDEN)
        self.q_proj = nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.k_proj = nn.Linear(HIDDEN, self.KV * self.hd, bias=False)
        self.v_proj = nn.Linear(HIDDEN, self.KV * self.hd, bias=False)
        self.o_proj = nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.gate_proj = nn.Linear(HIDDEN, 2 * HIDDEN, bias=False)
        self.up_proj = nn.Linear(HIDDEN, 2 * HIDDEN, bias=False)
        self.down_proj = nn.Linear(2 * HIDDEN, HIDDEN, bias=False)

    def forward(self, x, cos, sin, mask):
        b, t, _ = x.shape
        h = self.input_layernorm(x)
        q = self.q_proj(h).view(b, t, HEADS, self.hd).transpose(1, 2)
        k = self.k_proj(h).view(b, t, self.KV, self.hd).transpose(1, 2)
        v = self.v_proj(h).view(b, t, self.KV, self.hd).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = repeat_kv(k, HEADS // self.KV), repeat_kv(v, HEADS // self.KV)
        att = (q @ k.transpose(2, 3)) / math.sqrt(self.hd) + mask
        y = (att.softmax(-1) @ v).transpose(1, 2).reshape(b, t, HIDDEN)
        x = x + self.o_proj(y)
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Llama(nn.Module):
    """Llama: RoPE tables and the causal mask precomputed as buffers for SEQ positions."""

    def __init__(self, layers=LAYERS):
        super().__init__()
        hd = HIDDEN // HEADS
        inv = 1.0 / (10000 ** (torch.arange(0, hd, 2).float() / hd))
        freqs = torch.outer(torch.arange(SEQ).float(), inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("rope_cos", emb.cos()[None, None])
        self.register_buffer("rope_sin", emb.sin()[None, None])
        self.register_buffer("causal_mask", torch.full((SEQ, SEQ), float("-inf")).triu(1))
        self.embed_tokens = nn.Embedding(VOCAB, HIDDEN)
        self.layers = nn.ModuleList(LlamaBlock() for _ in range(layers))
        self.norm = RMSNorm(HIDDEN)
        self.lm_head = nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, ids):
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x, self.rope_cos, self.rope_sin, self.causal_mask)
        return self.lm_head(self.norm(x))


# --- MLP regression ----------------------------------------------------------------------------
class Mlp(nn.Module):
    """A regressor: Linear-GELU-Linear-Tanh-Linear, trained with mse."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(16, 64), nn.Linear(64, 64), nn.Linear(64, 8)

    def forward(self, x):
        return self.fc3(torch.tanh(self.fc2(F.gelu(self.fc1(x)))))


# --- ResNet-style CNN ---------------------------------------------------------------------------
class ResBlock(nn.Module):
    def __init__(self, ch):
        super().__init__()
        self.conv1 = nn.Conv2d(ch, ch, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(ch)
        self.conv2 = nn.Conv2d(ch, ch, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(ch)

    def forward(self, x):
        return F.relu(x + self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x))))))


class Cnn(nn.Module):
    """torchvision's ResNet idiom at toy size: conv-BN-ReLU stem, max pool, a basic residual block,
    global average pooling, a linear classifier. BatchNorm2d trains on the batch's statistics and
    updates its running_mean / running_var buffers. 16 channels: the residual block's 3x3
    convolutions are then of the shape the cpu plugin runs by Winograd (plugins/cpu/cpu_winograd.cpp),
    so its forward is compared with torch's too."""

    def __init__(self, ch=16):
        super().__init__()
        self.conv1 = nn.Conv2d(3, ch, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(ch)
        self.layer1 = ResBlock(ch)
        self.fc = nn.Linear(ch, CLASSES)

    def forward(self, img):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(img))), 2)
        x = F.adaptive_avg_pool2d(self.layer1(x), 1).flatten(1)
        return self.fc(x)


# --- ops beyond the transformer core ------------------------------------------------------------
class Zoo(nn.Module):
    """An image classifier built from the layers an encoder-decoder or GAN user reaches for: a
    strided Conv2d, InstanceNorm2d (affine), PReLU per channel, ConvTranspose2d with
    output_padding, ELU, Hardswish, a 1x1 conv into PixelShuffle (DepthToSpace, CRD mode), a
    cumulative sum along the width, then logsumexp and amax pooling of each channel (ReduceLogSumExp,
    ReduceMax) into a linear classifier."""

    def __init__(self, ch=8):
        super().__init__()
        # No bias before the norm: the norm removes it, so its gradient is rounding noise that
        # AdamW's normalisation would turn into full-size (and unreproducible) updates.
        self.conv = nn.Conv2d(3, ch, 3, stride=2, padding=1, bias=False)
        self.norm = nn.InstanceNorm2d(ch, affine=True)
        self.act = nn.PReLU(ch)
        self.up = nn.ConvTranspose2d(ch, ch, 3, stride=2, padding=1, output_padding=1)
        self.expand = nn.Conv2d(ch, 4 * ch, 1)
        self.shuffle = nn.PixelShuffle(2)
        self.fc = nn.Linear(2 * ch, CLASSES)

    def forward(self, img):
        x = self.act(self.norm(self.conv(img)))                 # N x ch x IMAGE/2 x IMAGE/2
        x = F.hardswish(F.elu(self.up(x), alpha=0.7))           # N x ch x IMAGE x IMAGE
        x = self.shuffle(self.expand(x))                        # N x ch x 2 IMAGE x 2 IMAGE
        x = torch.cumsum(x, dim=-1) * (1.0 / x.shape[-1])
        pooled = torch.cat([torch.logsumexp(x.flatten(2), dim=-1), x.amax(dim=(2, 3))], dim=1)
        return self.fc(pooled)


# --- recurrent ---------------------------------------------------------------------------------
class Recurrent(nn.Module):
    """A character-level language model in the pre-transformer idiom: an embedding, a 2-layer
    nn.LSTM (or a bidirectional nn.GRU), a linear head over every step."""

    def __init__(self, gru=False):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, HIDDEN)
        self.rnn = (nn.GRU(HIDDEN, HIDDEN, batch_first=True, bidirectional=True) if gru
                    else nn.LSTM(HIDDEN, HIDDEN, num_layers=2, batch_first=True))
        self.head = nn.Linear(2 * HIDDEN if gru else HIDDEN, VOCAB)

    def forward(self, ids):
        return self.head(self.rnn(self.tok(ids))[0])


# --- ViT ---------------------------------------------------------------------------------------
class VitBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(HIDDEN), nn.LayerNorm(HIDDEN)
        self.qkv = nn.Linear(HIDDEN, 3 * HIDDEN)
        self.proj = nn.Linear(HIDDEN, HIDDEN)
        self.fc1, self.fc2 = nn.Linear(HIDDEN, 2 * HIDDEN), nn.Linear(2 * HIDDEN, HIDDEN)

    def forward(self, x):
        b, n, c = x.shape
        qkv = self.qkv(self.norm1(x)).reshape(b, n, 3, HEADS, c // HEADS).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        att = (q @ k.transpose(-2, -1)) * (c // HEADS) ** -0.5
        x = x + self.proj((att.softmax(-1) @ v).transpose(1, 2).reshape(b, n, c))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class Vit(nn.Module):
    """timm-style ViT: Conv2d patch embedding, class token, learned positions, pre-LN blocks."""

    def __init__(self):
        super().__init__()
        n = (IMAGE // PATCH) ** 2
        self.patch_embed = nn.Conv2d(3, HIDDEN, PATCH, stride=PATCH)
        self.cls_token = nn.Parameter(torch.randn(1, 1, HIDDEN) * 0.02)
        self.pos_embed = nn.Parameter(torch.randn(1, n + 1, HIDDEN) * 0.02)
        self.blocks = nn.ModuleList(VitBlock() for _ in range(LAYERS))
        self.norm = nn.LayerNorm(HIDDEN)
        self.head = nn.Linear(HIDDEN, CLASSES)

    def forward(self, img):
        x = self.patch_embed(img).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        for b in self.blocks:
            x = b(x)
        return self.head(self.norm(x)[:, 0])


# --- top-k MoE ---------------------------------------------------------------------------------
class MoeLayer(nn.Module):
    """E experts of hidden -> ffn -> hidden (GELU), top-K routing; the sizes are the tests' unless a
    benchmark asks for larger (tests/bench/train/bench_ep.py). `combine` says how the experts'
    outputs come together: "stack" (torch.stack, then the top-k gathered or a scattered gate),
    "where" (Hugging Face's Mixtral block: each expert on the rows routed to it, torch.where on
    the one-hot routing, its weighted output added back with index_add_) or "sum" (every expert
    on every token, times its gate, zero off the top-k, added into a zeros_like)."""

    def __init__(self, scatter, hidden=HIDDEN, ffn=2 * HIDDEN, experts=4, top_k=2,
                 combine="stack"):
        super().__init__()
        self.scatter, self.combine, self.E, self.K = scatter, combine, experts, top_k
        self.ln = nn.LayerNorm(hidden)
        self.router = nn.Linear(hidden, self.E, bias=False)
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(hidden, ffn), nn.GELU(), nn.Linear(ffn, hidden))
            for _ in range(self.E))

    def forward(self, x):
        b, t, c = x.shape
        h = self.ln(x).reshape(b * t, c)
        probs = self.router(h).softmax(-1)
        topw, topi = torch.topk(probs, self.K, dim=-1)
        topw = topw / topw.sum(-1, keepdim=True)
        if self.combine == "where":  # as transformers' MixtralSparseMoeBlock writes it
            y = torch.zeros((b * t, c), dtype=h.dtype)
            mask = F.one_hot(topi, self.E).permute(2, 1, 0)  # [E, K, N]
            for e, expert in enumerate(self.experts):
                slot, rows = torch.where(mask[e])
                picked = h[None, rows].reshape(-1, c)
                y.index_add_(0, rows, expert(picked) * topw[rows, slot, None])
            return x + y.reshape(b, t, c)
        if self.combine == "sum":
            y = torch.zeros_like(h)
            for e, expert in enumerate(self.experts):
                gate = (topw * (topi == e).to(h.dtype)).sum(-1, keepdim=True)
                y = y + gate * expert(h)
            return x + y.reshape(b, t, c)
        outs = torch.stack([e(h) for e in self.experts], dim=1)  # [N, E, C]
        if self.scatter:  # the routing weights scattered into a dense [N, E] gate
            gate = torch.zeros_like(probs).scatter(1, topi, topw)
            y = (gate.unsqueeze(-1) * outs).sum(1)
        else:  # the chosen experts' outputs gathered: [N, K, C]
            chosen = torch.gather(outs, 1, topi.unsqueeze(-1).expand(b * t, self.K, c))
            y = (topw.unsqueeze(-1) * chosen).sum(1)
        return x + y.reshape(b, t, c)


class Moe(nn.Module):
    def __init__(self, scatter=False, vocab=VOCAB, hidden=HIDDEN, layers=LAYERS, **experts):
        super().__init__()
        self.tok = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList(MoeLayer(scatter, hidden, **experts) for _ in range(layers))
        self.head = nn.Linear(hidden, vocab)

    def forward(self, ids):
        x = self.tok(ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


# --- control flow ------------------------------------------------------------------------------
class Refine(nn.Module):
    """Iterative refinement with a stop the data decides and a data-dependent branch, written for
    torch.jit.script, whose export keeps them as an ONNX Loop (its condition computed by the body)
    and an If, both reading the weights from the outer graph."""

    def __init__(self, steps: int = 3):
        super().__init__()
        self.steps = steps
        self.inp = nn.Linear(16, HIDDEN)
        self.step = nn.Linear(HIDDEN, HIDDEN)
        self.gate = nn.Linear(HIDDEN, HIDDEN)
        self.out = nn.Linear(HIDDEN, 8)

    def forward(self, x):
        h = torch.tanh(self.inp(x))
        i = 0
        while i < self.steps and bool(h.abs().mean() > 1e-3):
            h = h + torch.tanh(self.step(h)) * torch.sigmoid(self.gate(h))
            i += 1
        if bool(h.mean() > 0):
            y = self.out(h)
        else:
            y = self.out(h * 0.5)
        return y


# --- registry and export -----------------------------------------------------------------------
@dataclasses.dataclass
class Spec:
    make: object          # () -> nn.Module
    kind: str             # "tokens" | "image" | "vector": what example() draws
    loss: str             # "cross_entropy" | "mse"
    input_name: str
    seq: int = SEQ        # tokens: sequence length (static in the export)
    recompute: bool = True  # whether recomputing its layers can lower the peak
    recompute_why: str = ""
    script: bool = False  # exported through torch.jit.script (control flow kept as If / Loop)


MODELS = {
    "gpt2": Spec(Gpt2, "tokens", "cross_entropy", "input_ids"),
    "llama": Spec(Llama, "tokens", "cross_entropy", "input_ids"),
    "mlp": Spec(Mlp, "vector", "mse", "x"),
    "vit": Spec(Vit, "image", "cross_entropy", "pixel_values"),
    "moe": Spec(Moe, "tokens", "cross_entropy", "input_ids"),
    "moe-scatter": Spec(lambda: Moe(scatter=True), "tokens", "cross_entropy", "input_ids"),
    "cnn": Spec(Cnn, "image", "cross_entropy", "pixel_values"),
    "zoo": Spec(Zoo, "image", "cross_entropy", "pixel_values"),
    "lstm": Spec(Recurrent, "tokens", "cross_entropy", "input_ids", recompute=False,
                 recompute_why="a recurrent layer keeps only its output, which the next layer "
                 "reads anyway: recomputing it frees nothing and rebuilds its weight reordering"),
    "gru": Spec(lambda: Recurrent(gru=True), "tokens", "cross_entropy", "input_ids"),
    "control": Spec(Refine, "vector", "mse", "x", script=True),
}
# Four blocks, for four pipeline stages (run_pipeline.py); not in the other tests' default lists.
DEEP = {
    "gpt2-deep": Spec(lambda: Gpt2(layers=4), "tokens", "cross_entropy", "input_ids"),
    "llama-deep": Spec(lambda: Llama(layers=4), "tokens", "cross_entropy", "input_ids"),
}
MODELS.update(DEEP)
# The MoE as loops write it, for the expert-parallel test (run_distributed.py); not in the other
# tests' lists: Mixtral's (torch.where, index_add_: NonZero, Gather and ScatterElements per
# expert), and a sum of gated experts.
LOOP = {"moe-loop": Spec(lambda: Moe(combine="where"), "tokens", "cross_entropy", "input_ids"),
        "moe-sum": Spec(lambda: Moe(combine="sum"), "tokens", "cross_entropy", "input_ids")}
MODELS.update(LOOP)
# The token-stream test's models: GPT-2 (and the MoE) over bytes (vocab 256), 16-token windows.
STREAM = {
    "gpt2": Spec(lambda: Gpt2(vocab=256), "tokens", "cross_entropy", "input_ids", seq=16),
    "moe": Spec(lambda: Moe(vocab=256), "tokens", "cross_entropy", "input_ids", seq=16),
}
OUTPUT = "logits"


def example(spec, batch, g, vocab=VOCAB):
    """One batch (input, labels) drawn from generator g: labels of cross_entropy are int64 of the
    logits' shape without the class axis, mse targets are shaped like the output."""
    if spec.kind == "tokens":
        ids = torch.randint(0, vocab, (batch, spec.seq + 1), generator=g)
        return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
    if spec.kind == "image":
        return (torch.randn(batch, 3, IMAGE, IMAGE, generator=g),
                torch.randint(0, CLASSES, (batch,), generator=g))
    x = torch.randn(batch, 16, generator=g)
    return x, torch.sin(x[:, :8]) + 0.5 * x[:, 8:]


def loss_fn(spec, out, labels):
    """The loss hp's [train].loss names, as PyTorch computes it (docs/training.md, "Loss")."""
    if spec.loss == "mse":
        return F.mse_loss(out, labels)
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), labels.reshape(-1))


@dataclasses.dataclass
class Exported:
    path: str
    params: dict   # ONNX initializer name -> torch parameter name
    frozen: list   # ONNX initializer names of buffers (for [train].frozen)


def build(name, seed=0):
    torch.manual_seed(seed)
    return MODELS[name].make().train()


def export(spec, model, path, batch=BATCH, dynamic=True):
    """Exports `model` (made by spec.make, at its current weights) for training; returns the
    initializer <-> parameter mapping. A dynamic batch axis is traced at batch + 1 so no batch size
    is baked in; dynamic=False exports at `batch` with every shape static."""
    g = torch.Generator().manual_seed(123)
    x, _ = example(spec, batch + 1 if dynamic else batch, g)
    axes = {spec.input_name: {0: "batch"}, OUTPUT: {0: "batch"}} if dynamic else None
    traced = torch.jit.script(model) if spec.script else model
    torch.onnx.export(traced, (x,), path, input_names=[spec.input_name], output_names=[OUTPUT],
                      dynamic_axes=axes,
                      opset_version=OPSET, training=torch.onnx.TrainingMode.TRAINING,
                      do_constant_folding=False)
    m = onnx.load(path)
    onnx.checker.check_model(m)
    inits = {i.name for i in m.graph.initializer}
    # Tied parameters are one tensor: named_parameters() yields the first name only.
    params = {n: n for n, _ in model.named_parameters()}
    missing = [n for n in params if n not in inits]
    if missing:
        raise RuntimeError(f"{path}: parameters not exported as initializers of their name: "
                           f"{missing} (initializers: {sorted(inits)})")
    frozen = sorted(n for n, _ in model.named_buffers() if n in inits)
    return Exported(path, params, frozen)
