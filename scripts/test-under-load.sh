#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Runs the README's test command (scripts/test.sh) with every CPU saturated by competing
# processes: stress-ng CPU workers at the tests' own priority, 2 per CPU by default
# (CXLPOOL_LOAD_WORKERS=N to change). The suite must pass on a busy machine as on a quiet one;
# the load average is sampled while it runs and printed at the end with the wall time.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
workers=${CXLPOOL_LOAD_WORKERS:-$((2 * $(nproc)))}
log=$(mktemp /tmp/cxlpool-load.XXXXXX)
stress-ng --cpu "$workers" --cpu-method int64 --quiet &
load_pid=$!
(while sleep 15; do cut -d' ' -f1 /proc/loadavg; done) > "$log" &
sampler=$!
cleanup() {
  kill "$sampler" 2>/dev/null || true
  kill -TERM "$load_pid" 2>/dev/null || true
  wait "$load_pid" 2>/dev/null || true
  rm -f "$log"
}
trap cleanup EXIT
echo "test-under-load: $workers stress-ng CPU workers on $(nproc) CPUs (pid $load_pid)"
start=$(date +%s)
status=0
bash scripts/test.sh || status=$?
elapsed=$(($(date +%s) - start))
loads=$(sort -n "$log" | awk 'NR == 1 { min = $1 } { max = $1; n++ } END { if (n) printf "load average %s..%s over %d samples", min, max, n; else print "no load samples" }')
echo "test-under-load: scripts/test.sh exited $status after ${elapsed}s with $workers CPU workers ($loads)"
exit $status
