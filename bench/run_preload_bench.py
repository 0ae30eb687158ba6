#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# Time and peak RSS of real programs run unmodified under glibc, cxlpool's interposer and
# jemalloc, mimalloc and tcmalloc through LD_PRELOAD, in one run, as ratios to glibc.
# Workloads: a g++ -O2 compile, a python3 workload, sort of a 100 MB file. Each is run
# --repeat times per allocator, interleaved; the table shows the median time and the largest
# peak RSS (wait4 rusage: the program and the children it waited for).
#   bench/run_preload_bench.py --preload build/release/lib/libcxlpool_preload.so [--repeat 3]
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

LIBDIR = "/usr/lib/x86_64-linux-gnu"
ALLOCATORS = [("glibc", None), ("cxlpool", "PRELOAD"), ("jemalloc", f"{LIBDIR}/libjemalloc.so.2"),
              ("mimalloc", f"{LIBDIR}/libmimalloc.so.2"), ("tcmalloc", f"{LIBDIR}/libtcmalloc_minimal.so.4")]


def measure(cmd, preload, stdout_path):
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD" and not k.startswith("CXLPOOL_")}
    if preload:
        env["LD_PRELOAD"] = preload
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        fd = os.open(stdout_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.execvpe(cmd[0], cmd, env)
    _, status, ru = os.wait4(pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"run_preload_bench: {' '.join(cmd)} failed under {preload or 'glibc'}")
    return wall, ru.ru_maxrss  # KiB


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preload", required=True)
    ap.add_argument("--source", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "alloc_bench.cpp"))
    ap.add_argument("--include", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "include"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default="bench-results/preload_bench.json")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="cxlpool-preload-bench-")
    data = os.path.join(work, "data.txt")
    with open(data, "w") as f:  # ~100 MB of pseudo-random lines
        x = 987654321
        for i in range(2_600_000):
            x = (x * 6364136223846793005 + 1442695040888963407) & 0xFFFFFFFFFFFFFFFF
            f.write(f"{x:020d} {i:08d} {'xyz' * (x % 5)}\n")
    py = ("import collections,json\n"
          "d={}\n"
          "for i in range(600000): d[str(i)]={'k':[i,str(i)*3],'v':i*1.5}\n"
          "c=collections.Counter(len(v['k'][1]) for v in d.values())\n"
          "s=json.dumps(d)\n"
          "print(len(s), sorted(c.items())[:3])\n")
    workloads = [
        ("g++ -O2 compile", ["g++", "-O2", "-std=c++20", "-DCXLPOOL_BENCH_BUILD_TYPE=\"Release\"", "-I", a.include, "-c", a.source, "-o", os.path.join(work, "x.o")]),
        ("python3 workload", ["/usr/bin/python3", "-c", py]),
        ("sort 100 MB", ["sort", data]),
    ]
    preload = os.path.abspath(a.preload)
    results = {w: {name: [] for name, _ in ALLOCATORS} for w, _ in workloads}
    for rep in range(a.repeat):
        for wname, cmd in workloads:
            for name, lib in ALLOCATORS:
                lib = preload if lib == "PRELOAD" else lib
                results[wname][name].append(measure(cmd, lib, os.path.join(work, "out.txt")))
        print(f"round {rep + 1} of {a.repeat} done", flush=True)
    print("\nmedian wall time (s) and peak RSS (MiB); ratios to glibc in parentheses")
    names = [n for n, _ in ALLOCATORS]
    print("workload".ljust(20) + "".join(n.rjust(22) for n in names))
    summary = {}
    for wname, _ in workloads:
        base_t = statistics.median(t for t, _ in results[wname]["glibc"])
        base_r = max(r for _, r in results[wname]["glibc"])
        row_t, row_r = wname.ljust(20), "  peak RSS".ljust(20)
        summary[wname] = {}
        for n in names:
            t = statistics.median(x for x, _ in results[wname][n])
            r = max(y for _, y in results[wname][n])
            summary[wname][n] = {"time_s": t, "time_ratio": t / base_t, "rss_kib": r, "rss_ratio": r / base_r}
            row_t += f"{t:10.2f} ({t / base_t:5.2f}x)".rjust(22)
            row_r += f"{r / 1024:10.1f} ({r / base_r:5.2f}x)".rjust(22)
        print(row_t)
        print(row_r)
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out, "w") as f:
        json.dump({"summary": summary, "raw": results}, f, indent=1)
    print(f"\nsaved {a.out}")


if __name__ == "__main__":
    main()
