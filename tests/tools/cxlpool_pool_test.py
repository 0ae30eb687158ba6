#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# cxlpool-pool end to end: create, info, check (clean, then with a participant killed, then
# --repair), rm; names that exist or are not pools are refused and left untouched; bad
# options name the bad token. cxlpool-info's view of shared pools from outside: participants
# alive and dead, quotas, health; files in /dev/shm that are not pools neither listed nor
# changed, a damaged pool listed with its error.
import json
import mmap
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

tool = sys.argv[1]
info_tool = sys.argv[3]
failures = 0
name = f"cxlpool-tooltest-{os.getpid()}"
dev = f"shm:{name}"
path = f"/dev/shm/{name}"


def check(cond, what):
    global failures
    print(("ok    " if cond else "FAIL  ") + what)
    if not cond:
        failures += 1


def run(*args):
    return subprocess.run([tool, *args], capture_output=True, text=True, timeout=60)


def pools_seen(*args):
    """cxlpool-info --json [args]: (exit code, {device: pool}) or (code, None) when not JSON."""
    r = subprocess.run([info_tool, "--json", *args], capture_output=True, text=True, timeout=60)
    try:
        return r.returncode, {p["device"]: p for p in json.loads(r.stdout)["shared_pools"]}, r
    except (ValueError, KeyError):
        return r.returncode, None, r


