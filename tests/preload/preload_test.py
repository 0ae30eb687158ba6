#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# Interposer tests, one CTest test per mode:
#   conformance  the malloc family vs glibc, case by case (0 deviations or each documented)
#   programs     real programs: identical stdout and exit code with and without the interposer
#   torture      fork and thread-exit torture under the interposer
#   bootstrap    constructor allocations before main, free(NULL) first
#   badconfig    each bad setting: one line on stderr naming the token, the program still works
#   placement    a threshold policy puts large buffers on the far device
import hashlib
import os
import subprocess
import sys
import tempfile

mode, preload, bindir, srcdir = sys.argv[1:5]
failures = 0


def check(cond, what):
    global failures
    print(("ok    " if cond else "FAIL  ") + what, flush=True)
    if not cond:
        failures += 1


def env(extra=None, preloaded=True):
    e = {k: v for k, v in os.environ.items() if not k.startswith("CXLPOOL_") and k != "LD_PRELOAD"}
    if preloaded:
        e["LD_PRELOAD"] = preload
    e.update(extra or {})
    return e


def run(cmd, preloaded=True, extra=None, timeout=300, **kw):
    return subprocess.run(cmd, env=env(extra, preloaded), capture_output=True, timeout=timeout, **kw)


def stats_rows(text):
    """CXLPOOL_STATS's table (columns named by the stats schema) as {device: {column: value}}."""
    lines = text.splitlines()
    head = next((l.split() for l in lines if l.split()[:2] == ["device", "tier"]), None)
    if not head:
        return {}
    rows = {}
    for l in lines:
        f = l.split()
        if len(f) == len(head) and f[0] != "device" and f[1].lstrip("-").isdigit():
            rows[f[0]] = dict(zip(head, [f[0]] + [int(x) for x in f[1:]]))
    return rows


def digest(b):
    return hashlib.sha256(b).hexdigest()[:16]


if mode == "conformance":
    exe = os.path.join(bindir, "preload_conformance")
    base = run([exe], preloaded=False).stdout.decode().splitlines()
    ours = run([exe]).stdout.decode().splitlines()
    check(len(base) == len(ours), f"same number of result lines ({len(base)})")
    deviations = [(b, o) for b, o in zip(base, ours) if b != o]
    for b, o in deviations:
        print(f"      glibc:    {b}\n      cxlpool:  {o}")
    cases = ours[-1] if ours else "?"
    check(not deviations, f"{cases} (16 entry points and argument classes) x 2 modes: {len(deviations)} deviations from glibc")

