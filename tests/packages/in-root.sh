#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Runs inside the fresh Debian root that tests/packages/run.sh made (chrooted, in its own mount
# and pid namespaces), from /tmp/cxlpool-pkg: installs the packages with apt (which must pull
# in their Debian dependencies), runs the tools and the Python module with nothing else
# installed, then installs a compiler and builds consumers against the packages with CMake's
# find_package and with pkg-config, and finally removes and purges the packages and checks that
# nothing of them is left. Any failure exits non-zero.
set -euo pipefail
cd /tmp/cxlpool-pkg
export DEBIAN_FRONTEND=noninteractive
t0=$(date +%s)
step() { echo "== [$(($(date +%s) - t0)) s] $*"; }
fail() { echo "packages: FAILED: $*" >&2; exit 1; }
apt_quiet() {  # apt-get, its output in a log shown only when it fails
  local log=/tmp/cxlpool-pkg/apt.log
  apt-get -o Dpkg::Use-Pty=0 "$@" > "$log" 2>&1 || { tail -n 40 "$log" >&2; fail "apt-get $*"; }
}

debs=(./debs/*.deb)
ours=()
for d in "${debs[@]}"; do ours+=("$(dpkg-deb -f "$d" Package)"); done

step "apt-get update"
apt_quiet update
step "apt-get install ${debs[*]}"
before=$(dpkg-query -W -f '${Package}\n' | sort)
apt_quiet install -y --no-install-recommends "${debs[@]}"
pulled=$(comm -13 <(echo "$before") <(dpkg-query -W -f '${Package}\n' | sort) | tr '\n' ' ')
echo "installed with their dependencies: $pulled"
for p in libnuma1 libhwloc15 libucx0 python3; do
  dpkg-query -W -f '${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || fail "$p was not pulled in"
done

# ---- The packages alone, before any build tool is installed --------------------------------
step "cxlpool-info"
cxlpool-info > info.txt || { cat info.txt; fail "cxlpool-info exited $?"; }
head -n 5 info.txt
grep -q "memory targets" info.txt || fail "cxlpool-info printed no target table"
cxlpool-info --json | python3 -c 'import json, sys; d = json.load(sys.stdin); print("cxlpool-info --json:", len(d["targets"]), "targets")'

step "cxlpool-run -- /bin/true"
cxlpool-run -- /bin/true
preload=$(cxlpool-run -- /bin/sh -c 'printf %s "$LD_PRELOAD"')
echo "cxlpool-run preloads $preload"
[[ $preload == /usr/*/libcxlpool_preload.so.0 && -f $preload ]] || fail "cxlpool-run preloads '$preload', not the installed interposer"
cxlpool-run --policy bind:cxl0 --stats=run-stats.txt -- python3 -c 'b = bytearray(64 << 20)'
cat run-stats.txt
awk '$1 == "cxl0" && $9 > 0 { found = 1 } END { exit !found }' run-stats.txt ||
  fail "the interposer served no allocation from cxl0 (columns: device tier ... allocations)"

step "cxlpool-pool, cxlpool-compose, cxlpool-stat"
cxlpool-pool create shm:cxlpool-pkg-test --size 64M --quota a=8M
cxlpool-pool check shm:cxlpool-pkg-test > check.txt || { cat check.txt; fail "cxlpool-pool check"; }
head -n 1 check.txt
cxlpool-compose reclaim shm:cxlpool-pkg-test a 4M || fail "cxlpool-compose reclaim"
cxlpool-compose grant shm:cxlpool-pkg-test default 4M || fail "cxlpool-compose grant"
cxlpool-pool rm shm:cxlpool-pkg-test
cxlpool-stat --schema > schema.txt || fail "cxlpool-stat --schema"
head -n 2 schema.txt
for t in cxlpool-info cxlpool-run cxlpool-stat cxlpool-pool cxlpool-capacity cxlpool-compose; do
  [ -f "/usr/share/man/man1/$t.1.gz" ] || fail "no manual page for $t"
done

step "python3 -c 'import cxlpool'"
python3 - <<'EOF'
import cxlpool
print("cxlpool module:", cxlpool.__file__)
print(cxlpool.Geometry.preset("opt-6.7b"))
pool = cxlpool.SharedPool.create("shm:cxlpool-pkg-py", 64 << 20)
print("shared pool size", pool.info()["size"])
pool.close()
cxlpool.SharedPool.unlink("shm:cxlpool-pkg-py")
EOF

# ---- Consumers built against the packages ----------------------------------------------------
step "apt-get install g++ cmake pkg-config make"
apt_quiet install -y --no-install-recommends g++ cmake pkg-config make
export UCX_TLS=tcp UCX_NET_DEVICES=lo  # loopback only, whatever the host has

