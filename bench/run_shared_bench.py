#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# Runs bench/shared_bench in one session and prints, each figure with the command that
# reproduces it: alloc/free throughput of 1, 2 and 4 processes on one cxlpool shared pool and
# on one Boost.Interprocess managed_shared_memory segment of the same size (ratio cxlpool/Boost,
# the 5x-at-2-processes target), publish/acquire on a non-coherent pool vs a coherent one (per
# line and per KiB), handle round trips, dead-participant detection and recovery vs pool size,
# the CPU the watch takes at rest, a breakdown of one alloc+free, and counts of live participants
# wrongly evicted. Medians of --repetitions runs, repetitions interleaved at random across the
# compared configurations; saves everything as one JSON file.
#   bench/run_shared_bench.py --build build [--out build/shared_bench.json] [--repetitions 5]
import argparse
import datetime
import json
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys

GROUPS = {  # name: (filter, extra arguments)
    "throughput": ("^alloc_free/", ["--benchmark_enable_random_interleaving=true"]),
    "micro": ("^(coherence|handle|part)/", ["--benchmark_min_time=0.2", "--benchmark_enable_random_interleaving=true"]),
    "recovery": ("^(recovery|watch)/", []),
    "hazards": ("^hazard/", []),
}
SUFFIX = re.compile(r"/(iterations|repeats|min_time|manual_time|real_time|threads)[^/]*")


def machine():
    model = "unknown"
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    except OSError:
        pass
    return {"cpu_model": model, "cpus": os.cpu_count(), "kernel": platform.release(), "loadavg": os.getloadavg()}


def run_group(binary, group, reps, ops, warmup):
    flt, extra = GROUPS[group]
    args = [binary, f"--benchmark_filter={flt}", f"--benchmark_repetitions={reps}", f"--ops={ops}",
            f"--warmup={warmup}", *extra]
    print(f"running {group}: {' '.join(shlex.quote(a) for a in args)}", flush=True)
    load_before = os.getloadavg()
    p = subprocess.run([*args, "--benchmark_format=json"], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"run_shared_bench: {group} failed (status {p.returncode}):\n{p.stderr}")
    doc = json.loads(p.stdout)
    doc["loadavg_before"], doc["loadavg_after"] = load_before, os.getloadavg()
    errors = [b for b in doc["benchmarks"] if b.get("error_occurred")]
    if errors:
        sys.exit(f"run_shared_bench: {errors[0]['name']}: {errors[0].get('error_message')}")
    return args, doc


def samples(doc):
    """run name -> list of per-repetition entries."""
    out = {}
    for b in doc["benchmarks"]:
        if b.get("run_type") != "iteration":
            continue
        out.setdefault(SUFFIX.sub("", b["run_name"]), []).append(b)
    return out


def med(entries, key):
    vals = [e[key] for e in entries]
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}


