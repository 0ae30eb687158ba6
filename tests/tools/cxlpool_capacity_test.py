#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# cxlpool-capacity end to end: unmodified programs under cxlpool-run with CXLPOOL_CONTROL=1 keep
# running, and print exactly what they print without cxlpool, while an outside tool shrinks
# and grows the device holding their memory 20 times: python3 holding 200 MiB (large and small
# objects), and sort with half its input read when the capacity flaps. Also: exit codes and
# words for no control socket (a plain program, a fork child, no such process), an unknown
# device, bad arguments; a shrink nothing can make room for is refused (exit 2) and the
# program goes on. Dynamic capacity's offer and release (deadline, force: exit 4 when memory
# was lost).
import os
import subprocess
import sys
import tempfile
import time

capacity_tool, run_tool, device_peer = sys.argv[1], sys.argv[2], sys.argv[3]
PY = "/usr/bin/python3"
failures = 0


def check(cond, what):
    global failures
    print(("ok    " if cond else "FAIL  ") + what, flush=True)
    if not cond:
        failures += 1


def tool(*args):
    r = subprocess.run([capacity_tool, *map(str, args)], capture_output=True, text=True, timeout=300)
    return r.returncode, r.stdout, r.stderr


def fields(text):
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def fenced():
    # Moves that copy need a userfaultfd that handles kernel faults (docs/devices.md).
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.syscall(323, os.O_CLOEXEC)  # userfaultfd(2) on x86_64
    if fd >= 0:
        os.close(fd)
        return True
    try:
        os.close(os.open("/dev/userfaultfd", os.O_RDWR | os.O_CLOEXEC))
        return True
    except OSError:
        return False


FENCED = fenced()
ENV = dict(os.environ, CXLPOOL_CONTROL="1", CXLPOOL_POLICY="bind:cxl0", CXLPOOL_STAT_PAGE="0")
for k in ("CXLPOOL_DEVICES", "CXLPOOL_CONFIG", "CXLPOOL_TIERING"):
    ENV.pop(k, None)


def flap(pid, times, small):
    """Shrinks cxl0 of pid to `small` and grows it back, `times` times; returns (done, refused)."""
    code, out, err = tool(pid, "show", "cxl0")
    check(code == 0, f"show cxl0 of {pid}: exit {code} ({err.strip()})")
    if code != 0:
        return 0, 0
    full = int(fields(out)["capacity"])
    done = refused = 0
    for _ in range(times):
        code, out, err = tool(pid, "resize", "cxl0", small)
        if code == 2:
            refused += 1
            check("write fence" in out or "write fence" in err, f"a refused shrink says why: {out.strip()[-160:]}")
            continue
        check(code == 0, f"resize cxl0 {small}: exit {code} ({err.strip()} {out.strip()[-200:]})")
        code, out, err = tool(pid, "resize", "cxl0", full)
        check(code == 0, f"resize cxl0 back to {full}: exit {code} ({err.strip()})")
        done += 1
    code, out, _ = tool(pid, "show", "cxl0")
    f = fields(out)
    check(code == 0 and int(f["capacity"]) == full, f"cxl0 whole again: {f.get('capacity')} of {full}")
    return done, refused


HOLDER = r"""
import hashlib, sys
big = [bytes([i % 251]) * ((1 << 20) + 4096 * (i % 7)) for i in range(200)]
small = {("k%d" % i): ("v%d" % (i * 7919)) * (1 + i % 5) for i in range(200000)}
print("ready", flush=True)
sys.stdin.readline()
h = hashlib.sha256()
for b in big:
    h.update(b)
for k in sorted(small):
    h.update(k.encode() + small[k].encode())
print(h.hexdigest(), flush=True)
"""


def run_holder(under_cxlpool, times):
    cmd = ([run_tool, "--"] if under_cxlpool else []) + [PY, "-c", HOLDER]
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=ENV if under_cxlpool else None)
    ready = p.stdout.readline().strip()
    check(ready == "ready", f"python3 holds its 200 MiB{' under cxlpool-run' if under_cxlpool else ''} ({ready!r})")
    done = refused = 0
    if under_cxlpool:
        done, refused = flap(p.pid, times, "64M")
    out, err = p.communicate("go\n", timeout=300)
    check(p.returncode == 0, f"python3 exit {p.returncode} ({err.strip()[-300:]})")
    return out.strip(), done, refused


