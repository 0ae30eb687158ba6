#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# System calls into memory the tiering engine moves, through cxlpool-run with aggressive
# settings and a small fast device (docs/tiering.md "Write fences"):
#   unprivileged  as an unprivileged user (when run as root: a uid and gid of no account, made up
#                 by the test, so nothing of the system is changed): a shell pipeline whose
#                 sort reads a pipe into a large buffer prints byte for byte what it prints
#                 without cxlpool, and syscall_io (read/pread/recv/O_DIRECT into malloc'd
#                 buffers) sees 0 EFAULT and every byte where it reads it: 20 runs in all;
#                 cxlpool-run says once that tiering is degraded and why
#   uring         as root: uring_io's io_uring registered buffers, every READ_FIXED checked
# usage: tiering_io_test.py MODE CXLPOOL_RUN PROGRAM_DIR
import os
import grp
import pwd
import shutil
import subprocess
import sys
import tempfile

mode, cxlpool_run, programs = sys.argv[1:4]
failures = 0

TIERING = "--tiering=interval=10ms,min_residence=20ms,halflife=20ms,hot=0.02,cold=0.005,budget=4GB/s"
DEVICES = "fast:backing=numa:0,size=64M;slow:backing=memfd,size=2G"
POLICY = "spill:near=fast,far=slow,watermark=90%"
PIPELINE = ("seq 1 3000000 | awk '{s+=$1*$1%97; print $1%1000, s}' | sort -k1,1n -k2,2n -S 100M | uniq -c "
            "| sort -rn | head -3")
DEGRADED = "cxlpool-run: tiering degraded: write fences: "


def check(cond, what):
    global failures
    print(("ok    " if cond else "FAIL  ") + what, flush=True)
    if not cond:
        failures += 1


def skip(reason):
    print(f"CXLPOOL-SKIP: {reason}", flush=True)
    sys.exit(0)


def clean_env():
    return {k: v for k, v in os.environ.items() if not k.startswith("CXLPOOL_") and k != "LD_PRELOAD"}


def sysctl_unprivileged_userfaultfd():
    try:
        with open("/proc/sys/vm/unprivileged_userfaultfd") as f:
            return int(f.read())
    except (OSError, ValueError):
        return -1


def has_account(uid):
    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        pass
    try:
        grp.getgrgid(uid)
        return True
    except KeyError:
        return False


def tiered(cmd):
    return [cxlpool_run, TIERING, "--devices", DEVICES, "--policy", POLICY, "--"] + cmd


if mode == "unprivileged":
    if os.geteuid() == 0:
        if sysctl_unprivileged_userfaultfd() != 0:
            skip("vm.unprivileged_userfaultfd is not 0: an unprivileged user has kernel-mode fences here")
        if not shutil.which("setpriv"):
            skip("no setpriv (util-linux) to run as an unprivileged user")
        uid = next((u for u in range(61000, 65000) if not has_account(u)), None)
        if uid is None:
            skip("no free uid in 61000-64999 for an unprivileged user")
        user = pwd.struct_passwd((f"uid{uid}", "x", uid, uid, "", "/", "/bin/sh"))
        as_user = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]
    else:
        user = pwd.getpwuid(os.geteuid())
        as_user = []
        if sysctl_unprivileged_userfaultfd() != 0 or os.access("/dev/userfaultfd", os.R_OK | os.W_OK):
            skip("this user has kernel-mode fences (vm.unprivileged_userfaultfd=1 or /dev/userfaultfd access)")
    work = tempfile.mkdtemp(prefix="cxlpool-tiering-io-")  # where syscall_io puts its file (a disk: O_DIRECT)
    if os.geteuid() == 0:
        os.chown(work, user.pw_uid, user.pw_gid)
    env = clean_env()

    def run(cmd, timeout=300):
        return subprocess.run(as_user + cmd, cwd=work, env=env, capture_output=True, timeout=timeout)

    plain = run(["bash", "-c", PIPELINE])
    check(plain.returncode == 0 and plain.stdout.count(b"\n") == 3,
          f"the pipeline without cxlpool: 3 lines, exit 0 ({plain.stdout!r})")
    # Ten runs of each (issue 19 asks for 20 in all): with the old interposer 6 of 10 pipelines
    # and 4 of 10 syscall_io runs failed. About 90 s on a quiet 2-core machine; on a CI host ten
    # times slower the 20 runs took over 900 s, hence CTest's 1800 s hang guard.
    runs = 10
    for i in range(runs):
        r = run(tiered(["bash", "-c", PIPELINE]))
        err = r.stderr.decode(errors="replace")
        said = err.count(DEGRADED)
        ok = r.returncode == 0 and r.stdout == plain.stdout and said == 1 and "Bad address" not in err
        check(ok, f"pipeline {i + 1}/{runs} as {user.pw_name} under tiering: same output, exit {r.returncode}, "
                  f"degraded mode said {said} time(s)" + ("" if ok else f"\n      stdout {r.stdout!r}\n      stderr {err}"))
        if i == 0:
            line = next((l for l in err.splitlines() if l.startswith(DEGRADED)), "")
            print(f"      {line}")
            check("user-mode-only" in line and "vm.unprivileged_userfaultfd=1" in line and "/dev/userfaultfd" in line,
                  "the line names the mode, why, and the knobs that enable fences")
    prog = os.path.join(programs, "syscall_io")
    for i in range(runs):
        r = run(tiered([prog, work, "4000"]))
        out = r.stdout.decode(errors="replace").strip()
        err = r.stderr.decode(errors="replace")
        check(r.returncode == 0 and " 0 EFAULT, 0 failed, 0 wrong" in out and err.count(DEGRADED) == 1,
              f"syscall_io {i + 1}/{runs} as {user.pw_name}: {out} (exit {r.returncode})"
              + ("" if r.returncode == 0 else f"\n      stderr {err}"))
    shutil.rmtree(work, ignore_errors=True)

elif mode == "uring":
    if os.geteuid() != 0:
        skip("not root: io_uring registered buffers are tested with the kernel-mode fence (root)")
    prog = os.path.join(programs, "uring_io")
    if not os.path.exists(prog):
        skip("uring_io not built: no liburing-dev (scripts/install-deps.sh installs it)")
    work = tempfile.mkdtemp(prefix="cxlpool-uring-io-")
    for i in range(5):
        r = subprocess.run(tiered([prog, work, "3000"]), env=clean_env(), capture_output=True, timeout=120)
        out = r.stdout.decode(errors="replace").strip()
        if r.returncode == 3:
            skip(f"io_uring unavailable here: {out}")
        check(r.returncode == 0 and " 0 wrong, 0 failed" in out,
              f"uring_io {i + 1}/5 under tiering: {out} (exit {r.returncode})"
              + ("" if r.returncode == 0 else "\n      stderr " + r.stderr.decode(errors="replace")))
    shutil.rmtree(work, ignore_errors=True)

else:
    print(f"unknown mode {mode}")
    sys.exit(2)

print(f"{failures} failure(s)")
sys.exit(1 if failures else 0)
