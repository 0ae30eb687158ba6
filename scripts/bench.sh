#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Builds Release and runs the benchmarks, each against its peers in the same run: the allocator
# (glibc, jemalloc, mimalloc, tcmalloc, memkind; every placement policy; peak RSS; instructions
# and simulated cache misses per malloc+free pair under callgrind), fork()
# with a far heap (vs glibc), backings, the interposer on real programs, and shared pools (vs
# Boost.Interprocess; publish/acquire, handles, recovery), and movable residency (vs memcpy and
# a naive page-by-page move), and the cost of reserving a device's room on commit. Prints the tables and ratios and
# saves bench-results/*.json.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=$(bash scripts/build-release.sh)
python3 bench/run_alloc_bench.py --build "$BUILD" --out bench-results/alloc_bench.json "$@"
python3 bench/run_alloc_instructions.py --build "$BUILD" --out bench-results/alloc_instructions.json
python3 bench/run_fork_bench.py --build "$BUILD" --out bench-results/fork_bench.json
"$BUILD/bench/backing_bench" --benchmark_out=bench-results/backing_bench.json --benchmark_out_format=json
python3 bench/run_preload_bench.py --preload "$BUILD/lib/libcxlpool_preload.so" --out bench-results/preload_bench.json
python3 bench/run_shared_bench.py --build "$BUILD" --out bench-results/shared_bench.json
"$BUILD/bench/rebind_bench" --benchmark_repetitions=5 --benchmark_report_aggregates_only=true \
  --benchmark_out=bench-results/rebind_bench.json --benchmark_out_format=json
"$BUILD/bench/room_bench" --benchmark_repetitions=5 --benchmark_report_aggregates_only=true \
  --benchmark_out=bench-results/room_bench.json --benchmark_out_format=json
"$BUILD/bench/tiering_bench" --seconds 10 --json bench-results/tiering_bench.json --plot bench-results/tiering_bench.png
"$BUILD/bench/kvcache_bench" --json bench-results/kvcache_bench.json --plot bench-results/kvcache_bench.png
