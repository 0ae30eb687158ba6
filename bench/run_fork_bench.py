#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# Runs bench/fork_bench once per heap kind in the same session and prints fork+exit time for
# 64 MiB and 1 GiB heaps, with each cxlpool heap's ratio to glibc's.
#   bench/run_fork_bench.py --build build/release [--out bench-results/fork_bench.json]
import argparse
import datetime
import json
import os
import subprocess
import sys

HEAPS = ["glibc", "far-cow", "near", "far-copy", "file-copy"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build/release")
    ap.add_argument("--out", default="bench-results/fork_bench.json")
    a = ap.parse_args()
    binary = os.path.join(a.build, "bench", "fork_bench")
    ms = {}
    raw = {}
    for heap in HEAPS:
        print(f"running {heap} ...", flush=True)
        p = subprocess.run([binary, f"--heap={heap}", "--benchmark_format=json"], capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"run_fork_bench: {heap} failed:\n{p.stderr}")
        doc = json.loads(p.stdout)
        raw[heap] = doc
        ms[heap] = {int(b["heap_MiB"]): b["real_time"] for b in doc["benchmarks"]}
    print("\nfork + child exit + wait, ms (lower is better); ratio to glibc")
    print("heap".ljust(12) + "".join(f"{m:>10} MiB{'ratio':>8}" for m in (64, 1024)))
    for heap in HEAPS:
        print(heap.ljust(12) + "".join(f"{ms[heap][m]:14.2f}{ms[heap][m] / ms['glibc'][m]:8.2f}" for m in (64, 1024)))
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out, "w") as f:
        json.dump({"date": datetime.datetime.now(datetime.timezone.utc).isoformat(), "ms": ms, "raw": raw}, f, indent=1)
    print(f"\nsaved {a.out}")


if __name__ == "__main__":
    main()
