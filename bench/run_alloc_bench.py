#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# Runs bench/alloc_bench once per allocator in the same session: glibc, jemalloc, mimalloc and
# tcmalloc (through LD_PRELOAD of their Debian libraries), memkind (its API), and cxlpool on
# the near tier and on an emulated far device. Prints ns/op per workload, the ratio of
# cxlpool to each peer, and saves everything as one JSON file.
#   bench/run_alloc_bench.py --build build/release [--out bench-results/alloc.json] [--min-time 1]
import argparse
import datetime
import json
import os
import subprocess
import sys

LIBDIR = "/usr/lib/x86_64-linux-gnu"
PEERS = [  # (label, --allocator, LD_PRELOAD library)
    ("glibc", "system", None),
    ("jemalloc", "system", "libjemalloc.so.2"),
    ("mimalloc", "system", "libmimalloc.so.2"),
    ("tcmalloc", "system", "libtcmalloc_minimal.so.4"),
    ("memkind", "memkind", None),
    ("cxlpool-near", "cxlpool-near", None),
    ("cxlpool-far", "cxlpool-far", None),
]


def run(binary, allocator, preload, min_time):
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    if preload:
        path = os.path.join(LIBDIR, preload)
        if not os.path.exists(path):
            sys.exit(f"run_alloc_bench: {path} is missing (bash scripts/install-deps.sh installs the peers)")
        env["LD_PRELOAD"] = path
    p = subprocess.run([binary, f"--allocator={allocator}", "--benchmark_format=json",
                        f"--benchmark_min_time={min_time}"], env=env, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"run_alloc_bench: {allocator} ({preload or 'no preload'}) failed:\n{p.stderr}")
    return json.loads(p.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build/release")
    ap.add_argument("--out", default="bench-results/alloc_bench.json")
    ap.add_argument("--min-time", default="1")
    a = ap.parse_args()
    binary = os.path.join(a.build, "bench", "alloc_bench")
    results, order = {}, []
    for label, allocator, preload in PEERS:
        print(f"running {label} ...", flush=True)
        doc = run(binary, allocator, preload, a.min_time)
        results[label] = doc
        for b in doc["benchmarks"]:
            name = b["name"].split("/")[0].removeprefix("BM_")
            if name not in order:
                order.append(name)
    ns = {label: {b["name"].split("/")[0].removeprefix("BM_"): 1e9 / b["items_per_second"]
                  for b in doc["benchmarks"] if b.get("items_per_second")}
          for label, doc in results.items()}
    labels = [p[0] for p in PEERS]
    width = max(len(w) for w in order) + 2
    print("\nns per operation (lower is better); one process per allocator, same machine, same run")
    print("workload".ljust(width) + "".join(l.rjust(14) for l in labels))
    for w in order:
        print(w.ljust(width) + "".join(f"{ns[l].get(w, float('nan')):14.1f}" for l in labels))
    for mine in ("cxlpool-near", "cxlpool-far"):
        print(f"\n{mine} time / peer time (below 1.00: cxlpool faster)")
        peers = [l for l in labels if not l.startswith("cxlpool")]
        print("workload".ljust(width) + "".join(p.rjust(12) for p in peers))
        for w in order:
            print(w.ljust(width) + "".join(f"{ns[mine][w] / ns[p][w]:12.2f}" for p in peers))
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out, "w") as f:
        json.dump({"date": datetime.datetime.now(datetime.timezone.utc).isoformat(), "ns_per_op": ns,
                   "raw": results}, f, indent=1)
    print(f"\nsaved {a.out}")


if __name__ == "__main__":
    main()
