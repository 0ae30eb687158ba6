#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Containers given a shared pool's quotas by the CDI spec cxlpool-compose writes, run by
# podman (rootful; docs/compose.md "Containers"): two containers share one pool with separate
# quotas and a block passes between them; each allocates only within its own quota and cannot
# open the other's, nor the default quota, nor change grants or keys; a container without the spec cannot open the pool;
# a container's process killed with SIGKILL gives its quota's extents back; the checker finds
# the pool clean. Exit 77 (skipped, with the reason) where podman cannot run a container.
# usage: podman_cdi_test.sh CXLPOOL_POOL CXLPOOL_COMPOSE CDI_PROBE WORKDIR
set -uo pipefail
pool_tool=$1 compose=$2 probe=$3 work=$4
failures=0 passes=0
check() {  # check CONDITION-STATUS WHAT
  if [ "$1" = 0 ]; then echo "ok    $2"; passes=$((passes + 1)); else echo "FAIL  $2"; failures=$((failures + 1)); fi
}
skip() {
  echo "SKIPPED: $*"
  exit 77
}
[ "$(id -u)" = 0 ] || skip "rootful podman needs root (this test hands a pool to containers as an administrator would)"
command -v podman > /dev/null || skip "podman is not installed (scripts/install-deps.sh installs it)"

name=cxlpool-cditest-$$
dev=shm:$name
kind=cxlpool-test.io/p$$
cdi_dir=/var/run/cdi
rootfs=$work/rootfs-$$
made_cdi_dir=0
containers=()
cleanup() {
  [ -n "${watcher:-}" ] && kill "$watcher" 2> /dev/null
  for c in "${containers[@]}"; do podman rm -f -t 0 "$c" > /dev/null 2>&1; done
  [ -n "${default_key:-}" ] && CXLPOOL_QUOTA_KEY=$default_key "$compose" cdi "$dev" --remove --dir "$cdi_dir" \
    --kind "$kind" > /dev/null 2>&1
  "$pool_tool" rm "$dev" > /dev/null 2>&1
  [ "$made_cdi_dir" = 1 ] && rmdir "$cdi_dir" 2> /dev/null
  rm -rf "$rootfs"
}
trap cleanup EXIT
trap "exit 1" INT TERM

# This sandbox's quirks (../shared/testbed/containers/README.md, Pitfalls 1 and 2), passed per
# run rather than written into the host's containers.conf: no CAP_SYS_RESOURCE, so no ulimit
# above the ones podman itself runs with; hybrid cgroups, which crun refuses and runc takes.
nofile=$(ulimit -Hn)
[ "$nofile" = unlimited ] && nofile=1048576
nproc=$(ulimit -Hu)
{ [ "$nproc" = unlimited ] || [ "$nproc" -gt 32768 ]; } && nproc=32768
run_flags=(--ulimit "nofile=$nofile:$nofile" --ulimit "nproc=$nproc:$nproc" --network=none)
if [ -s /sys/fs/cgroup/unified/cgroup.controllers ] && command -v runc > /dev/null; then
  podman_cmd=(podman --runtime runc)
else
  podman_cmd=(podman)
fi

# The image: a directory holding the probe and the libraries the dynamic linker resolves for
# it, at the host's paths (no registry, no image store).
mkdir -p "$rootfs"/{proc,sys,dev,tmp,etc} || exit 1
cp "$probe" "$rootfs/cdi_probe" || exit 1
while read -r lib; do
  mkdir -p "$rootfs$(dirname "$lib")" && cp -L "$lib" "$rootfs$lib" || exit 1
done < <(ldd "$probe" | grep -o '/[^ ]*' | sort -u)
pod() { "${podman_cmd[@]}" run --rm "${run_flags[@]}" "$@"; }
out=$(pod --rootfs "$rootfs" /cdi_probe 2>&1)
[ $? = 2 ] || skip "podman cannot run a container here: $(echo "$out" | tail -n 3)"
echo "podman runs containers ($("${podman_cmd[@]}" --version), runtime ${podman_cmd[2]:-the default})"

if [ ! -d "$cdi_dir" ]; then
  mkdir -p "$cdi_dir" && made_cdi_dir=1
fi
"$pool_tool" create "$dev" --size 48M --extent 1M --quota a=12M --quota b=12M --heartbeat-ms 10 \
  --timeout-ms 400 > /dev/null
check $? "create $dev with quotas a and b of 12 extents"
# The administrator keeps the default quota for the host: locked too, its key in the host's
# environment only.
default_key=$("$compose" lock "$dev" default)
check $? "lock the default quota"
export CXLPOOL_QUOTA_KEY=$default_key
spec=$("$compose" cdi "$dev" --quota a=ta --quota b=tb --dir "$cdi_dir" --kind "$kind" 2>&1)
check $? "cdi writes the spec: $(echo "$spec" | head -n 1)"
f=$(ls "$cdi_dir"/cxlpool-test_io_p$$_"$name"-*.json 2> /dev/null)
[ -n "$f" ] && [ "$(stat -c %a "$f")" = 600 ]
check $? "the spec is readable by root only"

