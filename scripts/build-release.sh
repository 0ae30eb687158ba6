#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Sets up the dependencies and builds a Release tree (no tests) in ${CXLPOOL_BUILD_DIR:-build/release};
# used by demo.sh and bench.sh. Prints the build directory.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh >&2
BUILD=${CXLPOOL_BUILD_DIR:-build/release}
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DCXLPOOL_BUILD_TESTS=OFF > /dev/null
cmake --build "$BUILD" -j "$(nproc)" > "$BUILD.build.log" 2>&1 || { tail -n 40 "$BUILD.build.log" >&2; exit 1; }
echo "$BUILD"
