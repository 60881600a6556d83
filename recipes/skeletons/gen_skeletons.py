#!/usr/bin/env python3
"""Weight-less ONNX skeletons of real models, for the planning recipes in recipes/ (and a template for
planning your own model without its weights). Only the Python standard library is needed: the ONNX
protobuf is written by hand.

A skeleton has the real graph structure and every weight's real shape, but each weight is a float16
initializer whose bytes live in an external file that does not exist (<name>.weights). `hp plan`
needs only shapes, so it plans a skeleton like the full model; `hp plan --summary` lists the absent
file, and `hp plan --require-data` refuses it.

  llama3-8b        Llama-3-8B: 32 layers, hidden 4096, SwiGLU ffn 14336, 32 query / 8 key-value heads,
                   vocab 128256
  llama3-70b       Llama-3-70B: 80 layers, hidden 8192, ffn 28672, 64 / 8 heads, vocab 128256
  gpt3-175b        GPT-3 175B: 96 layers, hidden 12288, 96 heads, GELU ffn 4 x hidden, vocab 50257,
                   learned positions (2048), lm_head tied to the token embedding
  deepseek-v3-moe  DeepSeek-V3-style MoE: 61 layers, hidden 7168, 128 heads, vocab 129280; layers 0-2
                   dense (ffn 18432), layers 3-60 with 256 routed experts (ffn 2048, top-8) and one
                   shared expert

Simplifications, none of which changes a weight shape of the dense models: norms are
LayerNormalization (RMSNorm has no ONNX op before opset 23; for Llama and DeepSeek the norms carry no
bias, as in the originals), rotary embeddings are left out (no weights, few FLOPs), DeepSeek's
multi-head latent attention is plain multi-head attention at hidden 7168 (MLA's low-rank projections
have ~10% fewer parameters), and routed experts see a perfectly balanced dispatch: the k routed copies
of each token are regrouped to (experts, k * tokens / experts, hidden) and run through stacked expert
weights (experts x in x out), so the graph's FLOPs are the active (top-k) FLOPs.

Usage: gen_skeletons.py [OUT_DIR]   (default: this script's directory); prints each file's size and
parameter count.
"""
import math
import os
import struct
import sys

FLOAT16, INT64 = 10, 7


# ---------------------------------------------------------------- protobuf wire format
def varint(n):
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def field_varint(number, value):
    return varint(number << 3) + varint(value)


def field_bytes(number, data):
    data = data.encode() if isinstance(data, str) else data
    return varint(number << 3 | 2) + varint(len(data)) + data


def field_packed(number, values):
    return field_bytes(number, b"".join(varint(v) for v in values))


# ---------------------------------------------------------------- ONNX messages (onnx.proto field numbers)
def attribute(name, value):
    """AttributeProto: name=1, f=2, i=3, t=5, ints=8, type=20 (FLOAT 1, INT 2, TENSOR 4, INTS 7)."""
    head = field_bytes(1, name)
    if isinstance(value, float):
        return head + varint(2 << 3 | 5) + struct.pack("<f", value) + field_varint(20, 1)
    if isinstance(value, int):
        return head + field_varint(3, value) + field_varint(20, 2)
    if isinstance(value, list):
        return head + field_packed(8, value) + field_varint(20, 7)
    return head + field_bytes(5, value) + field_varint(20, 4)  # a serialized TensorProto


def value_info(name, elem_type, dims):
    """ValueInfoProto with a tensor type; a str dim is symbolic (dim_param), an int is fixed."""
    shape = b"".join(field_bytes(1, field_bytes(2, d) if isinstance(d, str) else field_varint(1, d)) for d in dims)
    return field_bytes(1, name) + field_bytes(2, field_bytes(1, field_varint(1, elem_type) + field_bytes(2, shape)))