expected, _, _ = run_holder(False, 0)
got, done, refused = run_holder(True, 20)
check(got == expected and len(expected) == 64, f"python3 printed the same digest after {done} shrinks and growths")
if FENCED:
    check(done == 20, f"every shrink to 64M moved the program's memory out and back ({done} of 20)")
else:
    check(done + refused == 20, f"without a write fence the shrinks were refused, saying why ({refused} of 20)")

# sort: half its input read (in its buffers) when the capacity flaps.
with tempfile.TemporaryDirectory() as tmp:
    import random
    rnd = random.Random(7)
    lines = ["%016x %s\n" % (rnd.getrandbits(64), "x" * rnd.randrange(0, 200)) for _ in range(400000)]
    half = len(lines) // 2
    env = dict(ENV, LC_ALL="C")
    p = subprocess.Popen([run_tool, "--", "sort", "-S", "256M"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
    p.stdin.write("".join(lines[:half]))
    p.stdin.flush()
    # sort has read what it was given once its memory holds it: wait for the pool to hold 20 MiB.
    held = 0
    for _ in range(3000):
        code, out, _ = tool(p.pid, "show", "cxl0")
        held = int(fields(out).get("committed", 0)) if code == 0 else 0
        if held >= 20 << 20:
            break
        subprocess.run(["sleep", "0.01"])
    check(held >= 20 << 20, f"sort holds its input in cxl0 ({held >> 20} MiB)")
    done, refused = flap(p.pid, 20, "16M")
    out, err = p.communicate("".join(lines[half:]), timeout=300)
    check(p.returncode == 0, f"sort exit {p.returncode} ({err.strip()[-300:]})")
    check(out == "".join(sorted(lines)), f"sort's output is the sorted input after {done} shrinks and growths")

# Refusals and errors.
p = subprocess.Popen([run_tool, "--", PY, "-c", HOLDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                     stderr=subprocess.PIPE, text=True, env=dict(ENV, CXLPOOL_POLICY="bind:cxl0"))
p.stdout.readline()
code, out, err = tool(p.pid, "show", "nosuch")
check(code == 1 and "CXLPOOL_E_NOT_FOUND" in err and "not open" in out, f"an unknown device: exit {code} ({out.strip()})")
code, out, err = tool(p.pid, "show", "cxl0", "--timeout", 30)
check(code == 0 and "capacity=" in out, f"--timeout after the command: exit {code} ({err.strip()})")
code, out, err = tool("--timeout", 30, p.pid, "show", "cxl0", "--timeout", 30)
check(code == 1 and "given twice" in err, f"--timeout twice: exit {code} ({err.strip()})")
code, out, err = tool(p.pid, "resize", "cxl0", "1000")
check(code == 1 and "CXLPOOL_E_INVALID_ARGUMENT" in err, f"a bad size: exit {code} ({out.strip()[:120]})")
code, out, err = tool(p.pid, "withdraw", "cxl0", "0", "4K")
check(code in (0, 2), f"withdrawing the first page: exit {code} ({out.strip()[-160:]})")
withdrawn = code == 0
code, out, err = tool(p.pid, "add", "cxl0", "0", "4K")
check(code == (0 if withdrawn else 1), f"adding it back: exit {code} ({out.strip()[-120:]})")
# A socket named for the program but held by another process is never the one used.
import socket
squat = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
squat.bind(f"\0cxlpool-control.{p.pid}.0000000000000000")
squat.listen(4)
code, out, err = tool(p.pid, "show", "cxl0")
check(code == 0 and "capacity=" in out, f"a squatter's socket named for the program is not used: exit {code} ({err.strip()})")
squat.close()
# A stopped program: the tool gives up after its timeout instead of waiting for ever.
os.kill(p.pid, 19)  # SIGSTOP
# kill() returns before every thread has stopped: on a busy machine the control thread could
# still answer. Wait (bounded) until /proc shows each thread stopped.


def all_stopped(pid):
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
        return all(open(f"/proc/{pid}/task/{t}/stat").read().rsplit(")", 1)[1].split()[0] == "T" for t in tasks)
    except OSError:
        return False


for _ in range(600):
    if all_stopped(p.pid):
        break
    time.sleep(0.05)
code, out, err = tool("--timeout", 2, p.pid, "show", "cxl0")
os.kill(p.pid, 18)  # SIGCONT
check(code == 3 and "no reply within 2 s" in err, f"a stopped program: exit {code} ({err.strip()})")
p.communicate("go\n", timeout=300)
check(p.returncode == 0, f"the program finished normally ({p.returncode})")

# Dynamic capacity: an offer judged extent by extent, a release tried until its deadline, and a
# forced release that moves what it can and reports what it could not (exit 4).
BA = r"""
import sys
ba = bytearray(b'\xab') * (40 << 20)
print("ready", flush=True)
sys.stdin.readline()
print(ba.count(0xab), len(ba), flush=True)
"""
p = subprocess.Popen([run_tool, "--devices", "big:backing=shm,size=64M,max_size=256M", "--policy",
                      "threshold:size=32M,device=big|bind:near", "--", PY, "-c", BA],
                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
check(p.stdout.readline().strip() == "ready", "python3 holds a 40 MiB bytearray on device big")
code, out, err = tool(p.pid, "offer", "big", "64M", "64M", "96M", "8M", "512M", "64M")
verdicts = [l for l in out.splitlines() if l.startswith("verdict=")]
check(code == 1 and len(verdicts) == 3 and "accepted" in verdicts[0] and "rejected CXLPOOL_E_INVALID_ARGUMENT" in verdicts[1]
      and "rejected CXLPOOL_E_CAPACITY" in verdicts[2] and fields(out).get("capacity_after") == str(128 << 20),
      f"an offer: one extent accepted, an overlapping one and one past max_size rejected: exit {code} ({out.strip()})")
code, out, err = tool(p.pid, "release", "big", "64M", "64M", "--deadline", "5")
check(code == 0 and fields(out).get("attempts") == "1" and fields(out).get("capacity_after") == str(64 << 20),
      f"the offered extent, unused, is released at the first attempt: exit {code} ({out.strip()[-200:]})")
code, out, err = tool(p.pid, "release", "big", "0", "48M", "--deadline", "0.3")
check(code == 0 or (code == 2 and "still held at the deadline" in out),
      f"a release of the bytearray's range: moved out, or still held at the deadline: exit {code} ({out.strip()[-200:]})")
if code == 0:  # moved out: growing back brings it home, for the forced release to find
    code, out, err = tool(p.pid, "add", "big", "0", "48M")
    check(code == 0 and fields(out).get("returned_units") == "1", f"grown back, the bytearray went home: exit {code} ({out.strip()[-200:]})")
code, out, err = tool(p.pid, "release", "big", "0", "48M", "--force")
lost = [l for l in out.splitlines() if l.startswith("lost=")]
moved = code == 0 and not lost
check(moved or (code == 4 and lost and "contents=zeros" in lost[0] and int(fields(out)["lost_bytes"]) > 0),
      f"a forced release: moved out (exit 0), or lost and reported (exit 4): exit {code} ({out.strip()[-300:]})")
got, err = p.communicate("go\n", timeout=120)
count, length = (int(x) for x in got.split())
check(p.returncode == 0, f"python3 went on after the forced release (exit {p.returncode}, {err.strip()[-200:]})")
check(length == 40 << 20 and (count == length if moved else count < length),
      f"its bytes: {'intact' if moved else 'zeros where lost'} ({count} of {length} still 0xab)")
if lost:
    check("forced release" in err and "reads as zeros" in err, "the loss is said on stderr too")
for args in [["1", "release", "big", "0"], ["1", "release", "big", "0", "4K", "--deadline"],
             ["1", "release", "big", "0", "4K", "--deadline", "-1"], ["1", "offer", "big", "0"],
             ["1", "withdraw", "big", "0", "4K", "--force"], ["1", "release", "big", "0", "4K", "--deadline", "1e3"],
             ["1", "release", "big", "0", "4K", "--force", "--force"]]:
    code, out, err = tool(*args)
    check(code == 1, f"bad arguments {args}: exit {code}")

# A program whose only pool is shared answers too: its pool's device, which no change can resize.
name = f"cxlpool-capacity-test-{os.getpid()}"
holder = subprocess.Popen([device_peer, "shared", f"shm:{name}"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, env=ENV)
check(holder.stdout.readline().strip() == "ready", "a program holds 1 MiB of a 16 MiB shared pool")
code, out, err = tool(holder.pid, "show", f"shm:{name}")
check(code == 0 and fields(out).get("capacity") == str(16 << 20) and int(fields(out).get("committed", 0)) >= 1 << 20,
      f"a program with only a shared pool answers; show names its size and its bytes: exit {code} ({out.strip()[-200:]})")
code, out, err = tool(holder.pid, "resize", f"shm:{name}", "8M")
check(code == 2 and "CXLPOOL_E_BUSY" in err and "holds the shared pool" in out,
      f"resizing a shared pool's device is BUSY, saying why: exit {code} ({(out + err).strip()[-200:]})")
code, out, err = tool(holder.pid, "show", f"shm:{name}")
counters = ["grows", "shrinks", "refusals", "relocated", "evacuated_units", "evacuated_bytes", "forced",
            "lost_units", "lost_bytes"]
check(code == 0 and all(fields(out).get(k) == "0" for k in counters) and "max_space" in fields(out),
      f"show gives a shared pool's device the keys of any device, its counters 0: ({out.strip()[-300:]})")
holder.communicate("go\n", timeout=60)
check(holder.returncode == 0, f"the shared pool's holder finished normally ({holder.returncode})")
check(not os.path.exists(f"/dev/shm/{name}"), "and its pool is gone")

# A reply is one "key=value" per line whatever the names hold: a shm name may hold any byte but
# '/', so a pool named with a newline, shown through a link to it, must not add a line.
odd = f"{name}-odd\nshrinks=9"
holder = subprocess.Popen([device_peer, "shared", f"shm:{odd}"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, env=ENV)
check(holder.stdout.readline().strip() == "ready", "a program holds a shared pool whose name has a newline")
with tempfile.TemporaryDirectory() as links:
    link = os.path.join(links, "pool")
    os.symlink(f"/dev/shm/{odd}", link)
    code, out, err = tool(holder.pid, "show", link)
lines = out.splitlines()
check(code == 0 and sum(1 for l in lines if l.startswith("shrinks=")) == 1 and fields(out).get("shrinks") == "0"
      and fields(out).get("shared_pool", "").endswith("-odd\\x0Ashrinks=9"),
      f"its name is shown on one line, control bytes escaped: exit {code} ({out.strip()[-300:]!r})")
holder.communicate("go\n", timeout=60)
check(holder.returncode == 0 and not os.path.exists(f"/dev/shm/{odd}"), "its holder finished and its pool is gone")

plain = subprocess.Popen([PY, "-c", "import sys; print('ready', flush=True); sys.stdin.readline()"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
plain.stdout.readline()
code, out, err = tool(plain.pid, "show", "cxl0")
check(code == 3 and "CXLPOOL_CONTROL=1" in err, f"a program without a control socket: exit {code} ({err.strip()})")
plain.communicate("go\n")
forker = subprocess.Popen(
    [run_tool, "--", PY, "-c",
     "import os, sys\npid = os.fork()\nif pid == 0:\n    sys.stdin.readline(); os._exit(0)\n"
     "print(pid, flush=True)\nsys.stdin.readline()\nos.waitpid(pid, 0)\n"],
    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
child = int(forker.stdout.readline())
code, out, err = tool(child, "show", "cxl0")
check(code == 3, f"a fork child does not answer on its parent's socket: exit {code} ({err.strip()})")
code, out, err = tool(forker.pid, "show", "cxl0")
check(code == 0, f"its parent still does: exit {code}")
forker.communicate("go\ngo\n", timeout=60)
code, out, err = tool(2**22 + 12345, "show", "cxl0")
check(code == 3, f"no such process: exit {code}")
for args in [[], ["abc", "show", "cxl0"], ["1", "frob", "cxl0"], ["1", "resize", "cxl0"], ["1", "show", "a b"]]:
    code, out, err = tool(*args)
    check(code == 1, f"bad arguments {args}: exit {code}")

print(f"cxlpool-capacity: {failures} failure(s)")
sys.exit(1 if failures else 0)
