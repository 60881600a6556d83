#!/usr/bin/env python3
"""Weight-less ONNX skeletons for the planner's --compare cases (docs/planner.md, "The search"),
written with a minimal protobuf encoder so that neither onnx nor torch is needed (only the Python
standard library).

  planner-deepseek-moe-141b.onnx  DeepSeek-style MoE: 58 layers, hidden 5120, 40 heads, per layer
                                  96 routed SwiGLU experts (ffn 1536, top-6 routing) + 2 shared
                                  experts; ~141B parameters
  planner-gpt-141b.onnx           dense GPT: 77 layers, hidden 12288, 96 heads, vocab 64000; ~141B parameters

Every weight is a float16 initializer whose data lives in an external file that is deliberately
absent (planning needs only dims), as in gen_models.py's gpt-175b-skeleton. Routed experts are
stacked weights (experts x in x out) applied to tokens regrouped per expert: the k routed copies of
each token are tiled and reshaped to (experts, k*tokens/experts, hidden), i.e. a perfectly balanced
dispatch, so the graph's FLOPs are the active (top-k) expert FLOPs.

Usage: planner-gen_skeletons.py [OUT_DIR]   (default: the directory of this script)
"""
import json
import math
import os
import struct
import sys

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
FLOAT, INT64, FLOAT16 = 1, 7, 10


# ---------------------------------------------------------------- protobuf wire format
def varint(n):
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def key(field, wire):
    return varint(field << 3 | wire)


def f_int(field, n):
    return key(field, 0) + varint(n)


def f_bytes(field, data):
    if isinstance(data, str):
        data = data.encode()
    return key(field, 2) + varint(len(data)) + data


def f_float(field, x):
    return key(field, 5) + struct.pack("<f", x)


def f_packed(field, values):
    return f_bytes(field, b"".join(varint(v) for v in values))


# ---------------------------------------------------------------- ONNX messages
def tensor_external(name, dims, location, offset):
    length = math.prod(dims) * 2
    ext = b"".join(f_bytes(13, f_bytes(1, k) + f_bytes(2, v))
                   for k, v in (("location", location), ("offset", str(offset)), ("length", str(length))))
    return f_packed(1, dims) + f_int(2, FLOAT16) + f_bytes(8, name) + ext + f_int(14, 1), length


def tensor_i64(name, values):
    return f_packed(1, [len(values)]) + f_int(2, INT64) + f_packed(7, values) + f_bytes(8, name)


def tensor_f16_scalar(name, value):
    return f_int(2, FLOAT16) + f_bytes(8, name) + f_bytes(9, struct.pack("<e", value))


def attr(name, value):
    if isinstance(value, float):
        return f_bytes(1, name) + f_float(2, value) + f_int(20, 1)
    if isinstance(value, int):
        return f_bytes(1, name) + f_int(3, value) + f_int(20, 2)
    if isinstance(value, list):
        return f_bytes(1, name) + f_packed(8, value) + f_int(20, 7)
    if isinstance(value, bytes):  # a serialized TensorProto
        return f_bytes(1, name) + f_bytes(5, value) + f_int(20, 4)
    raise TypeError(value)


def value_info(name, elem, dims):
    shape = b"".join(f_bytes(1, f_bytes(2, d) if isinstance(d, str) else f_int(1, d)) for d in dims)
    return f_bytes(1, name) + f_bytes(2, f_bytes(1, f_int(1, elem) + f_bytes(2, shape)))


