#!/usr/bin/env python3
"""check_memory_svg.py SVG: the --svg memory picture of hp offload-profile is readable. Checks: it
parses as XML; a white background covers it; a visible legend (not an XML comment) names the
curves and the budget; every stage panel has the same time and memory scale (data-tmax,
data-ymax) and a time axis with labels; no two text labels overlap, nor a label and a transfer tick (boxes estimated from the font
size: 0.6 em a character, as wide as sans-serif digits)."""
import sys
import xml.etree.ElementTree as ET

NS = "{http://www.w3.org/2000/svg}"
root = ET.parse(sys.argv[1]).getroot()
errors = []


def check(ok, what):
    if not ok:
        errors.append(what)


width, height = float(root.get("width")), float(root.get("height"))
rects = list(root.iter(NS + "rect"))
check(bool(rects) and rects[0].get("fill") == "white" and float(rects[0].get("width")) >= width
      and float(rects[0].get("height")) >= height, "no white background rect first")
legend = [g for g in root.iter(NS + "g") if g.get("class") == "legend"]
check(len(legend) == 1, "no legend group")
labels = [t.text for g in legend for t in g.iter(NS + "text")]
for want in ("without offload", "with offload", "budget"):
    check(want in labels, f"legend lacks '{want}': {labels}")
stages = [g for g in root.iter(NS + "g") if g.get("class") == "stage"]
check(len(stages) >= 2, f"{len(stages)} stage panels")
check(len({(g.get("data-tmax"), g.get("data-ymax")) for g in stages}) == 1,
      "stage panels have different scales")
for i, g in enumerate(stages):
    axes = [a for a in g.iter(NS + "g") if a.get("class") == "time-axis"]
    check(len(axes) == 1 and len(list(axes[0].iter(NS + "text"))) >= 2,
          f"stage panel {i} has no labelled time axis")

root_size = float(root.get("font-size", 11))
boxes = []
for t in root.iter(NS + "text"):
    size = float(t.get("font-size", root_size))
    w = 0.6 * size * len(t.text or "")
    x, y = float(t.get("x")), float(t.get("y"))
    anchor = t.get("text-anchor", "start")
    x0 = x - w if anchor == "end" else x - w / 2 if anchor == "middle" else x
    boxes.append((x0, y - 0.8 * size, x0 + w, y + 0.2 * size, t.text))
boxes.sort()
for i, a in enumerate(boxes):
    for b in boxes[i + 1:]:
        if b[0] >= a[2]:
            break
        if b[1] < a[3] and a[1] < b[3]:
            errors.append(f"labels overlap: '{a[4]}' and '{b[4]}'")
# Transfer ticks (the 5-pixel-high rects under each plot) must not run under a label either.
for r in rects:
    if r.get("height") != "5":
        continue
    x0, y0 = float(r.get("x")), float(r.get("y"))
    x1, y1 = x0 + float(r.get("width")), y0 + 5
    hit = next((b for b in boxes if b[0] < x1 and x0 < b[2] and b[1] < y1 and y0 < b[3]), None)
    if hit:
        errors.append(f"a transfer tick at x={x0:.0f} runs under the label '{hit[4]}'")
        break
for e in errors[:20]:
    print("check_memory_svg:", e)
sys.exit(1 if errors else 0)
