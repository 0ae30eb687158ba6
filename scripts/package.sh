#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Builds the Debian packages: a Release tree installed under /usr (library, interposer, tools,
# UCX library, Python module; no tests, benches or examples), then `cpack -G DEB` into OUT_DIR,
# then lintian on the result. Usage: package.sh [OUT_DIR]  (default build/packages; the build
# tree is ${CXLPOOL_PACKAGE_BUILD_DIR:-build/package}; CXLPOOL_SKIP_LINTIAN=1 skips lintian),
# or package.sh --lint DEB_DIR (lintian only). docs/packaging.md.
set -euo pipefail

# lintian: errors and warnings fail; info and pedantic tags and the overridden ones (O:, each
# explained in cmake/lintian/) are shown. docs/packaging.md.
lint() {  # lint DEB_DIR LOG
  echo "package.sh: lintian $(lintian --version | awk '{print $2}') on $1"
  local rc=0
  lintian --display-level '>=pedantic' --show-overrides "$1"/*.deb > "$2" 2>&1 || rc=$?
  grep -v -e '^N:' -e 'running with root privileges' "$2" | sed 's/^/  /' || true
  # (exit status 2 only says that a tag was emitted; with --show-overrides that includes O: tags)
  if { [ "$rc" != 0 ] && [ "$rc" != 2 ]; } || grep -q '^[EW]: ' "$2"; then
    echo "package.sh: lintian reported errors or warnings, or failed (exit $rc): $2" >&2
    return 1
  fi
  echo "package.sh: lintian: no errors or warnings"
}
if [ "${1:-}" = --lint ]; then
  [ -n "${2:-}" ] && compgen -G "$2/*.deb" > /dev/null || { echo "usage: package.sh --lint DEB_DIR (with .deb files)" >&2; exit 2; }
  log=$(mktemp)
  rc=0
  lint "$2" "$log" || rc=$?
  rm -f "$log"
  exit $rc
fi
src=$(cd "$(dirname "$0")/.." && pwd)
out=$(realpath -m "${1:-$src/build/packages}")
build=$(realpath -m "${CXLPOOL_PACKAGE_BUILD_DIR:-$src/build/package}")

bash "$src/scripts/install-deps.sh" >&2
mkdir -p "$build"
# Debian's hardening flags (dpkg-buildflags: fortify, stack protector, relro, and bindnow),
# without its -g -O2: the project's Release flags (-O3) stay, and CPack strips the binaries.
# Debian's python3 (not one earlier in PATH, e.g. pyenv's): the module is built for its headers.
cd "$src"  # (dpkg-buildflags maps this directory out of the binaries' file names)
export DEB_BUILD_MAINT_OPTIONS=hardening=+bindnow DEB_CFLAGS_MAINT_STRIP="-g -O2" DEB_CXXFLAGS_MAINT_STRIP="-g -O2"
cppflags=$(dpkg-buildflags --get CPPFLAGS) ldflags=$(dpkg-buildflags --get LDFLAGS)
cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=/usr \
  -DCMAKE_C_FLAGS="$(dpkg-buildflags --get CFLAGS) $cppflags" -DCMAKE_CXX_FLAGS="$(dpkg-buildflags --get CXXFLAGS) $cppflags" \
  -DCMAKE_EXE_LINKER_FLAGS="$ldflags" -DCMAKE_SHARED_LINKER_FLAGS="$ldflags" -DCMAKE_MODULE_LINKER_FLAGS="$ldflags" \
  -DCMAKE_STRIP="$src/cmake/debian/strip.sh" -DPython3_EXECUTABLE=/usr/bin/python3 \
  -DPython3_INCLUDE_DIR="$(/usr/bin/python3 -c 'import sysconfig; print(sysconfig.get_path("include"))')" \
  -DCXLPOOL_BUILD_TESTS=OFF -DCXLPOOL_BUILD_BENCH=OFF -DCXLPOOL_BUILD_EXAMPLES=OFF > "$build/configure.log" ||
  { tail -n 30 "$build/configure.log" >&2; exit 1; }
cmake --build "$build" -j "$(nproc)" > "$build/build.log" 2>&1 || { tail -n 40 "$build/build.log" >&2; exit 1; }

# Only this run's packages in OUT_DIR (a stale one from another version would be installed too).
mkdir -p "$out"
rm -f "$out"/*.deb "$build"/cpack/*.deb
(cd "$build" && cpack -G DEB -B "$build/cpack" > "$build/cpack.log" 2>&1) || { tail -n 40 "$build/cpack.log" >&2; exit 1; }
mv "$build"/cpack/*.deb "$out"/
echo "package.sh: packages in $out:"
(cd "$out" && for f in *.deb; do printf '  %-48s %8s\n' "$f" "$(du -k "$f" | cut -f1) KiB"; done)

if [ "${CXLPOOL_SKIP_LINTIAN:-0}" != 1 ]; then
  lint "$out" "$build/lintian.log"
fi
