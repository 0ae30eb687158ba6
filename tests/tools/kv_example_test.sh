#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# examples/kv_prefill_server + kv_decode_server: two decode requests whose prompts share a
# prefix (the second reuses the first's whole blocks), read in place; an empty prompt refused;
# nothing left behind (socket, pool).
# Usage: kv_example_test.sh BINDIR
set -u
bin=$1
tag=$$-$RANDOM
sock=/tmp/cxlpool-kv-example-$tag.sock
dev=shm:cxlpool-kv-example-$tag
out=$(mktemp)
"$bin/kv_prefill_server" "$sock" "$dev" 3 > "$out" 2>&1 &
prefill=$!
# Its socket appears when it is ready: wait for that (60 s at most, a hang guard) or its end.
for _ in $(seq 600); do
  [ -S "$sock" ] && break
  kill -0 $prefill 2>/dev/null || { cat "$out"; echo "FAILED: the prefill server ended before it listened"; exit 1; }
  sleep 0.1
done
fail=0
a=$("$bin/kv_decode_server" "$sock" "$dev" "The capital of France is Paris. The capital of Italy is") || fail=1
b=$("$bin/kv_decode_server" "$sock" "$dev" "The capital of France is Paris. The capital of Spain is") || fail=1
c=$("$bin/kv_decode_server" "$sock" "$dev" "" 2>&1) && fail=1  # refused
wait $prefill || fail=1
echo "$a"; echo "$b"; echo "$c"; cat "$out"
grep -q "read 55 tokens in place (4 blocks" <<< "$a" || { echo "FAILED: first decode"; fail=1; }
grep -q "read 55 tokens in place" <<< "$b" || { echo "FAILED: second decode"; fail=1; }
grep -q "55 tokens (32 reused from the prefix cache)" "$out" || { echo "FAILED: prefix reuse"; fail=1; }
grep -q "ERROR empty prompt" <<< "$c" || { echo "FAILED: empty prompt refused"; fail=1; }
[ -e "$sock" ] && { echo "FAILED: socket left behind"; fail=1; }
[ -e "/dev/shm/${dev#shm:}" ] && { echo "FAILED: pool left behind"; fail=1; }
rm -f "$out"
exit $fail
