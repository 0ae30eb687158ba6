#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# Instructions per hot 64 B malloc+free pair (bench/hot_instructions.c) under callgrind, for
# glibc, jemalloc, mimalloc and tcmalloc (LD_PRELOAD), cxlpool near and far, and cxlpool under
# every placement policy: each is the difference between a run of N pairs and one of 2N, so
# start-up and the warm-up cancel out. Unlike nanoseconds, the count does not move with the
# machine's load or speed (it is not the whole cost: cache misses and branch mispredictions are
# not in it), so it compares commits and allocators on a busy machine too. Prints the table
# with ratios to mimalloc and saves JSON.
#
#   python3 bench/run_hot_instructions.py --build build/release [--pairs 100000] [--out F]
import argparse
import datetime
import json
import os
import re
import shutil
import subprocess
import sys

LIBDIR = "/usr/lib/x86_64-linux-gnu"
PEERS = [  # (label, hot_instructions arguments, LD_PRELOAD library)
    ("glibc", ["system"], None),
    ("jemalloc", ["system"], "libjemalloc.so.2"),
    ("mimalloc", ["system"], "libmimalloc.so.2"),
    ("tcmalloc", ["system"], "libtcmalloc_minimal.so.4"),
    ("cxlpool-near", ["cxlpool-near"], None),
    ("cxlpool-far", ["cxlpool-far"], None),
]
POLICIES = [  # as bench/run_alloc_bench.py: pools over node0 and the emulated far device
    "bind:near",
    "preferred:node0,cxlfar",
    "threshold:size=1M,tier=far",
    "spill:near=node0,far=cxlfar,watermark=90%",
    "ratio:node0=1,cxlfar=1",
    "interleave:node0=1,cxlfar=1",
    "hint:cold=cxlfar|bind:near",
]


def instructions(binary, args, preload, pairs):
    """Instructions callgrind counted for the whole run of `pairs` pairs."""
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    for k in ("CXLPOOL_DEVICES", "CXLPOOL_CONFIG", "CXLPOOL_POLICY", "CXLPOOL_TIERING", "CXLPOOL_STATS"):
        env.pop(k, None)
    if preload:
        path = os.path.join(LIBDIR, preload)
        if not os.path.exists(path):
            sys.exit(f"run_hot_instructions: {path} is missing (bash scripts/install-deps.sh installs the peers)")
        env["LD_PRELOAD"] = path
    cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", binary, args[0], str(pairs), *args[1:]]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    m = re.search(r"Collected\s*:\s*([0-9,]+)", r.stderr) or re.search(r"I\s+refs:\s*([0-9,]+)", r.stderr)
    if r.returncode != 0 or not m:
        sys.exit(f"run_hot_instructions: {' '.join(cmd)} failed (exit {r.returncode}):\n{r.stderr[-2000:]}")
    return int(m.group(1).replace(",", ""))


def per_pair(binary, args, preload, pairs):
    return (instructions(binary, args, preload, 2 * pairs) - instructions(binary, args, preload, pairs)) / pairs


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--build", required=True, help="a Release build tree (scripts/build-release.sh)")
    ap.add_argument("--pairs", type=int, default=100000)
    ap.add_argument("--out", default="bench-results/hot_instructions.json")
    a = ap.parse_args()
    if a.pairs <= 0:
        sys.exit("run_hot_instructions: --pairs must be positive")
    if not shutil.which("valgrind"):
        sys.exit("run_hot_instructions: valgrind is missing (bash scripts/install-deps.sh installs it)")
    binary = os.path.join(a.build, "bench", "hot_instructions")
    if not os.access(binary, os.X_OK):
        sys.exit(f"run_hot_instructions: {binary} is missing (build the Release tree first)")
    rows = {}
    for label, args, preload in PEERS:
        rows[label] = per_pair(binary, args, preload, a.pairs)
    for policy in POLICIES:
        rows[f"cxlpool {policy}"] = per_pair(binary, ["cxlpool", policy], None, a.pairs)
    width = max(len(k) for k in rows) + 2
    print(f"instructions per 64 B malloc+free pair (callgrind, {a.pairs} pairs: the run of 2N minus the run of N)")
    print("allocator".ljust(width) + f"{'instr':>8}{'/mimalloc':>11}{'/bind':>8}")
    base, bind = rows["mimalloc"], rows["cxlpool bind:near"]
    for k, v in rows.items():
        print(k.ljust(width) + f"{v:8.1f}{v / base:11.2f}" + (f"{v / bind:8.2f}" if k.startswith("cxlpool ") else ""))
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out, "w") as f:
        json.dump({"date": datetime.datetime.now(datetime.timezone.utc).isoformat(), "pairs": a.pairs,
                   "instructions_per_pair": rows}, f, indent=1)
    print(f"\nsaved {a.out}")


if __name__ == "__main__":
    main()
