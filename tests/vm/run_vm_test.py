#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# Boots one QEMU guest (TCG) with a chosen NUMA/HMAT topology and kernel, runs the guest plan
# (guest-init.sh), and turns the serial console into pass/fail with assertions made here on
# the host. Skips visibly (CXLPOOL-SKIP) when QEMU or the kernel is missing, unless --require.
#
#   run_vm_test.py --topology hmat2 --kernel 6.12 --cache /var/cache/cxlpool-vm \
#                  --initrd build/test/tests/vm/initramfs.cpio.gz --log-dir build/test/tests/vm
import argparse
import json
import os
import re
import sys
import time

from vmlib import Checker, died_before_plan, parse_json, qemu_command, require_runnable, run_guest, sections, skip

# node: (cpus or None, memory); hmat: (target, latency ns, bandwidth) from initiator 0.
TOPOLOGIES = {
    "hmat2": {"nodes": [("0-1", "1G"), (None, "1G")], "dist": {(0, 1): 20},
              "hmat": [(0, 100, "20G"), (1, 300, "5G")]},
    "tier3": {"nodes": [("0-1", "1G"), (None, "1G"), (None, "1G")], "dist": {(0, 1): 20, (0, 2): 30, (1, 2): 30},
              "hmat": [(0, 100, "20G"), (1, 200, "10G"), (2, 500, "2G")]},
    "nohmat2": {"nodes": [("0-1", "1G"), (None, "1G")], "dist": {(0, 1): 20}, "hmat": []},
    # node1's range (the 1 GiB above 4 GiB) marked soft-reserved: dax_hmem makes it /dev/dax0.0.
    "dax2": {"nodes": [("0-1", "2G"), (None, "1G")], "dist": {(0, 1): 20},
             "hmat": [(0, 100, "20G"), (1, 300, "5G")], "append": "memmap=1G%0x100000000-1+0xefffffff"},
    # An emulated CXL type-3 device (vmlib.cxl_command): 512 MiB of persistent memory behind a
    # host bridge and a root port; the guest makes it a region, a devdax namespace, a node.
    # pcie_ports=compat: without it 6.12's cxl_pci fails on event interrupts QEMU 7.2 lacks.
    "cxl": {"ram": "1G", "cxl_size": "512M", "hmat": [], "append": "pcie_ports=compat"},
}


def targets_of(doc):
    return {t["name"]: t for t in doc["targets"]}


def check_hmat2(c, doc, kernel, sec=None):
    t = targets_of(doc)
    n0, n1 = t.get("node0"), t.get("node1")
    c(n0 is not None and n1 is not None, "node0 and node1 are targets")
    if not (n0 and n1):
        return
    c(n0["cpuless"]["value"] is False and n1["cpuless"]["value"] is True, "node1 is CPU-less, node0 has CPUs")
    c(n1["tier"]["value"] > n0["tier"]["value"], "node1 is in a slower cxlpool tier than node0")
    for a in ("read_latency_ns", "read_bandwidth_mbps"):
        c(n0[a]["source"] == "hmat" and n1[a]["source"] == "hmat", f"{a} of both nodes sourced hmat")
    c(n1["read_latency_ns"]["value"] == 300 and n0["read_latency_ns"]["value"] == 100, "HMAT latencies 100 / 300 ns")
    c((n1["read_bandwidth_mbps"]["value"] or 0) * 3 < (n0["read_bandwidth_mbps"]["value"] or 0),
      "node1 bandwidth well below node0's")
    c(n1["kernel_tier"]["source"] == "sysfs", "kernel memory tier of node1 reported")
    c("cxl0" not in t, "no default emulated device: real far memory exists")
    wi = doc["kernel"]["weighted_interleave"]["value"]
    same_kernel_tier = n0["kernel_tier"]["value"] == n1["kernel_tier"]["value"]
    if kernel == "6.12":
        c(wi is True, "6.12: weighted interleave detected")
        c(not same_kernel_tier, "6.12: the kernel puts node1 in a lower memory tier from HMAT")
    else:
        c(wi is False, "6.1: weighted interleave absent")
        c(same_kernel_tier, "6.1: the kernel keeps both nodes in one memory tier (cxlpool still ranks them)")


def check_tier3(c, doc, kernel, sec=None):
    t = targets_of(doc)
    tiers = [t[n]["tier"]["value"] for n in ("node0", "node1", "node2") if n in t]
    c(len(tiers) == 3 and tiers[0] < tiers[1] < tiers[2], f"three nodes in three rising tiers: {tiers}")
    c(doc["tier_count"] >= 3, "tier_count >= 3")
    c(all(t[n]["read_latency_ns"]["source"] == "hmat" for n in ("node0", "node1", "node2") if n in t),
      "latencies sourced hmat")


