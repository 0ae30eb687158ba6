#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# Checks the include direction between lib/ components against the rule written in
# docs/architecture.md (between the layering:begin/end markers), and that devices are opened
# and their locations parsed in lib/backing only.
import os
import re
import sys

root = sys.argv[1]
doc = open(os.path.join(root, "docs", "architecture.md")).read()
block = doc.split("<!-- layering:begin -->")[1].split("<!-- layering:end -->")[0]
allowed = {}
for line in block.strip().splitlines():
    m = re.match(r"- (\w+): (.*)", line.strip())
    if not m:
        continue
    deps = [] if m.group(2).strip() == "(nothing)" else [d.strip() for d in m.group(2).split(",")]
    allowed[m.group(1)] = set(deps)

lib = os.path.join(root, "lib")
components = sorted(d for d in os.listdir(lib) if os.path.isdir(os.path.join(lib, d)))


def source_lines(comp):
    """(relative path, line number, line) of every source line of lib/comp."""
    for dirpath, _, files in os.walk(os.path.join(lib, comp)):
        for f in sorted(files):
            if f.endswith((".cpp", ".hpp", ".h", ".c")):
                path = os.path.join(dirpath, f)
                for n, line in enumerate(open(path), 1):
                    yield os.path.relpath(path, root), n, line


bad = 0
for comp in components:
    if comp not in allowed:
        print(f"FAIL  lib/{comp} is not described in docs/architecture.md")
        bad += 1
        continue
    for path, n, line in source_lines(comp):
        m = re.match(r'\s*#\s*include\s+"([^"/]+)/', line)
        if m and m.group(1) not in ("cxlpool", comp) and m.group(1) not in allowed[comp]:
            print(f"FAIL  {path}:{n}: {comp} may not include {m.group(1)}/")
            bad += 1
for comp in allowed:
    if comp not in components:
        print(f"FAIL  docs/architecture.md describes lib/{comp}, which does not exist")
        bad += 1
# One device layer: only lib/backing (the providers) opens, creates, locks or removes a device's
# object or parses a device's location; every other component asks it (docs/architecture.md).
openers = re.compile(r"\bos::(open_existing|open_existing_readonly|create_unnamed_file|link_new_file|unlink_path|"
                     r"open_tmpfile|open_char_device|memfd_create|try_lock|lock_exclusive)\s*\(")
parsers = re.compile(r"""(rfind|find|compare|starts_with|substr)\s*\(\s*"(shm|file|devdax|numa|memfd):"|"/dev/shm/"\s*\+""")
for comp in components:
    if comp in ("backing", "os"):
        continue
    for path, n, line in source_lines(comp):
        code = line.split("//")[0]
        if openers.search(code):
            print(f"FAIL  {path}:{n}: opens a device object outside lib/backing")
            bad += 1
        if parsers.search(code):
            print(f"FAIL  {path}:{n}: parses a device location outside lib/backing")
            bad += 1
print(f"{len(components)} components checked, {bad} violations")
sys.exit(1 if bad else 0)