class Builder:
    def __init__(self, data_file):
        self.nodes, self.inits = [], []
        self.data_file, self.offset, self.params = data_file, 0, 0

    def weight(self, name, dims):
        t, length = tensor_external(name, dims, self.data_file, self.offset)
        self.offset += length
        self.params += math.prod(dims)
        self.inits.append(t)
        return name

    def const_i64(self, name, values):
        self.inits.append(tensor_i64(name, values))
        return name

    def scalar(self, name, value):
        """A Constant node (not an initializer, so it is no parameter)."""
        self.node("Constant", [], [name], name + "/Constant", value=tensor_f16_scalar(name + "/v", value))
        return name

    def node(self, op, ins, outs, name, **attrs):
        msg = b"".join(f_bytes(1, i) for i in ins) + b"".join(f_bytes(2, o) for o in outs)
        msg += f_bytes(3, name) + f_bytes(4, op) + b"".join(f_bytes(5, attr(k, v)) for k, v in attrs.items())
        self.nodes.append(msg)
        return outs[0]

    def save(self, path, graph_name, inputs, outputs):
        graph = b"".join(f_bytes(1, n) for n in self.nodes) + f_bytes(2, graph_name)
        graph += b"".join(f_bytes(5, t) for t in self.inits)
        graph += b"".join(f_bytes(11, v) for v in inputs) + b"".join(f_bytes(12, v) for v in outputs)
        model = f_int(1, 8) + f_bytes(2, "hp planner-gen_skeletons.py") + f_bytes(7, graph)
        model += f_bytes(8, f_bytes(1, "") + f_int(2, 17))
        with open(path, "wb") as f:
            f.write(model)


# ---------------------------------------------------------------- shared pieces
def layer_norm(g, x, w, h, p, tag):
    return g.node("LayerNormalization", [x, g.weight(w + tag + ".weight", [h]), g.weight(w + tag + ".bias", [h])],
                  [f"{p}/{tag}/out"], f"{p}/{tag}/LayerNormalization", axis=-1, epsilon=1e-5)


def linear(g, x, w, p, tag, din, dout, bias=True):
    y = g.node("MatMul", [x, g.weight(w + tag + ".weight", [din, dout])], [f"{p}/{tag}/mm"], f"{p}/{tag}/MatMul")
    if not bias:
        return y
    return g.node("Add", [y, g.weight(w + tag + ".bias", [dout])], [f"{p}/{tag}/out"], f"{p}/{tag}/Add")


def attention(g, x, w, p, h, heads):
    hd = h // heads
    y = layer_norm(g, x, w, h, p, "ln_1")
    qkv = linear(g, y, w, p, "attn.qkv", h, 3 * h)
    q, k, v = (f"{p}/attn/{c}" for c in "qkv")
    g.node("Split", [qkv, g.const_i64(f"{p}/split", [h, h, h])], [q, k, v], f"{p}/attn/Split", axis=2)
    ts = []
    for c, t in (("q", q), ("k", k), ("v", v)):
        r = g.node("Reshape", [t, "shape_heads"], [f"{p}/attn/{c}_r"], f"{p}/attn/Reshape_{c}")
        ts.append(g.node("Transpose", [r], [f"{p}/attn/{c}_t"], f"{p}/attn/Transpose_{c}",
                         perm=[0, 2, 3, 1] if c == "k" else [0, 2, 1, 3]))
    sc = g.node("MatMul", ts[:2], [f"{p}/attn/scores"], f"{p}/attn/MatMul_qk")
    sc = g.node("Mul", [sc, g.scalar(f"{p}/attn/scale", 1.0 / math.sqrt(hd))], [f"{p}/attn/scaled"], f"{p}/attn/Mul")
    sm = g.node("Softmax", [sc], [f"{p}/attn/probs"], f"{p}/attn/Softmax", axis=-1)
    ctx = g.node("MatMul", [sm, ts[2]], [f"{p}/attn/ctx"], f"{p}/attn/MatMul_av")
    ctx = g.node("Transpose", [ctx], [f"{p}/attn/ctx_t"], f"{p}/attn/Transpose_ctx", perm=[0, 2, 1, 3])
    ctx = g.node("Reshape", [ctx, "shape_merge"], [f"{p}/attn/merged"], f"{p}/attn/Reshape_ctx")
    a = linear(g, ctx, w, p, "attn.proj", h, h)
    return g.node("Add", [x, a], [f"{p}/res1"], f"{p}/Add_1")


