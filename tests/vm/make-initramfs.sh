#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Builds the guest initramfs: static busybox, guest-init.sh as /init, and the project's own
# binaries (cxlpool-info, vm_checks, vm_multihost, vm_tiering, vm_rebind, vm_hotremove, the backing test
# suite) with their shared libraries, each at its build-tree path so RUNPATHs resolve
# unchanged inside the guest.
# With CACHE_DIR (fetch-kernels.sh), the DAX modules (device_dax, dax_hmem, kmem; with ndctl
# installed also the CXL and NVDIMM ones) of every cached kernel are added, uncompressed, with their dependencies and a modules.dep.
# When the build has libcxlpool_ucx (tests/kv_remote_peer), the Soft-RoCE run's parts are added
# too: UCX's transport modules, the rxe verbs provider, iproute2's ip and rdma (at /usr/bin: busybox
# installs its applets in /bin), and the kernel
# modules rdma_rxe, rdma_ucm, veth, crc32_generic.
# Usage: make-initramfs.sh BUILD_DIR OUT.cpio.gz [CACHE_DIR]
set -euo pipefail
build=$(cd "$1" && pwd) out=$2 cache=${3:-}
here=$(cd "$(dirname "$0")" && pwd)
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
mkdir -p "$root"/{bin,sbin,proc,sys,dev,tmp,etc,cxlpool}
cp /bin/busybox "$root/bin/busybox"
cp "$here/guest-init.sh" "$root/init"
chmod +x "$root/init"

copy() { # a binary and every shared library it loads, at the same absolute paths
  local b=$1
  mkdir -p "$root$(dirname "$b")"
  cp -L "$b" "$root$b"
  for lib in $(ldd "$b" | grep -oE '/[^ ]+\.so[^ ]*'); do
    [ -e "$root$lib" ] && continue
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
  done
}
info=$build/tools/cxlpool-info
checks=$build/tests/vm/vm_checks
backing=$build/tests/backing_test
peer=$build/tests/device_peer
multihost=$build/tests/vm/vm_multihost
tiering=$build/tests/vm/vm_tiering
rebind=$build/tests/vm/vm_rebind
hotremove=$build/tests/vm/vm_hotremove
for b in "$info" "$checks" "$backing" "$peer" "$multihost" "$tiering" "$rebind" "$hotremove"; do
  [ -x "$b" ] || { echo "make-initramfs: missing $b (build first)" >&2; exit 1; }
  copy "$b"
done
kvpeer=$build/tests/kv_remote_peer
mods="device_dax dax_hmem kmem"
# The CXL guest (plan cxl): Debian's cxl, ndctl and daxctl, and the CXL and NVDIMM drivers a
# persistent-memory region becomes a device-DAX device through (cxl_core, cxl_port and the region
# code are built into both kernels).
if [ -x /usr/bin/cxl ] && [ -x /usr/bin/ndctl ] && [ -x /usr/bin/daxctl ]; then
  for b in /usr/bin/cxl /usr/bin/ndctl /usr/bin/daxctl; do copy "$b"; done
  mods="$mods cxl_acpi cxl_pci cxl_mem cxl_pmem libnvdimm nd_pmem dax_pmem"
fi
if [ -x "$kvpeer" ]; then
  copy "$kvpeer"
  # UCX loads its transports (and the verbs library its providers) at run time.
  for b in /usr/lib/x86_64-linux-gnu/ucx/*.so.0 /usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav*.so \
           /usr/bin/ip /usr/bin/rdma; do
    [ -e "$b" ] && copy "$b"
  done
  mkdir -p "$root/etc/libibverbs.d"
  cp /etc/libibverbs.d/rxe.driver "$root/etc/libibverbs.d/" 2>/dev/null || true
  mods="$mods crc32_generic rdma_rxe rdma_ucm veth"
fi
if [ -n "$cache" ]; then
  for kver_file in "$cache"/kver-*; do
    [ -f "$kver_file" ] || continue
    label=${kver_file##*/kver-}
    kver=$(cat "$kver_file")
    kroot=$cache/kpkg-$label
    [ -d "$kroot/lib/modules/$kver" ] || continue
    [ -f "$kroot/lib/modules/$kver/modules.dep" ] || depmod -b "$kroot" "$kver"
    for m in $mods; do
      modprobe -C /dev/null -d "$kroot" -S "$kver" --show-depends "$m" 2>/dev/null | awk '/^insmod/{print $2}' |
        while read -r ko; do
          rel=${ko#"$kroot"}
          mkdir -p "$root$(dirname "$rel")"
          cp "$ko" "$root$rel"
        done
    done
    find "$root/lib/modules/$kver" -name '*.ko.xz' -exec xz -d {} + 2>/dev/null || true
    for f in modules.order modules.builtin modules.builtin.modinfo; do
      [ -f "$kroot/lib/modules/$kver/$f" ] && cp "$kroot/lib/modules/$kver/$f" "$root/lib/modules/$kver/"
    done
    depmod -b "$root" "$kver"
  done
fi
cat > "$root/cxlpool/paths" <<PATHS
INFO=$info
CHECKS=$checks
BACKING_TEST=$backing
MULTIHOST=$multihost
TIERING=$tiering
REBIND=$rebind
HOTREMOVE=$hotremove
KV_REMOTE_PEER=$kvpeer
PATHS
(cd "$root" && find . | cpio -o -H newc --quiet | gzip -1) > "$out.tmp"
mv "$out.tmp" "$out"
echo "make-initramfs: $out ($(du -h "$out" | cut -f1))"
