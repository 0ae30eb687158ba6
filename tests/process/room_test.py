#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# No signal from cxlpool's memory when its room runs out (docs/backing.md, "Room"). One CTest
# test per mode (label process), each in a private mount namespace with filesystems it mounts
# itself (as root: unshare -m; otherwise a user namespace, unshare -Urm), so nothing leaks:
#   file      a file: device declared 64 MiB in a 24 MiB tmpfs, through cxlpool-run: a C program
#             filling memory with several block sizes and python3 see NULL/ENOMEM (MemoryError),
#             never a signal, exit 0; copy-on-write memory is not limited by the tmpfs (it is
#             anonymous), fork=copy memory stops at its room; a spill policy goes on on the next
#             device; blocks kept while another process fills the filesystem stay intact;
#             the room warning is printed once; a fork whose child's copy does not fit the
#             filesystem still gives the child its copy
#   shm       the same for shm: in a 24 MiB /dev/shm of the namespace's own
#   memcg     a memfd device under a memory cgroup limit that holds it once but not twice:
#             NULL at the device's capacity, no OOM kill; a device larger than the limit is
#             warned about (needs root and a memory cgroup of one's own: v2 with the memory
#             controller delegated, or v1)
#   tiering   cxlpool-run --tiering with a fast numa:0 device and a slow file: device whose
#             tmpfs another process fills mid-run: exit 0, output identical to glibc's
#   capi      tests/process/room_capi.c: CXLPOOL_E_CAPACITY, ledger unchanged, shared pools
# Skips print "CXLPOOL-SKIP: <reason>" (CTest counts them as skipped).
# Usage: room_test.py MODE --bindir DIR [--run CXLPOOL-RUN --preload LIB] (all modes but capi need them)
import argparse
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile

ap = argparse.ArgumentParser()
ap.add_argument("mode")
ap.add_argument("--bindir", required=True)
ap.add_argument("--run", default="")
ap.add_argument("--preload", default="")
args = ap.parse_args()
for key in ("bindir", "run", "preload"):
    if getattr(args, key):
        setattr(args, key, os.path.abspath(getattr(args, key)))

PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else shutil.which("python3")
TOKEN = secrets.token_hex(4)
MIB = 1 << 20
failures = 0


def check(cond, what):
    global failures
    print(("ok    " if cond else "FAIL  ") + what, flush=True)
    if not cond:
        failures += 1
    return cond


def info(text):
    for line in text.rstrip().splitlines():
        print(f"      {line}", flush=True)


def describe(r):
    if r.returncode < 0:
        return f"killed by signal {-r.returncode} ({signal.Signals(-r.returncode).name})"
    return f"exit {r.returncode}"


def env(extra=None):
    e = {k: v for k, v in os.environ.items() if not k.startswith("CXLPOOL_") and k != "LD_PRELOAD"}
    e.update(extra or {})
    return e


