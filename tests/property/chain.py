#!/usr/bin/python3
"""Property test: every plan hp writes for a user's export runs and computes what torch computes.

For each model family of zoo.py, exported with a dynamic and with a static batch, and for every
`--fix` of tp / pp / dp (and their pairs) on 2-4 local ranks with everything else left to the
planner, the chain a user runs is

    hp plan MODEL --cluster local-cpu --nodes N --global-batch B [--seq S] --fix ... -o plan.toml
    hp shard plan.toml -o parts/
    hp launch plan.toml --shard-dir parts/ --inputs REF.io --outputs out/

and it must either stop at `hp plan` with a reason (a refusal: exit 2 usage, 4 infeasible, or 3
bad input naming the --fix it cannot honour) or finish with torch's outputs within 1e-4. A plan that
passes and fails later is a bug, as is a crash anywhere. Refusing everything is not a way out: the
free plan (no --fix) of every family on 2 ranks must run.

Usage: chain.py HP_BINARY WORK_DIR [--families a,b] [--quick]
Exit status 0 when every combination holds, 1 when one does not, 77 (CTest's skip) when this
Python has no torch/onnx; the report lists each combination's outcome.
"""
import argparse
import os
import shutil
import subprocess
import sys
import time

try:
    import numpy as np
    import onnx
    from onnx import numpy_helper

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import zoo  # noqa: E402
except ImportError as e:  # python3-torch / python3-onnx missing: say so, do not pass
    print(f"skipped: {e} (packaging/install-deps.sh installs python3-torch and python3-onnx)")
    sys.exit(77)

BATCH = 4
FIXES = [[], ["tp=2"], ["pp=2"], ["dp=2"], ["tp=2", "pp=2"], ["tp=2", "dp=2"], ["dp=2", "pp=2"]]


def run(cmd, log, timeout=300):
    t = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        rc, out = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:
        rc, out = 124, f"timed out after {timeout} s: {e}"
    log.write(f"$ {' '.join(cmd)}  # rc={rc} {time.time() - t:.1f}s\n{out}\n")
    return rc, out


def max_err(out_dir, ref_dir):
    got = numpy_helper.to_array(onnx.load_tensor(os.path.join(out_dir, "output_0.pb")))
    want = numpy_helper.to_array(onnx.load_tensor(os.path.join(ref_dir, "output_0.pb")))
    if got.shape != want.shape:
        return f"shape {got.shape} != torch's {want.shape}"
    return float(np.max(np.abs(got.astype(np.float64) - want)))


def last_error(out):
    lines = [l for l in out.splitlines() if "error" in l]
    return (lines[0] if lines else out.strip().splitlines()[-1] if out.strip() else "")[:200]


def chain(hp, work, model, ref, fixes, nodes, log, seq):
    """Returns (outcome, detail): outcome is 'ok', 'refused' or 'FAIL'."""
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    tag = "-".join(f.replace("=", "") for f in fixes) or "free"
    d = os.path.join(work, f"{os.path.basename(model)[:-5]}-{tag}-n{nodes}")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    recipe = os.path.join(d, "plan.toml")
    cmd = [hp, "plan", model, "--cluster", "local-cpu", "--nodes", str(nodes), "--global-batch",
           str(BATCH), "--dtype", "fp32", "-o", recipe]
    if seq:
        cmd += ["--seq", str(seq)]
    for f in fixes:
        cmd += ["--fix", f]
    rc, out = run(cmd, log)
    if "hp: error" in out and (rc in (2, 4) or (rc == 3 and "--fix" in out)):
        return "refused", last_error(out)
    if rc != 0:
        return "FAIL", f"plan exit {rc}: {last_error(out)}"
    rc, out = run([hp, "shard", recipe, "-o", os.path.join(d, "parts")], log)
    if rc != 0:
        return "FAIL", f"shard exit {rc}: {last_error(out)}"
    rc, out = run([hp, "launch", recipe, "--shard-dir", os.path.join(d, "parts"), "--inputs", ref,
                   "--outputs", os.path.join(d, "out"), "--run-dir", os.path.join(d, "run"),
                   "--threads", "1", "--timeout", "240"] + root, log)
    if rc != 0:
        return "FAIL", f"launch exit {rc}: {last_error(out)}"
    err = max_err(os.path.join(d, "out"), ref)
    if isinstance(err, str) or err > 1e-4:
        return "FAIL", f"outputs differ from torch: {err}"
    return "ok", f"max abs error {err:.2e}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("hp")
    ap.add_argument("work")
    ap.add_argument("--families", default=",".join(zoo.FAMILIES))
    ap.add_argument("--quick", action="store_true", help="single fixes only, dynamic batch only")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    fails = 0
    with open(os.path.join(a.work, "chain.log"), "w") as log:
        for fam in a.families.split(","):
            for dynamic in ([True] if a.quick else [True, False]):
                try:
                    model = zoo.export(fam, a.work, dynamic, BATCH)
                except Exception as e:  # every family exports with Debian's torch: a change
                    print(f"FAIL     {fam:10} export failed in torch: {e!r}"[:200])
                    fails += 1
                    continue
                ref = model[:-5] + ".io"
                # A user passes --seq for a dynamic sequence axis; a static one is in the model.
                seq = zoo.SEQ if dynamic and zoo.FAMILIES[fam][1] == "tokens" else 0
                for fixes in FIXES[:4] if a.quick else FIXES:
                    for nodes in ([2, 4] if len(fixes) < 2 else [4]):
                        outcome, detail = chain(a.hp, a.work, model, ref, fixes, nodes, log, seq)
                        if outcome == "refused" and not fixes and nodes == 2:
                            outcome, detail = "FAIL", "the free plan was refused: " + detail
                        fails += outcome == "FAIL"
                        name = os.path.basename(model)[:-5]
                        print(f"{outcome:8} {name:14} n{nodes} {' '.join(fixes) or '(free)':10} {detail}",
                              flush=True)
    print(f"\n{fails} failing combinations (log: {os.path.join(a.work, 'chain.log')})")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