try:
    r = run("create", dev, "--size", "64M", "--extent", "1M", "--heartbeat-ms", "5", "--timeout-ms", "100")
    check(r.returncode == 0 and "created" in r.stdout, "create")
    check(oct(os.stat(path).st_mode & 0o777) == "0o600", "mode 0600")
    before = open(path, "rb").read()
    r = run("create", dev, "--size", "64M")
    check(r.returncode == 2 and "CXLPOOL_E_EXISTS" in r.stderr, "create over an existing pool is refused")
    check(open(path, "rb").read() == before, "... and the pool is byte-identical")
    r = run("info", dev, "--json")
    info = json.loads(r.stdout)
    check(r.returncode == 0 and info["extents_total"] == info["extents_free"] > 0, "info --json")
    r = run("check", dev, "--json")
    rep = json.loads(r.stdout)
    check(r.returncode == 0 and rep["consistent"] and rep["blocks_in_use"] == 0, "check of a fresh pool")

    # A participant that allocates and is killed: check finds it, --repair recovers it. The
    # participant is Python loading the library with ctypes, which a sanitizer build's library
    # cannot do (its runtime must come first): skipped there, visibly.
    libs = subprocess.run(["ldd", sys.argv[2]], capture_output=True, text=True).stdout
    sanitized = "libasan" in libs or "libtsan" in libs
    if sanitized:
        print("skip  killed-participant scenario: sanitizer build (python cannot load the library)")
    if not sanitized:
        prog = ("import ctypes,os,sys,time\n"
                f"lib=ctypes.CDLL({sys.argv[2]!r})\n"
                "p=ctypes.c_void_p(); assert lib.cxlpool_shared_pool_open(" + repr(dev.encode()) + ",None,ctypes.byref(p))==0\n"
                "b=ctypes.c_void_p()\n"
                "for i in range(20): assert lib.cxlpool_shared_alloc(p,ctypes.c_size_t(1000),ctypes.byref(b))==0\n"
                # cxlpool_shared_info_t: 8 u64, 4 u32, 2 u64, char[24], 3 u64 (bytes_cached last)
                "class Info(ctypes.Structure): _fields_=[('a',ctypes.c_uint64*7),('bytes_in_use',ctypes.c_uint64),"
                "('b',ctypes.c_uint32*4),('c',ctypes.c_uint64*2),('quota',ctypes.c_char*24),('d',ctypes.c_uint64*2),"
                "('bytes_cached',ctypes.c_uint64),('r',ctypes.c_uint64*7)]\n"
                "i=Info(); assert lib.cxlpool_shared_pool_info(p,ctypes.byref(i))==0\n"
                "print('ready',i.bytes_cached//(i.bytes_in_use//20),flush=True); time.sleep(60)\n")
        child = subprocess.Popen([sys.executable, "-c", prog], stdout=subprocess.PIPE, text=True)
        line = child.stdout.readline().split()
        check(len(line) == 2 and line[0] == "ready", "a participant allocated 20 blocks")
        cached = int(line[1]) if len(line) == 2 else -1  # freed by nobody: its block cache's refill
        code, pools, _ = pools_seen("--no-pool-scan", "--pool", dev)
        p = (pools or {}).get(dev, {})
        parts = p.get("participants", [])
        check(code == 0 and len(parts) == 1 and parts[0]["alive"] and parts[0]["pid"] == child.pid and
              parts[0]["state"] == "active" and parts[0]["extents_owned"] >= 1 and p["health"]["consistent"] and
              [q["name"] for q in p["quotas"]] == ["default"] and p["quotas"][0]["used_extents"] >= 1,
              f"cxlpool-info shows the live participant, its extents and the quota in use (got {p})")
        child.send_signal(signal.SIGKILL)
        child.wait()
        code, pools, _ = pools_seen("--no-pool-scan", "--pool", dev)
        p = (pools or {}).get(dev, {})
        parts = p.get("participants", [])
        check(code == 0 and len(parts) == 1 and not parts[0]["alive"] and not p["health"]["consistent"] and
              "dead participants not recovered" in p["health"]["problems"],
              f"... and, once killed, the dead one not recovered (got {p})")
        r = run("check", dev, "--json")
        rep = json.loads(r.stdout)
        check(r.returncode == 1 and rep["dead_participants"] == 1 and cached > 0 and
              rep["leaked_blocks"] == 20 + cached,
              f"check finds the dead participant and its 20 + {cached} cached leaked blocks (got {rep})")
        r = run("check", dev, "--repair")
        check(r.returncode == 0 and "consistent" in r.stdout, "check --repair recovers it")
        r = run("check", dev, "--json")
        rep = json.loads(r.stdout)
        check(r.returncode == 0 and rep["blocks_in_use"] == 0 and rep["extents_free"] == rep["extents_total"],
              "afterwards the pool is empty and whole")

        # One flipped bit in the extent word of a killed participant: --repair restores the
        # word, the extent comes back to the pool, and the next check is clean.
        child = subprocess.Popen([sys.executable, "-c", prog], stdout=subprocess.PIPE, text=True)
        ready = child.stdout.readline().startswith("ready")
        child.send_signal(signal.SIGKILL)
        child.wait()
        with open(path, "r+b") as f:
            m = mmap.mmap(f.fileno(), 0)
            extents_offset = struct.unpack_from("<Q", m, 112)[0]  # Superblock::extents_offset
            words = [struct.unpack_from("<Q", m, extents_offset + 128 * e)[0] for e in range(4)]
            e = next((k for k, w in enumerate(words) if w), None)
            if e is not None:
                struct.pack_into("<Q", m, extents_offset + 128 * e, words[e] ^ (1 << 40))
            m.close()
        r = run("check", dev, "--repair", "--json")
        rep = json.loads(r.stdout) if r.stdout.startswith("{") else {}
        check(ready and e is not None and r.returncode == 0 and rep.get("words_repaired") == 1 and
              rep.get("corrupt_words") == 0 and rep.get("extents_free") == rep.get("extents_total"),
              f"a flipped bit in a dead participant's extent word: check --repair restores it (got {rep or r.stderr})")
        r = run("check", dev, "--json")
        rep = json.loads(r.stdout) if r.stdout.startswith("{") else {}
        check(r.returncode == 0 and rep.get("corrupt_words") == 0 and rep.get("extents_free") == rep.get("extents_total"),
              "... and the next check is clean, the pool whole")

        # Participants a pid namespace below ours holds (a container): the survey finds their
        # processes through /proc; were it reduced to their heartbeats (sampled up to 2 s per
        # pool), the 12 pools are still looked at side by side, not one after the other (24 s of
        # waiting on any machine: the bound below leaves the rest to a slow or busy one).
        many = [f"{dev}-ns{k}" for k in range(12)]
        for d in many:
            run("create", d, "--size", "16M", "--timeout-ms", "5000")
        prog = ("import ctypes,sys,time\n"
                f"lib=ctypes.CDLL({sys.argv[2]!r})\n"
                f"for d in {[d.encode() for d in many]!r}:\n"
                "    p=ctypes.c_void_p(); assert lib.cxlpool_shared_pool_open(d,None,ctypes.byref(p))==0\n"
                "print('ready',flush=True); time.sleep(60)\n")
        # --kill-child: the namespace's process dies with unshare, not 60 s later holding the
        # pools and this test's output pipe open.
        holder = subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", sys.executable, "-c", prog],
                                  stdout=subprocess.PIPE, text=True)
        ready = holder.stdout.readline().strip() == "ready"
        t0 = time.monotonic()
        code, pools, _ = pools_seen()
        took = time.monotonic() - t0
        seen = [pools.get(d, {}).get("participants", [{}])[0].get("alive") for d in many] if pools else []
        check(ready and code == 0 and seen == [True] * len(many) and took < 20,
              f"12 pools held from another pid namespace: all alive, surveyed in {took:.1f} s (got {seen})")
        holder.kill()
        holder.wait()
        for d in many:
            run("rm", d)

    # Things that are not pools.
    other = path + "-foreign"
    with open(other, "wb") as f:
        f.write(b"precious" * 1000)
    damaged = path + "-damaged"
    with open(path, "rb") as f:
        head = bytearray(f.read(1 << 16))
    head[100] ^= 0xFF  # the superblock's checksum no longer holds
    with open(damaged, "wb") as f:
        f.write(head)
    code, pools, r = pools_seen()
    check(code == 0 and pools is not None and dev in pools and "participants" in pools[dev],
          "cxlpool-info lists the pool found in /dev/shm")
    check(pools is not None and f"shm:{name}-foreign" not in pools, "... not the foreign file")
    check(open(other, "rb").read() == b"precious" * 1000, "... which stays byte-identical")
    check(pools is not None and "error" in pools.get(f"shm:{name}-damaged", {}),
          f"... and the damaged pool with its error (got {(pools or {}).get(f'shm:{name}-damaged')})")
    os.unlink(damaged)

    # A FIFO with a writer blocked on it: refused without being opened (the writer stays
    # blocked, nothing is thrown away); a sparse file is read without being filled in.
    fifo = path + "-fifo"
    os.mkfifo(fifo)
    writer = subprocess.Popen(["sh", "-c", f"echo precious > {fifo}"])
    time.sleep(0.2)
    r = subprocess.run([info_tool, "--no-pool-scan", "--pool", f"shm:{name}-fifo"], capture_output=True, text=True)
    time.sleep(0.2)
    check(r.returncode == 1 and "not a regular file" in r.stdout, "--pool of a FIFO: refused, named")
    check(writer.poll() is None, "... its blocked writer was not woken")
    pools_seen()  # the scan passes it by as well
    check(writer.poll() is None, "... not by the /dev/shm scan either")
    writer.kill()
    writer.wait()
    os.unlink(fifo)
    sparse = path + "-sparse"
    with open(sparse, "wb") as f:
        f.truncate(1 << 30)
    pools_seen()
    check(os.stat(sparse).st_blocks == 0, "a sparse file in /dev/shm is not filled in by the scan")
    os.unlink(sparse)
    # Names and strings that are not UTF-8 or carry control bytes: valid JSON, escaped text.
    odd = name.encode() + b"-\xff\x1b[2J\nx"
    r = subprocess.run([tool.encode(), b"create", b"shm:" + odd, b"--size", b"16M"], capture_output=True)
    check(r.returncode == 0, f"a pool with an odd name is created ({r.stderr[-200:]!r})")
    rj = subprocess.run([info_tool, "--json"], capture_output=True)
    try:
        doc = json.loads(rj.stdout.decode("utf-8"))
        devices = [p["device"] for p in doc["shared_pools"]]
    except (ValueError, KeyError, UnicodeDecodeError) as e:
        devices = [f"invalid: {e}"]
    check(f"shm:{name}-\\xFF\u001b[2J\nx" in devices, f"... listed in valid JSON, escaped (got {devices[-3:]})")
    rt = subprocess.run([info_tool], capture_output=True)
    check(b"\x1b" not in rt.stdout and (name.encode() + b"-\\xFF\\x1B[2J\\x0Ax") in rt.stdout,
          "... and in the text as \\xNN, no control byte reaching the terminal")
    # cxlpool-pool itself: the same name in valid JSON and in escaped text.
    quota = b'q"\x1b]0;x\x07'
    for what, args in ((b"info", [b"--json"]), (b"info", []), (b"check", [b"--json"]), (b"check", [])):
        r = subprocess.run([tool.encode(), what, b"shm:" + odd, *args], capture_output=True)
        if b"--json" in args:
            try:
                ok = json.loads(r.stdout.decode("utf-8"))["device"] == f"shm:{name}-\\xFF\u001b[2J\nx"
            except (ValueError, KeyError, UnicodeDecodeError):
                ok = False
        else:
            ok = b"\x1b" not in r.stdout and (name.encode() + b"-\\xFF\\x1B[2J\\x0Ax") in r.stdout
        check(r.returncode == 0 and ok, f"cxlpool-pool {what.decode()} {b' '.join(args).decode()}: the odd name "
              f"escaped ({r.stdout[:160]!r} {r.stderr[-160:]!r})")
    os.unlink(b"/dev/shm/" + odd)
    # A quota and a failure domain with control bytes are refused by the library, and the
    # message that names them reaches the terminal escaped.
    qdev = f"shm:{name}-quota".encode()
    for flag, value in ((b"--quota", quota + b"=4M"), (b"--failure-domain", b"rack\x1b[31m")):
        r = subprocess.run([tool.encode(), b"create", qdev, b"--size", b"16M", flag, value], capture_output=True)
        check(r.returncode == 2 and b"\x1b" not in r.stderr and b"\x07" not in r.stderr and b"\\x1B" in r.stderr and
              not os.path.exists(f"/dev/shm/{name}-quota"),
              f"create {flag.decode()} with control bytes: refused, the message escaped ({r.stderr[:200]!r})")

    code, pools, r = pools_seen("--no-pool-scan", "--pool", f"shm:{name}-nosuch")
    check(code == 1 and pools is not None and "error" in pools.get(f"shm:{name}-nosuch", {}),
          "cxlpool-info --pool of a missing pool: exit 1, the error in its entry")
    r = subprocess.run([info_tool, "--no-pool-scan", "--pool", f"file:{other}"], capture_output=True, text=True)
    check(r.returncode == 1 and "no cxlpool shared-pool header" in r.stdout, "--pool of a foreign file: named, refused")
    r = run("check", f"file:{other}")
    check(r.returncode == 2 and "no cxlpool shared-pool header" in r.stderr, "check refuses a foreign file")
    r = run("rm", f"file:{other}")
    check(r.returncode == 2 and os.path.exists(other), "rm refuses a foreign file and leaves it")
    check(open(other, "rb").read() == b"precious" * 1000, "... byte-identical")
    os.unlink(other)
    r = run("create", "shm:x", "--size", "12Q")
    check(r.returncode == 2 and '"12Q"' in r.stderr, "a bad size names the token")
    for size, says in (("1024T", "has no room for 1125899906842624 bytes"), ("20000000T", "too large"),
                       ("99999999999999999999", "too large"), ("16E", "not a non-negative"),
                       ("-1", "not a non-negative"), (" 5", "not a non-negative"), ("5MX", "not a non-negative")):
        r = run("create", f"shm:{name}-size", "--size", size)
        check(r.returncode == 2 and says in r.stderr and not os.path.exists(f"/dev/shm/{name}-size"),
              f"--size {size!r}: {says} ({r.stderr.splitlines()[0] if r.stderr else ''})")
    for size in ("16MiB", "16m", "16MB"):
        r = run("create", f"shm:{name}-tib", "--size", size, "--extent", "1M")
        check(r.returncode == 0 and os.path.exists(f"/dev/shm/{name}-tib"), f"--size {size} ({r.stderr.strip()[:160]})")
        r = run("rm", f"shm:{name}-tib", "--json")
        try:
            removed = json.loads(r.stdout) == {"device": f"shm:{name}-tib", "removed": True}
        except ValueError:
            removed = False
        check(r.returncode == 0 and removed and not os.path.exists(f"/dev/shm/{name}-tib"),
              f"rm --json says what it removed ({r.stdout.strip()!r})")
    r = run("create", f"shm:{name}-big", "--size", "9223372036854775808")
    check(r.returncode == 2 and "larger than any file" in r.stderr and "ftruncate" not in r.stderr and
          not os.path.exists(f"/dev/shm/{name}-big"), f"--size 2^63: refused before any file ({r.stderr.strip()[-120:]})")
    # Path walks say what is wrong once, naming the component that is: a regular file used as a
    # directory (CONFIG), and, for an unprivileged user, the directory it may not search.
    with tempfile.TemporaryDirectory() as walk:
        plain = os.path.join(walk, "plain")
        open(plain, "w").close()
        r = run("create", f"file:{plain}/pool", "--size", "16M")
        check(r.returncode == 2 and "CXLPOOL_E_CONFIG" in r.stderr and "'plain' is a regular file" in r.stderr and
              r.stderr.lower().count("not a directory") == 1,
              f"a file as a directory: CONFIG, said once ({r.stderr.strip()[-160:]})")
        r = run("create", f"file:{walk}/missing/pool", "--size", "16M")
        check(r.returncode == 2 and "'missing'" in r.stderr and r.stderr.count("No such file or directory") == 1,
              f"a missing directory: named, the reason said once ({r.stderr.strip()[-160:]})")
        if os.geteuid() == 0:
            os.chmod(walk, 0o755)
            closed = os.path.join(walk, "closed")
            os.mkdir(closed, 0o700)
            os.mkdir(os.path.join(closed, "inner"))
            r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", tool, "create",
                                f"file:{closed}/inner/pool", "--size", "16M"], capture_output=True, text=True, timeout=60)
            if r.returncode in (126, 127) or "setpriv" in r.stderr:
                print(f"skip  nobody cannot run the tool here ({r.stderr.strip()[:120]})")
            else:
                check(r.returncode == 2 and "no search permission on the directory 'closed' that holds 'inner'" in
                      r.stderr and r.stderr.count("Permission denied") == 1 and
                      not os.path.exists(os.path.join(closed, "inner", "pool")),
                      f"nobody, a directory it may not search: that directory named ({r.stderr.strip()[-200:]})")
                for cmd in ("info", "check"):
                    r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", tool, cmd,
                                        f"file:{closed}/inner/pool"], capture_output=True, text=True, timeout=60)
                    check(r.returncode == 2 and "no search permission on the directory 'closed'" in r.stderr,
                          f"nobody's {cmd} there: the same ({r.stderr.strip()[-160:]})")
                # root's pool, readable by nobody only as a file it may not write
                rootpool = os.path.join(walk, "rootpool")
                r = run("create", f"file:{rootpool}", "--size", "16M", "--mode", "0644")
                state = open(rootpool, "rb").read() if r.returncode == 0 else b""
                r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", tool, "rm",
                                    f"file:{rootpool}"], capture_output=True, text=True, timeout=60)
                check(r.returncode == 2 and "no permission to open it for reading and writing (its owner is uid 0, "
                      "its mode 0644; this process runs as uid 65534)" in r.stderr and
                      open(rootpool, "rb").read() == state,
                      f"nobody's rm of root's pool: refused saying whose it is, the pool intact ({r.stderr.strip()[-200:]})")
                # a directory nobody may not write to: named, with whose it is
                r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", tool, "create",
                                    f"file:{walk}/nobodys", "--size", "16M"], capture_output=True, text=True,
                                   timeout=60)
                check(r.returncode == 2 and "CXLPOOL_E_PERMISSION" in r.stderr and
                      f"no permission to create a file in the directory '{walk}' (its owner is uid 0, its mode 0755; "
                      "this process runs as uid 65534)" in r.stderr and not os.path.exists(f"{walk}/nobodys"),
                      f"nobody's create in root's directory: refused saying whose it is ({r.stderr.strip()[-200:]})")
    r = run("create", "--help")
    check(r.returncode == 0 and "usage:" in r.stdout, "--help after a command prints the usage")
    r = run("create", "--size", "16M")
    check(r.returncode == 2 and "DEVICE comes first" in r.stderr and not os.path.exists("/dev/shm/--size"),
          "an option where the DEVICE goes is a usage error, not a pool name")
    r = run("create", "shm:x", "--size", "64M", "--coherence", "sometimes")
    check(r.returncode == 2 and '"sometimes"' in r.stderr, "a bad coherence names the token")
    r = run("frobnicate", dev)
    check(r.returncode == 2 and "frobnicate" in r.stderr, "an unknown command is named")

    # Paths through another user's symbolic link (what anyone can put in /tmp): nothing is
    # followed, created, read or removed through it; root's own links are followed.
    if os.geteuid() == 0:
        sticky = tempfile.mkdtemp(prefix="cxlpool-pooltest-sticky-")
        private = tempfile.mkdtemp(prefix="cxlpool-pooltest-root-")
        try:
            os.chmod(sticky, 0o1777)
            link = os.path.join(sticky, "dir-link")
            os.symlink(private, link)
            os.lchown(link, 65534, 65534)  # nobody's
            mine = os.path.join(private, "pool")
            r = run("create", f"file:{link}/pool", "--size", "16M")
            check(r.returncode == 2 and "symbolic link" in r.stderr and not os.listdir(private),
                  f"create through nobody's link to root's directory: refused, nothing created ({r.stderr.strip()})")
            r = run("create", f"file:{mine}", "--size", "16M")
            check(r.returncode == 0, "a pool in root's directory, by its real path")
            state = open(mine, "rb").read()
            for args in (["info"], ["check"], ["check", "--repair"], ["rm"]):
                r = run(args[0], f"file:{link}/pool", *args[1:])
                check(r.returncode == 2 and "symbolic link" in r.stderr and open(mine, "rb").read() == state,
                      f"{' '.join(args)} through nobody's link: refused naming it, the pool byte-identical "
                      f"({r.returncode}: {r.stderr.strip()[:120]})")
            ri = subprocess.run([info_tool, "--no-pool-scan", "--pool", f"file:{link}/pool"], capture_output=True,
                                text=True, timeout=60)
            check(ri.returncode == 1 and "symbolic link" in ri.stdout + ri.stderr,
                  "cxlpool-info --pool through nobody's link: refused naming it")
            own_link = os.path.join(private, "pool-link")
            os.symlink(mine, own_link)
            r = run("rm", f"file:{own_link}")
            check(r.returncode == 2 and os.path.exists(mine) and os.path.islink(own_link),
                  "rm of a symlink to a pool (the last component): refused, both kept")
            root_link = os.path.join(sticky, "root-dir-link")  # root's own link: followed
            os.symlink(private, root_link)
            r = run("info", f"file:{root_link}/pool")
            check(r.returncode == 0, f"info through root's own link to its directory works ({r.stderr.strip()})")
            r = run("rm", f"file:{root_link}/pool")
            check(r.returncode == 0 and not os.path.exists(mine), "rm through root's own link removes the pool")
        finally:
            shutil.rmtree(sticky, ignore_errors=True)
            shutil.rmtree(private, ignore_errors=True)
    else:
        print("skip  paths through another user's symbolic link: planting one needs root")

    r = run("rm", dev)
    check(r.returncode == 0 and not os.path.exists(path), "rm removes the pool's name")
finally:
    if os.path.exists(path):
        os.unlink(path)

print(f"{failures} failures")
sys.exit(1 if failures else 0)
