#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# cxlpool-stat end to end, on unmodified python3 programs started with cxlpool-run: --json
# validates and agrees with the program's own CXLPOOL_STATS table and with --schema; the
# Prometheus output follows the text format; the live table refreshes with rates; a program
# tiered with --tiering shows its engine running and its moves; the program keeps its page
# when it closes every descriptor; exit codes for no process, no page (plain program,
# CXLPOOL_STAT_PAGE=0, a fork child), a forged page, a stopped program (stale), another
# user's process, bad arguments; bad CXLPOOL_STAT_* settings are reported and the program runs.
# Hostile pages (a process that is not a cxlpool program holds a memfd named cxlpool-stats): a
# huge one costs the reader no memory, one truncated or changed under the reader never kills it
# with a signal; another process's page is refused, a zombie is said to have exited, and a
# program in its own pid namespace is read from the host by its host pid.
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

stat_tool, run_tool, docs = sys.argv[1], sys.argv[2], sys.argv[3]
failures = 0
PY = "/usr/bin/python3"


def check(cond, what):
    global failures
    print(("ok    " if cond else "FAIL  ") + what, flush=True)
    if not cond:
        failures += 1


def stat(*args, **kw):
    return subprocess.run([stat_tool, *map(str, args)], capture_output=True, text=True, timeout=60, **kw)


def json_until(pid, done, limit=60):
    """stat --json PID until done(doc) holds (a hang guard of `limit` s, not a speed this machine
    must have): the publisher is a background thread and runs later on a busy machine.
    Returns (doc, seconds waited, the last result)."""
    start = time.monotonic()
    while True:
        r = stat("--json", pid)
        try:
            doc = json.loads(r.stdout)
        except ValueError:
            doc = None
        if (doc is not None and done(doc)) or time.monotonic() - start > limit:
            return doc, time.monotonic() - start, r
        time.sleep(0.05)


def env(extra=None):
    e = {k: v for k, v in os.environ.items() if not k.startswith("CXLPOOL_") and k != "LD_PRELOAD"}
    e.update(extra or {})
    return e


# A target: allocates 8 blocks of 4 MiB (on the far device with the threshold policy), prints
# "ready", then waits for a line on stdin (or for its own script to finish).
TARGET = ("import sys,os\nb=[bytearray(4<<20) for i in range(8)]\n"
          "for x in b:\n  x[::4096]=b'\\x01'*len(x[::4096])\n"
          "{extra}\nprint('ready',flush=True)\nsys.stdin.readline()\n")


class Target:
    def __init__(self, extra="", run_args=(), env_extra=None, preload=True):
        cmd = ([run_tool, *run_args, "--"] if preload else []) + [PY, "-c", TARGET.format(extra=extra)]
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  env=env(env_extra), text=True)
        line = self.p.stdout.readline()
        self.ready = line.strip() == "ready"
        self.pid = self.p.pid

    def finish(self):
        try:
            out, err = self.p.communicate("\n", timeout=60)
        except (BrokenPipeError, OSError):
            out, err = self.p.communicate(timeout=60)
        return self.p.returncode, out, err


far_policy = ["--policy", "threshold:size=1M,tier=far"]

