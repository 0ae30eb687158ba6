#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# The two-host test bed: two QEMU guests (TCG) whose CPU-less node 1 is the same host file in
# /dev/shm, soft-reserved so that each guest kernel exposes it as /dev/dax0.0 (device-DAX, the
# interface of real CXL memory), plus a host process mapping the file directly. Every
# participant runs one scenario of vm_multihost (ids: guests 0 and 1, host process 2); this
# runner drives the scenario (kill, pool-kill, pool-compose: SIGKILL to guest 0's QEMU), reads
# the shared file back and makes the assertions. pool-kill: the three are participants (host
# indices 0, 1, 2) of one cxlpool shared pool that the runner creates on the file before the
# guests boot; pool-compose: the same, with a quota per guest and a composer on the host.
# Skips visibly (CXLPOOL-SKIP) when QEMU or the kernel is missing, unless --require.
# docs/testing.md says what the bed can and cannot show.
#
#   run_multihost_test.py --scenario smoke --cache /var/cache/cxlpool-vm \
#       --initrd build/tests/vm/initramfs.cpio.gz --program build/tests/vm/vm_multihost \
#       --log-dir /tmp/mh [-- --key=value ...]      (after --: passed to every participant)
import argparse
import ctypes
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time

from vmlib import Checker, died_before_plan, qemu_command, require_runnable, sections, size_mib

GUESTS = 2
HOST_ID = 2
VICTIM = 0  # the kill scenarios' victim: guest 0 (vm_multihost's --victim default)
RUNNING = r"CXLPOOL-MH RUNNING id=(\d+)"

_libc = ctypes.CDLL(None, use_errno=True)


def die_with_parent():
    _libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: no QEMU outlives a killed runner


def bed_spec(size, smp):
    """node0: the guest's own 1 GiB of RAM, all below 4 GiB; node1: the shared file, placed at
    4 GiB and soft-reserved there (memmap=SIZE%4G-1+0xefffffff), so dax_hmem makes it
    /dev/dax0.0 with offset 0 = offset 0 of the file."""
    cpus = int((re.search(r"maxcpus=(\d+)", smp) or re.match(r"(\d+)", smp)).group(1))
    return {"nodes": [("0" if cpus == 1 else f"0-{cpus - 1}", "1G"), (None, size)],
            "dist": {}, "hmat": [], "smp": smp, "machine": ["max-ram-below-4g=1G"],
            "append": f"memmap={size}%0x100000000-1+0xefffffff"}


class Participant:
    """A child process (a guest's QEMU, or vm_multihost on the host) whose output lines are
    collected as they arrive, each stamped with the host's CLOCK_MONOTONIC."""

    def __init__(self, name, cmd, pass_fds=()):
        self.name, self.cmd = name, cmd
        self.started = time.monotonic_ns()
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     pass_fds=pass_fds, preexec_fn=die_with_parent)
        self.lines, self.lock = [], threading.Lock()
        self.thread = None

    def start_reader(self):
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        fd, rest = self.proc.stdout.fileno(), b""
        while True:
            chunk = os.read(fd, 65536)
            t = time.monotonic_ns()
            if chunk:
                *complete, rest = (rest + chunk).split(b"\n")
            else:
                complete, rest = [rest] if rest else [], b""
            with self.lock:
                self.lines += [(t, l.decode(errors="replace").rstrip("\r")) for l in complete]
            if not chunk:
                return

    def find(self, pattern):
        with self.lock:
            return next(((t, m) for t, l in self.lines if (m := re.search(pattern, l))), None)

    def log(self):
        with self.lock:
            return "\n".join(l for _, l in self.lines)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        if self.thread:
            self.thread.join(5)


