#!/usr/bin/python3
"""Writes one malformed variant of the bundled tiny GPT-2 for the hardening CLI cases.

    /usr/bin/python3 tests/data/models/gen_bad_models.py KIND SRC_MODEL OUT_MODEL

Each KIND breaks one assumption a loader or shape inference might make (docs/hardening.md, "Bad
files"); the CLI case then checks that hp refuses the file with the cause and exit code 3:

  elem-type-0       the token input's elem_type is 0 (UNDEFINED)
  input-rank        the token input is declared rank 1 although the graph indexes dims 0 and 1
  input-rank-high   the token input is declared rank 4 ([batch, seq, 3, 5]) where the graph uses 2
  scan              every MatMul renamed to Scan (a control-flow op without its body)
  empty-input-name  the token input is named "" (and its consumers read "")
  declared-dim      the token input declares a fixed dim of 2^62
  constant-oversized  a Constant declared as [2^31] floats holding 4 bytes
  reshape-2e31      a Reshape whose target shape is the constant [2^31]
  empty-broadcast   Mul of an empty integer constant [0] with a [1] (shape arithmetic broadcasting)
  seq-second-input  an Add reading a sequence through its second input (found by the fuzzer)
  expand-huge       an Expand of a small integer constant to [4096, 4096, 4096] (2^36 elements)
  ext-offset-junk   one initializer moved to external data with offset "12abc"
  ext-length-junk   the same with length "8x"
  ext-absolute      one initializer's external data at /etc/passwd
  ext-dotdot        one initializer's external data at ../outside.bin
  ext-symlink       one initializer's external data at link.bin (the CLI case makes it a symlink)
Exits 77 (CTest's skip) when the onnx package is missing.
"""
import sys

try:
    import onnx
    from onnx import helper, numpy_helper, TensorProto
except ImportError:
    sys.exit(77)

kind, src, out = sys.argv[1], sys.argv[2], sys.argv[3]
m = onnx.load(src)
g = m.graph
inits = {t.name for t in g.initializer}
tokens = [i for i in g.input if i.name not in inits][0]


def external(location, **extra):
    t = max(g.initializer, key=lambda t: len(t.raw_data))
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    kv = t.external_data.add()
    kv.key, kv.value = "location", location
    for k, v in extra.items():
        kv = t.external_data.add()
        kv.key, kv.value = k, v


if kind == "elem-type-0":
    tokens.type.tensor_type.elem_type = 0
elif kind == "input-rank":
    del tokens.type.tensor_type.shape.dim[1:]
elif kind == "input-rank-high":
    tokens.type.tensor_type.shape.dim.add().dim_value = 3
    tokens.type.tensor_type.shape.dim.add().dim_value = 5
elif kind == "scan":
    for n in g.node:
        if n.op_type == "MatMul":
            n.op_type = "Scan"
elif kind == "empty-input-name":
    old = tokens.name
    tokens.name = ""
    for n in g.node:
        for i, x in enumerate(n.input):
            if x == old:
                n.input[i] = ""
elif kind == "declared-dim":
    tokens.type.tensor_type.shape.dim[0].Clear()
    tokens.type.tensor_type.shape.dim[0].dim_value = 2**62
elif kind == "constant-oversized":
    t = TensorProto(name="big", data_type=TensorProto.FLOAT, dims=[2**31], raw_data=b"\0" * 4)
    g.node.insert(0, helper.make_node("Constant", [], ["big_c"], value=t))
elif kind == "reshape-2e31":
    shape = numpy_helper.from_array(__import__("numpy").array([2**31], dtype="int64"), "shape_2e31")
    g.initializer.append(shape)
    g.node.append(helper.make_node("Reshape", [g.output[0].name, "shape_2e31"], ["reshaped"]))
    g.output.append(helper.make_tensor_value_info("reshaped", TensorProto.FLOAT, None))
elif kind == "empty-broadcast":
    empty = TensorProto(name="e", data_type=TensorProto.INT64, dims=[0])
    g.node.append(helper.make_node("Constant", [], ["empty"], value=empty))
    g.node.append(helper.make_node("Constant", [], ["three"], value_ints=[3]))
    g.node.append(helper.make_node("Mul", ["empty", "three"], ["product"]))
    g.output.append(helper.make_tensor_value_info("product", TensorProto.INT64, None))
elif kind == "seq-second-input":
    g.node.append(helper.make_node("Constant", [], ["three"], value_ints=[3]))
    g.node.append(helper.make_node("SequenceConstruct", ["three"], ["seq"]))
    g.node.append(helper.make_node("Add", ["three", "seq"], ["odd_sum"]))
    g.output.append(helper.make_tensor_value_info("odd_sum", TensorProto.INT64, None))
elif kind == "expand-huge":
    g.node.append(helper.make_node("Constant", [], ["one"], value_ints=[1]))
    g.node.append(helper.make_node("Constant", [], ["huge_shape"], value_ints=[4096, 4096, 4096]))
    g.node.append(helper.make_node("Expand", ["one", "huge_shape"], ["expanded"]))
    g.output.append(helper.make_tensor_value_info("expanded", TensorProto.INT64, None))
elif kind == "ext-offset-junk":
    external("w.bin", offset="12abc")
elif kind == "ext-length-junk":
    external("w.bin", length="8x")
elif kind == "ext-absolute":
    external("/etc/passwd")
elif kind == "ext-dotdot":
    external("../outside.bin")
elif kind == "ext-symlink":
    external("link.bin")
else:
    sys.exit(f"unknown kind {kind}")
onnx.save(m, out)
