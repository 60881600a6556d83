#!/usr/bin/env python3
"""check_schedule_svg.py SVG PLAN_JSON [--break]: the --schedule-svg picture is readable and agrees
with the plan. Checks: the SVG parses as XML; a white background covers it; a legend group holds
a label for every colour; a time axis has tick labels and ends at the step `hp plan --json`
predicts (best.predicted.iteration_seconds, to 1e-6 relative), at the right edge of every drawn
box; with --break, a long steady state is drawn once with its repeat count ("xN") and rows stay
far from a barcode (under 80 boxes per stage)."""
import json
import re
import sys
import xml.etree.ElementTree as ET

NS = "{http://www.w3.org/2000/svg}"
svg_path, json_path = sys.argv[1], sys.argv[2]
want_break = "--break" in sys.argv[3:]
root = ET.parse(svg_path).getroot()
plan = json.load(open(json_path))
errors = []


def check(ok, what):
    if not ok:
        errors.append(what)


width, height = float(root.get("width")), float(root.get("height"))
rects = list(root.iter(NS + "rect"))
bg = rects[0] if rects else None
check(bg is not None and bg.get("fill") == "white" and float(bg.get("width")) >= width and
      float(bg.get("height")) >= height, "no white background rect first")
legend = [g for g in root.iter(NS + "g") if g.get("class") == "legend"]
check(len(legend) == 1, "no legend group")
if legend:
    labels = [t.text for t in legend[0].iter(NS + "text")]
    swatches = legend[0].findall(NS + "rect")
    check("forward" in labels and "bubble" in labels, f"legend lacks forward/bubble: {labels}")
    check(len(labels) == len(swatches), "legend labels and swatches differ in number")
    fills = {r.get("fill") for r in swatches}
    drawn = {r.get("fill") for r in rects[1:] if r not in swatches and r.get("fill") != "white"}
    check(drawn <= fills, f"colours drawn without a legend entry: {drawn - fills}")
axis = [g for g in root.iter(NS + "g") if g.get("class") == "time-axis"]
check(len(axis) == 1, "no time axis")
end = root.find(f".//{NS}text[@id='time-axis-end']")
check(end is not None, "no time-axis-end label")
if axis and end is not None:
    ticks = [t.text for t in axis[0].iter(NS + "text") if t.get("id") != "time-axis-end"]
    check(len(ticks) >= 2, f"time axis has too few labels: {ticks}")
    predicted = plan["best"]["predicted"]["iteration_seconds"]
    drawn_end = float(end.get("data-seconds"))
    check(abs(drawn_end - predicted) <= 1e-6 * predicted,
          f"drawn end {drawn_end} s, predicted step {predicted} s")
    x_end = float(end.get("x"))
    right = max(float(r.get("x")) + float(r.get("width")) for r in rects[1:]
                if r not in (legend[0].findall(NS + "rect") if legend else []) and r.get("fill") != "white")
    check(abs(right - x_end) <= 0.5, f"boxes end at x={right}, the axis at x={x_end}")
texts = [t.text or "" for t in root.iter(NS + "text")]
if want_break:
    check(any(re.fullmatch(r"x\d+", t) for t in texts), "no 'xN' repeat count")
    check(any("steady state is" in t for t in texts), "no steady-state note")
    stage_rects = len([r for r in rects if r.find(NS + "title") is not None])
    stages = len(plan["best"]["stages"])
    check(stage_rects < 80 * stages + 10, f"{stage_rects} boxes for {stages} stages: a barcode")
for e in errors:
    print("check_schedule_svg:", e)
sys.exit(1 if errors else 0)