class Bed:
    """One attempt: the shared file, two guests and the host process."""

    def __init__(self, a, kernel, extra, pid_dir, attempt):
        self.a, self.kernel, self.extra = a, kernel, extra
        self.pidfiles = [os.path.join(pid_dir, f"qemu{i}-{attempt}.pid") for i in range(GUESTS)]
        self.participants = GUESTS + (0 if a.no_host else 1)
        self.nonce = secrets.randbits(63)
        # pool-kill: the cxlpool pool takes [0, pool size) of the file, vm_multihost's own
        # layout (header, slots, handle boxes) the 2 MiB after it.
        self.pool = a.scenario in ("pool-kill", "pool-compose")
        self.layout = [f"--layout-offset={size_mib(a.pool_size) << 20}"] if self.pool else []
        # Unique per run. The name is removed as soon as both QEMUs have mapped the file, so a
        # runner killed later (a CTest timeout) leaves nothing behind in /dev/shm -- except for
        # pool-kill, whose host process and final check open the pool by name (cxlpool refuses
        # symbolic links such as /dev/fd/N): the name goes in close(), and each pool-kill
        # runner first removes the names left by runners that are gone.
        self.path = f"{SHM_PREFIX}{os.getpid()}-{attempt}-{self.nonce:x}"
        self.fd, self.guests, self.host, self.t_kill = None, [], None, None

    def program(self, *args):
        """vm_multihost on the host, on the shared file (through the runner's descriptor)."""
        return [self.a.program, *args, f"--path=/dev/fd/{self.fd}", *self.layout]

    def pool_command(self, *args):
        """vm_multihost's commands on the cxlpool pool, by its name."""
        out = subprocess.run([self.a.program, *args, f"--pool=file:{self.path}"], capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"vm_multihost {args[0]} failed: {out.stdout}{out.stderr}")
        return dict(l.split("=", 1) for l in out.stdout.splitlines() if "=" in l)

    def start(self):
        a = self.a
        if self.pool:  # cxlpool creates the file (it refuses an existing name), then it is extended
            sweep_stale_files()
            made = self.pool_command("pool-create", f"--pool-size={size_mib(a.pool_size) << 20}",
                                     f"--device-size={size_mib(a.size) << 20}", f"--hosts={self.participants}",
                                     f"--host-index={HOST_ID}", f"--heartbeat-ms={a.pool_heartbeat_ms}",
                                     f"--lease-ms={a.pool_lease_ms}",
                                     *([f"--quota-bytes={size_mib(a.quota_size) << 20}"]
                                       if a.scenario == "pool-compose" else []))
            self.fd = os.open(self.path, os.O_RDWR)
            print(f"pool: file:{self.path}, {made.get('pool_size')} of {size_mib(a.size) << 20} bytes, "
                  f"{made.get('extents')} extents of {made.get('extent_size')}, {self.participants} hosts, coherence "
                  f"NONE, heartbeat {a.pool_heartbeat_ms} ms, lease {a.pool_lease_ms} ms")
        else:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            os.ftruncate(self.fd, size_mib(a.size) << 20)
        init = subprocess.run(self.program("init", f"--nonce={self.nonce}", f"--participants={self.participants}",
                                           f"--iterations={a.iterations}", f"--rounds={a.rounds}",
                                           f"--period-ms={a.period_ms}", f"--misses={a.misses}"),
                              pass_fds=(self.fd,), capture_output=True, text=True)
        if init.returncode != 0:
            raise RuntimeError(f"vm_multihost init failed: {init.stdout}{init.stderr}")
        spec = bed_spec(a.size, a.smp)
        for i in range(GUESTS):
            mh = ",".join([a.scenario, str(i), f"--nonce={self.nonce}", *self.layout, *self.extra])
            cmd = qemu_command(spec, self.kernel, a.initrd, f"cxlpool.plan=multihost cxlpool.mh={mh}",
                               files={1: self.path}, pidfile=self.pidfiles[i])
            self.guests.append(Participant(f"guest{i}", cmd))
        if not a.no_host:
            pool = [f"--pool=file:{self.path}"] if self.pool else []
            self.host = Participant("host", self.program(a.scenario, str(HOST_ID), f"--nonce={self.nonce}", *pool,
                                                         *self.extra), pass_fds=(self.fd,))
        for p in self.all():
            p.start_reader()
        deadline = time.monotonic() + 120  # a hang guard: QEMU maps the file before the guest boots
        while any(p.proc.poll() is None and not mapped(p.proc.pid, self.path) for p in self.guests):
            if time.monotonic() > deadline:
                break
            time.sleep(0.02)
        if not self.pool:
            self.remove_file()

    def all(self):
        return self.guests + ([self.host] if self.host else [])

    def remove_file(self):
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def early_panic(self):
        for g in self.guests:
            if g.proc.poll() is not None and (panic := died_before_plan(g.log())):
                return f"{g.name}: {panic}"
        return None

    def wait_exit(self, deadline):
        """Waits for every participant to end; False at the deadline. Returns at once when a
        guest died in early boot: the others would only wait for it until their barrier times out."""
        while any(p.proc.poll() is None for p in self.all()):
            if time.monotonic() > deadline or self.early_panic():
                return False
            time.sleep(0.05)
        for p in self.all():
            p.thread.join(5)
        return True

    def inspect(self):
        out = subprocess.run(self.program("inspect"), pass_fds=(self.fd,), capture_output=True, text=True).stdout
        return dict(l.split("=", 1) for l in out.splitlines() if "=" in l)

    def close(self):
        for p in self.all():
            p.stop()
        self.remove_file()
        if self.fd is not None:
            os.close(self.fd)


