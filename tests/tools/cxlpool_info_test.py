#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# End-to-end checks of cxlpool-info and of the shared library's exported symbols: the
# acceptance lines of the foundation issue, run on every test run.
import json
import os
import subprocess
import sys

info, fixtures, lib = sys.argv[1], sys.argv[2], sys.argv[3]
failures = 0


def check(cond, what):
    global failures
    print(("ok    " if cond else "FAIL  ") + what)
    if not cond:
        failures += 1


def run(args, env_extra=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("CXLPOOL_")}
    env.update(env_extra or {})
    return subprocess.run([info] + args, env=env, capture_output=True, text=True, timeout=60)


ATTRS = ["capacity_bytes", "free_bytes", "read_latency_ns", "write_latency_ns", "read_bandwidth_mbps",
         "write_bandwidth_mbps", "kernel_tier", "tier", "cpuless"]

# 1. --json on the live machine: valid, every target with its attributes and their sources.
r = run(["--json"])
check(r.returncode == 0, "cxlpool-info --json exits 0")
doc = json.loads(r.stdout)
check(len(doc["targets"]) >= 1, "at least one target")
for t in doc["targets"]:
    for a in ATTRS:
        check(a in t and "value" in t[a] and "source" in t[a], f"{t['name']}.{a} has value and source")
    check(t["tier"]["value"] is not None, f"{t['name']} is ranked")
    check((t["capacity_bytes"]["value"] is None) == (t["capacity_bytes"]["source"] == "unknown"),
          f"{t['name']} capacity source matches presence")
has_far = any(t["cpuless"]["value"] and t["kind"] in ("numa", "dax") for t in doc["targets"])
if not has_far:
    cxl0 = [t for t in doc["targets"] if t["name"] == "cxl0"]
    check(len(cxl0) == 1 and cxl0[0]["kind"] == "emulated", "no CXL hardware: default emulated device cxl0 listed")
    if cxl0:
        c = cxl0[0]
        check(c["read_latency_ns"]["source"] == "default" and c["read_bandwidth_mbps"]["source"] == "default",
              "default device figures are labelled default")
        check(c["capacity_bytes"]["value"] > 0, "default device has a capacity")
        check(c["tier"]["value"] > min(t["tier"]["value"] for t in doc["targets"]), "default device is a slower tier")

# 2. A CPU-less node with HMAT: slower tier than the CPU node, latency/bandwidth from hmat.
tree = os.path.join(fixtures, "cpuless-hmat", "sys")
r = run(["--json", "--sysfs-root", tree])
check(r.returncode == 0, "--sysfs-root cpuless-hmat exits 0")
d = {t["name"]: t for t in json.loads(r.stdout)["targets"]}
check(d["node1"]["cpuless"]["value"] is True, "node1 is CPU-less")
check(d["node1"]["tier"]["value"] > d["node0"]["tier"]["value"], "node1 is in a slower tier than node0")
for a in ["read_latency_ns", "write_latency_ns", "read_bandwidth_mbps", "write_bandwidth_mbps"]:
    check(d["node1"][a]["source"] == "hmat", f"node1 {a} sourced hmat")
check(d["node1"]["kernel_tier"]["value"] == 22, "node1 kernel memory tier reported")
r = run(["--sysfs-root", tree])
check(r.returncode == 0 and "300 ns [hmat]" in r.stdout and "numa_balancing=1" in r.stdout,
      "table shows hmat sources and the numa_balancing warning")

# 3. Bad configuration: non-zero exit, the offending token named.
r = run([], {"CXLPOOL_DEVICES": "cxl0:backing=shm,size=12Q"})
check(r.returncode != 0 and "12Q" in r.stderr, "size=12Q is rejected naming 12Q")
r = run([], {"CXLPOOL_CONFIG": "/nonexistent/cxlpool.conf"})
check(r.returncode != 0 and "/nonexistent/cxlpool.conf" in r.stderr, "unreadable CXLPOOL_CONFIG named")
r = run(["--bogus"])
check(r.returncode == 2 and "--bogus" in r.stderr, "unknown option is a usage error")
r = run(["--devices", "a:backing=numa:99"])
check(r.returncode == 1 and "numa:99" in r.stderr, "missing NUMA node named")

# 4. The shared library exports the C ABI only.
nm = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True, check=True)
syms = [line.split()[-1] for line in nm.stdout.splitlines() if line.strip()]
check(len(syms) > 10 and all(s.startswith("cxlpool_") for s in syms),
      f"nm -D --defined-only lists only cxlpool_* ({len(syms)} symbols)")

print(f"{failures} failed")
sys.exit(1 if failures else 0)