elif mode == "programs":
    work = tempfile.mkdtemp(prefix="cxlpool-preload-")
    big = os.path.join(work, "lines.txt")
    with open(big, "w") as f:  # ~40 MB, deterministic
        x = 12345
        for i in range(1_500_000):
            x = (x * 1103515245 + 12345) & 0x7FFFFFFF
            f.write(f"{x:010d} line {i} {'abc' * (x % 7)}\n")
    cpp = os.path.join(work, "t.cpp")
    with open(cpp, "w") as f:
        f.write("#include <map>\n#include <string>\n#include <vector>\n#include <iostream>\n#include <algorithm>\n"
                "template <int N> struct F { static constexpr long v = N * F<N - 1>::v % 1000003; };\n"
                "template <> struct F<0> { static constexpr long v = 1; };\n"
                "int main() { std::map<std::string, std::vector<int>> m; for (int i = 0; i < 100000; ++i) "
                "m[std::to_string(i % 997)].push_back(i); long s = F<200>::v; for (auto& [k, v] : m) s += v.size() * k.size(); "
                "std::cout << s << std::endl; }\n")
    py = ("import json,collections,hashlib\n"
          "d={str(i):[i]*(i%13) for i in range(200000)}\n"
          "c=collections.Counter(len(v) for v in d.values())\n"
          "s=json.dumps(d)[:100000]\n"
          "print(sorted(c.items()), hashlib.sha256(s.encode()).hexdigest())\n")
    programs = [
        ("ls", ["ls", "-la", "--time-style=+%s", "/usr/include", "/usr/lib/x86_64-linux-gnu"]),
        ("grep", ["grep", "-rn", "define", "/usr/include/linux"]),
        ("sort 40 MB", ["sort", big]),
        ("python3", ["/usr/bin/python3", "-c", py]),
        ("git", ["git", "-C", srcdir, "log", "--stat", "-n", "30"]),
        ("perl", ["perl", "-e", 'my %h; $h{$_}=$_*2 for 1..300000; print scalar(keys %h), "\\n"; '
                  'print join(",", (sort { $a <=> $b } values %h)[0..9]), "\\n";']),
        ("g++ compile", ["g++", "-O1", "-std=c++20", "-o", os.path.join(work, "t"), cpp]),
        ("compiled program", [os.path.join(work, "t")]),
    ]
    for name in ["parse_test", "device_spec_test", "policy_test", "topology_test", "backing_test", "alloc_test"]:
        programs.append((f"project test {name}", [os.path.join(bindir, name)]))
    for name, cmd in programs:
        if name == "compiled program":
            base = run(cmd, preloaded=False)
            ours = run(cmd)
        else:
            if name == "g++ compile":
                os.environ.pop("LD_PRELOAD", None)
            base = run(cmd, preloaded=False)
            ours = run(cmd)
        same = base.stdout == ours.stdout and base.returncode == ours.returncode
        if name.startswith("project test"):  # test reporters print timings; compare outcome only
            same = base.returncode == ours.returncode == 0
        check(same, f"{name}: exit {base.returncode}/{ours.returncode}, stdout {digest(base.stdout)}/{digest(ours.stdout)}"
                    f" ({len(base.stdout)} bytes)")
        if not same and ours.stderr:
            print(ours.stderr.decode(errors="replace")[-2000:])

elif mode == "torture":
    exe = os.path.join(bindir, "preload_torture")
    for sub in ["fork", "threads"]:
        r = run([exe, sub], timeout=600)
        check(r.returncode == 0, f"{sub}: {r.stdout.decode().strip()} (exit {r.returncode})")
        if r.returncode:
            print(r.stderr.decode(errors="replace")[-2000:])

elif mode == "bootstrap":
    exe = os.path.join(bindir, "preload_bootstrap")
    for i in range(20):
        r = run([exe], timeout=30)
        if r.returncode != 0 or b"early=1" not in r.stdout:
            break
    check(r.returncode == 0 and b"early=1" in r.stdout, f"20 runs: constructor allocations before main ({r.stdout.decode().strip()})")

elif mode == "badconfig":
    exe = os.path.join(bindir, "preload_bootstrap")
    cases = [
        ({"CXLPOOL_POLICY": "bogus"}, "bogus"),
        ({"CXLPOOL_POLICY": "spill:near=node0,far=cxl0,watermark=140%"}, "140%"),
        ({"CXLPOOL_DEVICES": "cxl0:backing=shm,size=12Q"}, "12Q"),
        ({"CXLPOOL_DEVICES": "far9:backing=numa:9"}, "numa:9"),
        ({"CXLPOOL_CONFIG": "/nonexistent/cxlpool.conf"}, "/nonexistent/cxlpool.conf"),
        ({"CXLPOOL_STATS": "/nonexistent-dir/stats.txt"}, "/nonexistent-dir/stats.txt"),
    ]
    for extra, token in cases:
        r = run([exe, "1000"], extra=extra)
        lines = [l for l in r.stderr.decode().splitlines() if l.strip()]
        check(r.returncode == 0 and b"early=1" in r.stdout and len(lines) == 1 and token in lines[0],
              f"{extra}: exit {r.returncode}, {len(lines)} stderr line(s) naming {token!r}")
        if lines:
            print(f"      {lines[0]}")
    r = run(["ls", "/"], extra={"CXLPOOL_POLICY": "bogus"})
    check(r.returncode == 0 and r.stdout == run(["ls", "/"], preloaded=False).stdout, "ls / lists the directory with a bad policy")

