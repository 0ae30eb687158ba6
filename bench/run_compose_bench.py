#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# Runs bench/compose_bench (a Release build) and draws what issue #22 asks for: the time of one
# grant + reclaim against the pool's size, of a reclaim that evacuates N MiB of a borrowed
# device's live blocks, and a composer's cost to allocations (as a ratio to no composer, same
# run). Saves the benchmark's JSON, a table on stdout, and a PNG next to the JSON (gnuplot).
#   bench/run_compose_bench.py --build build/release [--out bench-results/compose_bench.json]
import argparse
import json
import os
import shutil
import subprocess
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build/release")
    ap.add_argument("--out", default="bench-results/compose_bench.json")
    args = ap.parse_args()
    exe = os.path.join(args.build, "bench", "compose_bench")
    if not os.access(exe, os.X_OK):
        sys.exit(f"run_compose_bench: {exe} is missing: cmake --build {args.build} --target compose_bench")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    subprocess.run([exe, "--benchmark_format=json", f"--benchmark_out={args.out}", "--benchmark_out_format=json"],
                   check=True, stdout=subprocess.DEVNULL)
    data = json.load(open(args.out))
    rows = {b["name"]: b for b in data["benchmarks"] if b.get("error_occurred") is not True}
    skipped = [b["name"] + ": " + b.get("error_message", "") for b in data["benchmarks"] if b.get("error_occurred")]
    for s in skipped:
        print("skipped " + s)

    def ms(b):
        scale = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[b["time_unit"]]
        return b["real_time"] * scale

    grant = sorted((int(n.split("/")[1]), ms(b)) for n, b in rows.items() if n.startswith("BM_reclaim_grant/"))
    evac = sorted((b["evacuated_MiB_avg"], ms(b), int(n.split("/")[1])) for n, b in rows.items()
                  if n.startswith("BM_reclaim_evacuate/"))
    print(f"machine: {data['context'].get('host_name', '?')}, {data['context'].get('num_cpus', '?')} CPUs, "
          f"load {data['context'].get('load_avg', '?')}")
    print("one reclaim + one grant (no evacuation), by pool size:")
    for n, t in grant:
        print(f"  {n:6d} extents  {t * 1000:10.1f} us")
    print("a reclaim of N extents below what the quota holds, a borrowed device's live blocks evacuated:")
    for moved, t, n in evac:
        print(f"  {n:4d} extents  {moved:6.1f} MiB moved  {t:8.1f} ms   {moved / (t / 1000):8.0f} MiB/s")
    for size in ("64B", "1MiB"):
        pick = lambda arg: next((b for n, b in rows.items() if n.startswith(f"BM_alloc_{size}/{arg}")), None)
        base, with_c = pick(0), pick(1)
        if base and with_c:
            print(f"alloc+free {size}: {base['real_time']:.1f} vs {with_c['real_time']:.1f} {base['time_unit']} "
                  f"with a composer stepping every 10 ms: ratio {with_c['real_time'] / base['real_time']:.3f}")

    if not shutil.which("gnuplot"):
        print("run_compose_bench: gnuplot is missing (bash scripts/install-deps.sh installs it): no plot")
        return
    png = args.out.removesuffix(".json") + ".png"
    dat = args.out.removesuffix(".json") + ".dat"
    with open(dat, "w") as f:
        f.write("# extents  ms (reclaim+grant)\n")
        f.writelines(f"{n} {t}\n" for n, t in grant)
        f.write("\n\n# MiB evacuated  ms\n")
        f.writelines(f"{moved} {t}\n" for moved, t, _ in evac)
    script = [
        "set terminal pngcairo size 1200,500",
        f"set output '{png}'",
        "set multiplot layout 1,2 title 'bench/compose\\_bench (measured, this machine, one run)'",
        "set style data linespoints", "set grid",
        "set logscale x", "set xlabel 'pool size (extents of 1 MiB)'", "set ylabel 'ms'",
        f"plot '{dat}' index 0 using 1:2 lw 2 title 'one reclaim + one grant'",
        "unset logscale x", "set xlabel 'MiB evacuated (measured)'", "set ylabel 'ms'",
        f"plot '{dat}' index 1 using 1:2 lw 2 title 'reclaim with evacuation'",
        "unset multiplot",
    ]
    subprocess.run(["gnuplot"], input="\n".join(script) + "\n", text=True, check=True)
    print(f"saved {png}")


if __name__ == "__main__":
    main()