class Graph:
    """Collects nodes and initializers; weights are external float16 tensors in one absent file."""

    def __init__(self, name):
        self.name, self.data_file = name, name + ".weights"
        self.nodes, self.inits = [], []
        self.offset = self.params = 0

    def weight(self, name, dims):
        length = math.prod(dims) * 2
        location = b"".join(field_bytes(13, field_bytes(1, k) + field_bytes(2, v)) for k, v in
                            (("location", self.data_file), ("offset", str(self.offset)), ("length", str(length))))
        # TensorProto: dims=1, data_type=2, name=8, external_data=13, data_location=14 (EXTERNAL = 1)
        self.inits.append(field_packed(1, dims) + field_varint(2, FLOAT16) + field_bytes(8, name) + location +
                          field_varint(14, 1))
        self.offset += length
        self.params += math.prod(dims)
        return name

    def ints(self, name, values):
        """An int64 vector initializer (shapes, axes): not a parameter."""
        self.inits.append(field_packed(1, [len(values)]) + field_varint(2, INT64) + field_packed(7, values) +
                          field_bytes(8, name))
        return name

    def scalar(self, name, value):
        """A float16 Constant node (not an initializer, so not counted as a parameter)."""
        tensor = field_varint(2, FLOAT16) + field_bytes(8, name + "/value") + field_bytes(9, struct.pack("<e", value))
        return self.op("Constant", [], name, value=tensor)

    def op(self, op_type, inputs, output, **attrs):
        """One node with one output named `output` (the node is named after it); returns the output."""
        self.nodes.append(b"".join(field_bytes(1, i) for i in inputs) + field_bytes(2, output) +
                          field_bytes(3, output + "/" + op_type) + field_bytes(4, op_type) +
                          b"".join(field_bytes(5, attribute(k, v)) for k, v in attrs.items()))
        return output

    def op_multi(self, op_type, inputs, outputs, **attrs):
        self.nodes.append(b"".join(field_bytes(1, i) for i in inputs) + b"".join(field_bytes(2, o) for o in outputs) +
                          field_bytes(3, outputs[0] + "/" + op_type) + field_bytes(4, op_type) +
                          b"".join(field_bytes(5, attribute(k, v)) for k, v in attrs.items()))
        return outputs

    def save(self, path, inputs, outputs):
        graph = b"".join(field_bytes(1, n) for n in self.nodes) + field_bytes(2, self.name)
        graph += b"".join(field_bytes(5, t) for t in self.inits)
        graph += b"".join(field_bytes(11, v) for v in inputs) + b"".join(field_bytes(12, v) for v in outputs)
        # ModelProto: ir_version=1 (8), producer_name=2, graph=7, opset_import=8 (default domain, 17)
        model = field_varint(1, 8) + field_bytes(2, "hp recipes/skeletons/gen_skeletons.py") + field_bytes(7, graph)
        model += field_bytes(8, field_bytes(1, "") + field_varint(2, 17))
        with open(path, "wb") as f:
            f.write(model)


# ---------------------------------------------------------------- building blocks
def norm(g, x, w, h, bias):
    ins = [x, g.weight(w + ".weight", [h])] + ([g.weight(w + ".bias", [h])] if bias else [])
    return g.op("LayerNormalization", ins, w + "/out", axis=-1, epsilon=1e-5)


def linear(g, x, w, din, dout, bias):
    y = g.op("MatMul", [x, g.weight(w + ".weight", [din, dout])], w + "/mm")
    return g.op("Add", [y, g.weight(w + ".bias", [dout])], w + "/out") if bias else y


