#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# scripts/demo.sh --quick on this build: every section is there with the figures it promises
# (measured tables, the model labelled as such, the tiering time series, the pool seen from
# outside and consistent, a model served from the pool with the right first token), the PNG and JSON files exist, and nothing is left behind.
# Usage: demo_test.sh SOURCE_DIR BUILD_DIR OUT_DIR
set -u
src=$1 build=$2 out=$3
rm -rf "$out"
log=$(mktemp)
before=$(ls /dev/shm | grep -c '^cxlpool-demo-')
bash "$src/scripts/demo.sh" --quick --build-dir "$build" --out "$out" > "$log" 2>&1
status=$?
cat "$log"
fail=0
need() {  # need WHAT PATTERN: an extended regex the output must match
  grep -Eq -- "$2" "$log" || { echo "FAILED: $1 (no line matches /$2/)"; fail=1; }
}
[ $status = 0 ] || { echo "FAILED: demo.sh exited $status"; fail=1; }
need "section 1 header" '^== 1\. The memory tiers'
need "topology table with sources" '^TIER +TARGET'
need "a target with its source" '\[(sysfs|default|hwloc|config)\]'
need "section 2 header" '^== 2\. KV-cache handoff'
need "pool handoff row" '^pool +0% +128 '
need "TCP row" '^tcp +0% +128 '
need "the model labelled" '^MODEL \(not measured'
need "one table, measured and model" '^ +tokens +pool +ucx-sm +tcp +model CXL +model RDMA200 +model RDMA100$'
need "section 3 header" '^== 3\. Tiering'
need "tiering table row for the engine" '^cxlpool +10%'
need "tiering time series" '^hot set on the fast tier over time'
need "section 4 header" '^== 4\. A shared pool in use'
need "the pool seen by cxlpool-info" '^shared pools \(--pool, seen from outside\)'
need "a live participant" 'active +yes'
need "check says consistent" ': consistent$'
need "the survey finds the pool healthy" 'participants alive, [0-9]+ leases; health: consistent$'
need "prefix reuse" 'reused from the prefix cache'
need "section 5 header" '^== 5\. Serving a model from the pool'
need "TTFT table, measured" '^TTFT p50 of the decode process \(ms\), measured'
need "TTFT row, first token right on every path" '^ +128 +[0-9]+( +[0-9.]+){5} +[0-9.]+x +0$'
need "TTFT model labelled" '^MODEL \(not measured\): OPT-6\.7B'
need "the end" '^== done in [0-9]+ s; plots: '
for f in kvcache.png kvcache.json tiering.png tiering.json ttft.png ttft.json; do
  [ -s "$out/$f" ] || { echo "FAILED: $out/$f missing or empty"; fail=1; }
done
after=$(ls /dev/shm | grep -c '^cxlpool-demo-')
[ "$after" -le "$before" ] || { echo "FAILED: a demo pool is left in /dev/shm"; fail=1; }
rm -f "$log"
exit $fail
