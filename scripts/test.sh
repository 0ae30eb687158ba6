#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Sets everything up (Debian packages, guest kernels for the VM tests), builds with warnings
# as errors, runs the whole CTest suite but the soak, lint, packages and slow labels (clang-tidy:
# scripts/lint.sh; the Debian packages: tests/packages/run.sh; the slow tests: ctest -L slow;
# .ci/run runs these three), and shows the multi-node guest's cxlpool-info table.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash tests/vm/fetch-kernels.sh || echo "test.sh: guest kernels unavailable; the vm tests will report SKIPPED"
BUILD=${CXLPOOL_BUILD_DIR:-build/test}
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCXLPOOL_WERROR=ON > /dev/null
cmake --build "$BUILD" -j "$(nproc)"
status=0
ctest --test-dir "$BUILD" --output-on-failure -j "$(nproc)" -LE "soak|lint|packages|slow" || status=$?
table=$BUILD/tests/vm/hmat2-6.12.info.txt
if [ -f "$table" ]; then
  echo
  echo "== cxlpool-info inside the QEMU guest (node0: 2 CPUs; node1: CPU-less, HMAT 300 ns / 5 GB/s; kernel 6.12)"
  cat "$table"
fi
if [ "$status" -ne 0 ] && [ -f "$BUILD/Testing/Temporary/LastTest.log" ]; then
  # Last, where a log's tail shows it: each failed check with the lines after it.
  echo
  echo "== failed checks (from $BUILD/Testing/Temporary/LastTest.log)"
  grep -a -A4 -E '^FAIL  |: FAILED:$' "$BUILD/Testing/Temporary/LastTest.log" | cut -c1-400 | head -80 || true
fi
exit $status
