#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# Runs bench/alloc_bench once per allocator in the same session: glibc, jemalloc, mimalloc and
# tcmalloc (through LD_PRELOAD of their Debian libraries), memkind (its API), cxlpool on the
# near tier and on an emulated far device, and cxlpool under every placement policy (hot path
# and shuffled workload only). Prints ns/op per workload, the ratio of cxlpool to each peer,
# each policy's ratio to bind and to mimalloc, the peak RSS of each allocator's process, the
# ratio of cxlpool to the best peer per workload, and the threads-scaling rows (1..2,000
# threads, short- and long-lived, one process per row so its peak RSS is its own). Saves
# everything as one JSON file and a PNG plot next to it (ns/op per workload per allocator; peak
# RSS vs threads), drawn with gnuplot.
#   bench/run_alloc_bench.py --build build/release [--out bench-results/alloc.json] [--min-time 1]
#                            [--only-threads]
import argparse
import datetime
import json
import math
import os
import shutil
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
THREAD_COUNTS = [1, 8, 64, 500, 2000]
THREAD_KINDS = ["short", "long"]


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


def run_threads(binary, labels):
    """threads_short/N and threads_long/N, one process each: time per operation, the process's
    peak RSS, NULL mallocs and threads that failed to start."""
    rows = {}
    for label, allocator, preload in PEERS:
        if label not in labels:
            continue
        print(f"running {label} threads rows ...", flush=True)
        for kind in THREAD_KINDS:
            for n in THREAD_COUNTS:
                doc = run_measured(binary, allocator, preload, "0.05",
                                   (f"--benchmark_filter=^BM_threads_{kind}/{n}/",))
                b = doc["benchmarks"][0]
                rows.setdefault(label, {})[f"{kind}/{n}"] = {
                    "ns_per_op": 1e9 / b["items_per_second"],
                    "peak_rss_kib": doc["peak_rss_kib"],
                    "null_mallocs": int(b.get("null_mallocs", 0)),
                    "failed_thread_starts": int(b.get("failed_thread_starts", 0)),
                    "peak_threads_alive": int(b.get("peak_threads_alive", 0)),
                }
    return rows


def print_threads(rows, labels):
    print("\nthreads: N threads at once, each keeping up to 64 blocks of 1 B-64 KiB through 1,000 replacements;")
    print("short: each frees its blocks as it exits; long: all hold theirs until every thread is done")
    print("peak RSS MiB (the process's own, one process per row); ns per malloc+free in brackets")
    print("row".ljust(12) + "".join(l.rjust(20) for l in labels))
    for kind in THREAD_KINDS:
        for n in THREAD_COUNTS:
            key = f"{kind}/{n}"
            cells = []
            for l in labels:
                r = rows[l][key]
                bad = ""
                if r["null_mallocs"] or r["failed_thread_starts"]:
                    bad = f" NULL {r['null_mallocs']} nostart {r['failed_thread_starts']}"
                cells.append(f"{r['peak_rss_kib'] / 1024:8.1f} ({r['ns_per_op']:6.0f}){bad}".rjust(20))
            print(key.ljust(12) + "".join(cells))
    peers = [l for l in labels if not l.startswith("cxlpool")]
    print("\ncxlpool-near peak RSS / peer peak RSS, and / the best peer's")
    print("row".ljust(12) + "".join(p.rjust(11) for p in peers) + "best".rjust(11))
    for kind in THREAD_KINDS:
        for n in THREAD_COUNTS:
            key = f"{kind}/{n}"
            mine = rows["cxlpool-near"][key]["peak_rss_kib"]
            vals = [rows[p][key]["peak_rss_kib"] for p in peers]
            print(key.ljust(12) + "".join(f"{mine / v:11.2f}" for v in vals) + f"{mine / min(vals):11.2f}")
    # A short-lived storm's peak RSS follows how many threads overlap, not how many were made.
    print("\nshort-lived rows: most threads alive at once")
    print("row".ljust(12) + "".join(l.rjust(14) for l in labels))
    for n in THREAD_COUNTS:
        key = f"short/{n}"
        print(key.ljust(12) + "".join(str(rows[l][key]["peak_threads_alive"]).rjust(14) for l in labels))