# ---- --json, --schema, --once, the live table, --prometheus, --list ----
t = Target(run_args=far_policy, env_extra={"CXLPOOL_STAT_INTERVAL_MS": "50", "CXLPOOL_STATS": "1"})
check(t.ready, "the target started under cxlpool-run")
# Two publishes after the first look: the page then shows everything done before "ready".
first, _, _ = json_until(t.pid, lambda d: True)
seen = first["publishes"] if first else 0
doc, waited, r = json_until(t.pid, lambda d: d["publishes"] >= seen + 2 and 0 <= d["age_seconds"] < 1)
check(r.returncode == 0 and doc is not None, f"--json: exit 0 and JSON ({r.returncode}, {r.stderr.strip()})")
if doc:
    check(doc["pid"] == t.pid and doc["program"] == "python3" and doc["layout_version"] == 1,
          f"--json names the process: pid {doc['pid']}, program {doc['program']!r}")
    check(doc["stale"] is False and doc["publishes"] >= 2 and 0 <= doc["age_seconds"] < 1,
          f"--json is fresh: publishes {doc['publishes']}, age {doc['age_seconds']} (after {waited:.1f} s)")
    types_ok = all(isinstance(v, int) and v >= 0 for v in doc["process"].values())
    types_ok &= all(isinstance(d["device"], str) and isinstance(d["tier"], int) for d in doc["devices"])
    for d in doc["devices"]:
        types_ok &= all(isinstance(d[m["name"]], int) for m in doc["schema"] if m["scope"] == "device")
    check(types_ok and {"process", "devices", "tiers", "schema"} <= doc.keys(), "--json: every value a count")
    far = [d for d in doc["devices"] if d["tier"] > 0]
    check(far and far[0]["allocated_bytes"] >= 32 << 20 and far[0]["allocations"] >= 8 and far[0]["pools"] == 1,
          f"--json: the far device holds the 32 MiB: {far}")
    sr = stat("--schema", "--json")
    schema = json.loads(sr.stdout)
    check(sr.returncode == 0 and [m["name"] for m in schema] == [m["name"] for m in doc["schema"]],
          "--schema lists what the page carries, in page order")
    names = [m["name"] for m in schema]
    check(len(names) == len(set(names)) and all(re.fullmatch(r"[a-z][a-z0-9_]*", n) for n in names),
          "schema names are unique and Prometheus-safe")
    text = open(os.path.join(docs, "stats.md")).read()
    table = text[text.index("<!-- schema:begin -->"):text.index("<!-- schema:end -->")]
    rows = [[c.strip().strip("`") for c in l.strip().strip("|").split("|")] for l in table.splitlines()[3:] if l.startswith("|")]
    want = [[m["name"], m["scope"], m["kind"], m["unit"], m["help"]] for m in schema]
    check(rows == want, f"docs/stats.md's metrics table is the schema ({len(rows)} rows, {len(want)} in the schema)")
    for must in ("pgpromote_success", "pgdemote_success", "pgmigrate_fail", "promote_bytes", "monitor_faults",
                 "scan_ns", "hot_bytes", "allocated_bytes", "device_committed_bytes"):
        check(must in names, f"schema has {must}")

r = stat("--once", t.pid)
check(r.returncode == 0 and f"pid {t.pid} (python3)" in r.stdout and "allocated_bytes" in r.stdout,
      "--once prints one table")
r = stat("--interval", "0.2", "--count", "3", t.pid)
check(r.returncode == 0 and r.stdout.count(f"pid {t.pid}") == 3 and "per second" in r.stdout,
      f"the live table refreshes 3 times with rates ({r.returncode})")

r = stat("--prometheus", t.pid)
lines = r.stdout.splitlines()
sample = re.compile(r'^(cxlpool_[a-z0-9_]+)\{([a-z_]+="(?:[^"\\\n]|\\.)*"(?:,[a-z_]+="(?:[^"\\\n]|\\.)*")*)\} '
                    r'(\d+(?:\.\d+)?)$')
typed, helped, bad, samples = set(), set(), [], 0
for line in lines:
    if line.startswith("# HELP "):
        helped.add(line.split()[2])
    elif line.startswith("# TYPE "):
        f = line.split()
        if len(f) != 4 or f[3] not in ("counter", "gauge"):
            bad.append(line)
        typed.add(f[2])
    else:
        m = sample.match(line)
        if not m or m.group(1) not in typed or m.group(1) not in helped:
            bad.append(line)
        samples += 1
check(r.returncode == 0 and not bad and samples > 30, f"--prometheus: text format, HELP/TYPE before samples "
      f"({samples} samples, bad: {bad[:3]})")
check(f'cxlpool_allocated_bytes{{pid="{t.pid}",program="python3",device=' in r.stdout,
      "--prometheus: per-device samples carry pid, program and device labels")

r = stat("--list")
check(r.returncode == 0 and re.search(rf"^\s*{t.pid}\s+python3\s+live$", r.stdout, re.M),
      "--list shows the target as live")
code, out, err = t.finish()
# The program's own at-exit table uses the same names.
head = next((l.split() for l in err.splitlines() if l.split()[:2] == ["device", "tier"]), [])
check(code == 0 and [m["name"] for m in schema if m["scope"] == "device"] == head[2:],
      f"CXLPOOL_STATS's columns are the schema's device metrics: {head}")
r = stat("--json", t.pid)
check(r.returncode == 2 and "no process" in r.stderr, f"an exited process: exit 2 ({r.returncode}, {r.stderr.strip()})")

