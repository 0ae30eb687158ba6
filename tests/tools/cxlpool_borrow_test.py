#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# Programs follow composed capacity (docs/compose.md, "Programs follow"), end to end: an
# unmodified program under cxlpool-run whose far device is borrowed from a shared pool's quota
# (CXLPOOL_DEVICES=lent:backing=pool:a@shm:NAME) allocates past its quota's grant; a composer
# daemon sees the demand and moves the idle quota's capacity to it, and the program's device
# grows while it runs (cxlpool-stat shows the device, its capacity and borrow refusals). Then a
# reclaim of the quota moves the program's data off the runs it gives back, its bytes intact;
# the program is killed and its capacity returns; the checker finds the pool clean. Quota a is
# locked: the program has its key, as a container given it by a CDI spec does. Also run as an
# unprivileged user where one exists.
import json
import os
import pwd
import signal
import subprocess
import sys
import time

compose, pool_tool, run_tool, stat_tool = sys.argv[1:5]
# The system's interpreter: one under root's home cannot run as another user.
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
failures = 0
name = f"cxlpool-borrowtest-{os.getpid()}"
dev = f"shm:{name}"

# Allocates 1 MiB buffers, each filled with its index, one every 10 ms up to 64 MiB, prints
# "filled", then checks every buffer on each line read from stdin, printing "intact" or "BAD".
PROGRAM = r"""
import sys, time
bufs = []
for i in range(64):
    b = bytearray(1 << 20)
    b[::4096] = bytes([i % 251]) * len(b[::4096])
    bufs.append(b)
    time.sleep(0.01)
print("filled", flush=True)
for line in sys.stdin:
    ok = all(all(x == i % 251 for x in b[::4096]) for i, b in enumerate(bufs))
    print("intact" if ok else "BAD", flush=True)
"""


def check(cond, what):
    global failures
    print(("ok    " if cond else "FAIL  ") + what, flush=True)
    if not cond:
        failures += 1