def swiglu(g, x, w_gate, w_up, w_down, p, tag):
    gate = g.node("MatMul", [x, w_gate], [f"{p}/{tag}/gate"], f"{p}/{tag}/MatMul_gate")
    sig = g.node("Sigmoid", [gate], [f"{p}/{tag}/sig"], f"{p}/{tag}/Sigmoid")
    act = g.node("Mul", [gate, sig], [f"{p}/{tag}/silu"], f"{p}/{tag}/Mul_silu")
    up = g.node("MatMul", [x, w_up], [f"{p}/{tag}/up"], f"{p}/{tag}/MatMul_up")
    hid = g.node("Mul", [act, up], [f"{p}/{tag}/hid"], f"{p}/{tag}/Mul_up")
    return g.node("MatMul", [hid, w_down], [f"{p}/{tag}/down"], f"{p}/{tag}/MatMul_down")


def embed(g, h, vocab, heads):
    g.const_i64("shape_heads", [0, 0, heads, h // heads])
    g.const_i64("shape_merge", [0, 0, h])
    return g.node("Gather", [g.weight("wte", [vocab, h]), "input_ids"], ["tok_emb"], "/wte/Gather")


def head(g, x, h, vocab):
    y = g.node("LayerNormalization", [x, g.weight("ln_f.weight", [h]), g.weight("ln_f.bias", [h])], ["ln_f_out"],
               "/ln_f/LayerNormalization", axis=-1, epsilon=1e-5)
    return g.node("MatMul", [y, g.weight("lm_head.weight", [h, vocab])], ["logits"], "/lm_head/MatMul")


def finish(g, name, vocab, config, flops_per_token):
    path = os.path.join(OUT, name + ".onnx")
    g.save(path, name, [value_info("input_ids", INT64, ["batch", "seq"])],
           [value_info("logits", FLOAT16, ["batch", "seq", vocab])])
    exp = {"parameters": g.params, "blocks": config["layers"], "dims": {"batch": 1, "seq": config["seq"]},
           "matmul_flops_per_token_excluding_attention_scores": flops_per_token,
           "missing_external_data": [g.data_file], "config": config}
    with open(os.path.join(OUT, name + ".json"), "w") as f:
        json.dump(exp, f, indent=2, sort_keys=True)
        f.write("\n")
    print(f"{name}: {os.path.getsize(path)} bytes, {g.params / 1e9:.1f}B parameters")


# ---------------------------------------------------------------- the two models
def gen_moe(name="planner-deepseek-moe-141b", layers=58, h=5120, heads=40, vocab=102400, experts=96, top_k=6,
            ffn=1536, shared=2, seq=4096):
    g = Builder(name + ".weights")
    x = embed(g, h, vocab, heads)
    g.const_i64("shape_tokens", [-1, h])
    g.const_i64("tile_k", [top_k, 1])
    g.const_i64("shape_experts", [experts, -1, h])
    g.const_i64("shape_copies", [top_k, -1, h])
    g.const_i64("shape_gates", [top_k, -1, 1])
    g.const_i64("k", [top_k])
    g.const_i64("axis0", [0])
    for i in range(layers):
        p, w = f"/layers.{i}", f"layers.{i}."
        x = attention(g, x, w, p, h, heads)
        y = layer_norm(g, x, w, h, p, "ln_2")
        # router: softmax scores, top-k experts per token, their scores as gates
        logits = g.node("MatMul", [y, g.weight(w + "router.weight", [h, experts])], [f"{p}/router/logits"],
                        f"{p}/router/MatMul")
        scores = g.node("Softmax", [logits], [f"{p}/router/scores"], f"{p}/router/Softmax", axis=-1)
        g.node("TopK", [scores, "k"], [f"{p}/router/gates", f"{p}/router/idx"], f"{p}/router/TopK", axis=-1)
        # shared experts: one dense SwiGLU of shared * ffn
        sh = swiglu(g, y, g.weight(w + "shared.gate.weight", [h, shared * ffn]),
                    g.weight(w + "shared.up.weight", [h, shared * ffn]),
                    g.weight(w + "shared.down.weight", [shared * ffn, h]), p, "shared")
        # routed experts on a balanced dispatch: (k * tokens, h) -> (experts, k * tokens / experts, h)
        tok = g.node("Reshape", [y, "shape_tokens"], [f"{p}/moe/tokens"], f"{p}/moe/Reshape_tokens")
        rep = g.node("Tile", [tok, "tile_k"], [f"{p}/moe/copies"], f"{p}/moe/Tile")
        disp = g.node("Reshape", [rep, "shape_experts"], [f"{p}/moe/dispatch"], f"{p}/moe/Reshape_dispatch")
        out = swiglu(g, disp, g.weight(w + "experts.gate.weight", [experts, h, ffn]),
                     g.weight(w + "experts.up.weight", [experts, h, ffn]),
                     g.weight(w + "experts.down.weight", [experts, ffn, h]), p, "experts")
        back = g.node("Reshape", [out, "shape_copies"], [f"{p}/moe/combine"], f"{p}/moe/Reshape_combine")
        gt = g.node("Transpose", [f"{p}/router/gates"], [f"{p}/moe/gates_t"], f"{p}/moe/Transpose_gates", perm=[2, 0, 1])
        gr = g.node("Reshape", [gt, "shape_gates"], [f"{p}/moe/gates_r"], f"{p}/moe/Reshape_gates")
        wt = g.node("Mul", [back, gr], [f"{p}/moe/weighted"], f"{p}/moe/Mul_gates")
        red = g.node("ReduceSum", [wt, "axis0"], [f"{p}/moe/sum"], f"{p}/moe/ReduceSum", keepdims=0)
        shp = g.node("Shape", [x], [f"{p}/moe/shape_x"], f"{p}/moe/Shape")
        routed = g.node("Reshape", [red, shp], [f"{p}/moe/routed"], f"{p}/moe/Reshape_out")
        x = g.node("Add", [x, sh], [f"{p}/res2"], f"{p}/Add_2")
        x = g.node("Add", [x, routed], [f"{p}/res3"], f"{p}/Add_3")
    head(g, x, h, vocab)
    per_token = layers * (2 * 4 * h * h + 2 * h * experts + 6 * h * shared * ffn + 6 * top_k * h * ffn) + 2 * h * vocab
    finish(g, name, vocab, {"layers": layers, "hidden": h, "heads": heads, "vocab": vocab, "experts": experts,
                            "top_k": top_k, "ffn": ffn, "shared_experts": shared, "seq": seq}, per_token)


def gen_dense(name="planner-gpt-141b", layers=77, h=12288, heads=96, vocab=64000, seq=4096):
    g = Builder(name + ".weights")
    x = embed(g, h, vocab, heads)
    for i in range(layers):
        p, w = f"/h.{i}", f"h.{i}."
        x = attention(g, x, w, p, h, heads)
        y = layer_norm(g, x, w, h, p, "ln_2")
        f1 = linear(g, y, w, p, "mlp.fc", h, 4 * h)
        act = g.node("Relu", [f1], [f"{p}/mlp/act"], f"{p}/mlp/Relu")
        f2 = linear(g, act, w, p, "mlp.proj", 4 * h, h)
        x = g.node("Add", [x, f2], [f"{p}/res2"], f"{p}/Add_2")
    head(g, x, h, vocab)
    per_token = layers * 2 * 12 * h * h + 2 * h * vocab
    finish(g, name, vocab, {"layers": layers, "hidden": h, "heads": heads, "vocab": vocab, "seq": seq}, per_token)


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    gen_moe()
    gen_dense()