out=$(pod --device "$kind=ta" --rootfs "$rootfs" /cdi_probe open 2>&1)
echo "$out" | grep -q "joined quota a" && ! echo "$out" | grep -q "pid $$"
check $? "a container with device ta joins quota a, in its own pid namespace ($out)"
out=$(pod --device "$kind=ta" --rootfs "$rootfs" /cdi_probe fill 2>&1)
n=$(echo "$out" | sed -n 's/^filled \([0-9]*\) MiB/\1/p')
[ -n "$n" ] && [ "$n" -gt 0 ] && [ "$n" -le 12 ]
check $? "it allocates only within quota a's 12 extents ($out)"
out=$(pod --device "$kind=ta" --rootfs "$rootfs" /cdi_probe open b 2>&1)
[ $? = 1 ] && echo "$out" | grep -q "CXLPOOL_E_PERMISSION" && echo "$out" | grep -q 'quota "b" is locked'
check $? "it cannot open quota b ($(echo "$out" | head -c 200))"
out=$(pod --device "$kind=ta" --rootfs "$rootfs" /cdi_probe open default 2>&1)
[ $? = 1 ] && echo "$out" | grep -q "CXLPOOL_E_PERMISSION"
check $? "nor the default quota"
out=$(pod --device "$kind=ta" --rootfs "$rootfs" /cdi_probe compose 2>&1)
[ $? = 0 ]
check $? "it cannot lock default, unlock quota b or grant itself extents ($(echo "$out" | tail -n 1 | head -c 200))"
out=$(pod -e CXLPOOL_POOL="$dev" -e CXLPOOL_QUOTA=a --rootfs "$rootfs" /cdi_probe open 2>&1)
[ $? = 1 ] && echo "$out" | grep -q "^open: "
check $? "a container without the spec cannot open the pool ($(echo "$out" | head -c 160))"
key_a=$(grep -o 'CXLPOOL_QUOTA_KEY=[0-9a-f]*' "$f" | head -n 1 | cut -d= -f2)
out=$(pod -e CXLPOOL_POOL="$dev" -e CXLPOOL_QUOTA=a -e CXLPOOL_QUOTA_KEY="$key_a" --rootfs "$rootfs" \
  /cdi_probe open 2>&1)
[ $? = 1 ]
check $? "nor with quota a's key copied into its environment: the pool's file is not there"

# Sharing: a block exported in one container is read in the other.
containers+=("$name-exp")
"${podman_cmd[@]}" run -d --name "$name-exp" "${run_flags[@]}" --device "$kind=ta" --rootfs "$rootfs" \
  /cdi_probe export > /dev/null
handle=
for ((t = SECONDS + 60; SECONDS < t; )); do
  handle=$("${podman_cmd[@]}" logs "$name-exp" 2> /dev/null | sed -n 's/^handle \([0-9a-f]*\)$/\1/p')
  [ -n "$handle" ] && break
  sleep 0.1
done
[ -n "$handle" ]
check $? "container ta exports a block ($("${podman_cmd[@]}" logs "$name-exp" 2>&1 | tail -n 2 | head -c 300))"
out=$(pod --device "$kind=tb" --rootfs "$rootfs" /cdi_probe import "$handle" 2>&1)
echo "$out" | grep -q "joined quota b" && echo "$out" | grep -q "read ok"
check $? "container tb, on quota b, imports it and reads its bytes ($out)"

# A container's process killed: its quota's extents come back. The composer's watch on the
# host is a live participant: it judges the killed process through the container's pid
# namespace (a child of the host's) and recovers its slot.
"$compose" watch "$dev" --interval 1 > /dev/null 2>&1 &
watcher=$!
containers+=("$name-hold")
"${podman_cmd[@]}" run -d --name "$name-hold" "${run_flags[@]}" --device "$kind=tb" --rootfs "$rootfs" \
  /cdi_probe hold 6 > /dev/null
used() { "$compose" list "$dev" --json | python3 -c "import json,sys; \
print(next(q['used_extents'] for q in json.load(sys.stdin)['quotas'] if q['name']=='$1'))"; }
held=0
for ((t = SECONDS + 60; SECONDS < t; )); do
  "${podman_cmd[@]}" logs "$name-hold" 2> /dev/null | grep -q holding && held=$(used b) && [ "$held" -ge 6 ] && break
  sleep 0.1
done
[ "$held" -ge 6 ]
check $? "a container holds 6 MiB of quota b (the host sees $held extents used)"
"${podman_cmd[@]}" kill -s KILL "$name-hold" > /dev/null
left=$held
for ((t = SECONDS + 60; SECONDS < t; )); do
  left=$(used b) && [ "$left" = 0 ] && break
  sleep 0.1
done
[ "$left" = 0 ]
check $? "after its process is killed, quota b's extents come back (used $left)"
kill "$watcher" 2> /dev/null
wait "$watcher" 2> /dev/null
# The exporting container still runs: it recovered the killed one, and the checker finds
# every block accounted for.
out=$("$pool_tool" check "$dev" --json 2>&1)
echo "$out" | grep -q '"consistent": true'
check $? "the checker finds the pool consistent ($(echo "$out" | head -c 300))"
"${podman_cmd[@]}" rm -f -t 0 "$name-exp" > /dev/null 2>&1

"$compose" cdi "$dev" --remove --dir "$cdi_dir" --kind "$kind" > /dev/null
[ ! -e "$f" ]
check $? "cdi --remove deletes the spec"
out=$(pod --device "$kind=ta" --rootfs "$rootfs" /cdi_probe open 2>&1)
[ $? != 0 ]
check $? "a container asking for the removed device does not start"

echo "$passes passed, $failures failed"
[ "$failures" = 0 ]
