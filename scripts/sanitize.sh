#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Builds and runs the test suite under a sanitizer: "address" (ASan + UBSan) or "thread"
# (TSan). The consumer test (uninstrumented program), the guests (label vm) and the Debian
# packages (label packages: a Release build of their own) are left out.
set -euo pipefail
cd "$(dirname "$0")/.."
kind=${1:?usage: sanitize.sh address|thread}
case $kind in
  address) flag=-DCXLPOOL_SANITIZE_ADDRESS=ON ;;
  thread) flag=-DCXLPOOL_SANITIZE_THREAD=ON ;;
  *) echo "sanitize.sh: unknown sanitizer '$kind' (expected address or thread)" >&2; exit 2 ;;
esac
bash scripts/install-deps.sh
BUILD=build/$kind
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Debug $flag -DCXLPOOL_BUILD_BENCH=OFF -DCXLPOOL_WERROR=ON > /dev/null
cmake --build "$BUILD" -j "$(nproc)"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# die_after_fork=0: a forked child may start the allocator's purger thread (a thread after a
# multi-threaded fork, which glibc supports and TSan refuses by default).
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:die_after_fork=0
ctest --test-dir "$BUILD" --output-on-failure -j "$(nproc)" -LE "consumer|vm|soak|packages"