# ---- a tiered program ----
# The hot loop runs until the target is told to finish: the test waits for the promotions
# (60 s guard) instead of a time that holds only on a machine as fast as this one.
hot = ("import time,threading\nh=[bytearray(3<<20) for i in range(3)]\ndef hot():\n  while True:\n"
       "    for x in h:\n      for o in range(0,len(x),4096): x[o]=1\n    time.sleep(0.005)\n"
       "threading.Thread(target=hot,daemon=True).start()")
devs = "fastmem:backing=shm,size=64M,tier=0;slowmem:backing=shm,size=1G,tier=1"
t = Target(extra=hot, run_args=["--devices", devs, "--policy", "bind:slowmem",
                                "--tiering=interval=50ms,monitors=pagemap_scan+hint"],
           env_extra={"CXLPOOL_STAT_INTERVAL_MS": "50"})
check(t.ready, "the tiered target runs its hot loop")
doc, waited, _ = json_until(t.pid, lambda d: d["process"].get("promote_bytes", 0) >= 9 << 20)
doc = doc or {}
proc = doc.get("process", {})
print(f"info  promotions seen after {waited:.1f} s")
check(proc.get("tiering_running") == 1 and proc.get("units", 0) > 0 and proc.get("scans", 0) > 0,
      f"a tiered program: engine running, units tracked, monitors collected ({proc})")
check(proc.get("pgpromote_success", 0) > 0 and proc.get("promote_bytes", 0) >= 9 << 20,
      f"a tiered program: its hot buffers were promoted ({proc.get('pgpromote_success')} pages)")
check(any(tier.get("hot_bytes", 0) > 0 for tier in doc.get("tiers", [])) or proc.get("pgpromote_success", 0) > 0,
      "a tiered program: hot bytes or promotions are published")
r = stat("--once", t.pid)
check("tiering: running, kernel=" in r.stdout, "the table says the engine runs and its kernel mode")
fence = proc.get("write_fence_mode")
check(fence in (1, 2, 3) and ("write fences: kernel-mode" in r.stdout) == (fence == 1),
      f"the stats carry the write-fence mode ({fence}) and the table says it")
if os.geteuid() == 0:
    check(fence == 1, "as root the write fences are kernel-mode")
t.finish()

# ---- a program that closes every descriptor it did not open keeps its page ----
t = Target(extra="os.closerange(3, 1<<20)", run_args=far_policy, env_extra={"CXLPOOL_STAT_INTERVAL_MS": "50"})
r = stat("--json", t.pid)
check(t.ready and r.returncode == 0 and json.loads(r.stdout)["publishes"] >= 1,
      f"after closerange(3, ...) the page is found through its mapping ({r.returncode}, {r.stderr.strip()})")
t.finish()

# ---- exit codes ----
r = stat("--json", 2 ** 22 + 7)  # above pid_max
check(r.returncode == 2, f"no such process: exit 2 ({r.returncode}, {r.stderr.strip()})")
plain = subprocess.Popen(["sleep", "30"])
r = stat("--json", plain.pid)
check(r.returncode == 3 and "no cxlpool stats page" in r.stderr, f"a plain program: exit 3 ({r.stderr.strip()})")
plain.kill()
plain.wait()
t = Target(run_args=far_policy, env_extra={"CXLPOOL_STAT_PAGE": "0"})
r = stat("--json", t.pid)
check(t.ready and r.returncode == 3, f"CXLPOOL_STAT_PAGE=0: exit 3 ({r.returncode})")
t.finish()

# A fork child (no exec) has no page of its own and does not show its parent's. The child
# names itself once fork() has returned in it (its fork handlers have run by then); the
# parent's fork() may return long before the child runs on a busy machine.
pidfile = f"/tmp/cxlpool-stat-test-{os.getpid()}.child"
t = Target(extra="pid=os.fork()\nif pid==0:\n"
                 f"  open({pidfile!r}+'.tmp','w').write(str(os.getpid())); os.rename({pidfile!r}+'.tmp',{pidfile!r})\n"
                 "  import time; os.closerange(0,3); time.sleep(30); os._exit(0)\n",
           run_args=far_policy, env_extra={"CXLPOOL_STAT_INTERVAL_MS": "50"})
child = 0
for _ in range(600):  # a hang guard only: the child names itself as soon as it runs
    if not t.ready or os.path.exists(pidfile):
        break
    time.sleep(0.1)