SHM_PREFIX = "/dev/shm/cxlpool-mh-"


def sweep_stale_files():
    """Removes the shared files of runners that are gone (cxlpool-mh-PID-...: PID not running)."""
    for name in os.listdir("/dev/shm"):
        m = re.match(r"cxlpool-mh-(\d+)-", name)
        if m and not os.path.exists(f"/proc/{m.group(1)}"):
            try:
                os.unlink(os.path.join("/dev/shm", name))
                print(f"removed /dev/shm/{name}, left by a runner that is gone")
            except OSError:
                pass


def mapped(pid, path):
    try:
        with open(f"/proc/{pid}/maps") as f:
            return path in f.read()
    except OSError:
        return False


# ---- scenarios: an optional driver (runs while the participants run) and the assertions ----

def drive_kill(bed, deadline):
    """Once both guests (and the host process) report that they see every peer beating,
    SIGKILL guest 0's QEMU, pid from its -pidfile."""
    while not all(p.find(RUNNING) for p in bed.all()):
        if time.monotonic() > deadline or any(p.proc.poll() is not None for p in bed.all()):
            return  # a participant ended first: the assertions say what went wrong
        time.sleep(0.01)
    time.sleep(0.2)  # a few more beats seen by everyone
    target = bed.a.kill_guest  # VICTIM, unless a negative control kills the other guest
    with open(bed.pidfiles[target]) as f:
        pid = int(f.read())
    bed.t_kill = time.monotonic_ns()
    os.kill(pid, signal.SIGKILL)
    print(f"killed guest{target}'s QEMU (pid {pid}, SIGKILL) "
          f"{(bed.t_kill - bed.guests[target].started) / 1e9:.1f} s after it started")


def check_smoke(c, bed, st):
    a, n = bed.a, bed.participants
    total = int(st.get("counter", -1))
    c(total == n * a.iterations, f"atomic total {total} = {n} x {a.iterations} lock xadd (exact, read from the file)")
    for p in range(n):
        c(int(st.get(f"slot{p}.own", -1)) == a.iterations, f"participant {p}: {a.iterations} plain increments "
          f"on its own line (got {st.get(f'slot{p}.own')})")
        for q in range(p + 1, n):
            c(int(st.get(f"pair{p}{q}", -1)) == 2 * a.rounds, f"ping-pong {p}<->{q}: {a.rounds} round trips")
    control = int(st.get("control", 0))
    spans = [(int(st.get(f"slot{p}.first_seen", 0)), int(st.get(f"slot{p}.last_seen", 0))) for p in range(n)]
    overlapped = all(x[0] < y[1] and y[0] < x[1] for i, x in enumerate(spans) for y in spans[i + 1:])
    print(f"non-atomic control on one shared line: {control} of {n * a.iterations} "
          f"({100 - 100 * control / (n * a.iterations):.1f}% lost); runs overlapped: {'yes' if overlapped else 'no'} "
          f"(counter spans {spans})")


