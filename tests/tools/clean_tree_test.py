#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The tree a packager gets holds no run artifacts: no tracked file looks like one (a pid file,
a socket, a core dump, a profile, a build or test directory, editor or patch leftovers), and
.gitignore keeps new ones out. Skips (exit 77) outside a git checkout (e.g. a source tarball).
Usage: clean_tree_test.py SOURCE_DIR"""
import fnmatch
import os
import subprocess
import sys

ARTIFACTS = ["*.pid", "*.sock", "core", "core.[0-9]*", "vgcore.*", "perf.data*", "callgrind.out.*",
             "massif.out.*", "*.orig", "*.rej", "*~", ".#*", "*.swp", "*.pyc"]
DIRS = {"Testing", "__pycache__", "bench-results", "CMakeFiles"}


def git(src, *args):
    return subprocess.run(["git", "-C", src, *args], capture_output=True, text=True)


def main():
    src = sys.argv[1]
    if not os.path.isdir(os.path.join(src, ".git")) and not os.path.isfile(os.path.join(src, ".git")):
        print(f"SKIPPED: {src} is not a git checkout")
        return 77
    r = git(src, "ls-files", "-z")
    if r.returncode != 0:
        print(f"SKIPPED: git ls-files failed: {r.stderr.strip()}")
        return 77
    bad = []
    for path in filter(None, r.stdout.split("\0")):
        parts = path.split("/")
        if any(fnmatch.fnmatch(parts[-1], p) for p in ARTIFACTS):
            bad.append(f"{path}: a run artifact")
        elif parts[0].startswith("build") and len(parts) > 1 or DIRS.intersection(parts[:-1]):
            bad.append(f"{path}: inside a build or test output directory")
    # New artifacts anywhere in the tree are ignored, so `git add .` cannot pick them up.
    probes = ["p2.pid", "tests/x.pid", "srv.sock", "core", "core.1234", "vgcore.99", "perf.data",
              "perf.data.old", "lib/a.cpp.orig", "x.rej", "README.md~", "build/x", "build-asan/x",
              "bench-results/a.json", "tests/Testing/Temporary/LastTest.log", "python/__pycache__/m.pyc"]
    r = subprocess.run(["git", "-C", src, "check-ignore", "--no-index", "--stdin", "-z"],
                       input="\0".join(probes) + "\0", capture_output=True, text=True)
    ignored = set(filter(None, r.stdout.split("\0")))
    for p in probes:
        if p not in ignored:
            bad.append(f"{p}: not ignored by .gitignore")
    for b in bad:
        print("FAILED:", b)
    if not bad:
        print(f"clean tree: no tracked run artifact; {len(probes)} artifact names ignored")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
