# SPDX-License-Identifier: MIT
# Pieces the VM runners share (run_vm_test.py: one guest; run_multihost_test.py: two guests
# on one shared file): the QEMU command line for a NUMA topology, the guest's marked console
# sections, pass/fail bookkeeping and the visible skip.
import json
import os
import re
import shutil
import sys


def size_mib(size):
    """'1G' / '256M' -> MiB."""
    return int(size[:-1]) * {"M": 1, "G": 1024}[size[-1]]


def qemu_command(spec, kernel, initrd, kernel_args, files=None, pidfile=None):
    """spec: {"nodes": [(cpus or None, size)], "dist": {(a, b): d}, "hmat": [(target, ns, bw)],
    optional "smp", "machine" (extra -machine options), "append" (kernel arguments)}.
    files: {node: host file} backs those nodes with a shared file instead of private RAM."""
    if "cxl" in spec:
        return cxl_command(spec, kernel, initrd, kernel_args, pidfile)
    hmat = bool(spec["hmat"])
    total = sum(size_mib(m) for _, m in spec["nodes"])
    machine = "q35" + (",hmat=on" if hmat else "") + "".join("," + o for o in spec.get("machine", []))
    # Lock-prefixed instructions are only atomic across guests with thread=multi and maxcpus >= 2.
    cmd = ["qemu-system-x86_64", "-accel", "tcg,thread=multi", "-cpu", "max",
           "-machine", machine, "-smp", spec.get("smp", "2"), "-m", f"{total}M"]
    for i, (cpus, mem) in enumerate(spec["nodes"]):
        path = (files or {}).get(i)
        if path:
            cmd += ["-object", f"memory-backend-file,size={mem},id=m{i},share=on,mem-path={path}"]
        else:
            cmd += ["-object", f"memory-backend-ram,size={mem},id=m{i}"]
        node = f"node,nodeid={i},memdev=m{i}"
        if cpus:
            node += f",cpus={cpus}"
        elif hmat:
            node += ",initiator=0"
        cmd += ["-numa", node]
    for (a, b), d in spec["dist"].items():
        cmd += ["-numa", f"dist,src={a},dst={b},val={d}"]
    for target, lat, bw in spec["hmat"]:
        cmd += ["-numa", f"hmat-lb,initiator=0,target={target},hierarchy=memory,data-type=access-latency,latency={lat}",
                "-numa", f"hmat-lb,initiator=0,target={target},hierarchy=memory,data-type=access-bandwidth,bandwidth={bw}"]
    cmd += ["-kernel", kernel, "-initrd", initrd,
            "-append", f"console=ttyS0 panic=-1 quiet loglevel=3 {kernel_args} {spec.get('append', '')}",
            "-nographic", "-no-reboot", "-net", "none"]
    if pidfile:
        cmd += ["-pidfile", pidfile]
    return cmd


def cxl_command(spec, kernel, initrd, kernel_args, pidfile=None):
    """An emulated CXL 2.0 hierarchy (QEMU 7.2; ../shared/testbed/cxl): one pxb-cxl host bridge
    with two root ports (with one, kernel 6.1 reads zeros from the region), a cxl-type3 memory
    device (persistent memory: QEMU 7.2 has no volatile type-3) on the first, and a 4 GiB fixed
    memory window. spec["cxl"] = (memdev file, label-area file, memdev size): the caller makes
    the files new for every boot (an old label area holds an old namespace).
    -cpu max,-hypervisor: kernel 6.12 refuses to commit a region when CPUID says hypervisor."""
    mem, lsa, size = spec["cxl"]
    cmd = ["qemu-system-x86_64", "-accel", "tcg,thread=multi", "-cpu", "max,-hypervisor", "-smp", "2",
           "-machine", "q35,cxl=on", "-m", f"{spec['ram']},maxmem=8G,slots=4",
           "-object", f"memory-backend-file,id=cxl-mem0,share=on,mem-path={mem},size={size}",
           "-object", f"memory-backend-file,id=cxl-lsa0,share=on,mem-path={lsa},size=256M",
           "-device", "pxb-cxl,bus_nr=12,bus=pcie.0,id=cxl.1",
           "-device", "cxl-rp,port=0,bus=cxl.1,id=root_port13,chassis=0,slot=2",
           "-device", "cxl-rp,port=1,bus=cxl.1,id=root_port14,chassis=0,slot=3",
           "-device", "cxl-type3,bus=root_port13,memdev=cxl-mem0,lsa=cxl-lsa0,id=cxl-pmem0",
           "-M", "cxl-fmw.0.targets.0=cxl.1,cxl-fmw.0.size=4G",
           "-kernel", kernel, "-initrd", initrd,
           "-append", f"console=ttyS0 panic=-1 quiet loglevel=3 {kernel_args} {spec.get('append', '')}",
           "-nographic", "-no-reboot", "-net", "none"]
    if pidfile:
        cmd += ["-pidfile", pidfile]
    return cmd


