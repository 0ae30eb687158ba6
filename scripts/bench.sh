#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Builds Release and runs the allocator benchmark against glibc, jemalloc, mimalloc, tcmalloc
# and memkind in one run; prints the ns/op table and ratios and saves bench-results/*.json.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=$(bash scripts/build-release.sh)
python3 bench/run_alloc_bench.py --build "$BUILD" --out bench-results/alloc_bench.json "$@"
"$BUILD/bench/backing_bench" --benchmark_out=bench-results/backing_bench.json --benchmark_out_format=json
python3 bench/run_preload_bench.py --preload "$BUILD/lib/libcxlpool_preload.so" --out bench-results/preload_bench.json