def check_nohmat2(c, doc, kernel, sec=None):
    t = targets_of(doc)
    n0, n1 = t["node0"], t["node1"]
    c(n1["cpuless"]["value"] is True, "node1 is CPU-less")
    c(n1["tier"]["value"] > n0["tier"]["value"], "node1 ranked slower without HMAT")
    c(n1["abstract_distance"]["basis"] == "slit", "ranking basis is the SLIT distance")
    c(n1["read_latency_ns"]["source"] == "unknown", "no latency is invented")
    # The HMAT assertions must fail here: proof that the guest tests can fail.
    probe = Checker()
    saved = sys.stdout
    sys.stdout = open(os.devnull, "w")
    try:
        check_hmat2(probe, doc, kernel)
    finally:
        sys.stdout.close()
        sys.stdout = saved
    c(probe.failed > 0, f"the HMAT assertions reject this guest ({probe.failed} of {probe.failed + probe.passed} fail)")


def check_dax2(c, doc, kernel, sec):
    daxdoc = parse_json(sec["dax-info-json"][0]) if "dax-info-json" in sec else {"targets": []}
    t = targets_of(daxdoc)
    c("node1" not in t, "before kmem: the soft-reserved range is not a NUMA memory target")
    dax = t.get("dax0.0")
    c(dax is not None and dax["kind"] == "dax", "dax0.0 is a device-DAX target")
    if dax:
        c(dax["capacity_bytes"]["value"] == 1 << 30 and dax["capacity_bytes"]["source"] == "sysfs",
          "dax0.0 capacity 1 GiB from sysfs")
        c(dax["backing"]["kind"] == "devdax" and dax["backing"]["path"] == "/dev/dax0.0" and
          dax["backing"]["page_size"] == 2 << 20, "devdax backing /dev/dax0.0 with 2 MiB pages")
    c("devdax-checks" in sec and sec["devdax-checks"][1] == 0, "devdax backing checks on the real device")
    if "devdax-checks" in sec:
        print("\n".join(l for l in sec["devdax-checks"][0].splitlines() if l.startswith(("ok", "FAIL", "vm_checks"))))
    kmem = parse_json(sec["kmem-info-json"][0]) if "kmem-info-json" in sec else None
    c(kmem is not None, "cxlpool-info after onlining the device with kmem")
    if kmem:
        k = targets_of(kmem)
        n1 = k.get("node1")
        c(n1 is not None and n1["cpuless"]["value"] is True and n1["capacity_bytes"]["value"] > (900 << 20),
          "after kmem: node1 is a CPU-less memory node of about 1 GiB")
        c("dax0.0" not in k, "after kmem: dax0.0 is system RAM, not a devdax target")
        if n1:
            c(n1["tier"]["value"] > k["node0"]["tier"]["value"], "after kmem: node1 ranks in a slower tier")


# Plan cxl: the stack and discovery after each step; the other items run programs on it.
CXL_SECTIONS = {"cxl": ["cxl-modules", "cxl-info-mem", "cxl-region", "cxl-list", "cxl-info-region", "cxl-devdax",
                        "cxl-info-dax", "cxl-sysram", "cxl-info-kmem"],
                "cxl-devdax": ["cxl-devdax-checks"], "cxl-node": ["cxl-checks"], "cxl-tiering": ["cxl-tiering"],
                "cxl-hotremove": ["cxl-hotremove"]}


def cxl_list_facts(text):
    """memdevs and regions from `cxl list -M -D -R -v` (the tree under root0)."""
    memdevs, regions = {}, {}

    def walk(x):
        if isinstance(x, dict):
            m = x.get("memdev")
            if isinstance(m, dict):
                memdevs[m["memdev"]] = m
            if "region" in x and "mappings" in x:
                regions[x["region"]] = x
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)
    walk(parse_json(text))
    return memdevs, regions


