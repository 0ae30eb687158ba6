#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The README's first command: sets everything up, builds (Release) and shows what cxlpool is for,
# every figure measured in this run (model columns say "model"):
#   1. the memory tiers cxlpool finds, each fact with its source (shortened);
#   2. an inference server's KV cache handed from a prefill process to a decode process through a
#      shared pool, against UCX and TCP, with the modelled CXL vs RDMA table, and a PNG;
#   3. tiering: a hot set that starts on the slow device, pulled to the fast one by the engine,
#      as a time series, and a PNG;
#   4. a shared pool in use, seen from outside by cxlpool-info and cxlpool-pool check;
#   5. an OPT-125m-shaped model (random weights) served by a decode process from KV blocks a
#      prefill process wrote into the pool: time to first token against recomputing the prompt and
#      against the KV sent over TCP and UCX, with the OPT-6.7B shape as a labelled model, and a PNG.
# Usage: demo.sh [--quick] [--build-dir DIR] [--out DIR]
#   --quick          smaller sizes and shorter runs, on any build type (the test suite runs this)
#   --build-dir DIR  use an existing build (no dependency install, no build)
#   --out DIR        where the JSON and PNG files go (default bench-results/demo)
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0 build="" out=bench-results/demo
while [ $# -gt 0 ]; do
  case $1 in
    --quick) quick=1 ;;
    --build-dir) build=${2:?--build-dir needs a directory}; shift ;;
    --out) out=${2:?--out needs a directory}; shift ;;
    *) echo "usage: demo.sh [--quick] [--build-dir DIR] [--out DIR]" >&2; exit 2 ;;
  esac
  shift
done
if [ -z "$build" ]; then
  echo "== building (Release; the log is in build/release.build.log)"
  build=$(bash scripts/build-release.sh)
fi
for t in tools/cxlpool-info tools/cxlpool-pool bench/kvcache_bench bench/tiering_bench bench/ttft_bench \
         examples/kv_prefill_server examples/kv_decode_server; do
  [ -x "$build/$t" ] || { echo "demo.sh: $build/$t is missing (build the project first)" >&2; exit 1; }
done
mkdir -p "$out"
out=$(cd "$out" && pwd)
start=$SECONDS

if [ $quick = 1 ]; then
  kv_tokens=16,128 kv_reps=2 tier_seconds=6 tier_mib=256 any_build=--any-build ttft=(--quick --layers 2)
else
  kv_tokens=128,512,2048 kv_reps=3 tier_seconds=10 tier_mib=1024 any_build="" ttft=(--tokens 128,512,1024 --reps 1)
fi

echo
echo "== 1. The memory tiers of this machine, each value with its [source] (cxlpool-info; --json for all of it)"
info=$("$build/tools/cxlpool-info" --no-pool-scan)
sed -n '/^ranking/q;p' <<< "$info" | sed '${/^$/d}'
sed -n '/^warnings:/,/^$/p' <<< "$info" | sed '${/^$/d}'

echo
echo "== 2. KV-cache handoff, prefill -> decode process, OPT-6.7B geometry: through a shared pool (in place),"
echo "      over UCX (same host) and over TCP (loopback); the CXL vs RDMA table is a model, labelled so"
"$build/bench/kvcache_bench" $any_build --model opt-6.7b --tokens "$kv_tokens" --reuse 0 --reps "$kv_reps" \
  --paths pool,ucx-sm,tcp --json "$out/kvcache.json" --plot "$out/kvcache.png"

echo
echo "== 3. Tiering: a program's hot set starts on the slow device; the engine pulls it to the fast one"
echo "      (static first-touch placement for comparison; both tiers are DRAM here, so speed is a model)"
"$build/bench/tiering_bench" --seconds "$tier_seconds" --footprint-mib "$tier_mib" --hot 10 \
  --placements static,cxlpool --series "$(awk "BEGIN{print $tier_seconds/10}")" \
  --json "$out/tiering.json" --plot "$out/tiering.png"

echo
echo "== 4. A shared pool in use, seen from outside: a prefill server holds it, decode servers read from it"
tag=$$-$RANDOM
sock=/tmp/cxlpool-demo-$tag.sock
dev=shm:cxlpool-demo-$tag
if [ -e "$sock" ] || [ -L "$sock" ] || [ -e "/dev/shm/cxlpool-demo-$tag" ]; then
  echo "demo.sh: $sock or /dev/shm/cxlpool-demo-$tag exists already: not ours, left alone" >&2
  exit 1
fi
log=$(mktemp)
prefill=""
# The prefill server removes its socket and pool itself; only if it had to be killed are they
# removed here, and only once it had listened (so they are its own, not a name found taken).
listening=0
cleanup() {
  set +e
  if [ -n "$prefill" ]; then
    kill "$prefill" 2> /dev/null && wait "$prefill" 2> /dev/null
    if [ $listening = 1 ]; then
      [ -S "$sock" ] && rm -f "$sock"
      "$build/tools/cxlpool-pool" rm "$dev" > /dev/null 2>&1
    fi
  fi
  rm -f "$log"
  return 0
}
trap cleanup EXIT
"$build/examples/kv_prefill_server" "$sock" "$dev" 2 > "$log" 2>&1 &
prefill=$!
for _ in $(seq 600); do
  [ -S "$sock" ] && { listening=1; break; }
  kill -0 "$prefill" 2>/dev/null || { cat "$log"; echo "demo.sh: the prefill server ended before it listened" >&2; exit 1; }
  sleep 0.1
done
"$build/examples/kv_decode_server" "$sock" "$dev" "The capital of France is Paris. The capital of Italy is"
echo "-- cxlpool-info --pool $dev (its participants, quotas, leases and health):"
"$build/tools/cxlpool-info" --no-pool-scan --pool "$dev" | sed -n '/^shared pools/,$p'
echo "-- cxlpool-pool check $dev:"
"$build/tools/cxlpool-pool" check "$dev"
"$build/examples/kv_decode_server" "$sock" "$dev" "The capital of France is Paris. The capital of Spain is"
wait "$prefill"
prefill=""
echo "-- the prefill server's log:"
cat "$log"

echo
echo "== 5. Serving a model from the pool: an OPT-125m-shaped model (random weights); the decode process's"
echo "      time to first token when the prefill process hands it the KV blocks in the pool, against"
echo "      recomputing the prompt and against the KV sent over TCP and UCX (docs/inference.md)"
"$build/bench/ttft_bench" $any_build "${ttft[@]}" --json "$out/ttft.json" --plot "$out/ttft.png"

echo
echo "== done in $((SECONDS - start)) s; plots: $out/kvcache.png $out/tiering.png $out/ttft.png (JSON next to them)"
