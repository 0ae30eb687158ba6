#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Fetches the guest kernels for the VM test bed from Debian: bookworm's linux-image (6.1)
# and bookworm-backports' (6.12), with `apt-get download` into a cache directory, using
# private apt state for backports so the system's apt configuration is not touched.
# Idempotent. Usage: fetch-kernels.sh [CACHE_DIR]   (default /var/cache/cxlpool-vm)
set -euo pipefail
cache=${1:-${CXLPOOL_VM_CACHE:-/var/cache/cxlpool-vm}}
mkdir -p "$cache"
cd "$cache"

# The same mirror as the system's own Debian source.
mirror=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
[ -n "$mirror" ] || mirror=$(awk '$1=="deb"{print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
[ -n "$mirror" ] || mirror=http://deb.debian.org/debian

fetch() { # suite label
  local suite=$1 label=$2
  if [ -f "vmlinuz-$label" ] && [ -f "kver-$label" ] && [ -d "kpkg-$label/lib/modules/$(cat "kver-$label")" ]; then
    echo "fetch-kernels: $label present ($(cat "kver-$label"))"
    return 0
  fi
  local apt=$cache/apt-$label
  mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial"
  echo "deb $mirror $suite main" > "$apt/sources.list"
  local opts=(-o "Dir::Etc::SourceList=$apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
              -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt/cache" -o APT::Sandbox::User=root)
  apt-get "${opts[@]}" update -qq
  local pkg
  pkg=$(apt-cache "${opts[@]}" depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
  [ -n "$pkg" ] || { echo "fetch-kernels: no linux-image in $suite" >&2; return 1; }
  local ver=${pkg#linux-image-}
  rm -f "${pkg}"_*.deb
  (cd "$apt" && apt-get "${opts[@]}" download "$pkg" > /dev/null)
  rm -rf "kpkg-$label"
  dpkg -x "$apt/${pkg}"_*.deb "kpkg-$label"
  rm -f "$apt/${pkg}"_*.deb
  cp "kpkg-$label/boot/vmlinuz-$ver" "vmlinuz-$label"
  echo "$ver" > "kver-$label"
  echo "fetch-kernels: $label = $ver"
}

fetch bookworm 6.1
fetch bookworm-backports 6.12
