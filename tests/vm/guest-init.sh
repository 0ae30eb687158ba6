#!/bin/busybox sh
# SPDX-License-Identifier: MIT
# PID 1 of the test guest: mounts the pseudo filesystems, runs the plan given on the kernel
# command line (cxlpool.plan=a,b,...) as marked sections on the serial console, powers off.
# The host (run_vm_test.py) turns the sections into pass/fail.
/bin/busybox --install -s /bin
export PATH=/bin:/sbin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs dev /dev
# /tmp stays on the initramfs root (already RAM and writable): the project's binaries sit at
# their build-tree paths, which may be under /tmp.
mkdir -p /dev/shm /tmp
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
chmod 1777 /tmp
. /cxlpool/paths
plan=$(sed -n 's/.*cxlpool\.plan=\([a-z0-9_,-]*\).*/\1/p' /proc/cmdline)

section() {
  name=$1
  shift
  echo "=== CXLPOOL-VM BEGIN $name at $(cut -d' ' -f1 /proc/uptime) s"
  "$@" 2>&1
  rc=$?
  echo "=== CXLPOOL-VM END $name rc=$rc"
}
has() { case ",$plan," in *,$1,*) return 0 ;; esac; return 1; }
# A soft-reserved range (memmap=...%...) becomes a device-DAX device through dax_hmem. Kernels
# since 6.3 type hmem devices for kmem, so device_dax needs a dynamic id to take them.
bind_dax() {
  modprobe device_dax
  modprobe dax_hmem
  for d in /sys/bus/dax/devices/*; do
    [ -e "$d/driver" ] || echo "${d##*/}" > /sys/bus/dax/drivers/device_dax/new_id 2>/dev/null ||
      echo "${d##*/}" > /sys/bus/dax/drivers/device_dax/bind
  done
}

echo  # the firmware leaves terminal escapes on the current line
section kernel uname -r
# Discovery as the machine boots (numa_balancing at its default), so warnings show.
section info-json "$INFO" --json
section info-table "$INFO"
# Deterministic placement from here on: no NUMA balancing, no THP (exact page counts).
echo 0 > /proc/sys/kernel/numa_balancing
echo never > /sys/kernel/mm/transparent_hugepage/enabled
has checks && section vm-checks "$CHECKS"
# The device-DAX device as system RAM with kmem, in movable blocks: a CPU-less node whose
# memory can be offlined again.
online_kmem() {
  dev=$(ls /sys/bus/dax/devices | head -n 1)
  echo online_movable > /sys/devices/system/memory/auto_online_blocks
  modprobe kmem
  echo "$dev" > /sys/bus/dax/drivers/device_dax/unbind
  echo "$dev" > /sys/bus/dax/drivers/kmem/new_id 2>/dev/null || echo "$dev" > /sys/bus/dax/drivers/kmem/bind
}
if has dax; then
  # Test the devdax backing on the device, then online it as system RAM with kmem (a CPU-less node).
  bind_dax
  section dax-info-json "$INFO" --json
  section devdax-checks "$CHECKS" devdax
  online_kmem
  section kmem-info-json "$INFO" --json
fi
if has hotremove; then
  # Memory hot-remove and hot-add of that node under a pool (vm_hotremove).
  bind_dax
  online_kmem
  section hotremove-info "$INFO"
  section hotremove "$HOTREMOVE"