elif mode == "placement":
    exe = os.path.join(bindir, "preload_bootstrap")
    far = run([exe, str(8 << 20)], extra={"CXLPOOL_POLICY": "threshold:size=1M,tier=far"})
    near = run([exe, str(8 << 20)])
    small = run([exe, "100000"], extra={"CXLPOOL_POLICY": "threshold:size=1M,tier=far"})
    out = far.stdout.decode().strip()
    # The far device's private memory is anonymous memory (docs/backing.md, "Room"): the
    # stats below tell where it went.
    check(far.returncode == 0 and "[anonymous]" in out, f"8 MiB block with threshold policy: {out}")
    check(near.returncode == 0 and "cxlpool" not in near.stdout.decode(), f"default policy keeps it near: {near.stdout.decode().strip()}")
    check(small.returncode == 0 and "cxlpool" not in small.stdout.decode(), f"100 KB stays near under threshold: {small.stdout.decode().strip()}")
    stats = run([exe, str(8 << 20)], extra={"CXLPOOL_POLICY": "threshold:size=1M,tier=far", "CXLPOOL_STATS": "1"})
    far = stats_rows(stats.stderr.decode()).get("cxl0", {})
    check(far.get("allocations", 0) >= 1 and far.get("peak_resident_bytes", 0) >= 8 << 20,
          f"CXLPOOL_STATS reports the far allocation: {far}")
