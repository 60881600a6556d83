#!/usr/bin/env python3
"""same_skeleton.py A.onnx B.onnx: exit 0 when two skeletons are the same model, node for node and
initializer for initializer (names, ops, attributes, shapes, external-data entries, inputs and
outputs), ignoring only producer_name (`hp model-skeleton` and gen_skeletons.py sign differently).
Needs the onnx package; exit 77 (skip) without it. Used by the model-skeleton CLI cases' setup."""
import sys

try:
    import onnx
except ImportError:
    sys.exit(77)

a, b = (onnx.load(p, load_external_data=False) for p in sys.argv[1:3])
for m in (a, b):
    m.producer_name = ""
if a.SerializeToString() == b.SerializeToString():
    sys.exit(0)
ga, gb = a.graph, b.graph
print(f"differ: {len(ga.node)} vs {len(gb.node)} nodes, {len(ga.initializer)} vs "
      f"{len(gb.initializer)} initializers")
for i, (x, y) in enumerate(zip(ga.node, gb.node)):
    if x != y:
        print(f"first differing node #{i}:\n{x}\nvs\n{y}")
        break
for i, (x, y) in enumerate(zip(ga.initializer, gb.initializer)):
    if x != y:
        print(f"first differing initializer #{i}:\n{x}\nvs\n{y}")
        break
sys.exit(1)