def died_before_plan(log):
    """Multi-threaded TCG occasionally loses a race with the guest kernel's boot-time text
    patching (an int3 Oops in early boot): such a guest may be booted again. Returns the first
    panic line, or None when the guest reached its plan (failures after that are never retried)."""
    if "Kernel panic" not in log or "=== CXLPOOL-VM BEGIN" in log:
        return None
    m = re.search(r"(Oops|Kernel panic).*", log)
    return m.group(0).strip() if m else "kernel panic"


def run_guest(cmd, timeout, boot_timeout=180):
    """Runs a guest to its end or `timeout` seconds. A guest whose plan has not started after
    `boot_timeout` seconds (TCG sometimes hangs at "Booting from ROM..." before the kernel
    prints anything) is killed then. Returns (log, qemu rc or None, hung_in_boot)."""
    import subprocess
    import threading
    import time
    p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    chunks = []

    def read():
        for chunk in iter(lambda: p.stdout.read1(65536), b""):
            chunks.append(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    t0 = time.time()
    hung = False
    while p.poll() is None:
        elapsed = time.time() - t0
        if elapsed > timeout:
            break
        if elapsed > boot_timeout and b"=== CXLPOOL-VM BEGIN" not in b"".join(chunks):
            hung = True
            break
        time.sleep(0.2)
    rc = p.poll()
    if rc is None:
        p.kill()
        p.wait()
    reader.join(5)
    return b"".join(chunks).decode(errors="replace"), rc, hung


def sections(log):
    out, current, lines = {}, None, []
    for raw in log.splitlines():
        line = raw.rstrip("\r")
        m = re.search(r"=== CXLPOOL-VM BEGIN (\S+)", line)
        if m:
            current, lines = m.group(1), []
            continue
        m = re.search(r"=== CXLPOOL-VM END (\S+) rc=(\d+)", line)
        if m and current == m.group(1):
            out[current] = ("\n".join(lines), int(m.group(2)))
            current = None
            continue
        if current is not None:
            lines.append(line)
    return out


def parse_json(text):
    try:
        return json.loads(text)
    except ValueError:  # a kernel message landed in the middle: drop printk-looking lines
        return json.loads("\n".join(l for l in text.splitlines() if not re.match(r"\s*\[\s*\d+\.\d+\]", l)))


class Checker:
    def __init__(self):
        self.failed = 0
        self.passed = 0

    def __call__(self, cond, what):
        print(("ok    " if cond else "FAIL  ") + what)
        if cond:
            self.passed += 1
        else:
            self.failed += 1


def skip(require, reason):
    """CXLPOOL-SKIP makes CTest count the test as skipped; with --require a skip is a failure."""
    if require:
        print(f"FAIL  required VM test cannot run: {reason}")
        sys.exit(1)
    print(f"CXLPOOL-SKIP: {reason}")
    sys.exit(0)


def require_runnable(require, kernel, initrd):
    if not shutil.which("qemu-system-x86_64"):
        skip(require, "qemu-system-x86_64 is not installed (bash scripts/install-deps.sh installs it)")
    if not os.path.exists(kernel):
        skip(require, f"guest kernel {kernel} is missing (bash tests/vm/fetch-kernels.sh fetches it)")
    if not os.path.exists(initrd):
        print(f"FAIL  initramfs {initrd} was not built")
        sys.exit(1)