def reproduce(args, name, prefix=False):
    """The group's command narrowed to one figure, or to every name starting with name (run from the source
    directory)."""
    flt = f"^{name}" if prefix else f"^{name}(/|$)"
    narrowed = [a if not a.startswith("--benchmark_filter=") else f"--benchmark_filter={flt}" for a in args]
    return " ".join(shlex.quote(a) for a in narrowed if not a.startswith("--benchmark_enable_random"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--out", default=None, help="JSON output (default: BUILD/shared_bench.json)")
    ap.add_argument("--repetitions", type=int, default=5)
    ap.add_argument("--ops", type=int, default=400000, help="timed alloc+free pairs per process")
    ap.add_argument("--warmup", type=int, default=50000, help="untimed pairs per process before the barrier")
    ap.add_argument("--groups", default="throughput,micro,recovery,hazards")
    a = ap.parse_args()
    binary = os.path.join(a.build, "bench", "shared_bench")
    out_path = a.out or os.path.join(a.build, "shared_bench.json")
    if not os.path.exists(binary):
        sys.exit(f"run_shared_bench: {binary} missing (cmake --build {a.build} --target shared_bench)")
    info = machine()
    if info["loadavg"][0] > (info["cpus"] or 1) * 0.5:
        print(f"warning: load average {info['loadavg'][0]:.2f} on {info['cpus']} CPUs: other work shares the "
              "machine; multi-process figures will be noisy", flush=True)
    result = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(), "machine": info,
              "repetitions": a.repetitions, "ops_per_process": a.ops, "warmup_per_process": a.warmup,
              "commands": {}, "figures": {}, "raw": {}}
    runs = {}
    for group in a.groups.split(","):
        args, doc = run_group(binary, group, a.repetitions, a.ops, a.warmup)
        result["commands"][group] = " ".join(shlex.quote(x) for x in args)
        result["raw"][group] = doc
        runs[group] = (args, samples(doc))
    figures = result["figures"]

    if "throughput" in runs:
        args, s = runs["throughput"]
        print(f"\nalloc + write one word + free, ops/s, median of {a.repetitions} (min..max); {a.ops} timed pairs per "
              "process after a warm-up; aggregate = all pairs / (barrier .. last process done)")
        print(f"{'sizes':<16}{'procs':>5}{'cxlpool agg':>14}{'per proc':>11}{'boost agg':>14}{'per proc':>11}"
              f"{'cxlpool/boost':>15}")
        tput = {}
        for sizes in ("256B", "mixed128-4096", "256B-burst512"):
            for procs in (1, 2, 4):
                row = {}
                for impl in ("cxlpool", "boost"):
                    name = f"alloc_free/{impl}/{sizes}/procs:{procs}"
                    e = s[name]
                    row[impl] = {"agg_ops_per_s": med(e, "agg_ops_per_s"),
                                 "per_proc_ops_per_s": med(e, "per_proc_ops_per_s"),
                                 "per_proc_ops_per_cpu_s": med(e, "per_proc_ops_per_cpu_s"),
                                 "cpus_used": med(e, "cpus_used"), "command": reproduce(args, name)}
                ratio = row["cxlpool"]["agg_ops_per_s"]["median"] / row["boost"]["agg_ops_per_s"]["median"]
                row["ratio_cxlpool_to_boost"] = ratio
                tput[f"{sizes}/procs:{procs}"] = row
                c, b = row["cxlpool"], row["boost"]
                print(f"{sizes:<16}{procs:>5}{c['agg_ops_per_s']['median'] / 1e6:>12.2f} M"
                      f"{c['per_proc_ops_per_s']['median'] / 1e6:>9.2f} M{b['agg_ops_per_s']['median'] / 1e6:>12.2f} M"
                      f"{b['per_proc_ops_per_s']['median'] / 1e6:>9.2f} M{ratio:>14.2f}x")
        figures["throughput"] = tput
        print("\nthe same runs per CPU-second each process received (its CPU time, heartbeat thread included: "
              "robust to other work on the machine; a process asleep on a lock is not charged)")
        print(f"{'sizes':<16}{'procs':>5}{'cxlpool':>12}{'cpus':>6}{'boost':>12}{'cpus':>6}{'cxlpool/boost':>15}")
        for key, row in tput.items():
            sizes, procs = key.split("/procs:")
            c, b = row["cxlpool"], row["boost"]
            r = c["per_proc_ops_per_cpu_s"]["median"] / b["per_proc_ops_per_cpu_s"]["median"]
            row["ratio_per_cpu_s"] = r
            print(f"{sizes:<16}{procs:>5}{c['per_proc_ops_per_cpu_s']['median'] / 1e6:>10.2f} M"
                  f"{c['cpus_used']['median']:>6.2f}{b['per_proc_ops_per_cpu_s']['median'] / 1e6:>10.2f} M"
                  f"{b['cpus_used']['median']:>6.2f}{r:>14.2f}x")
        for sizes in ("256B", "mixed128-4096", "256B-burst512"):
            r = tput[f"{sizes}/procs:2"]["ratio_cxlpool_to_boost"]
            print(f"target cxlpool >= 5x Boost at 2 processes, {sizes}: {r:.2f}x -> {'MET' if r >= 5 else 'NOT MET'}")
        print("reproduce one row: " + tput["256B/procs:2"]["cxlpool"]["command"])

    if "micro" in runs:
        args, s = runs["micro"]
        coh = {}
        print("\n(single-process figures below: CPU time of the calling thread, so time the machine's other work "
              "takes from us is not counted)")
        print("\npublish/acquire, ns per call (median); none = CXLPOOL_COHERENCE_NONE pool (clwb/clflushopt + fence), "
              "host = coherent pool (no-op)")
        print("  publish: call on clean lines; publish_dirty: one store per line, then publish; acquire: call alone; "
              "acquire_read: acquire, then one load per line. extra = none - host")
        print(f"{'op':<14}{'bytes':>9}{'none ns':>11}{'host ns':>10}{'extra ns':>11}{'/line':>8}{'/KiB':>9}")
        for op in ("publish", "publish_dirty", "acquire", "acquire_read"):
            for size in (64, 4096, 65536, 1 << 20):
                none = s[f"coherence/{op}/none/{size}B"]
                host = s[f"coherence/{op}/host/{size}B"]
                n, h = med(none, "cpu_time"), med(host, "cpu_time")
                extra = n["median"] - h["median"]
                lines, kib = size / 64, size / 1024
                coh[f"{op}/{size}"] = {"none_ns": n, "host_ns": h, "extra_ns": extra, "extra_ns_per_line": extra / lines,
                                       "extra_ns_per_kib": extra / kib,
                                       "command": reproduce(args, f"coherence/{op}/(none|host)/{size}B")}
                print(f"{op:<14}{size:>9}{n['median']:>11.1f}{h['median']:>10.1f}{extra:>11.1f}"
                      f"{extra / lines:>8.2f}{extra / kib:>9.1f}")
        figures["coherence"] = coh
        print("reproduce: " + reproduce(args, "coherence/", prefix=True))

        hd = {}
        print("\nhandles (two participants of one pool in one process, 256 B block), ns per operation (median)")
        base = med(s["handle/cxlpool/alloc_free"], "cpu_time")["median"]
        for op in ("export", "import_release", "roundtrip", "lifecycle", "alloc_free"):
            m = med(s[f"handle/cxlpool/{op}"], "cpu_time")
            hd[op] = {"ns": m, "command": reproduce(args, f"handle/cxlpool/{op}")}
            print(f"  {op:<36}{m['median']:>9.1f}   ({m['median'] / base:.2f}x alloc+free)")
        m = med(s["handle/boost/offset_roundtrip"], "cpu_time")
        hd["boost_offset_roundtrip"] = {"ns": m, "command": reproduce(args, "handle/boost/offset_roundtrip")}
        print(f"  {'boost offset round trip (no checks)':<36}{m['median']:>9.1f}")
        print("  roundtrip = export + import + release; lifecycle = alloc + export + import + release + free")
        print("reproduce: " + reproduce(args, "handle/", prefix=True))
        figures["handles"] = hd

        parts = {}
        print("\nwhere one cxlpool alloc+free goes (single process, ns per call, median)")
        for p in ("cxlpool_alloc_free_256B", "boost_alloc_free_256B", "cxlpool_alloc_free_256B_none", "getpid_syscall",
                  "clock_monotonic", "std_mutex", "cxlpool_info", "liveness_probe"):
            m = med(s[f"part/{p}"], "cpu_time")
            parts[p] = {"ns": m, "command": reproduce(args, f"part/{p}")}
            print(f"  {p:<32}{m['median']:>10.1f}")
        print("  getpid and clock_monotonic are for scale: the alloc/free path makes neither call (a fork "
              "generation bumped at fork, a coarse clock); liveness_probe is paid per other participant per heartbeat")
        print("reproduce: " + reproduce(args, "part/", prefix=True))
        figures["parts"] = parts

    if "recovery" in runs:
        args, s = runs["recovery"]
        rec = {}
        print(f"\ndead participant: kill(2) -> survivor starts recovery (detect) -> recovered_slots counts it "
              f"(recover), ms, median of {a.repetitions} (min..max)")
        print("  few = 1000 blocks of 256 B; quarter = a quarter of the pool in 256 B blocks; _exported = every block "
              "exported; stall = survivor's own alloc+free during recovery")
        print(f"{'case':<52}{'detect':>18}{'recover':>18}{'total':>10}{'stall':>9}{'extents':>12}")
        names = [n for n in s if n.startswith("recovery/")]
        for name in sorted(names, key=lambda n: (n.split("/")[1], int(n.split("/")[2][:-3]), n)):
            e = s[name]
            d, r, t, st = med(e, "detect_ms"), med(e, "recover_ms"), med(e, "real_time"), med(e, "stall_ms")
            rec[name.removeprefix("recovery/")] = {"detect_ms": d, "recover_ms": r, "total_ms": t, "stall_ms": st,
                                                   "extents_adopted": e[0]["extents_adopted"],
                                                   "extents_total": e[0]["extents_total"],
                                                   "command": reproduce(args, name)}
            print(f"{name.removeprefix('recovery/'):<52}{d['median']:>7.2f} ({d['min']:.1f}..{d['max']:.1f})"
                  f"{r['median']:>7.2f} ({r['min']:.2f}..{r['max']:.2f}){t['median']:>10.2f}{st['max']:>9.2f}"
                  f"{int(e[0]['extents_adopted']):>6}/{int(e[0]['extents_total'])}")
        print("reproduce: " + reproduce(args, "recovery/kill/1024MiB/quarter_exported"))
        figures["recovery"] = rec
        watch = {}
        print("\nthe watch at rest: CPU of n idle participants' heartbeat threads (10 ms heartbeat), % of one CPU")
        for n in (2, 8, 32):
            name = f"watch/idle/participants:{n}"
            m = med(s[name], "cpu_percent")
            watch[n] = {"cpu_percent": m, "command": reproduce(args, name)}
            print(f"  {n:>3} participants {m['median']:>8.1f} %   ({m['median'] / n:.2f} % each)")
        print("reproduce: " + reproduce(args, "watch/", prefix=True))
        figures["watch"] = watch

    if "hazards" in runs:
        args, s = runs["hazards"]
        hz = {}
        print("\nhazards: live participants wrongly evicted (counts summed over the repetitions)")
        for name, what, bad in (("hazard/join_reused_slot", "joins into a slot just left, watcher at 1 ms",
                                 "live_joiners_evicted"),
                                ("hazard/stalled_observer/stop:200ms", "process with 2 participants stopped 200 ms",
                                 "rounds_with_eviction"),
                                ("hazard/stalled_observer/stop:500ms", "process with 2 participants stopped 500 ms",
                                 "rounds_with_eviction")):
            e = s[name]
            rounds, n_bad = sum(x["rounds"] for x in e), sum(x[bad] for x in e)
            other = sum(x["other_failures"] for x in e)
            hz[name.removeprefix("hazard/")] = {"rounds": rounds, "evicted": n_bad, "other_failures": other,
                                                "command": reproduce(args, name)}
            print(f"  {what:<48}{int(n_bad):>6} of {int(rounds):<6} evicted   ({int(other)} other failures)")
        print("  (lease 300 ms; the stopped process's participants judge each other on resuming)")
        print("reproduce: " + reproduce(args, "hazard/", prefix=True))
        figures["hazards"] = hz

    print(f"\nmachine: {info['cpu_model']}, {info['cpus']} CPUs, load average at start {info['loadavg'][0]:.2f}")
    os.makedirs(os.path.dirname(out_path) or ".", exist_ok=True)
    with open(out_path, "w") as f:
        json.dump(result, f, indent=1)
    print(f"saved {out_path}")


if __name__ == "__main__":
    main()