def check_kill(c, bed, st):
    a, victim = bed.a, bed.guests[VICTIM]
    c(bed.t_kill is not None, f"guest{VICTIM} was killed once every participant reported RUNNING")
    if bed.t_kill is None:
        return
    c(victim.proc.returncode == -signal.SIGKILL, f"guest{VICTIM}'s QEMU ended by SIGKILL (rc {victim.proc.returncode})")
    c(st.get(f"slot{VICTIM}.state") == "running", f"guest{VICTIM} was running when killed (never finished)")
    survivors = [p for p in range(bed.participants) if p != VICTIM]
    for p in survivors:
        c(st.get(f"slot{p}.state") == "done", f"participant {p} finished cleanly after the death")
        c(st.get(f"slot{p}.dead_mask") == str(1 << VICTIM),
          f"participant {p} declared exactly guest{VICTIM} dead (dead mask {st.get(f'slot{p}.dead_mask')})")
        beats, victim_beats = int(st.get(f"slot{p}.heartbeat", 0)), int(st.get(f"slot{VICTIM}.heartbeat", 0))
        c(beats > victim_beats, f"participant {p} kept beating after the kill ({beats} beats, "
          f"guest{VICTIM} {victim_beats})")
    for p in range(bed.participants):
        c(st.get(f"slot{p}.area") == "intact", f"data area of participant {p}, written before the kill, intact")
    # Detection latency, on the host's clock only: guest 1's DEAD line as it reached the
    # console; the host process's own CLOCK_MONOTONIC stamp.
    lease = a.misses * a.period_ms
    for who in [p for p in bed.all() if p is not victim]:
        hit = who.find(rf"CXLPOOL-MH DEAD id=\d+ peer={VICTIM} mono_ns=(\d+)")
        if not hit:
            c(False, f"{who.name} reported guest{VICTIM}'s death")
            continue
        t = int(hit[1].group(1)) if who is bed.host else hit[0]
        ms = (t - bed.t_kill) / 1e6
        how = "its CLOCK_MONOTONIC" if who is bed.host else "console arrival"
        c(0 < ms < lease + a.slack_ms, f"{who.name} detected guest{VICTIM}'s death {ms:.1f} ms after the SIGKILL "
          f"({how}; lease {a.misses} x {a.period_ms} ms = {lease} ms; {a.slack_ms} ms more is a hang guard)")


