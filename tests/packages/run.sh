#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The Debian packages, end to end (CTest label "packages"; docs/packaging.md): builds them
# (scripts/package.sh, lintian included) or takes them from DEB_DIR (then lints them), checks
# their control data, makes a fresh Debian 12 root (debootstrap --variant=minbase bookworm,
# cached as a tarball in WORK_DIR) and, chrooted into it in private mount and pid namespaces,
# runs tests/packages/in-root.sh: apt install, the tools and the Python module, consumers built
# with find_package and pkg-config, apt remove and purge.
# Usage: run.sh WORK_DIR [DEB_DIR]. Everything it writes is under WORK_DIR. Exit 77 (CTest:
# skipped), with the reason, when it cannot run here: not root, no debootstrap/chroot/unshare,
# no namespaces, or the Debian mirror unreachable; CXLPOOL_REQUIRE_ALL_TESTS=1 makes that a
# failure. CXLPOOL_DEBIAN_MIRROR overrides http://deb.debian.org/debian.
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
[ $# -ge 1 ] || { echo "usage: run.sh WORK_DIR [DEB_DIR]" >&2; exit 2; }
work=$(realpath -m "$1")
deb_dir=${2:+$(realpath -m "$2")}
mirror=${CXLPOOL_DEBIAN_MIRROR:-http://deb.debian.org/debian}
export PATH=$PATH:/usr/sbin:/sbin
t0=$(date +%s)
step() { echo "== [$(($(date +%s) - t0)) s] $*"; }
fail() { echo "packages: FAILED: $*" >&2; exit 1; }
skip() {
  if [ "${CXLPOOL_REQUIRE_ALL_TESTS:-0}" = 1 ]; then fail "cannot run (CXLPOOL_REQUIRE_ALL_TESTS): $*"; fi
  echo "packages: SKIPPED: $*" >&2
  exit 77
}

# ---- Can it run here? ------------------------------------------------------------------------
[ "$(id -u)" = 0 ] || skip "needs root (debootstrap, chroot, mount namespaces); run as root"
bash "$src/scripts/install-deps.sh" >&2 || skip "scripts/install-deps.sh could not install the packaging tools"
for tool in debootstrap chroot unshare mount lintian dpkg-deb readelf python3; do
  command -v "$tool" > /dev/null || skip "$tool is missing"
done
unshare --mount --pid --fork --propagation private true 2> /dev/null ||
  skip "cannot make mount and pid namespaces here (unshare --mount --pid failed)"
why=$(python3 - "$mirror" 2>&1 <<'EOF'
import sys, urllib.request
try:
    urllib.request.urlopen(sys.argv[1] + "/dists/bookworm/Release", timeout=20).read(64)
except Exception as e:
    sys.exit(str(e))
EOF
) || skip "the Debian mirror $mirror is unreachable ($why; set CXLPOOL_DEBIAN_MIRROR)"

mkdir -p "$work"
root=$work/root
base_tar=$work/bookworm-minbase.tar
# Refuse to go on (or to delete anything) while something is mounted under WORK_DIR: the
# namespaces below keep every mount private, so this only trips if that guarantee broke.
check_no_mounts() {
  if awk -v w="$work/" '{ gsub(/\\040/, " ", $5); if (index($5 "/", w) == 1) { print $5; bad = 1 } } END { exit !bad }' \
      /proc/self/mountinfo; then
    fail "mounts under $work (listed above) on the host; unmount them by hand"
  fi
}
check_no_mounts

# ---- The packages ------------------------------------------------------------------------------
if [ -n "$deb_dir" ]; then
  step "packages from $deb_dir; lintian"
  compgen -G "$deb_dir/*.deb" > /dev/null || fail "no .deb files in $deb_dir"
  bash "$src/scripts/package.sh" --lint "$deb_dir"
else
  step "scripts/package.sh $work/debs (Release build in $work/build, cpack, lintian)"
  deb_dir=$work/debs
  CXLPOOL_PACKAGE_BUILD_DIR=$work/build bash "$src/scripts/package.sh" "$deb_dir"
fi

step "control data"
version=""
for d in "$deb_dir"/*.deb; do
  p=$(dpkg-deb -f "$d" Package)
  [ -n "$version" ] || version=$(dpkg-deb -f "$d" Version)
  [ "$(dpkg-deb -f "$d" Version)" = "$version" ] || fail "$p has version $(dpkg-deb -f "$d" Version), others $version"
  printf '  %-16s %-10s %-9s %5s KiB  Depends: %s\n' "$p" "$version" "$(dpkg-deb -f "$d" Section)" \
    "$(dpkg-deb -f "$d" Installed-Size)" "$(dpkg-deb -f "$d" Depends)"
done
expect_dep() {  # expect_dep PACKAGE DEPENDENCY...: each must appear in PACKAGE's Depends
  local d deps
  d=$(compgen -G "$deb_dir/$1_*.deb" | head -n 1) || fail "no package $1 in $deb_dir"
  deps=", $(dpkg-deb -f "$d" Depends),"
  shift
  for want in "$@"; do
    [[ $deps == *", $want"[\ ,]* ]] || fail "$(basename "$d") does not depend on '$want' (Depends: ${deps:2:-1})"
  done
}
exact="(= $version)"
expect_dep libcxlpool0 libc6 libstdc++6 libnuma1 libhwloc15
expect_dep libcxlpool-dev "libcxlpool0 $exact" "libcxlpool-ucx0 $exact"
expect_dep cxlpool-tools "libcxlpool0 $exact"
expect_dep libcxlpool-ucx0 "libcxlpool0 $exact" libucx0
expect_dep python3-cxlpool "libcxlpool0 $exact" python3
# Files: copyright and changelog per package, no RUNPATH into a build tree, no file owned by
# anyone but root.
rm -rf "$work/extract" && mkdir -p "$work/extract"
for d in "$deb_dir"/*.deb; do
  p=$(dpkg-deb -f "$d" Package)
  x=$work/extract/$p
  dpkg-deb -x "$d" "$x"
  for f in copyright changelog.Debian.gz; do
    [ -f "$x/usr/share/doc/$p/$f" ] || fail "$p has no /usr/share/doc/$p/$f"
  done
  owners=$(dpkg-deb -c "$d" | awk '$2 != "root/root"')
  [ -z "$owners" ] || fail "$p has files not owned by root: $owners"
  while IFS= read -r -d '' f; do
    if readelf -h "$f" > /dev/null 2>&1 && readelf -d "$f" 2> /dev/null | grep -E 'RPATH|RUNPATH'; then
      fail "$p: ${f#"$x"} has a RUNPATH/RPATH"
    fi
  done < <(find "$x" -type f -print0)
done
rm -rf "$work/extract"
echo "  copyright and changelog.Debian.gz in each; no RUNPATH; all files root/root"

# ---- A fresh Debian 12 root ------------------------------------------------------------------
# Roots live in tmpfs mounts of private mount namespaces: whatever happens, nothing stays
# mounted on the host, and nothing is left to delete but WORK_DIR's own files.
if [ ! -f "$base_tar" ]; then
  step "debootstrap --variant=minbase bookworm (cached in $base_tar)"
  mkdir -p "$work/base.tmp"
  unshare --mount --propagation private --fork /bin/bash -euo pipefail -c '
    mount -t tmpfs -o mode=755,size=2g cxlpool-pkg-base "$1"
    debootstrap --variant=minbase bookworm "$1" "$2" > "$3/debootstrap.log" 2>&1
    tar --numeric-owner -C "$1" -cf "$4.tmp" .
  ' debootstrap "$work/base.tmp" "$mirror" "$work" "$base_tar" ||
    { tail -n 30 "$work/debootstrap.log" >&2; check_no_mounts; rm -f "$base_tar.tmp"; fail "debootstrap (log: $work/debootstrap.log)"; }
  check_no_mounts
  mv "$base_tar.tmp" "$base_tar"
  rmdir "$work/base.tmp"
fi
stage=$work/stage
rm -rf "$stage"
mkdir -p "$stage/debs" "$stage/examples" "$work/apt-archives/partial" "$root"
cp "$deb_dir"/*.deb "$stage/debs/"
cp -r "$src/tests/consumer" "$stage/consumer"
cp -r "$src/tests/packages/ucx_consumer" "$stage/ucx_consumer"
cp "$src"/examples/*.c "$src"/examples/*.cpp "$stage/examples/"
cp "$src/tests/packages/in-root.sh" "$stage/"

# ---- Inside it -------------------------------------------------------------------------------
# Private mount and pid namespaces: every mount below and every process started inside goes
# when the namespace's first process exits. /dev/shm is a tmpfs of its own (the pools the test
# makes never reach the host's); downloaded .debs are kept in WORK_DIR/apt-archives.
step "fresh root from $base_tar (tmpfs); chroot: tests/packages/in-root.sh"
rc=0
unshare --mount --pid --fork --propagation private /bin/bash -euo pipefail -c '
  root=$1 base=$2 stage=$3 archives=$4 mirror=$5
  mount -t tmpfs -o mode=755,size=4g cxlpool-pkg-root "$root"
  tar --numeric-owner -C "$root" -xpf "$base"
  cp -r "$stage" "$root/tmp/cxlpool-pkg"
  cp -L /etc/resolv.conf "$root/etc/resolv.conf" 2> /dev/null || true
  echo "deb $mirror bookworm main" > "$root/etc/apt/sources.list"
  mount -t proc proc "$root/proc"
  mount --rbind /sys "$root/sys"
  mount --rbind /dev "$root/dev"
  mount -t tmpfs -o mode=1777,size=1g tmpfs "$root/dev/shm"
  mount -t tmpfs -o mode=755 tmpfs "$root/run"
  mount --bind "$archives" "$root/var/cache/apt/archives"
  exec chroot "$root" /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    HOME=/root LANG=C.UTF-8 TERM=dumb /bin/bash /tmp/cxlpool-pkg/in-root.sh
' in-root "$root" "$base_tar" "$stage" "$work/apt-archives" "$mirror" || rc=$?
check_no_mounts
rmdir "$root"
rm -rf "$stage"
[ "$rc" = 0 ] || fail "in the fresh root (exit $rc; its output is above)"
step "packages: PASSED (lintian, install into a fresh Debian 12 root, tools, Python, consumers, removal)"