if t.ready and os.path.exists(pidfile):
    child = int(open(pidfile).read())
    os.unlink(pidfile)
r = stat("--json", child)
check(child > 0 and r.returncode == 3, f"a fork child: exit 3, no page ({r.returncode}, {r.stderr.strip()})")
check(stat("--json", t.pid).returncode == 0, "its parent still has its page")
if child > 0:
    os.kill(child, signal.SIGKILL)
t.finish()

# A forged page: a memfd of that name holding something else.
forger = subprocess.Popen([PY, "-c", "import os,sys\nfd=os.memfd_create('cxlpool-stats',0)\n"
                           "os.write(fd,b'NOTSTATS'*64)\nprint('ready',flush=True)\nsys.stdin.readline()"],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env())
forger.stdout.readline()
r = stat("--json", forger.pid)
check(r.returncode == 5 and "not a cxlpool stats page" in r.stderr, f"a forged page: exit 5 ({r.stderr.strip()})")
forger.communicate("\n", timeout=30)

# A stopped program: stale after three intervals (at least 3 s), numbers still printed.
t = Target(run_args=far_policy, env_extra={"CXLPOOL_STAT_INTERVAL_MS": "100"})
os.kill(t.pid, signal.SIGSTOP)
time.sleep(3.5)
r = stat("--json", t.pid)
doc = json.loads(r.stdout or "{}")
check(r.returncode == 6 and doc.get("stale") is True, f"a stopped program: exit 6, stale ({r.returncode})")
os.kill(t.pid, signal.SIGCONT)
doc, waited, r = json_until(t.pid, lambda d: d.get("stale") is False, limit=30)
check(r.returncode == 0, f"resumed: fresh again (after {waited:.1f} s)")
t.finish()

# Another user's process: permission denied.
t = Target(run_args=far_policy)
if os.geteuid() == 0 and os.path.exists("/usr/bin/setpriv"):
    r = subprocess.run(["/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", stat_tool, "--json",
                        str(t.pid)], capture_output=True, text=True, timeout=60)
    check(r.returncode == 4 and "permission denied" in r.stderr, f"another user's process: exit 4 ({r.stderr.strip()})")
else:
    print("CXLPOOL-NOTE: not root: the other-user case is not run")
t.finish()

# ---- hostile pages: a process that is not a cxlpool program holds a memfd named cxlpool-stats ----
# The forger's prelude: header() builds a version-1 header of its own pid, slot() a metric
# descriptor; SEALS are the publisher's (seal, shrink, grow, future write). The forgers below
# hold an odd sequence while their page looks valid: a reader that maps it then waits in its
# seqlock loop, and the forger changes the page under it (so the tests fail reliably without
# the checks, not once in a hundred reads).
FORGE = r'''
import fcntl, mmap, os, struct, sys, time
SEALS = 0x1 | 0x2 | 0x4 | 0x10
def header(total, counts=(0, 0, 0), max_devices=0, n_tiers=0, n_devices=0, offsets=None, seq=2):
    n = sum(counts)
    mo = 256
    do = mo + n * 128
    vo = do + max_devices * 64
    mo, do, vo = offsets or (mo, do, vo)
    now = time.time_ns()
    h = b"CXLPSTAT" + struct.pack("<IIQiIQQQQQ", 1, 256, total, os.getpid(), 1000, seq, now, now, time.monotonic_ns(), 1)
    h += struct.pack("<IIIIIIIIII", n, max_devices, n_devices, n_tiers, mo, do, vo, *counts)
    return (h + b"forger".ljust(64, b"\0")).ljust(256, b"\0")
def slot(scope, name):
    return struct.pack("<BB6x", scope, 2) + name.ljust(40, b"\0") + b"count".ljust(16, b"\0") + b"forged".ljust(64, b"\0")
'''


def forger(body):
    p = subprocess.Popen([PY, "-c", FORGE + body], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True,
                         env=env())
    ready = p.stdout.readline().strip() == "ready"
    return p, ready


def stat_measured(*args):
    """Runs cxlpool-stat; its exit status (negative: killed by that signal), stderr, peak RSS in KiB."""
    with tempfile.TemporaryFile() as o, tempfile.TemporaryFile() as e:
        p = subprocess.Popen([stat_tool, *map(str, args)], stdout=o, stderr=e)
        _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        e.seek(0)
        return p.returncode, e.read().decode(errors="replace").strip(), usage.ru_maxrss