def check_pool_kill(c, bed, st):
    a, victim = bed.a, bed.guests[VICTIM]
    c(bed.t_kill is not None, f"guest{VICTIM} was killed once every participant reported RUNNING")
    if bed.t_kill is None:
        return
    c(victim.proc.returncode == -signal.SIGKILL, f"guest{VICTIM}'s QEMU ended by SIGKILL (rc {victim.proc.returncode})")
    c(st.get(f"box{VICTIM}.phase") == "running",
      f"guest{VICTIM} was churning in the pool when killed, holding leases (phase {st.get(f'box{VICTIM}.phase')})")
    survivors = [p for p in range(bed.participants) if p != VICTIM]
    recovered = {p: int(st.get(f"box{p}.recovered", -1)) for p in survivors}
    c(sorted(recovered.values()) == [0] * (len(survivors) - 1) + [1],
      f"exactly one survivor recovered guest{VICTIM}'s slot (recovered_slots by participant: {recovered})")
    for p in survivors:
        def g(key):
            return int(st.get(f"box{p}.{key}", -1))
        c(st.get(f"box{p}.phase") == "done" and g("failed") == 0,
          f"participant {p} went through every step and closed the pool (phase {st.get(f'box{p}.phase')}, "
          f"{g('failed')} failed)")
        c(g("participants") == bed.participants - 1, f"participant {p}: {g('participants')} participants left active")
        c(g("loops_after") >= 10, f"participant {p} kept allocating and freeing: {g('loops_after')} of {g('loops')} "
          f"churn iterations after the death was seen")
        c(g("victim_checked") == 4 and g("victim_intact") == 4,
          f"participant {p}: guest{VICTIM}'s exported blocks it holds intact after the recovery "
          f"({g('victim_intact')} of {g('victim_checked')} checksums)")
        c(g("q_delta_alive") == 0 and g("q_done") == 1,
          f"participant {p}: probe Q, freed while guest{VICTIM} leased it, stayed in use until the death "
          f"(bytes dropped {g('q_delta_alive')}), then its free completed (bytes in use exact: {g('q_done') == 1})")
        c(g("p_bytes") > 0 and g("p_delta") == g("p_bytes"),
          f"participant {p}: probe P, leased only by the dead guest{VICTIM}, freed at once "
          f"({g('p_delta')} of {g('p_bytes')} bytes)")
        c(g("stale_expected") > 0 and g("stale_seen") == g("stale_expected"),
          f"participant {p}: guest{VICTIM}'s handles and the freed probes refused as stale: {g('stale_seen')} of "
          f"{g('stale_expected')} ({g('stale_invalid')} as invalid)")
    # Latencies on the host's clock: guest 1's lines as they reached the console; the host
    # process's own CLOCK_MONOTONIC stamps.
    lease = a.pool_lease_ms
    ids = {p: i for i, p in enumerate(bed.guests)}
    if bed.host:
        ids[bed.host] = HOST_ID
    for who in [p for p in bed.all() if p is not victim]:
        def after_kill(tag):
            hit = who.find(rf"CXLPOOL-MH {tag} id=\d+ .*mono_ns=(\d+)")
            return None if not hit else ((int(hit[1].group(1)) if who is bed.host else hit[0]) - bed.t_kill) / 1e6
        how = "its CLOCK_MONOTONIC" if who is bed.host else "console arrival"
        dead, rec, seen = after_kill("POOL-DEAD"), after_kill("POOL-RECOVERED"), after_kill("POOL-RECOVERY-SEEN")
        c(dead is not None and 0 < dead < lease + a.slack_ms,
          f"{who.name} saw guest{VICTIM} evicted {dead or float('nan'):.0f} ms after the SIGKILL "
          f"({how}; lease {lease} ms + {a.slack_ms} ms allowed)")
        if recovered.get(ids[who]) == 1:
            c(rec is not None and 0 < rec < lease + a.slack_ms,
              f"{who.name} recovered guest{VICTIM}'s slot {rec or float('nan'):.0f} ms after the SIGKILL ({how})")
        if seen is not None:
            print(f"      {who.name}: recovery complete seen {seen:.0f} ms after the SIGKILL")
    # The pool as a whole, checked from the host once every survivor has closed it.
    keys = ["leaked_blocks", "dangling_leases", "corrupt_words", "dead_participants"]
    c(st.get("check.status") == "ok" and all(st.get(f"check.{k}") == "0" for k in keys),
      "cxlpool_shared_pool_check on the file: " + ", ".join(f"{k} {st.get(f'check.{k}')}" for k in keys))
    c(st.get("check.blocks_in_use") == "0" and st.get("check.leases") == "0"
      and st.get("check.extents_free") == st.get("check.extents_total") is not None,
      f"every block and extent back in the pool ({st.get('check.blocks_in_use')} blocks in use, "
      f"{st.get('check.extents_free')} of {st.get('check.extents_total')} extents free)")