def check_cxl(c, sec, plan):
    """The kernel's own CXL stack, step by step: what cxlpool discovers after each step against
    what `cxl list`, ndctl and daxctl say, then the programs' ok/FAIL lines."""
    for s in [s for p in plan for s in CXL_SECTIONS.get(p, [])]:
        c(s in sec and sec[s][1] == 0, f"cxl: guest section {s} exited 0")
    info = {s: parse_json(sec[s][0]) for s in ("cxl-info-mem", "cxl-info-region", "cxl-info-dax", "cxl-info-kmem")
            if s in sec and sec[s][1] == 0}
    if "cxl-list" not in sec or len(info) < 4:
        return
    memdevs, regions = cxl_list_facts(sec["cxl-list"][0])
    c(list(memdevs) == ["mem0"] and list(regions) == ["region0"], f"cxl list: memdevs {list(memdevs)}, "
      f"regions {list(regions)}")
    if "mem0" not in memdevs or "region0" not in regions:
        return
    m, r = memdevs["mem0"], regions["region0"]
    print(f"cxl list: mem0 pmem {m.get('pmem_size')} B, region0 {r['size']} B at {r['resource']:#x}, "
          f"{r['interleave_ways']} way(s), decoders {[x['decoder'] for x in r['mappings']]}")

    before = info["cxl-info-mem"]
    mine = {d["name"]: d for d in before["cxl"]["memdevs"]}
    c(list(mine) == ["mem0"] and mine["mem0"]["pmem_bytes"] == m["pmem_size"] and
      mine["mem0"]["ram_bytes"] == m.get("ram_size", 0) and int(mine["mem0"]["serial"], 16) == m["serial"],
      f"memdev: discovery agrees with cxl list (mem0, {m['pmem_size']} B persistent, serial {m['serial']})")
    c(any("mem0 (512.0 MiB persistent) have no region" in w for w in before["warnings"]),
      "memdev without a region: a warning names it and says 'cxl create-region'")
    c(any(t["name"] == "cxl0" for t in before["targets"]),
      "memdev without a region: nothing usable, the emulated default device stands in")

    region_doc = info["cxl-info-region"]
    regs = {x["name"]: x for x in region_doc["cxl"]["regions"]}
    g = regs.get("region0")
    c(g is not None and g["size_bytes"] == r["size"] and g["interleave_ways"] == r["interleave_ways"] and
      g["targets"] == [x["decoder"] for x in r["mappings"]] and g["mode"] in ("pmem", ""),
      f"region: discovery agrees with cxl list (region0: {g and g['size_bytes']} B, {g and g['interleave_ways']} "
      f"way(s), targets {g and g['targets']}, mode '{g and g['mode']}'; 6.1 has no mode attribute)")
    c(any("CXL region region0" in w and "ndctl create-namespace" in w for w in region_doc["warnings"]),
      "region without a DAX device: a warning names it and says 'ndctl create-namespace'")

    text = sec["cxl-devdax"][0]
    ndctl = json.JSONDecoder().raw_decode(text[text.index("{"):])[0]
    nd_dax = ndctl["daxregion"]["devices"][0]
    dax_doc = info["cxl-info-dax"]
    t = targets_of(dax_doc)
    d = t.get("dax0.0")
    c(d is not None and d["kind"] == "dax" and d["backing"]["path"] == "/dev/dax0.0" and
      d["backing"]["page_size"] == nd_dax["align"], "devdax namespace: /dev/dax0.0 is a device-DAX target with "
      f"ndctl's alignment ({nd_dax['align']})")
    if d:
        c(d["cxl_backed"] == {"value": True, "source": "sysfs"} and d.get("cxl_region") == "region0",
          f"dax0.0 is CXL memory from region0 (cxl_backed {d['cxl_backed']}, region {d.get('cxl_region')})")
        c(d["capacity_bytes"]["value"] > (500 << 20) and d["capacity_bytes"]["source"] == "sysfs",
          f"dax0.0 capacity {d['capacity_bytes']['value']} B from sysfs (ndctl: {nd_dax['size']})")
        c(d["read_latency_ns"]["source"] != "hmat", "no HMAT figure is claimed for the CXL device: "
          f"latency source '{d['read_latency_ns']['source']}'")
    c("cxl0" not in t, "with a usable CXL device, no emulated default")
    if "cxl-devdax-checks" in sec:
        print("\n".join(l for l in sec["cxl-devdax-checks"][0].splitlines() if l.startswith(("ok", "FAIL"))))

    text = sec["cxl-sysram"][0]  # daxctl's JSON, then "reconfigured 1 device"
    daxctl = json.JSONDecoder().raw_decode(text[text.index("["):])[0][0]
    kmem = info["cxl-info-kmem"]
    k = targets_of(kmem)
    n0, n1 = k.get("node0"), k.get("node1")
    c(n1 is not None and daxctl["target_node"] == 1 and daxctl["mode"] == "system-ram",
      f"system RAM: daxctl onlined dax0.0 as node {daxctl['target_node']}; node1 is a target")
    if n0 and n1:
        c(n1["cpuless"]["value"] is True and n1["capacity_bytes"]["value"] == daxctl["online_memblocks"] * (128 << 20),
          f"node1: CPU-less, {n1['capacity_bytes']['value']} B = {daxctl['online_memblocks']} memory blocks of 128 MiB")
        c(n1["cxl_backed"] == {"value": True, "source": "sysfs"} and n1.get("cxl_region") == "region0",
          f"node1 is CXL memory from region0 ({n1['cxl_backed']}, {n1.get('cxl_region')})")
        c(n0["cxl_backed"] == {"value": False, "source": "sysfs"}, "node0 is not CXL memory")
        c(n1["tier"]["value"] > n0["tier"]["value"], "node1 ranks in a slower cxlpool tier than node0")
        c(n1["read_latency_ns"]["source"] == "unknown",
          "node1: no access0 latency in sysfs (QEMU's CDAT gives the node none), and none is invented")
    c("dax0.0" not in k and "cxl0" not in k, "after kmem: dax0.0 is system RAM, no emulated default")
    for s in ("cxl-checks", "cxl-tiering", "cxl-hotremove"):
        if s in sec:
            print(f"---- guest {s} ----")
            print("\n".join(l for l in sec[s][0].splitlines() if l.lstrip().startswith(("ok", "FAIL", "vm_", "cxlpool:",
                                                                                        "writers:", "node1"))))