def hammer(pid, runs):
    """cxlpool-stat --json PID, runs times: {exit status: {message without its /proc path: how many}}."""
    seen = {}
    for _ in range(runs):
        r = stat("--json", pid)
        why = re.sub(r"^cxlpool-stat: (/proc/\S+: |process \d+: )?", "", r.stderr.strip())[:100]
        seen.setdefault(r.returncode, {}).setdefault(why, 0)
        seen[r.returncode][why] += 1
    return seen


# What the reader itself costs (its peak RSS as wait4 reports it includes what the forked child
# had before exec): the bound below is this plus 16 MiB.
_, _, base_rss = stat_measured("--schema")


# A huge page (256 MiB, sparse: costs the forger nothing), its header claiming that size: refused
# without being copied, unsealed or sealed as the publisher seals (then the size bound refuses it).
for sealed in (False, True):
    seal = "fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)" if sealed else ""
    f, ready = forger(f"fd = os.memfd_create('cxlpool-stats', os.MFD_ALLOW_SEALING)\nos.ftruncate(fd, 256 << 20)\n"
                      f"os.pwrite(fd, header(256 << 20), 0)\n{seal}\nprint('ready', flush=True)\ntime.sleep(60)")
    code, err, rss = stat_measured("--json", f.pid)
    what = "sealed" if sealed else "unsealed"
    check(ready and code == 5 and "not a cxlpool stats page" in err and rss < base_rss + (16 << 10),
          f"a forged 256 MiB page ({what}): exit 5, peak RSS {rss} KiB (--schema: {base_rss}) ({code}, {err})")
    f.kill()
    f.wait()

# A forger that shrinks its page to nothing and grows it back, again and again, while the reader
# maps it: never a signal (SIGBUS), only clean refusals (it is not sealed) or reports.
f, ready = forger("fd = os.memfd_create('cxlpool-stats', 0)\nprint('ready', flush=True)\nwhile True:\n"
                  "  os.ftruncate(fd, 4096); os.pwrite(fd, header(4096, seq=3), 0); time.sleep(0.002)\n"
                  "  os.ftruncate(fd, 0); time.sleep(0.001)")
seen = hammer(f.pid, 200)
check(ready and all(c in (0, 5, 6) for c in seen), f"a page truncated and regrown in a loop: 200 reads, no signal {seen}")
f.kill()
f.wait()

# A forger whose page passes every check when mapped (sealed, of the right size and shape) but
# whose header then turns to offsets or counts far beyond the page, or whose first descriptor's
# scope turns to garbage (through a writable mapping made before the seals, which
# F_SEAL_FUTURE_WRITE leaves alone): the reader checks its copy again and never reads outside it.
f, ready = forger(r'''
fd = os.memfd_create("cxlpool-stats", os.MFD_ALLOW_SEALING)
os.ftruncate(fd, 4096)
m = mmap.mmap(fd, 4096)
good = header(4096, (1, 1, 1), 1, 1, 1)
m[0:256] = good
m[256:640] = slot(1, b"forged_a") + slot(2, b"forged_b") + slot(3, b"forged_c")
fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)
bad = [header(4096, (4000000, 0, 0), 1, 1, 1, offsets=(256, 640, 4000)),
       header(4096, (1, 1, 1), 1, 1, 1, offsets=(0x7fffff00, 640, 704)),
       header(4096, (1, 1, 1), 1, 1, 1, offsets=(256, 640, 0x7ffff000)),
       header(4096, (1, 1, 1), 200, 1, 200)]
print("ready", flush=True)
writing = header(4096, (1, 1, 1), 1, 1, 1, seq=3)
i = 0
while True:
    m[0:256] = writing
    m[256] = 1
    time.sleep(0.001)
    m[0:256] = bad[i % len(bad)] if i % 5 else good
    m[256] = 1 if i % 5 else 0xee
    time.sleep(0.001)
    i += 1
''')
seen = hammer(f.pid, 200)
changed = sum(n for why, n in seen.get(5, {}).items() if "changed after it was mapped" in why or "malformed" in why)
check(ready and all(c in (0, 5, 6) for c in seen) and changed > 0,
      f"a page whose header flips while it is read: 200 reads, no signal, {changed} refused in the copy {seen}")