def check_pool_compose(c, bed, st):
    """Capacity moved by the host's composer: to busy guest 1 from idle guest 0, back to guest 0,
    and after guest 0 was killed holding it, to guest 1 again."""
    a, victim = bed.a, bed.guests[VICTIM]

    def g(p, key):
        return int(st.get(f"cbox{p}.{key}", -1))
    quota = size_mib(a.quota_size) // 2  # extents of 2 MiB
    target = g(1, "target")
    c(target > quota, f"each guest asks for {target} extents, more than its quota's {quota}")
    c(g(1, "busy_ms") >= 0 and g(1, "phase") >= 2,
      f"guest1, busy while guest0 idles, was served its {target} extents after {g(1, 'busy_ms')} ms")
    c(0 <= g(2, "g0_granted_busy") < quota,
      f"... from guest0's idle quota: g0 granted {g(2, 'g0_granted_busy')} of its {quota} then")
    c(g(0, "back_ms") >= 0 and g(0, "phase") >= 4,
      f"guest0, busy once guest1 freed its blocks, was served {target} extents after {g(0, 'back_ms')} ms")
    c(0 <= g(2, "g1_granted_back") < quota,
      f"... back from guest1's: g1 granted {g(2, 'g1_granted_back')} of its {quota} then")
    c(bed.t_kill is not None and victim.proc.returncode == -signal.SIGKILL,
      f"guest{VICTIM} was killed holding its extents (rc {victim.proc.returncode})")
    c(g(1, "phase") == 6 and g(1, "failed") == 0 and g(1, "after_kill_ms") >= 0,
      f"after the kill guest1 was served {target} extents again ({g(1, 'after_kill_ms')} ms after it asked)")
    hit = bed.guests[1].find(r"CXLPOOL-MH COMPOSE-SERVED id=1 mono_ns=(\d+)")
    if hit and bed.t_kill is not None:
        ms = (hit[0] - bed.t_kill) / 1e6
        c(0 < ms < a.pool_lease_ms + a.slack_ms, f"... {ms:.0f} ms after the SIGKILL (console arrival; lease "
          f"{a.pool_lease_ms} ms, then the composer's hold time)")
    c(g(2, "phase") == 6 and g(2, "failed") == 0,
      f"the host's composer ran through ({g(2, 'moves_up')} grants, {g(2, 'moves_down')} reclaims)")
    keys = ["leaked_blocks", "dangling_leases", "corrupt_words", "dead_participants"]
    c(st.get("check.status") == "ok" and all(st.get(f"check.{k}") == "0" for k in keys),
      "cxlpool_shared_pool_check on the file: " + ", ".join(f"{k} {st.get(f'check.{k}')}" for k in keys))


SCENARIOS = {"smoke": (None, check_smoke), "kill": (drive_kill, check_kill), "pool-kill": (drive_kill, check_pool_kill),
             "pool-compose": (drive_kill, check_pool_compose)}


def run_bed(a, kernel, extra, pid_dir, deadline):
    """Boots the bed and runs the scenario; when a guest kernel dies in early boot (see
    vmlib.died_before_plan), everything is stopped and booted again, at most twice."""
    drive = SCENARIOS[a.scenario][0]
    for attempt in range(1, 4):
        bed = Bed(a, kernel, extra, pid_dir, attempt)
        try:
            bed.start()
            if drive:
                drive(bed, deadline)
            finished = bed.wait_exit(deadline)
            panic = bed.early_panic()
            if panic:
                print(f"{panic}: a guest kernel died during boot before the plan started; "
                      + (f"booting both again (attempt {attempt + 1} of 3)" if attempt < 3 else "3 attempts"))
            if panic and attempt < 3:
                continue
            state = bed.inspect()
            if bed.pool:  # after the survivors closed the pool (or were stopped)
                for p in bed.all():
                    p.stop()
                try:
                    state.update({f"check.{k}": v for k, v in bed.pool_command("pool-check").items()})
                except RuntimeError as e:
                    print(e)
            return bed, finished, state
        finally:
            bed.close()