CHECKS = {"hmat2": check_hmat2, "tier3": check_tier3, "nohmat2": check_nohmat2, "dax2": check_dax2}

# Plan items of the tiering guest and the sections they run (guest-init.sh).
TIERING_SECTIONS = {"rebind": ["rebind"], "tiering": ["tiering-writers", "tiering-full"],
                    "heat": ["tiering-heat-nb0"], "heat-kernel": ["tiering-heat-respect2", "tiering-heat-own2"]}
HOT_PAGES = 4 * 3 * 256  # vm_tiering's hot set: 4 blocks of 3 MiB


def heat_result(text):
    m = re.search(r"heat-result (.*)", text or "")
    if not m:
        return None
    out = {}
    for item in m.group(1).split():
        k, _, v = item.partition("=")
        try:
            out[k] = float(v) if re.fullmatch(r"-?[0-9.]+", v) else v
        except ValueError:
            out[k] = v
    return out


def check_tiering(c, sec, kernel, plan):
    """vm_rebind and vm_tiering print ok/FAIL lines (their exit status says whether all held) and
    the heat runs one heat-result line each; the heat outcome is asserted here."""
    for item in plan:
        for s in TIERING_SECTIONS.get(item, []):
            text = sec.get(s, ("", None))[0]
            keep = ("ok", "FAIL", "kernel:", "engine:", "  t=", "node1", "heat-result", "writers:", "vm_", "---",
                    "pagemap_scan", "  move(")
            print(f"---- guest {s} ----")
            print("\n".join(l for l in text.splitlines() if l.lstrip().startswith(keep) or l.startswith(keep)))
    for mode in [m for item in plan for m in {"heat": ["nb0"], "heat-kernel": ["respect2", "own2"]}.get(item, [])]:
        text = sec.get(f"tiering-heat-{mode}", ("", None))[0]
        r = heat_result(text)
        c(r is not None, f"heat {mode}: the guest reported a heat-result line")
        if not r:
            continue
        c(r["hot_start"] == 0 and r["control_start"] == 0, f"heat {mode}: the hot set and the control started on node1")
        kernel_json = re.search(r'engine: "kernel":(\{.*\})', text)
        kmode = re.search(r'"mode":"(\w+)"', kernel_json.group(1)).group(1) if kernel_json else None
        nb = re.search(r'"numa_balancing":(\d+)', kernel_json.group(1)).group(1) if kernel_json else None
        if mode == "respect2":
            # cxlpool leaves NUMA-to-NUMA moves to the kernel, and says so; the kernel's own doing
            # is reported, not asserted (see docs/tiering.md "In the guest").
            c(kmode == "respect" and nb == "2" and "left to the kernel" in (kernel_json.group(1) if kernel_json else ""),
              f"heat {mode}: the engine's stats say kernel mode respect, numa_balancing=2, moves left to the kernel")
            c(r["engine_moves"] == 0 and r["promoted_pages"] == 0 and r["ptr_info_tier0"] == 0,
              f"heat {mode}: cxlpool moved nothing (moves {r['engine_moves']:.0f}, promoted pages "
              f"{r['promoted_pages']:.0f}, blocks on tier 0 {r['ptr_info_tier0']:.0f})")
            if kernel == "6.12":
                # The test bed's own check: the kernel's tiering does run here (node1 is a lower
                # memory tier on 6.12), so what it leaves alone is its choice, not a dead guest.
                c(r["control_end"] >= 0.5, f"heat {mode}: the kernel promoted plain memory on its own "
                  f"({r['control_end']:.1%} of the default-policy control on node0)")
            print(f"figure heat {mode}: after {r['seconds']:.1f} s the kernel had moved {r['hot_end']:.1%} of "
                  f"cxlpool's hot set, {r['control_end']:.1%} of the plain-memory control and "
                  f"{r['bound_control_end']:.1%} of the MPOL_BIND control to node0; cold blocks on node0 "
                  f"{r['cold_end']:.1%}")
        else:
            want = "own" if mode == "own2" else "respect"
            c(kmode == want and nb == str(r["numa_balancing"]).split(".")[0],
              f"heat {mode}: the engine's stats say kernel mode {want}, numa_balancing={r['numa_balancing']:.0f}")
            c(r["hot_end"] == 1.0 and r["converged_s"] > 0,
              f"heat {mode}: the engine ({r['monitor']}) moved the whole hot set to node0 (move_pages), "
              f"first complete after {r['converged_s']:.2f} s")
            c(r["cold_end"] == 0, f"heat {mode}: no cold page moved to node0 ({r['cold_end']:.1%})")
            c(r["promoted_pages"] >= HOT_PAGES and r["agree"] == 24,
              f"heat {mode}: the engine counts {r['promoted_pages']:.0f} promoted pages (>= {HOT_PAGES}); ptr_info "
              f"and move_pages agree on all 24 blocks")
            print(f"figure heat {mode}: hot set on node0 {r['hot_start']:.0%} -> {r['hot_end']:.0%} "
                  f"(complete at {r['converged_s']:.2f} s), cold {r['cold_end']:.0%}, plain-memory control "
                  f"{r['control_end']:.0%} (the kernel's doing)")