f.kill()
f.wait()

# A process holding another process's real page (its descriptor, opened through /proc) is refused.
t = Target(run_args=far_policy)
page_fd = next((n for n in os.listdir(f"/proc/{t.pid}/fd")
                if os.readlink(f"/proc/{t.pid}/fd/{n}").startswith("/memfd:cxlpool-stats")), None)
holder = subprocess.Popen([PY, "-c", "import os,sys\nfd=os.open(sys.argv[1],os.O_RDONLY)\nprint('ready',flush=True)\n"
                           "sys.stdin.readline()", f"/proc/{t.pid}/fd/{page_fd}"],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env())
holder.stdout.readline()
r = stat("--json", holder.pid)
check(t.ready and page_fd and r.returncode == 5 and "belongs to another process" in r.stderr,
      f"another process's page, held open: exit 5 ({r.returncode}, {r.stderr.strip()})")
holder.communicate("\n", timeout=30)
t.finish()

# A zombie (exited, its parent, this script, has not reaped it): exit 2, and it says so.
z = subprocess.Popen([run_tool, *far_policy, "--", PY, "-c", "b=bytearray(4<<20)"], env=env())
state = ""
for _ in range(200):
    try:
        state = open(f"/proc/{z.pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        break
    if state == "Z":
        break
    time.sleep(0.05)
r = stat("--json", z.pid)
check(state == "Z" and r.returncode == 2 and "zombie" in r.stderr,
      f"a zombie: exit 2, says it exited ({state}, {r.returncode}, {r.stderr.strip()})")
z.wait()

# A cxlpool program in its own pid namespace (pid 1 there), read from this one by its pid here.
if os.geteuid() == 0 and shutil.which("unshare"):
    ns = subprocess.Popen(["unshare", "-p", "-f", "--mount-proc", run_tool, *far_policy, "--", PY, "-c",
                           TARGET.format(extra="")], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, env=env({"CXLPOOL_STAT_INTERVAL_MS": "50"}), text=True)
    ready = ns.stdout.readline().strip() == "ready"
    kids = open(f"/proc/{ns.pid}/task/{ns.pid}/children").read().split() if ready else []
    inner = int(kids[0]) if len(kids) == 1 else 0
    nspid = next((l.split()[1:] for l in open(f"/proc/{inner}/status") if l.startswith("NSpid:")), []) if inner else []
    check(ready and nspid == [str(inner), "1"], f"the program runs as pid 1 of its own namespace (NSpid {nspid})")
    time.sleep(0.2)
    r = stat("--json", inner)
    doc = json.loads(r.stdout) if r.returncode == 0 else {}
    far = [d for d in doc.get("devices", []) if d["tier"] > 0]
    check(r.returncode == 0 and doc.get("pid") == inner and doc.get("stale") is False and far and
          far[0]["allocated_bytes"] >= 32 << 20 and not r.stderr,
          f"another pid namespace: exit 0, the host pid, its 32 MiB ({r.returncode}, {r.stderr.strip()})")
    r = stat("--list")
    check(re.search(rf"^\s*{inner}\s+python3\s+live$", r.stdout, re.M) is not None,
          "--list shows the program of the other namespace")
    ns.communicate("\n", timeout=60)
else:
    print("CXLPOOL-NOTE: not root or no unshare: the pid namespace case is not run")

# Bad arguments and settings.
for args in (["--json", "--prometheus", "1"], ["--interval", "0", "1"], ["--count", "x", "1"], ["abc"], []):
    r = stat(*args)
    check(r.returncode == 1 and r.stderr.startswith("cxlpool-stat: "), f"bad arguments {args}: exit 1 ({r.stderr.strip()[:60]})")
for var, value in (("CXLPOOL_STAT_PAGE", "yes"), ("CXLPOOL_STAT_INTERVAL_MS", "3")):
    r = subprocess.run([run_tool, *far_policy, "--", PY, "-c", "print('ran')"], capture_output=True, text=True,
                       env=env({var: value}), timeout=60)
    check(r.returncode == 0 and r.stdout.strip() == "ran" and var in r.stderr and f"'{value}'" in r.stderr,
          f"{var}={value}: the program runs, the message names it ({r.stderr.strip()[:100]})")

print(f"cxlpool-stat: {failures} failure(s)")
sys.exit(1 if failures else 0)
