#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# The library has one lifecycle (lib/lifecycle/lifecycle.cpp): one pthread_atfork registration,
# whose order is written there, and one load-time constructor per library that carries the
# components. Two modes:
#   source ROOT     no other pthread_atfork (or __register_atfork) call in lib/, tools/ or python/,
#                   exactly one in lib/lifecycle/lifecycle.cpp; load-time constructors only in
#                   capi/common_api.cpp and preload/preload.cpp, one each.
#   runtime SHIM FORK_DIFF [PRELOAD FORK_MALLOC]
#                   with SHIM (atfork_count.c) preloaded, every registration the process makes
#                   is counted by library: a program linked with libcxlpool.so that forks
#                   (FORK_DIFF, a copy-mode device) registers once, from libcxlpool.so; a plain
#                   program under the interposer (FORK_MALLOC) once, from the interposer; a linked
#                   program under the interposer once from each, the interposer first (its
#                   prepare handler must run after every other library's, lifecycle.cpp). Each
#                   program's own fork check must pass too.
import os
import re
import signal
import subprocess
import sys
import tempfile

SOURCE_DIRS = ("lib", "tools", "python")
EXTENSIONS = (".c", ".cc", ".cpp", ".h", ".hpp")
LIFECYCLE = "lib/lifecycle/lifecycle.cpp"
CONSTRUCTOR_FILES = ("lib/capi/common_api.cpp", "lib/preload/preload.cpp")

REGISTRATION = re.compile(r"\b(pthread_atfork|__register_atfork)\s*\(")
CONSTRUCTOR = re.compile(r"\[\[\s*gnu::constructor\b|__attribute__\s*\(\(\s*(__)?constructor(__)?\b|\.init_array")


def code_only(text):
    """The text with comments, string and character literals blanked (newlines kept)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif c in "\"'" and not (c == "'" and i > 0 and text[i - 1].isalnum()):  # 60'000 is a number
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(c + "\n" * text.count("\n", i, j) + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def source_mode(root):
    registrations, constructors = [], []
    for top in SOURCE_DIRS:
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for f in sorted(files):
                if not f.endswith(EXTENSIONS):
                    continue
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, root)
                code = code_only(open(path, encoding="utf-8", errors="replace").read())
                for n, line in enumerate(code.splitlines(), 1):
                    if REGISTRATION.search(line):
                        registrations.append((rel, n))
                    if CONSTRUCTOR.search(line):
                        constructors.append((rel, n))
    bad = 0
    for rel, n in registrations:
        if rel != LIFECYCLE:
            print(f"FAIL  {rel}:{n}: a fork handler registered outside {LIFECYCLE}; add the component's hooks "
                  f"to the order table there instead (a second registration runs in an order nobody wrote down)")
            bad += 1
    mine = [r for r in registrations if r[0] == LIFECYCLE]
    if len(mine) != 1:
        print(f"FAIL  {LIFECYCLE}: {len(mine)} pthread_atfork calls, expected exactly one")
        bad += 1
    for rel, n in constructors:
        if rel not in CONSTRUCTOR_FILES:
            print(f"FAIL  {rel}:{n}: a load-time constructor outside {' and '.join(CONSTRUCTOR_FILES)}; what runs "
                  f"at load belongs in lifecycle::init (constructors run in link order, written nowhere)")
            bad += 1
    for rel in CONSTRUCTOR_FILES:
        count = sum(1 for r in constructors if r[0] == rel)
        if count != 1:
            print(f"FAIL  {rel}: {count} load-time constructors, expected exactly one (it calls lifecycle::init)")
            bad += 1
    print(f"{len(registrations)} fork handler registration(s), {len(constructors)} constructor(s), {bad} problem(s)")
    return 1 if bad else 0


def registrations_of(cmd, env_extra, label):
    """Runs cmd with env_extra, returns (exit status, output, [library basenames in registration order])."""
    with tempfile.TemporaryDirectory(prefix="cxlpool-lifecycle-") as tmp:
        log = os.path.join(tmp, "atfork.log")
        env = dict(os.environ)
        env.update(env_extra)
        env["CXLPOOL_TEST_ATFORK_LOG"] = log
        env["CXLPOOL_DEVICES"] = f"farmem:backing=shm,size=256M,fork=copy"
        # Its own session, so that a hung fork child is ended with it (a child that waits for a
        # lock its parent's other library held at fork() never ends by itself).
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            print(f"FAIL  {label}: no end after 120 s (a fork hung)")
            return None, out.decode(errors="replace"), []
        libs = []
        if os.path.exists(log):
            for line in open(log):
                if line.startswith("atfork "):
                    libs.append(os.path.basename(line[len("atfork "):].strip()))
        return proc.returncode, out.decode(errors="replace"), libs


def cxlpool_libs(libs):
    """Only cxlpool's libraries, by kind: 'libcxlpool' or 'preload' (other libraries may register too)."""
    kinds = []
    for lib in libs:
        if lib.startswith("libcxlpool_preload.so"):
            kinds.append("preload")
        elif lib.startswith("libcxlpool.so"):
            kinds.append("libcxlpool")
    return kinds


def runtime_mode(shim, fork_diff, preload=None, fork_malloc=None):
    bad = 0
    cases = [("a program linked with libcxlpool.so", [fork_diff, "farmem"], {"LD_PRELOAD": shim}, ["libcxlpool"],
              "fork differential: ok")]
    if preload:
        both = shim + ":" + preload
        cases.append(("a plain program under the interposer", [fork_malloc], {"LD_PRELOAD": both}, ["preload"],
                      "fork differential: ok"))
        cases.append(("a program linked with libcxlpool.so under the interposer", [fork_diff, "farmem"],
                      {"LD_PRELOAD": both}, ["preload", "libcxlpool"], "fork differential: ok"))
    for label, cmd, env, want, needle in cases:
        rc, out, libs = registrations_of(cmd, env, label)
        got = cxlpool_libs(libs)
        ok = rc == 0 and needle in out and got == want
        print(f"{'ok   ' if ok else 'FAIL '} {label}: registrations {got} (expected {want}), exit {rc}")
        if not ok:
            print("      every registration: " + ", ".join(libs))
            print("      output: " + out[-2000:].replace("\n", "\n      "))
            bad += 1
    return 1 if bad else 0


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "source":
        return source_mode(sys.argv[2])
    if len(sys.argv) in (4, 6) and sys.argv[1] == "runtime":
        return runtime_mode(*sys.argv[2:])
    print("usage: lifecycle_test.py source ROOT | runtime SHIM FORK_DIFF [PRELOAD FORK_MALLOC]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