elif mode == "run":
    tool = sys.argv[5]
    py = "b=[bytearray(4<<20) for i in range(10)]; print(sum(len(x) for x in b))"
    r = subprocess.run([tool, "--policy", "threshold:size=1M,tier=far", "--stats", "--", "/usr/bin/python3", "-c", py],
                       env=env(preloaded=False), capture_output=True, timeout=120)
    far = stats_rows(r.stderr.decode()).get("cxl0", {})
    check(r.returncode == 0 and r.stdout.strip() == b"41943040" and far.get("allocations", 0) >= 10,
          f"cxlpool-run --policy threshold --stats -- python3: far-tier allocations {far}")
    r = subprocess.run([tool, "--", "ls", "/"], env=env({"CXLPOOL_POLICY": "bogus"}, preloaded=False),
                       capture_output=True, timeout=60)
    lines = [l for l in r.stderr.decode().splitlines() if l.strip()]
    check(r.returncode == 0 and len(lines) == 1 and "bogus" in lines[0] and
          r.stdout == subprocess.run(["ls", "/"], capture_output=True).stdout,
          f"CXLPOOL_POLICY=bogus cxlpool-run -- ls: one line ({lines[:1]}) and the listing")
    r = subprocess.run([tool, "--", "/bin/busybox", "true"], env=env(preloaded=False), capture_output=True, timeout=60)
    check(r.returncode == 0 and b"statically linked" in r.stderr, "a static program gets a warning and still runs")
    work = tempfile.mkdtemp(prefix="cxlpool-run-")
    suid = os.path.join(work, "true-suid")
    with open("/bin/true", "rb") as src, open(suid, "wb") as dst:
        dst.write(src.read())
    os.chmod(suid, 0o4755)
    r = subprocess.run([tool, "--", suid], env=env(preloaded=False), capture_output=True, timeout=60)
    check(r.returncode == 0 and b"setuid" in r.stderr, "a setuid program gets a warning and still runs")
    r = subprocess.run([tool, "--", "no-such-program-xyz"], env=env(preloaded=False), capture_output=True)
    check(r.returncode == 127 and b"not found" in r.stderr, "a missing program: exit 127 with a message")
    r = subprocess.run([tool, "--frobnicate", "ls"], env=env(preloaded=False), capture_output=True)
    check(r.returncode == 2 and b"--frobnicate" in r.stderr, "an unknown option is a usage error naming it")
    # --tiering: an unmodified python3 writing 3 of 32 buffers of 3 MiB placed on the slow
    # device; the engine moves them to a tier-0 device (the machine's node0 or fastmem). It writes
    # until cxlpool-stat shows 9 MiB promoted (at most 60 s: a hang guard, not a speed this
    # machine must have). Without --tiering nothing reaches tier 0 in 2.5 s of writing.
    stat_tool = os.path.join(os.path.dirname(tool), "cxlpool-stat")
    hot = ("import json,os,subprocess,sys,time\nb=[bytearray(3<<20) for i in range(32)]\n"
           "until=sys.argv[1]=='until-promoted'\nt=time.time()\nlast=0\n"
           "e={k:v for k,v in os.environ.items() if k!='LD_PRELOAD'}\n"
           "while time.time()-t<(60 if until else 2.5):\n"
           "  for x in b[4:7]:\n    for o in range(0,len(x),4096): x[o]=1\n  time.sleep(0.005)\n"
           "  if until and time.time()-last>0.2:\n    last=time.time()\n"
           "    r=subprocess.run([sys.argv[2],'--json',str(os.getpid())],capture_output=True,text=True,env=e)\n"
           "    if r.stdout and json.loads(r.stdout)['process'].get('promote_bytes',0)>=9<<20: break\n"
           "print('done', round(time.time()-t,1))")
    devs = "fastmem:backing=shm,size=64M,tier=0;slowmem:backing=shm,size=1G,tier=1"
    def tier0_peak(extra_args):
        how = "until-promoted" if extra_args else "fixed"
        r = subprocess.run([tool, "--devices", devs, "--policy", "bind:slowmem", "--stats"] + extra_args +
                           ["--", "/usr/bin/python3", "-c", hot, how, stat_tool], env=env(preloaded=False),
                           capture_output=True, timeout=180)
        lines = r.stderr.decode().splitlines()
        rows = stats_rows(r.stderr.decode())
        peak = sum(row["peak_resident_bytes"] for row in rows.values() if row["tier"] == 0)
        return r, peak, lines
    r, peak, lines = tier0_peak(["--tiering=interval=50ms,monitors=pagemap_scan+hint"])
    check(r.returncode == 0 and r.stdout.startswith(b"done") and peak >= 9 << 20,
          f"cxlpool-run --tiering: the written buffers reached tier 0 (peak resident {peak}, "
          f"{r.stdout.decode().strip()} s of writing): {lines[-6:]}")
    r, peak, lines = tier0_peak([])
    check(r.returncode == 0 and r.stdout.startswith(b"done") and peak == 0,
          f"without --tiering nothing reaches tier 0 (peak resident {peak})")
    r = subprocess.run([tool, "--tiering=budget=fast", "--", "/usr/bin/true"], env=env(preloaded=False),
                       capture_output=True, timeout=60)
    check(r.returncode == 0 and b"budget=fast" in r.stderr and b"tiering is off" in r.stderr,
          f"a bad --tiering spec is named by the interposer and the program still runs: {r.stderr[:200]}")
    # The sample monitor is refused for unmodified programs (their system calls on heap memory
    # would fail with EFAULT): said once, and a shell pipeline that spawns programs still works.
    r = subprocess.run([tool, "--tiering=monitors=sample,interval=2ms", "--", "/bin/sh", "-c",
                        "for i in 1 2 3 4 5 6 7 8; do /usr/bin/printf x; done"], env=env(preloaded=False),
                       capture_output=True, timeout=60)
    check(r.returncode == 0 and r.stdout == b"x" * 8 and b"'sample' is refused under the interposer" in r.stderr,
          f"--tiering=monitors=sample is refused under the interposer, the program runs: {r.stdout!r} {r.stderr[:300]}")
else:
    sys.exit(f"unknown mode {mode}")

print(f"{failures} failed")
sys.exit(1 if failures else 0)