def quotas():
    r = subprocess.run([compose, "list", dev, "--json"], capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        return {}
    return {q["name"]: q for q in json.loads(r.stdout)["quotas"]}


def lent_device(pid):
    r = subprocess.run([stat_tool, "--json", str(pid)], capture_output=True, text=True, timeout=60)
    if r.returncode not in (0, 6):
        return None
    return next((d for d in json.loads(r.stdout)["devices"] if d["device"] == "lent"), None)


def can_move(prefix):
    """Whether this user may move memory (a userfaultfd that handles kernel faults)."""
    if not prefix:
        return os.geteuid() == 0 or open("/proc/sys/vm/unprivileged_userfaultfd").read().strip() == "1"
    return open("/proc/sys/vm/unprivileged_userfaultfd").read().strip() == "1"


def eventually(cond, seconds=60):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


def scenario(prefix, tag):
    r = subprocess.run([*prefix, pool_tool, "create", dev, "--size", "96M", "--extent", "1M", "--quota", "a=24M",
                        "--quota", "b=48M", "--heartbeat-ms", "5", "--timeout-ms", "200", "--mode", "600"],
                       capture_output=True, text=True, timeout=60)
    check(r.returncode == 0, f"{tag}: create a pool, quota a 24 MiB, b 48 MiB ({r.stderr.strip()})")
    daemon = subprocess.Popen([*prefix, compose, "daemon", dev, "--period", "20", "--hold-ms", "200"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    # Quota a locked, as a CDI spec hands it to a container (docs/compose.md, "Containers"):
    # without its key the program runs on default placement and says why; with it, as before.
    r = subprocess.run([*prefix, compose, "lock", dev, "a"], capture_output=True, text=True, timeout=60)
    key = r.stdout.strip()
    check(r.returncode == 0 and len(key) == 32, f"{tag}: lock quota a ({r.stderr.strip()})")
    env = dict(os.environ, CXLPOOL_DEVICES=f"lent:backing=pool:a@{dev},size=4M",
               CXLPOOL_POLICY="spill:near=lent,far=node0,watermark=95%")
    env.pop("CXLPOOL_QUOTA_KEY", None)
    r = subprocess.run([*prefix, run_tool, "--", "/bin/true"], env=env, capture_output=True, text=True, timeout=60)
    check(r.returncode == 0 and 'quota "a" is locked' in r.stderr,
          f"{tag}: without the key: the program runs, and is told the quota is locked ({r.stderr.strip()[:200]})")
    env["CXLPOOL_QUOTA_KEY"] = key
    prog = subprocess.Popen([*prefix, run_tool, "--", PYTHON, "-c", PROGRAM], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = prog.stdout.readline().strip()
        check(line == "filled", f"{tag}: the program allocated 64 MiB ({line or prog.stderr.read()[-400:]})")
        d = lent_device(prog.pid)
        check(d is not None and d["kind"] == "pool", f"{tag}: cxlpool-stat lists the borrowed device ({d})")
        # The composer moved b's idle extents to a while the program asked: the device holds
        # more than a's 24 MiB at creation.
        grew = eventually(lambda: (lent_device(prog.pid) or {}).get("resident_bytes", 0) > 24 << 20)
        d = lent_device(prog.pid) or {}
        q = quotas()
        check(grew and q["a"]["granted_extents"] > 24,
              f"{tag}: capacity moved to the program's quota while it ran (device resident "
              f"{d.get('resident_bytes', 0) >> 20} MiB of capacity {d.get('capacity_bytes', 0) >> 20} MiB, "
              f"a granted {q.get('a', {}).get('granted_extents')})")
        check(d.get("borrow_refusals", 0) > 0, f"{tag}: refusals counted before the grant came "
                                               f"({d.get('borrow_refusals')})")
        # b's demand comes back: the daemon stops, a reclaim of a's extents moves the program's
        # data off the runs it gives back.
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=60)
        held = quotas()["a"]
        before, granted_before = held["used_extents"], held["granted_extents"]
        r = subprocess.run([*prefix, compose, "reclaim", dev, "a", "16", "--extents", "--deadline", "20"],
                           capture_output=True, text=True, timeout=180)
        after = quotas()["a"]
        if can_move(prefix):
            # The grant drops by 16; the program gives back runs until it holds no more than that.
            check(r.returncode == 0 and after["granted_extents"] <= granted_before - 16 and
                  after["used_extents"] <= after["granted_extents"] and
                  (before <= after["granted_extents"] or after["used_extents"] < before),
                  f"{tag}: a reclaim of 16 extents takes runs back from the running program, moving what they "
                  f"hold ({before} -> {after['used_extents']} used; {r.stdout.strip()} {r.stderr.strip()})")
        else:
            # Without a userfaultfd for this user no memory can move (docs/devices.md): only the
            # runs that are empty go back, and the reclaim says what the quota still holds.
            check(r.returncode in (0, 2) and after["used_extents"] <= after["granted_extents"] and
                  (r.returncode == 0 or "still held" in r.stderr),
                  f"{tag}: without moves a reclaim takes the empty runs and names the rest "
                  f"({before} -> {after['used_extents']} used; {r.stdout.strip()} {r.stderr.strip()})")
        try:
            prog.stdin.write("check\n")
            prog.stdin.flush()
            answer = prog.stdout.readline().strip()
        except BrokenPipeError:
            answer = "the program ended: " + prog.stderr.read()[-300:]
        check(answer == "intact", f"{tag}: the program's 64 buffers are intact ({answer})")
        # A composer runs again (it recovers participants that die, as any participant does).
        daemon = subprocess.Popen([*prefix, compose, "daemon", dev, "--period", "20", "--hold-ms", "200"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        d = lent_device(prog.pid) or {}
        check(d.get("capacity_changes", 0) > 0, f"{tag}: the device's capacity changes are counted "
                                                f"({d.get('capacity_changes')})")
        prog.kill()
        prog.wait(timeout=60)
        # Killed, the program's runs return when a participant (the composer) recovers it.
        check(eventually(lambda: quotas().get("a", {}).get("used_extents", 1) == 0),
              f"{tag}: the killed program's capacity returned")
    finally:
        if prog.poll() is None:
            prog.kill()
            prog.wait(timeout=60)
        if daemon.poll() is None:
            daemon.send_signal(signal.SIGTERM)  # it leaves the pool
            daemon.wait(timeout=60)
    r = subprocess.run([*prefix, pool_tool, "check", dev], capture_output=True, text=True, timeout=120)
    check(r.returncode == 0, f"{tag}: the checker finds the pool clean ({r.stdout.strip()[-300:]})")
    subprocess.run([*prefix, pool_tool, "rm", dev], capture_output=True, timeout=60)


try:
    scenario((), "root" if os.geteuid() == 0 else "user")
    if os.geteuid() == 0:
        try:
            nobody = pwd.getpwnam("nobody")
            scenario(("setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups"),
                     "unprivileged")
        except KeyError:
            print("skip  unprivileged: no user 'nobody'")
finally:
    subprocess.run([pool_tool, "rm", dev], capture_output=True, timeout=60)

print(f"{failures} failure(s)")
sys.exit(1 if failures else 0)