step "find_package(cxlpool): tests/consumer and the UCX consumer"
cmake -S consumer -B build/consumer > build-consumer.log 2>&1 || { cat build-consumer.log; fail "cmake consumer"; }
cmake --build build/consumer >> build-consumer.log 2>&1 || { cat build-consumer.log; fail "build consumer"; }
build/consumer/consumer_c
build/consumer/consumer_cpp
cmake -S ucx_consumer -B build/ucx_consumer > build-ucx.log 2>&1 || { cat build-ucx.log; fail "cmake ucx consumer"; }
cmake --build build/ucx_consumer >> build-ucx.log 2>&1 || { cat build-ucx.log; fail "build ucx consumer"; }
build/ucx_consumer/consumer_ucx shm:cxlpool-pkg-ucx1

step "pkg-config cxlpool: tests/consumer, the examples and the UCX consumer"
pkg-config --exists --print-errors cxlpool cxlpool-ucx || fail "pkg-config does not find cxlpool and cxlpool-ucx"
echo "pkg-config cxlpool: $(pkg-config --modversion cxlpool): $(pkg-config --cflags --libs cxlpool)"
mkdir -p build/pc
cc -std=c11 -Wall -Werror consumer/main.c -o build/pc/consumer_c $(pkg-config --cflags --libs cxlpool)
c++ -std=c++20 -Wall -Werror consumer/main.cpp -o build/pc/consumer_cpp $(pkg-config --cflags --libs cxlpool)
build/pc/consumer_c
build/pc/consumer_cpp
for src in examples/*.c examples/*.cpp; do
  # The OPT examples link the inference engine (lib/engine), a static library of the source
  # tree that is not packaged: only the examples of the public API are built here.
  if grep -qE '#include "(engine/|opt_common\.hpp)' "$src"; then
    echo "not packaged, skipped: $src (the inference engine's example)"
    continue
  fi
  exe=build/pc/$(basename "${src%.*}")
  case $src in
    *.c) cc -std=gnu11 -Wall "$src" -o "$exe" $(pkg-config --cflags --libs cxlpool) ;;  # (POSIX: fdopen, lstat)
    *) c++ -std=c++20 -Wall "$src" -o "$exe" $(pkg-config --cflags --libs cxlpool) ;;
  esac
done
echo "built: $(cd build/pc && ls | tr '\n' ' ')"
build/pc/threshold_pool | tail -n 3
build/pc/pmr_far | tail -n 2
cc -std=c11 -Wall -Werror ucx_consumer/main.c -o build/pc/consumer_ucx $(pkg-config --cflags --libs cxlpool-ucx)
build/pc/consumer_ucx shm:cxlpool-pkg-ucx2

# ---- Removal -------------------------------------------------------------------------------
step "apt-get remove ${ours[*]}, then purge"
for p in "${ours[@]}"; do dpkg-query -L "$p"; done | sort -u > files.txt
apt_quiet remove -y "${ours[@]}"
left=""
while read -r f; do
  if [ -e "$f" ] && [ ! -d "$f" ]; then left+=" $f"; fi
done < files.txt
[ -z "$left" ] || fail "files left after apt-get remove:$left"
! ldconfig -p | grep -q libcxlpool || fail "ldconfig still lists: $(ldconfig -p | grep libcxlpool)"
# Left known to dpkg only as "rc" (config-files: the libraries, which have a postrm); purge those.
rc_left=()
for p in "${ours[@]}"; do
  status=$(dpkg-query -W -f '${db:Status-Abbrev}' "$p" 2>/dev/null || true)
  case $status in
    "" | un*) ;;
    rc*) rc_left+=("$p") ;;
    *) fail "$p is in state '$status' after apt-get remove" ;;
  esac
done
if ((${#rc_left[@]})); then
  dpkg --purge "${rc_left[@]}" > purge.log 2>&1 || { cat purge.log; fail "dpkg --purge ${rc_left[*]}"; }
fi
for p in "${ours[@]}"; do
  status=$(dpkg-query -W -f '${db:Status-Abbrev}' "$p" 2>/dev/null || true)
  [ -z "$status" ] || [[ $status == un* ]] || fail "$p is still known to dpkg after purge: '$status'"
  [ ! -e "/usr/share/doc/$p" ] || fail "/usr/share/doc/$p is left after purge"
done
python3 -c 'import cxlpool' 2> /dev/null && fail "python3 still imports cxlpool after removal"
echo "removed and purged: nothing of ${ours[*]} is left"
step "done"
