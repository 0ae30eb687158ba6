#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Builds Release and runs the allocator benchmark against glibc, jemalloc, mimalloc, tcmalloc
# and memkind in one run; prints the ns/op table and ratios and saves bench-results/*.json.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
BUILD=${CXLPOOL_BUILD_DIR:-build/release}
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DCXLPOOL_BUILD_TESTS=OFF > /dev/null
cmake --build "$BUILD" -j "$(nproc)" > "$BUILD.build.log" 2>&1 || { tail -n 40 "$BUILD.build.log"; exit 1; }
python3 bench/run_alloc_bench.py --build "$BUILD" --out bench-results/alloc_bench.json "$@"
"$BUILD/bench/backing_bench" --benchmark_out=bench-results/backing_bench.json --benchmark_out_format=json
python3 bench/run_preload_bench.py --preload "$BUILD/lib/libcxlpool_preload.so" --out bench-results/preload_bench.json