def main():
    ap = argparse.ArgumentParser(epilog="Arguments after -- go to every participant (vm_multihost --key=value).")
    ap.add_argument("--scenario", required=True, choices=sorted(SCENARIOS))
    ap.add_argument("--kernel", default="6.12", choices=["6.1", "6.12"])
    ap.add_argument("--cache", required=True)
    ap.add_argument("--initrd", required=True)
    ap.add_argument("--program", required=True, help="vm_multihost built for the host")
    ap.add_argument("--log-dir", required=True)
    ap.add_argument("--no-host", action="store_true", help="no host-process participant")
    ap.add_argument("--iterations", type=int, default=2000000, help="smoke: increments per participant")
    ap.add_argument("--rounds", type=int, default=1000, help="smoke: ping-pong round trips per pair")
    ap.add_argument("--period-ms", type=int, default=10, help="kill: heartbeat period")
    ap.add_argument("--misses", type=int, default=300,
                    help="kill: periods without a beat before a peer is dead (3 s: a TCG guest on a busy host "
                         "can be descheduled for a second and more, and must not be taken for dead)")
    ap.add_argument("--size", default="256M", help="the shared file (node 1 of each guest)")
    ap.add_argument("--pool-size", default="128M", help="pool-kill: the part of the file the cxlpool pool uses")
    ap.add_argument("--pool-heartbeat-ms", type=int, default=10, help="pool-kill: the pool's heartbeat period")
    ap.add_argument("--quota-size", default="48M", help="pool-compose: each guest's quota (g0, g1)")
    ap.add_argument("--pool-lease-ms", type=int, default=3000,
                    help="pool-kill: the pool's lease timeout (a TCG guest on a busy host stalls for a second and more)")
    ap.add_argument("--slack-ms", type=int, default=60000,
                    help="kill, pool-kill: detection (and recovery) must come within lease + this after the SIGKILL: "
                         "a hang guard, the figures are printed")
    ap.add_argument("--kill-guest", type=int, default=VICTIM, choices=range(GUESTS),
                    help="the guest to kill (negative control: 1, while the participants expect guest 0 to die)")
    ap.add_argument("--smp", default="1,maxcpus=2", help="QEMU -smp; lock-prefixed atomics need maxcpus >= 2")
    ap.add_argument("--timeout", type=int, default=600,
                    help="seconds for the whole bed: a hang guard (1-2 minutes on a quiet 2-core host)")
    ap.add_argument("--require", action="store_true", help="a skip is a failure")
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    a = ap.parse_args(argv[:len(argv) - len(extra) - (1 if "--" in argv else 0)])
    if any("," in x or " " in x for x in extra):
        ap.error("participant arguments travel on the kernel command line: no commas or spaces")

    kernel = os.path.join(a.cache, f"vmlinuz-{a.kernel}")
    require_runnable(a.require, kernel, a.initrd)
    if not os.access(a.program, os.X_OK):
        print(f"FAIL  {a.program} was not built")
        sys.exit(1)
    os.makedirs(a.log_dir, exist_ok=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that the cleanup below runs
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="cxlpool-mh-") as pid_dir:
        bed, finished, state = run_bed(a, kernel, extra, pid_dir, t0 + a.timeout)
    wall = time.monotonic() - t0

    for p in bed.all():
        path = os.path.join(a.log_dir, f"multihost-{a.scenario}-{p.name}.log")
        with open(path, "w") as f:
            f.write(" ".join(p.cmd) + "\n\n" + p.log() + "\n")
        ran = p.find(RUNNING)
        print(f"{p.name}: rc={p.proc.returncode}, scenario running "
              f"{(ran[0] - p.started) / 1e9 if ran else float('nan'):.1f} s after start, log {path}")
    print(f"bed: {bed.participants} participants, kernel {a.kernel}, -smp {a.smp}, {wall:.1f} s wall")

    c = Checker()
    c(finished, f"every participant ended by itself within {a.timeout} s")
    for p in bed.all():
        log = p.log()
        sec = sections(log) if p is not bed.host else {"multihost": (log, p.proc.returncode)}
        body = sec["multihost"][0] if "multihost" in sec else log.partition("=== CXLPOOL-VM BEGIN multihost")[2]
        for line in body.splitlines():
            if line.startswith(("ok", "FAIL", "CXLPOOL-MH", "control", "vm_multihost", "note", "churn", "pool", "import",
                                "compose")):
                print(f"  {p.name:6}| {line}")
        if a.scenario in ("kill", "pool-kill", "pool-compose") and p is bed.guests[VICTIM]:
            continue  # check_kill asserts how it ended
        c("multihost" in sec and sec["multihost"][1] == 0, f"{p.name}: vm_multihost {a.scenario} exited 0")
        if p is not bed.host:
            c(sec.get("kernel", ("",))[0].strip().startswith(a.kernel + "."), f"{p.name} runs kernel {a.kernel}")
            c("=== CXLPOOL-VM DONE" in log and p.proc.returncode == 0, f"{p.name} ran its whole plan and powered off")
    c(state.get("magic") == "ok" and state.get("nonce") == str(bed.nonce), "the shared file holds this run's header")
    SCENARIOS[a.scenario][1](c, bed, state)
    print(f"multihost {a.scenario}: {c.passed} passed, {c.failed} failed")
    sys.exit(1 if c.failed else 0)


if __name__ == "__main__":
    main()