def plot(png, order, ns, labels, trows):
    """Two panels with gnuplot: ns/op per workload per allocator (log scale), peak RSS vs threads."""
    if not shutil.which("gnuplot"):
        print("run_alloc_bench: gnuplot is missing (bash scripts/install-deps.sh installs it): no plot")
        return
    dat = png.removesuffix(".png") + ".dat"
    with open(dat, "w") as f:
        f.write("# workload " + " ".join(labels) + "\n")
        for w in order:
            f.write(w + " " + " ".join(f"{ns[l].get(w, math.nan):.6g}" for l in labels) + "\n")
        f.write("\n\n")
        for kind in THREAD_KINDS:
            for l in labels:
                if l not in trows:
                    continue
                f.write(f"# {kind} {l}\n")
                for n in THREAD_COUNTS:
                    f.write(f"{n} {trows[l][f'{kind}/{n}']['peak_rss_kib'] / 1024:.3f}\n")
                f.write("\n\n")
    script = [
        "set terminal pngcairo size 1400,1000",
        f"set output '{png}'",
        "set multiplot layout 2,1 title 'bench/alloc_bench (measured, this machine, one run)' noenhanced",
        "set style data histogram", "set style histogram clustered gap 1", "set style fill solid 0.8 border -1",
        "set logscale y", "set ylabel 'ns per operation (log)'", "set xtics noenhanced", "set key noenhanced outside right",
        "plot " + ", ".join(f"'{dat}' index 0 using {i + 2}:xtic(1) title '{l}'" for i, l in enumerate(labels)),
        "unset style", "set style data linespoints", "set logscale xy", "set xlabel 'threads'",
        "set ylabel 'peak RSS MiB (log)'", "set xtics (1, 8, 64, 500, 2000)",
    ]
    series, idx = [], 1
    for kind in THREAD_KINDS:
        for i, l in enumerate(labels):
            if l not in trows:
                continue
            series.append(f"'{dat}' index {idx} using 1:2 lw 2 lc {i + 1} dt {1 if kind == 'short' else 2} "
                          f"title '{l} {kind}'")
            idx += 1
    script.append("plot " + ", ".join(series))
    script.append("unset multiplot")
    subprocess.run(["gnuplot"], input="\n".join(script) + "\n", text=True, check=True)
    print(f"saved {png}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build/release")
    ap.add_argument("--out", default="bench-results/alloc_bench.json")
    ap.add_argument("--min-time", default="1")
    ap.add_argument("--only-threads", action="store_true", help="only the threads-scaling rows")
    a = ap.parse_args()
    binary = os.path.join(a.build, "bench", "alloc_bench")
    labels = [p[0] for p in PEERS]
    if a.only_threads:
        trows = run_threads(binary, labels)
        print_threads(trows, labels)
        os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
        with open(a.out, "w") as f:
            json.dump({"date": datetime.datetime.now(datetime.timezone.utc).isoformat(), "threads": trows}, f, indent=1)
        print(f"\nsaved {a.out}")
        return
    results, order = {}, []
    for label, allocator, preload in PEERS:
        print(f"running {label} ...", flush=True)
        doc = run_measured(binary, allocator, preload, a.min_time, ("--benchmark_filter=-threads_",))
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
    trows = run_threads(binary, labels)
    ns = {label: ns_of(doc) for label, doc in results.items()}
    pns = {policy: ns_of(doc) for policy, doc in policy_results.items()}
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
    peers = [l for l in labels if not l.startswith("cxlpool")]
    print("\ncxlpool-near / the best peer of each workload (below 1.00: cxlpool faster)")
    for w in order:
        best = min(peers, key=lambda p: ns[p].get(w, math.inf))
        print(f"{w.ljust(width)}{ns['cxlpool-near'][w] / ns[best][w]:8.2f}  (best: {best}, {ns[best][w]:.1f} ns)")
    print_threads(trows, labels)
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
                   "peak_rss_kib": {l: results[l]["peak_rss_kib"] for l in labels}, "threads": trows,
                   "raw": results, "raw_policies": policy_results}, f, indent=1)
    print(f"\nsaved {a.out}")
    plot(a.out.removesuffix(".json") + ".png", order, ns, labels, trows)


if __name__ == "__main__":
    main()
