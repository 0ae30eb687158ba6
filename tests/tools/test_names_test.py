#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# Every Catch2 test case runs under CTest: catch_discover_tests splits a name at ';' (a CMake
# list separator) into tests that match no case and pass without running anything, so no
# TEST_CASE name may hold one.
import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1])
bad = []
for path in sorted((root / "tests").rglob("*.cpp")):
    for m in re.finditer(r'TEST_CASE\(\s*"((?:[^"\\]|\\.)*)"', path.read_text(errors="replace")):
        if ";" in m.group(1):
            bad.append(f"{path.relative_to(root)}: {m.group(1)}")
for b in bad:
    print("FAIL  a test name with ';' never runs under ctest:", b)
print(f"test names: {len(bad)} with ';'")
sys.exit(1 if bad else 0)