def check_rxe(c, sec):
    # The KV handoff of libcxlpool_ucx between two processes over UCX's verbs transport on a
    # Soft-RoCE device (rdma_rxe): correctness only (TCG, software RDMA).
    setup, kv = sec.get("rxe-setup", ("", 1))[0], sec.get("rxe-kv", ("", 1))[0]
    c("rxe0" in setup and "uverbs" in setup, "rxe: rdma_rxe loaded, rxe0 on the veth, a verbs device in /dev/infiniband")
    m = re.search(r"connected (.*)", kv)
    path = m.group(1) if m else ""
    print(f"rxe: the connection's path: {path or '(none)'}")
    c("rc_verbs/rxe0:1" in path and "tcp" not in path.split("(")[0],
      "rxe: the blocks go over rc_verbs on rxe0 (UCX lanes), not tcp")
    m = re.search(r"pair: (\d+) handoffs, (\d+) bad", kv)
    c(m is not None and int(m.group(1)) == 51 and int(m.group(2)) == 0,
      f"rxe: 51 handoffs (1..400 tokens and one of 2048) over verbs, every checksum equal ({m.group(0) if m else kv[-300:]})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--topology", required=True, choices=sorted(TOPOLOGIES))
    ap.add_argument("--kernel", required=True, choices=["6.1", "6.12"])
    ap.add_argument("--cache", required=True)
    ap.add_argument("--initrd", required=True)
    ap.add_argument("--log-dir", required=True)
    ap.add_argument("--plan", default="checks")
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--require", action="store_true", help="a skip is a failure")
    ap.add_argument("--label", default="", help="added to the log names (a second test on the same guest)")
    a = ap.parse_args()

    kernel = os.path.join(a.cache, f"vmlinuz-{a.kernel}")
    require_runnable(a.require, kernel, a.initrd)
    if a.topology == "cxl" and not all(os.path.exists(f"/usr/bin/{t}") for t in ("cxl", "ndctl", "daxctl")):
        skip(a.require, "the CXL guest needs Debian's cxl, ndctl and daxctl in its initramfs "
                        "(bash scripts/install-deps.sh installs ndctl and daxctl; then rebuild the initramfs)")

    name = f"{a.topology}-{a.kernel}" + (f"-{a.label}" if a.label else "")
    os.makedirs(a.log_dir, exist_ok=True)
    log_path = os.path.join(a.log_dir, f"{name}.log")
    spec = dict(TOPOLOGIES[a.topology])
    if "cxl_size" in spec:
        files = [os.path.join(a.log_dir, f"{name}-{f}.raw") for f in ("cxl-mem0", "cxl-lsa0")]
        spec["cxl"] = (files[0], files[1], spec["cxl_size"])
    cmd = qemu_command(spec, kernel, a.initrd, f"cxlpool.plan={a.plan}")
    # A guest that dies in early boot (vmlib.died_before_plan) or hangs there (no plan after
    # 180 s, a generous bound for a loaded host: TCG sometimes stops at "Booting from ROM..." before the kernel prints anything) is
    # booted again, at most twice, and the retry is reported.
    for attempt in range(1, 4):
        for f in spec.get("cxl", ())[:2]:  # an empty label area for every boot
            if os.path.exists(f):
                os.unlink(f)
        t0 = time.time()
        log, rc, hung = run_guest(cmd, a.timeout)
        wall = time.time() - t0
        why = died_before_plan(log) or (f"no guest output {wall:.0f} s into the boot (a hang under TCG)" if hung else None)
        if not why or attempt == 3:
            break
        print(f"guest {a.topology}-{a.kernel}: the guest did not reach its plan ({why}); "
              f"booting again (attempt {attempt + 1} of 3)")
    for f in spec.get("cxl", ())[:2]:
        if os.path.exists(f):
            os.unlink(f)
    with open(log_path, "w") as f:
        f.write(" ".join(cmd) + "\n\n" + log)
    print(f"guest {name}: qemu rc={rc}, {wall:.1f} s wall, log {log_path}")

    c = Checker()
    c(rc is not None and not hung, f"guest finished within {a.timeout} s" + (" (it hung in boot)" if hung else ""))
    c("=== CXLPOOL-VM DONE" in log, "guest ran its whole plan")
    sec = sections(log)
    if "kernel" in sec:
        print(f"guest kernel: {sec['kernel'][0].strip()}")
        c(sec["kernel"][0].strip().startswith(a.kernel + "."), f"guest runs kernel {a.kernel}")
    table = sec.get("info-table")
    if table:
        print("---- guest cxlpool-info ----\n" + table[0] + "\n----------------------------")
        with open(os.path.join(a.log_dir, f"{name}.info.txt"), "w") as f:
            f.write(table[0] + "\n")
    planned = {"checks": ["vm-checks"], "backing": ["backing-test"], "dax": ["dax-info-json"], "hotremove": ["hotremove"],
               "rxe": ["rxe-setup", "rxe-kv"], **TIERING_SECTIONS}
    for s in ["info-json", "info-table"] + [s for p in a.plan.split(",") for s in planned.get(p, [])]:
        c(s in sec and sec[s][1] == 0, f"guest section {s} exited 0")
        if s in sec and s not in ("info-json", "info-table") and sec[s][1] != 0 and s not in sum(TIERING_SECTIONS.values(), []):
            print(sec[s][0])
    if "vm-checks" in sec:
        print("\n".join(l for l in sec["vm-checks"][0].splitlines() if l.startswith(("ok", "FAIL", "vm_checks", "weighted"))))
    if "hotremove" in sec:
        print("\n".join(l for l in sec["hotremove"][0].splitlines()
                        if l.startswith(("ok", "FAIL", "vm_hotremove", "node1", "cxlpool:"))))
    doc = None
    if "info-json" in sec:
        try:
            doc = parse_json(sec["info-json"][0])
        except ValueError as e:
            c(False, f"guest cxlpool-info --json is valid JSON ({e})")
    plan = a.plan.split(",")
    # The topology's own checks read the dax plan's sections; the hotremove plan onlines the
    # device-DAX range without them (its program's ok/FAIL lines are its checks).
    if a.topology == "cxl":
        check_cxl(c, sec, plan)
    elif doc is not None and plan != ["hotremove"]:
        CHECKS[a.topology](c, doc, a.kernel, sec)
    if "rxe" in plan:
        check_rxe(c, sec)
    if any(p in TIERING_SECTIONS for p in plan):
        check_tiering(c, sec, a.kernel, plan)
    print(f"vm {name}: {c.passed} passed, {c.failed} failed")
    sys.exit(1 if c.failed else 0)


if __name__ == "__main__":
    main()
