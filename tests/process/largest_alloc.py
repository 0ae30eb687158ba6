# SPDX-License-Identifier: MIT
# The address-space probe of the process test `ulimit-room`: builds N small strings and keeps
# them (a workload of many small objects), then finds the largest bytearray it can still
# allocate, in MiB: by bisection over malloc (through ctypes, so that the probes do not touch
# hundreds of MiB each), then down from there until a bytearray of that size (zero-filled:
# every page touched) is made. Run under a virtual-memory limit, bare and under cxlpool-run.
# Prints one line: "strings N largest_mib M vmsize_kib V" (VmSize after the workload).
import ctypes
import resource
import sys

libc = ctypes.CDLL(None)  # malloc and free as the program has them: glibc's or the interposer's
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]

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
    p = libc.malloc(mid << 20)
    if p:
        libc.free(p)
        lo = mid
    else:
        hi = mid - 1
while lo > 0:
    try:
        b = bytearray(lo << 20)
        del b
        break
    except MemoryError:
        lo -= 1
print(f"strings {len(keep)} largest_mib {lo} vmsize_kib {vmsize}")