fi
if has cxl; then
  # The kernel's own CXL stack (../shared/testbed/cxl): the type-3 device's persistent memory
  # becomes a CXL region, a device-DAX namespace on it, then system RAM on a CPU-less node.
  # Discovery is recorded after every step; the pool, tiering and hot-remove programs run on
  # the result with small sizes (the CXL window is emulated MMIO: ~3 MiB/s of stores under TCG).
  cxl_modules() {
    for m in cxl_acpi cxl_pci cxl_mem cxl_pmem libnvdimm nd_pmem dax_pmem device_dax kmem; do
      modprobe $m || echo "modprobe $m failed"
    done
    i=0  # the port and memdev drivers probe asynchronously
    while [ ! -e /sys/bus/cxl/devices/endpoint2 ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
    ls /sys/bus/cxl/devices
  }
  cxl_devdax() {
    r=$(/usr/bin/ndctl list -R | sed -n 's/.*"dev":"\(region[0-9]*\)".*/\1/p' | head -n 1)
    /usr/bin/ndctl create-namespace -m devdax -a 2M -r "$r"
  }
  cxl_sysram() {
    # 6.12 boots with auto_online_blocks=online, which daxctl refuses; it onlines them movable.
    echo offline > /sys/devices/system/memory/auto_online_blocks
    /usr/bin/daxctl reconfigure-device --mode=system-ram dax0.0
  }
  section cxl-modules cxl_modules
  section cxl-info-mem "$INFO" --json
  section cxl-region /usr/bin/cxl create-region -m -d decoder0.0 -w 1 -t pmem mem0
  section cxl-list /usr/bin/cxl list -M -D -R -v
  section cxl-info-region "$INFO" --json
  section cxl-devdax cxl_devdax
  section cxl-info-dax "$INFO" --json
  has cxl-devdax && section cxl-devdax-checks "$CHECKS" devdax
  section cxl-sysram cxl_sysram
  section cxl-info-kmem "$INFO" --json
  section cxl-info-table "$INFO"
  has cxl-node && section cxl-checks "$CHECKS"
  has cxl-tiering && section cxl-tiering "$TIERING" writers 20 10
  has cxl-hotremove && section cxl-hotremove "$HOTREMOVE" 16
fi
if has multihost; then
  # The two-host bed (run_multihost_test.py): node1 is one host file every guest maps as
  # /dev/dax0.0; never online it with kmem (each kernel would use it as its own RAM).
  # cxlpool.mh=SCENARIO,ID,--key=value,... holds vm_multihost's arguments.
  bind_dax
  section multihost "$MULTIHOST" $(sed -n 's/.*cxlpool\.mh=\([^ ]*\).*/\1/p' /proc/cmdline | tr , ' ') --path=/dev/dax0.0
fi
# Tiering between node0 and node1 (vm_rebind: the device layer; vm_tiering: the public API).
# The heat sections set kernel.numa_balancing (and demotion_enabled) themselves and put 0 back.
has rebind && section rebind "$REBIND"
if has tiering; then
  section tiering-writers "$TIERING" writers
  section tiering-full "$TIERING" full
fi
has heat && section tiering-heat-nb0 "$TIERING" heat nb0
if has heat-kernel; then
  section tiering-heat-respect2 "$TIERING" heat respect2
  section tiering-heat-own2 "$TIERING" heat own2
fi
has backing && section backing-test "$BACKING_TEST" --reporter compact
# Soft-RoCE: an rxe device on one end of a veth pair, and the KV handoff between two processes
# of libcxlpool_ucx over UCX's rc_verbs on it (kv_remote_peer pair: checksums compared).
rxe_up() {
  for m in crc32_generic rdma_rxe rdma_ucm veth; do modprobe $m || echo "modprobe $m failed"; done
  /usr/bin/ip link set lo up
  /usr/bin/ip link add v0 type veth peer name v1
  /usr/bin/ip addr add 169.254.10.1/24 dev v0
  /usr/bin/ip link set v0 up
  /usr/bin/ip link set v1 up
  /usr/bin/rdma link add rxe0 type rxe netdev v0
  /usr/bin/rdma link show
  ls /dev/infiniband
}
if has rxe; then
  section rxe-setup rxe_up
  section rxe-kv env UCX_TLS=rc_v,tcp UCX_NET_DEVICES=rxe0:1 UCX_LOG_LEVEL=error "$KV_REMOTE_PEER" pair 169.254.10.1 50
fi
echo "=== CXLPOOL-VM DONE"
sync
poweroff -f
