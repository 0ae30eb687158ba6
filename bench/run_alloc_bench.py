#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# Runs bench/alloc_bench once per allocator in the same session: glibc, jemalloc, mimalloc and
# tcmalloc (through LD_PRELOAD of their Debian libraries), memkind (its API), cxlpool on the
# near tier and on an emulated far device, and cxlpool under every placement policy (hot path
# and shuffled workload only). Prints ns/op per workload, the ratio of cxlpool to each peer,
# each policy's ratio to bind and to mimalloc, the peak RSS of each allocator's process, and
# saves everything as one JSON file.
#   bench/run_alloc_bench.py --build build/release [--out bench-results/alloc.json] [--min-time 1]
import argparse
import datetime
import json
import os
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
# Pools over node0 and the emulated far device "cxlfar"; the hot path and the shuffled free.
POLICIES = [
    "bind:near",
    "preferred:node0,cxlfar",
    "threshold:size=1M,tier=far",
    "spill:near=node0,far=cxlfar,watermark=90%",
    "ratio:node0=1,cxlfar=1",
    "interleave:node0=1,cxlfar=1",
    "hint:cold=cxlfar|bind:near",
]
POLICY_FILTER = "hot_64B|shuffled"


def run_measured(binary, allocator, preload, min_time, extra=()):
    """One alloc_bench process; its JSON plus its own peak RSS (from wait4)."""
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    if preload:
        path = os.path.join(LIBDIR, preload)
        if not os.path.exists(path):
            sys.exit(f"run_alloc_bench: {path} is missing (bash scripts/install-deps.sh installs the peers)")
        env["LD_PRELOAD"] = path
    out_r, out_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.dup2(out_w, 1)
        os.close(out_r)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        os.execve(binary, [binary, f"--allocator={allocator}", "--benchmark_format=json",
                           f"--benchmark_min_time={min_time}", *extra], env)
    os.close(out_w)
    chunks = []
    while True:
        b = os.read(out_r, 1 << 16)
        if not b:
            break
        chunks.append(b)
    os.close(out_r)
    _, status, usage = os.wait4(pid, 0)
    if status != 0:
        sys.exit(f"run_alloc_bench: {allocator} {' '.join(extra)} ({preload or 'no preload'}) failed (status {status})")
    doc = json.loads(b"".join(chunks))
    doc["peak_rss_kib"] = usage.ru_maxrss
    return doc


def ns_of(doc):
    return {b["name"].split("/")[0].removeprefix("BM_"): 1e9 / b["items_per_second"]
            for b in doc["benchmarks"] if b.get("items_per_second")}


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
        doc = run_measured(binary, allocator, preload, a.min_time)
        results[label] = doc
        for b in doc["benchmarks"]:
            name = b["name"].split("/")[0].removeprefix("BM_")
            if name not in order:
                order.append(name)
    policy_results = {}
    for policy in POLICIES:
        print(f"running cxlpool {policy} ...", flush=True)
        policy_results[policy] = run_measured(binary, "cxlpool", None, a.min_time,
                                              (f"--policy={policy}", f"--benchmark_filter={POLICY_FILTER}"))
    ns = {label: ns_of(doc) for label, doc in results.items()}
    pns = {policy: ns_of(doc) for policy, doc in policy_results.items()}
    labels = [p[0] for p in PEERS]
    width = max(len(w) for w in order) + 2
    print("\nns per operation (lower is better); one process per allocator, same machine, same run")
    print("workload".ljust(width) + "".join(l.rjust(14) for l in labels))
    for w in order:
        print(w.ljust(width) + "".join(f"{ns[l].get(w, float('nan')):14.1f}" for l in labels))
    print("peak RSS MiB".ljust(width) +
          "".join(f"{results[l]['peak_rss_kib'] / 1024:14.1f}" for l in labels))
    for mine in ("cxlpool-near", "cxlpool-far"):
        print(f"\n{mine} time / peer time (below 1.00: cxlpool faster)")
        peers = [l for l in labels if not l.startswith("cxlpool")]
        print("workload".ljust(width) + "".join(p.rjust(12) for p in peers))
        for w in order:
            print(w.ljust(width) + "".join(f"{ns[mine][w] / ns[p][w]:12.2f}" for p in peers))
        print("peak RSS".ljust(width) + "".join(
            f"{results[mine]['peak_rss_kib'] / results[p]['peak_rss_kib']:12.2f}" for p in peers))
    pw = max(len(p) for p in POLICIES) + 2
    print("\npolicies: ns per operation (pool over node0 + cxlfar), and ratios to bind:near and to mimalloc")
    print("policy".ljust(pw) + "".join(f"{w:>12}{'/bind':>8}{'/mimalloc':>10}" for w in ("hot_64B", "shuffled_1M_16_512B")))
    bind = pns["bind:near"]
    for policy in POLICIES:
        row = policy.ljust(pw)
        for w in ("hot_64B", "shuffled_1M_16_512B"):
            v = pns[policy][w]
            row += f"{v:12.1f}{v / bind[w]:8.2f}{v / ns['mimalloc'][w]:10.2f}"
        print(row)
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out, "w") as f:
        json.dump({"date": datetime.datetime.now(datetime.timezone.utc).isoformat(), "ns_per_op": ns,
                   "policy_ns_per_op": pns,
                   "peak_rss_kib": {l: results[l]["peak_rss_kib"] for l in labels},
                   "raw": results, "raw_policies": policy_results}, f, indent=1)
    print(f"\nsaved {a.out}")


if __name__ == "__main__":
    main()
