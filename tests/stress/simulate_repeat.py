#!/usr/bin/env python3
"""Repeated `hp verify RECIPE --simulate` runs must agree exactly and pass.

All ranks of a simulated run share one process and one cpu backend, so state shared between rank
threads (the backend's cached oneDNN primitives and their scratchpads, the in-process transport, the
executor's pools) races if it is not made per thread. Such races show as outputs that differ from
run to run (a wrong answer on some runs only), so one run proves little: this test runs each recipe
many times and requires every run to pass and to report the same errors, bit for bit.

Usage: simulate_repeat.py HP RUNS RECIPE...
"""
import json
import subprocess
import sys


def outputs_of(hp, recipe):
    p = subprocess.run([hp, "verify", recipe, "--simulate", "--json"], capture_output=True, text=True, timeout=120)
    try:
        j = json.loads(p.stdout)
    except json.JSONDecodeError:
        return None, f"exit {p.returncode}, no JSON: {p.stderr.strip()[:300]}"
    run = j.get("run", {})
    if p.returncode != 0 or not j.get("ok") or not run.get("ran"):
        return None, f"exit {p.returncode}: {json.dumps(run)[:300]} {p.stderr.strip()[:300]}"
    # Timings differ between runs; the comparison must not.
    return [(o["name"], o["max_abs"], o["max_rel"], o["bad"]) for o in run["outputs"]], ""


def main():
    hp, runs, recipes = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    failed = 0
    for recipe in recipes:
        seen = {}
        for k in range(runs):
            got, why = outputs_of(hp, recipe)
            key = json.dumps(got) if got is not None else "failed: " + why
            seen.setdefault(key, []).append(k)
        if len(seen) == 1 and not next(iter(seen)).startswith("failed"):
            print(f"ok: {recipe}: {runs} runs agree: {next(iter(seen))}")
            continue
        failed += 1
        print(f"FAIL: {recipe}: {len(seen)} different result(s) over {runs} runs")
        for key, which in seen.items():
            print(f"  runs {which[:10]}{'...' if len(which) > 10 else ''}: {key}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