def attention(g, x, w, h, heads, kv_heads, bias):
    """Multi-head attention with kv_heads key/value heads repeated to `heads` (grouped-query when fewer)."""
    hd = h // heads
    q = linear(g, x, w + ".q_proj", h, h, bias)
    k = linear(g, x, w + ".k_proj", h, kv_heads * hd, bias)
    v = linear(g, x, w + ".v_proj", h, kv_heads * hd, bias)

    def split(t, n, tag):  # (b, s, n*hd) -> (b, n, s, hd)
        r = g.op("Reshape", [t, g.ints(f"{w}/{tag}_shape", [0, 0, n, hd])], f"{w}/{tag}_r")
        return g.op("Transpose", [r], f"{w}/{tag}_t", perm=[0, 2, 1, 3])

    def repeat(t, tag):  # (b, kv, s, hd) -> (b, heads, s, hd)
        if kv_heads == heads:
            return t
        u = g.op("Unsqueeze", [t, g.ints(f"{w}/{tag}_axis", [2])], f"{w}/{tag}_u")
        e = g.op("Expand", [u, g.ints(f"{w}/{tag}_rep", [1, 1, heads // kv_heads, 1, 1])], f"{w}/{tag}_e")
        return g.op("Reshape", [e, g.ints(f"{w}/{tag}_merge", [0, heads, -1, hd])], f"{w}/{tag}_rep_out")

    qt = split(q, heads, "q")
    kt = repeat(split(k, kv_heads, "k"), "k")
    vt = repeat(split(v, kv_heads, "v"), "v")
    kT = g.op("Transpose", [kt], f"{w}/k_T", perm=[0, 1, 3, 2])
    scores = g.op("MatMul", [qt, kT], f"{w}/scores")
    scores = g.op("Mul", [scores, g.scalar(f"{w}/scale", 1.0 / math.sqrt(hd))], f"{w}/scaled")
    probs = g.op("Softmax", [scores], f"{w}/probs", axis=-1)
    ctx = g.op("MatMul", [probs, vt], f"{w}/ctx")
    ctx = g.op("Transpose", [ctx], f"{w}/ctx_t", perm=[0, 2, 1, 3])
    ctx = g.op("Reshape", [ctx, g.ints(f"{w}/merge", [0, 0, h])], f"{w}/merged")
    return linear(g, ctx, w + ".o_proj", h, h, bias)


def swiglu(g, x, w, din, ffn, stacked=None):
    """down(silu(x gate) * (x up)); `stacked` = expert count for stacked (experts x in x out) weights."""
    lead = [stacked] if stacked else []
    gate = g.op("MatMul", [x, g.weight(w + ".gate_proj.weight", lead + [din, ffn])], w + "/gate")
    silu = g.op("Mul", [gate, g.op("Sigmoid", [gate], w + "/sigmoid")], w + "/silu")
    up = g.op("MatMul", [x, g.weight(w + ".up_proj.weight", lead + [din, ffn])], w + "/up")
    hidden = g.op("Mul", [silu, up], w + "/hidden")
    return g.op("MatMul", [hidden, g.weight(w + ".down_proj.weight", lead + [ffn, din])], w + "/down")


def gelu_mlp(g, x, w, h):
    """fc -> gelu (erf form, as PyTorch exports it before opset 20) -> proj, with biases."""
    f = linear(g, x, w + ".c_fc", h, 4 * h, True)
    e = g.op("Erf", [g.op("Div", [f, g.scalar(w + "/sqrt2", math.sqrt(2.0))], w + "/div")], w + "/erf")
    e = g.op("Add", [e, g.scalar(w + "/one", 1.0)], w + "/erf1")
    act = g.op("Mul", [g.op("Mul", [f, e], w + "/mul"), g.scalar(w + "/half", 0.5)], w + "/gelu")
    return linear(g, act, w + ".c_proj", 4 * h, h, True)


def moe(g, x, w, h, experts, top_k, ffn, shared):
    """Router (softmax, top-k gates), `shared` always-on experts and top-k routed experts."""
    logits = g.op("MatMul", [x, g.weight(w + ".gate.weight", [h, experts])], w + "/router_logits")
    scores = g.op("Softmax", [logits], w + "/router_scores", axis=-1)
    gates, _ = g.op_multi("TopK", [scores, g.ints(w + "/k", [top_k])], [w + "/gates", w + "/experts"], axis=-1)
    out = swiglu(g, x, w + ".shared_experts", h, shared * ffn)
    tokens = g.op("Reshape", [x, g.ints(w + "/tokens_shape", [-1, h])], w + "/tokens")
    copies = g.op("Tile", [tokens, g.ints(w + "/tile", [top_k, 1])], w + "/copies")
    dispatch = g.op("Reshape", [copies, g.ints(w + "/dispatch_shape", [experts, -1, h])], w + "/dispatch")
    routed = swiglu(g, dispatch, w + ".experts", h, ffn, stacked=experts)
    routed = g.op("Reshape", [routed, g.ints(w + "/combine_shape", [top_k, -1, h])], w + "/combine")
    gates = g.op("Transpose", [gates], w + "/gates_t", perm=[2, 0, 1])
    gates = g.op("Reshape", [gates, g.ints(w + "/gates_shape", [top_k, -1, 1])], w + "/gates_r")
    summed = g.op("ReduceSum", [g.op("Mul", [routed, gates], w + "/weighted"), g.ints(w + "/axis0", [0])],
                  w + "/sum", keepdims=0)
    routed = g.op("Reshape", [summed, g.op("Shape", [x], w + "/x_shape")], w + "/routed")
    return g.op("Add", [out, routed], w + "/out")


def decoder(name, layers, h, heads, kv_heads, vocab, mlp, bias=False, positions=0, tied=False):
    """Token embedding (+ learned positions), `layers` pre-norm blocks, final norm, lm_head (or, tied,
    the transposed token embedding)."""
    g = Graph(name)
    x = g.op("Gather", [g.weight("embed_tokens.weight", [vocab, h]), "input_ids"], "embed/tokens")
    inputs = [value_info("input_ids", INT64, ["batch", "seq"])]
    if positions:
        pos = g.op("Gather", [g.weight("embed_positions.weight", [positions, h]), "position_ids"], "embed/positions")
        x = g.op("Add", [x, pos], "embed/out")
        inputs.append(value_info("position_ids", INT64, ["batch", "seq"]))
    for i in range(layers):
        w = f"layers.{i}"
        a = attention(g, norm(g, x, w + ".input_norm", h, bias), w + ".attn", h, heads, kv_heads, bias)
        x = g.op("Add", [x, a], w + "/res_attn")
        m = mlp(g, norm(g, x, w + ".post_attention_norm", h, bias), w + ".mlp", i)
        x = g.op("Add", [x, m], w + "/res_mlp")
    y = norm(g, x, "norm", h, bias)
    head = g.op("Transpose", ["embed_tokens.weight"], "lm_head/tied", perm=[1, 0]) if tied else \
        g.weight("lm_head.weight", [h, vocab])
    g.op("MatMul", [y, head], "logits")
    return g, inputs, [value_info("logits", FLOAT16, ["batch", "seq", vocab])]


def llama(name, layers, h, ffn, heads, kv_heads, vocab=128256):
    return decoder(name, layers, h, heads, kv_heads, vocab, lambda g, x, w, i: swiglu(g, x, w, h, ffn))


def gpt3(name="gpt3-175b", layers=96, h=12288, heads=96, vocab=50257, positions=2048):
    return decoder(name, layers, h, heads, heads, vocab, lambda g, x, w, i: gelu_mlp(g, x, w, h), bias=True,
                   positions=positions, tied=True)


def deepseek_v3(name="deepseek-v3-moe", layers=61, h=7168, heads=128, vocab=129280, dense_layers=3,
                dense_ffn=18432, experts=256, top_k=8, ffn=2048, shared=1):
    def mlp(g, x, w, i):
        return swiglu(g, x, w, h, dense_ffn) if i < dense_layers else moe(g, x, w, h, experts, top_k, ffn, shared)
    return decoder(name, layers, h, heads, heads, vocab, mlp)


MODELS = {
    "llama3-8b": lambda: llama("llama3-8b", 32, 4096, 14336, 32, 8),
    "llama3-70b": lambda: llama("llama3-70b", 80, 8192, 28672, 64, 8),
    "gpt3-175b": gpt3,
    "deepseek-v3-moe": deepseek_v3,
}

if __name__ == "__main__":
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    os.makedirs(out_dir, exist_ok=True)
    for name, build in MODELS.items():
        graph, ins, outs = build()
        path = os.path.join(out_dir, name + ".onnx")
        graph.save(path, ins, outs)
        print(f"{name}.onnx: {os.path.getsize(path)} bytes, {graph.params / 1e9:.2f}B parameters")