def run(cmd, timeout=300, stdin=None, input=None):
    """The whole session is killed on timeout (a hang guard only, never a measure)."""
    p = subprocess.Popen(cmd, env=env(), stdin=subprocess.PIPE if input is not None else stdin or subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = p.communicate(input=input, timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
    return subprocess.CompletedProcess(cmd, p.returncode, out.decode(errors="replace"), err.decode(errors="replace"))


def cxl(cmd, devices, policy, tiering=None):
    full = [args.run, "--preload", args.preload, "--devices", devices, "--policy", policy]
    if tiering:
        full.append(f"--tiering={tiering}")
    return full + ["--"] + cmd


def fill(cap_mib, *sizes, pause=None):
    cmd = [os.path.join(args.bindir, "process_fill_memory"), str(cap_mib)]
    if pause:
        cmd += ["--pause", str(pause)]
    return cmd + [str(s) for s in sizes]


# python3 filling memory with bytearrays of one size until MemoryError (at most cap MiB).
PY_FILL = r"""
import sys
size, cap = int(sys.argv[1]), int(sys.argv[2]) << 20
b, why = [], "cap"
try:
    while (len(b) + 1) * size <= cap:
        x = bytearray(size)
        x[::4096] = b"\x01" * len(range(0, size, 4096))
        b.append(x)
except MemoryError:
    why = "MemoryError"
n = len(b)
b = None
print(size, (n * size) >> 20, why)
"""


# python3 holding N MiB of a fork=copy device forks when the filesystem has less room than the
# child's copy needs: the child gets its copy anyway (in anonymous memory), intact.
PY_FORK = r"""
import os, sys
b = [bytearray(bytes([i % 251]) * (1 << 20)) for i in range(int(sys.argv[1]))]
st = os.statvfs(sys.argv[2])
print("free before fork", st.f_bavail * st.f_frsize >> 20, "MiB", flush=True)
pid = os.fork()
if pid == 0:
    ok = all(x[0] == i % 251 and x[-1] == i % 251 for i, x in enumerate(b))
    for x in b:
        x[0] = 7
    os._exit(0 if ok else 3)
_, status = os.waitpid(pid, 0)
print("child", os.waitstatus_to_exitcode(status), "parent intact", all(x[0] == i % 251 for i, x in enumerate(b)))
"""


def block_lines(out):
    """{size: (MiB, how it ended, blocks changed)} from fill_memory's output."""
    got = {}
    for m in re.finditer(r"block (\d+): (\d+) MiB, then (NULL errno=\S+|the cap); (\d+) blocks changed", out):
        got[int(m.group(1))] = (int(m.group(2)), m.group(3).rstrip(";"), int(m.group(4)))
    return got


def room_warnings(err, device):
    return [l for l in err.splitlines() if l.startswith(f"cxlpool-run: warning: device '{device}'")
            and "cannot all be had" in l]


def fill_until_full(d):
    """Another process's writes take whatever room is left in d (ENOSPC ends them)."""
    r = run([PY, "-c", "import sys\nf = open(sys.argv[1], 'wb')\ntry:\n"
             "    while True: f.write(b'\\xee' * (1 << 20)); f.flush()\nexcept OSError as e: print(e.errno)",
             os.path.join(d, f"filler-{TOKEN}")])
    st = os.statvfs(d)
    return st.f_bavail * st.f_frsize


def mount_tmpfs(where, size):
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=1777", f"cxlpool-room-{TOKEN}", where], check=True)


SIZES = [4096, 65536, MIB, 8 * MIB]
ROOM = 24  # MiB of the tmpfs
DEVICE = 64  # MiB declared


def fill_claims(label, spec, room_limited):
    """A C program and python3 fill memory on device t (spec) until NULL; never a signal."""
    r = run(cxl(fill(256, *SIZES), spec, "bind:t"))
    got = block_lines(r.stdout)
    check(r.returncode == 0 and len(got) == len(SIZES),
          f"{label}: C program filling memory with blocks of {', '.join(map(str, SIZES))} bytes: {describe(r)}")
    info(r.stdout)
    if r.returncode != 0:
        info(r.stderr[-2000:])
    check(all(v[1] == "NULL errno=ENOMEM" and v[2] == 0 for v in got.values()),
          f"{label}: every size ended with NULL + ENOMEM, every block intact")
    first = got.get(SIZES[0], (0,))[0]
    if room_limited:
        check(0 < first <= ROOM, f"{label}: memory kept in the file stops at the filesystem's room ({first} MiB)")
    else:
        check(first > ROOM + 8,
              f"{label}: copy-on-write memory is anonymous, not limited by the {ROOM} MiB filesystem ({first} MiB)")
    check(len(room_warnings(r.stderr, "t")) == 1, f"{label}: cxlpool-run printed the room warning once")
    info("\n".join(room_warnings(r.stderr, "t")))
    for size in (100_000, MIB):
        p = run(cxl([PY, "-c", PY_FILL, str(size), "256"], spec, "bind:t"))
        check(p.returncode == 0 and p.stdout.strip().endswith("MemoryError"),
              f"{label}: python3 bytearrays of {size} bytes until MemoryError: {describe(p)}, {p.stdout.strip()}")
        if p.returncode != 0:
            info(p.stderr[-2000:])


def room_claims(kind):
    d = tempfile.mkdtemp(prefix=f"cxlpool-room-{TOKEN}-")
    try:
        if kind == "shm":
            mount_tmpfs("/dev/shm", f"{ROOM}M")
            where = f"shm:cxlpool-room-{TOKEN}"
        else:
            mount_tmpfs(d, f"{ROOM}M")
            where = f"file:{d}/dev"
        fill_claims(f"{kind} cow", f"t:backing={where},size={DEVICE}M", False)
        fill_claims(f"{kind} fork=copy", f"t:backing={where},size={DEVICE}M,fork=copy", True)
        # A spill policy goes on on the next device when the filesystem is full.
        r = run(cxl(fill(256, 65536), f"t:backing={where},size={DEVICE}M,fork=copy;u:backing=memfd,size=64M",
                    "spill:near=t,far=u,watermark=100%"))
        got = block_lines(r.stdout).get(65536, (0, "", 1))
        check(r.returncode == 0 and got[1] == "NULL errno=ENOMEM" and got[2] == 0 and got[0] > ROOM + 32,
              f"{kind}: spill from the full filesystem's device to a memfd: {describe(r)}, {got[0]} MiB in all")
        # Room once had stays: another process fills the filesystem while the program holds
        # 8 MiB; it rewrites those and goes on until NULL.
        p = subprocess.Popen(cxl(fill(256, 65536, pause=8), f"t:backing={where},size={DEVICE}M,fork=copy", "bind:t"),
                             env=env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             start_new_session=True)
        first = p.stdout.readline().decode()
        left = fill_until_full("/dev/shm" if kind == "shm" else d)
        out, err = p.communicate(b"go\n", timeout=300)
        got = block_lines(out.decode()).get(65536, (0, "", 1))
        check(first.startswith("paused") and left < MIB and p.returncode == 0 and got[1] == "NULL errno=ENOMEM"
              and got[2] == 0,
              f"{kind}: the filesystem filled by another process mid-run ({left >> 10} KiB left): "
              f"exit {p.returncode}, the blocks had before intact, then NULL + ENOMEM ({got[0]} MiB)")
        if p.returncode != 0:
            info(err.decode(errors="replace")[-2000:])
        os.unlink(os.path.join("/dev/shm" if kind == "shm" else d, f"filler-{TOKEN}"))
        # fork() when the child's copy does not fit the filesystem.
        r = run(cxl([PY, "-c", PY_FORK, "12", "/dev/shm" if kind == "shm" else d],
                    f"t:backing={where},size={DEVICE}M,fork=copy", "bind:t"))
        check(r.returncode == 0 and "child 0 parent intact True" in r.stdout,
              f"{kind}: fork with 12 MiB of fork=copy memory and less room left for the child's copy: "
              f"{describe(r)}, {' '.join(r.stdout.split())}")
        if "child 0" not in r.stdout:
            info(r.stderr[-1000:])
    finally:
        subprocess.run(["umount", "-l", "/dev/shm" if kind == "shm" else d], stderr=subprocess.DEVNULL)
        shutil.rmtree(d, ignore_errors=True)


def hugetlbfs_claims():
    """A file: device on hugetlbfs declared twice the free huge pages: NULL, never SIGBUS (both
    fork modes). Needs free huge pages (vm.nr_hugepages) and a real root (no hugetlbfs mounts in
    a user namespace); skipped with a line saying so otherwise."""
    try:
        free = int(open("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages").read())
    except OSError:
        free = 0
    if free < 4 or os.geteuid() != 0 or not os.path.exists("/proc/self/ns/user") or \
            open("/proc/self/uid_map").read().split()[:3] != ["0", "0", "4294967295"]:
        print(f"skip  hugetlbfs: {free} free 2 MiB huge pages (needs 4, vm.nr_hugepages) and the initial user "
              "namespace's root", flush=True)
        return
    d = tempfile.mkdtemp(prefix=f"cxlpool-room-{TOKEN}-")
    try:
        subprocess.run(["mount", "-t", "hugetlbfs", "-o", "pagesize=2M", f"cxlpool-room-{TOKEN}", d], check=True)
        for fork in ("", ",fork=cow"):
            spec = f"t:backing=file:{d}/dev,size={2 * free * 2}M{fork}"
            r = run(cxl(fill(4 * free, 4096, MIB), spec, "bind:t"))
            got = block_lines(r.stdout)
            check(r.returncode == 0 and len(got) == 2 and all(v[1] == "NULL errno=ENOMEM" for v in got.values()),
                  f"hugetlbfs{fork or ' (fork=copy)'}: a device of twice the {free} free huge pages: {describe(r)}, "
                  f"NULL + ENOMEM")
            info(r.stdout)
    finally:
        subprocess.run(["umount", "-l", d], stderr=subprocess.DEVNULL)
        shutil.rmtree(d, ignore_errors=True)


# A deterministic workload for the tiering run: blocks written in two phases, a hot set
# rewritten in between; the digest of everything at the end. "ready" between the phases.
PY_TIER = r"""
import hashlib, sys
blocks = []
def grow(n, tag):
    for i in range(n):
        size = (1 << 20) if i % 4 == 0 else (64 << 10) * (1 + i % 7)
        blocks.append(bytearray(bytes([(tag * 31 + i) % 251]) * size))
def churn(first, count, rounds):
    for r in range(rounds):
        for b in blocks[first:first + count]:
            for k in range(0, len(b), 4096):
                b[k] = (b[k] + r + 1) % 256
grow(96, 1)
churn(0, 8, 200)
print("ready", flush=True)
sys.stdin.readline()
grow(96, 2)
churn(96, 8, 200)
churn(0, 96, 20)
h = hashlib.sha256()
for b in blocks:
    h.update(b)
print(len(blocks), sum(map(len, blocks)), h.hexdigest())
"""


def tiering_claims():
    d = tempfile.mkdtemp(prefix=f"cxlpool-room-{TOKEN}-")
    try:
        mount_tmpfs(d, "96M")
        plain = run([PY, "-c", PY_TIER], input=b"go\n")
        check(plain.returncode == 0, f"the workload under glibc: {describe(plain)}")
        for fork in ("", ",fork=copy"):
            os.makedirs(d, exist_ok=True)
            devices = (f"fast:backing=numa:0,size=16M,tier=0;slow:backing=file:{d}/slow,size=256M,tier=1{fork};"
                       f"spare:backing=memfd,size=256M,tier=2")
            cmd = cxl([PY, "-c", PY_TIER], devices, "preferred:fast,slow,spare",
                      "interval=10ms,min_residence=20ms,halflife=20ms,hot=0.02,cold=0.005")
            p = subprocess.Popen(cmd, env=env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 start_new_session=True)
            first = p.stdout.readline()
            left = fill_until_full(d)
            out, err = p.communicate(b"go\n", timeout=600)
            label = f"tiering, slow file: device{fork or ' (copy-on-write)'}"
            check(p.returncode == 0 and first + out == plain.stdout.encode(),
                  f"{label}, its tmpfs filled by another process mid-run ({left >> 10} KiB left): "
                  f"{describe(p)}, output {'identical to glibc' if first + out == plain.stdout.encode() else 'DIFFERENT'}")
            if p.returncode != 0 or first + out != plain.stdout.encode():
                info((first + out).decode(errors="replace")[-500:] + "\n" + err.decode(errors="replace")[-2000:])
            for f in os.listdir(d):
                os.unlink(os.path.join(d, f))
    finally:
        subprocess.run(["umount", "-l", d], stderr=subprocess.DEVNULL)
        shutil.rmtree(d, ignore_errors=True)


def capi_claims():
    d = tempfile.mkdtemp(prefix=f"cxlpool-room-{TOKEN}-")
    try:
        mount_tmpfs(d, "16M")
        r = run([os.path.join(args.bindir, "process_room_capi"), d])
        print(r.stdout.rstrip(), flush=True)
        check(r.returncode == 0 and "FAIL" not in r.stdout, f"C API on a full filesystem: {describe(r)}")
        if r.returncode != 0:
            info(r.stderr[-2000:])
    finally:
        subprocess.run(["umount", "-l", d], stderr=subprocess.DEVNULL)
        shutil.rmtree(d, ignore_errors=True)


# ---- memory cgroup -------------------------------------------------------------------------------
def own_memory_cgroup():
    """(kind, directory) of a memory cgroup this test may make children in, or (None, why)."""
    if os.geteuid() != 0:
        return None, "not root: cannot make a memory cgroup"
    lines = open("/proc/self/cgroup").read().splitlines()
    for line in lines:
        hid, controllers, path = line.split(":", 2)
        if hid == "0" and not controllers:
            root = "/sys/fs/cgroup" if os.path.exists("/sys/fs/cgroup/cgroup.controllers") else "/sys/fs/cgroup/unified"
            here = root + path
            try:
                subtree = open(os.path.join(here, "cgroup.subtree_control")).read().split()
            except OSError:
                subtree = []
            if "memory" in subtree:
                return "v2", here
    for line in lines:
        hid, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            here = "/sys/fs/cgroup/memory" + path
            if os.access(here, os.W_OK):
                return "v1", here
    return None, "no memory cgroup to make a child in (cgroup v2 without the memory controller delegated here, no v1)"


def memcg_claims():
    kind, where = own_memory_cgroup()
    if not kind:
        print(f"CXLPOOL-SKIP: {where}", flush=True)
        return
    cg = os.path.join(where, f"cxlpool-room-{TOKEN}")
    os.mkdir(cg)
    try:
        limit = 112 * MIB
        open(os.path.join(cg, "memory.max" if kind == "v2" else "memory.limit_in_bytes"), "w").write(str(limit))
        inside = ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', cg]
        info(f"cgroup {kind} {cg}, limit {limit >> 20} MiB")
        # 64 MiB fits the limit once (glibc's heap would too); a device that charged each page
        # twice would not.
        r = run(inside + cxl(fill(256, 4096, MIB), "t:backing=memfd,size=64M", "bind:t"))
        got = block_lines(r.stdout)
        check(r.returncode == 0 and len(got) == 2 and all(v[1] == "NULL errno=ENOMEM" and v[2] == 0
                                                           for v in got.values()),
              f"memfd device of 64 MiB under a {limit >> 20} MiB memory cgroup: {describe(r)}, NULL + ENOMEM at "
              f"its capacity, no OOM kill")
        info(r.stdout)
        p = run(inside + cxl([PY, "-c", PY_FILL, str(100_000), "256"], "t:backing=memfd,size=64M", "bind:t"))
        check(p.returncode == 0 and p.stdout.strip().endswith("MemoryError"),
              f"python3 on that device under the limit: {describe(p)}, {p.stdout.strip()}")
        w = run(inside + cxl(["/bin/true"], "t:backing=memfd,size=256M", "bind:t"))
        lines = room_warnings(w.stderr, "t")
        check(w.returncode == 0 and len(lines) == 1 and "memory cgroup" in lines[0],
              "a 256 MiB memfd device under the limit is warned about, naming the memory cgroup")
        info("\n".join(lines))
    finally:
        try:
            os.rmdir(cg)
        except OSError as e:
            check(False, f"removing {cg}: {e}")


# ---- namespaces ---------------------------------------------------------------------------------
def in_namespace(inner_mode):
    """Reruns this script as inner_mode in a private mount namespace; its lines become ours."""
    global failures
    me = [sys.executable, os.path.abspath(__file__), inner_mode, "--bindir", args.bindir]
    if args.run:
        me += ["--run", args.run, "--preload", args.preload]
    if os.geteuid() == 0:
        wrap = ["unshare", "--mount", "--propagation", "private"]
    else:
        wrap = ["unshare", "--user", "--map-root-user", "--mount", "--propagation", "private"]
    probe = run(wrap + ["true"], timeout=60)
    if probe.returncode != 0:
        print(f"CXLPOOL-SKIP: {' '.join(wrap[:3])} does not work here ({probe.stderr.strip()[:100]}): "
              "cannot mount a small filesystem of the test's own", flush=True)
        return
    r = run(wrap + me, timeout=1500)
    print(r.stdout.rstrip(), flush=True)
    inner = sum(l.startswith("FAIL") for l in r.stdout.splitlines())
    if r.returncode != 0 and not inner:
        check(False, f"{inner_mode}: {describe(r)}: {r.stderr[-1500:]}")
    failures += inner


MODES = {"file": lambda: in_namespace("file-ns"), "shm": lambda: in_namespace("shm-ns"),
         "tiering": lambda: in_namespace("tiering-ns"), "capi": lambda: in_namespace("capi-ns"),
         "memcg": memcg_claims, "file-ns": lambda: (room_claims("file"), hugetlbfs_claims()), "shm-ns": lambda: room_claims("shm"),
         "tiering-ns": tiering_claims, "capi-ns": capi_claims}
if args.mode not in MODES:
    sys.exit(f"unknown mode {args.mode}")
MODES[args.mode]()
print(f"{failures} failed", flush=True)
sys.exit(1 if failures else 0)
