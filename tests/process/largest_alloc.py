# SPDX-License-Identifier: MIT
# The address-space probe of the process test `ulimit-room`: builds N small strings and keeps
# them (a workload of many small objects), then finds by bisection the largest bytearray it
# can still allocate, in MiB. Run under a virtual-memory limit, bare and under cxlpool-run.
# Prints one line: "strings N largest_mib M vmsize_kib V" (VmSize after the workload).
import resource
import sys

n = int(sys.argv[1])
try:
    keep = [str(i) * 2 for i in range(n)]
except MemoryError:
    print(f"strings {n} did not fit")
    sys.exit(3)
vmsize = 0
with open("/proc/self/status") as f:
    for line in f:
        if line.startswith("VmSize:"):
            vmsize = int(line.split()[1])
limit = resource.getrlimit(resource.RLIMIT_AS)[0]
lo, hi = 0, (limit >> 20 if limit != resource.RLIM_INFINITY else 1 << 16)  # MiB
while lo < hi:
    mid = (lo + hi + 1) // 2
    try:
        b = bytearray(mid << 20)  # zero-filled: every page is touched
        del b
        lo = mid
    except MemoryError:
        hi = mid - 1
print(f"strings {len(keep)} largest_mib {lo} vmsize_kib {vmsize}")
