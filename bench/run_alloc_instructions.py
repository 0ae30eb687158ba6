#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# Instructions, and callgrind's simulated first-level and last-level data-cache misses, per
# malloc+free pair of two of alloc_bench's workloads (bench/alloc_instructions.c: hot 64 B,
# and 16-512 B blocks freed in a shuffled order), for glibc, jemalloc, mimalloc and tcmalloc
# (LD_PRELOAD), cxlpool near and far, and cxlpool under every placement policy. Each figure is
# the difference between a run of N and one of 2N, so start-up and warm-up cancel out; the
# harness (the loop, its calls, the shuffled order) is in every column alike. Unlike
# nanoseconds these counts do not move with the machine's load or speed, so they compare
# commits and allocators on a busy machine too; they are not the whole cost (no real cache,
# no mispredicted branches). Prints the tables with ratios to mimalloc and saves JSON.
#
#   python3 bench/run_alloc_instructions.py --build build/release [--pairs 100000] [--out F]
import argparse
import datetime
import json
import os
import re
import shutil
import subprocess
import sys

from run_alloc_bench import LIBDIR, POLICIES  # the same peers' libraries and policies as the timed bench

PEERS = [  # (label, alloc_instructions arguments after the workload, LD_PRELOAD library)
    ("glibc", ["system"], None),
    ("jemalloc", ["system"], "libjemalloc.so.2"),
    ("mimalloc", ["system"], "libmimalloc.so.2"),
    ("tcmalloc", ["system"], "libtcmalloc_minimal.so.4"),
    ("cxlpool-near", ["cxlpool-near"], None),
    ("cxlpool-far", ["cxlpool-far"], None),
]
WORKLOADS = {"hot": 1, "shuffled": 2}  # pairs per unit of N
EVENTS = {"instructions": r"I\s+refs:\s*([0-9,]+)", "d1_misses": r"D1\s+misses:\s*([0-9,]+)",
          "ll_misses": r"LLd\s+misses:\s*([0-9,]+)"}


def counts(binary, workload, args, preload, n):
    """callgrind's totals for one whole run."""
    env = dict(os.environ)
    for k in ("LD_PRELOAD", "CXLPOOL_DEVICES", "CXLPOOL_CONFIG", "CXLPOOL_POLICY", "CXLPOOL_TIERING",
              "CXLPOOL_STATS"):
        env.pop(k, None)
    if preload:
        path = os.path.join(LIBDIR, preload)
        if not os.path.exists(path):
            sys.exit(f"run_alloc_instructions: {path} is missing (bash scripts/install-deps.sh installs the peers)")
        env["LD_PRELOAD"] = path
    cmd = ["valgrind", "--tool=callgrind", "--cache-sim=yes", "--callgrind-out-file=/dev/null", binary, workload,
           args[0], str(n), *args[1:]]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    out = {}
    for name, pattern in EVENTS.items():
        m = re.search(pattern, r.stderr)
        if m:
            out[name] = int(m.group(1).replace(",", ""))
    if r.returncode != 0 or len(out) != len(EVENTS):
        sys.exit(f"run_alloc_instructions: {' '.join(cmd)} failed (exit {r.returncode}):\n{r.stderr[-2000:]}")
    return out


def per_pair(binary, workload, args, preload, n):
    one, two = counts(binary, workload, args, preload, n), counts(binary, workload, args, preload, 2 * n)
    pairs = n * WORKLOADS[workload]
    # round() + 0.0: a difference of a few misses either way prints as 0.00, not -0.00
    return {k: round((two[k] - one[k]) / pairs, 3) + 0.0 for k in EVENTS}


def main():
    ap = argparse.ArgumentParser(description="instructions and simulated cache misses per malloc+free pair")
    ap.add_argument("--build", required=True, help="a Release build tree (scripts/build-release.sh)")
    ap.add_argument("--pairs", type=int, default=100000, help="N (default 100000)")
    ap.add_argument("--out", default="bench-results/alloc_instructions.json")
    a = ap.parse_args()
    if a.pairs <= 0:
        sys.exit("run_alloc_instructions: --pairs must be positive")
    if not shutil.which("valgrind"):
        sys.exit("run_alloc_instructions: valgrind is missing (bash scripts/install-deps.sh installs it)")
    binary = os.path.join(a.build, "bench", "alloc_instructions")
    if not os.access(binary, os.X_OK):
        sys.exit(f"run_alloc_instructions: {binary} is missing (build the Release tree first)")
    rows = {}
    for workload in WORKLOADS:
        rows[workload] = {}
        for label, args, preload in PEERS:
            rows[workload][label] = per_pair(binary, workload, args, preload, a.pairs)
        for policy in POLICIES:
            rows[workload][f"cxlpool {policy}"] = per_pair(binary, workload, ["cxlpool", policy], None, a.pairs)
    width = max(len(k) for k in rows["hot"]) + 2
    for workload, table in rows.items():
        print(f"\n{workload}: per malloc+free pair (callgrind, N={a.pairs}: the run of 2N minus the run of N)")
        print("allocator".ljust(width) + f"{'instr':>8}{'/mimalloc':>10}{'/bind':>7}{'D1 miss':>9}{'LL miss':>9}")
        base, bind = table["mimalloc"], table["cxlpool bind:near"]
        for k, v in table.items():
            ratio_bind = f"{v['instructions'] / bind['instructions']:7.2f}" if k.startswith("cxlpool ") else " " * 7
            print(k.ljust(width) + f"{v['instructions']:8.1f}{v['instructions'] / base['instructions']:10.2f}"
                  + ratio_bind + f"{v['d1_misses']:9.2f}{v['ll_misses']:9.2f}")
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out, "w") as f:
        json.dump({"date": datetime.datetime.now(datetime.timezone.utc).isoformat(), "n": a.pairs,
                   "per_pair": rows}, f, indent=1)
    print(f"\nsaved {a.out}")


if __name__ == "__main__":
    main()
