#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# cxlpool-compose end to end: list, grant and reclaim in text and JSON, each exit status
# (refused, busy, no pool), a program holding its quota's blocks through a reclaim, an
# unprivileged user against root's pool, and the tool killed with SIGKILL at random points
# a hundred times: afterwards the grants add up to no more than the pool and the checker
# finds nothing to repair.
import json
import os
import random
import signal
import subprocess
import sys
import time

tool, pool_tool, lib = sys.argv[1], sys.argv[2], sys.argv[3]
failures = 0
name = f"cxlpool-composetest-{os.getpid()}"
dev = f"shm:{name}"
path = f"/dev/shm/{name}"


def check(cond, what):
    global failures
    print(("ok    " if cond else "FAIL  ") + what)
    if not cond:
        failures += 1


def run(*args, prefix=()):
    return subprocess.run([*prefix, tool, *args], capture_output=True, text=True, timeout=120)


def state():
    r = run("list", dev, "--json")
    return r.returncode, (json.loads(r.stdout) if r.returncode == 0 else None), r


def quota(s, q):
    return next(x for x in s["quotas"] if x["name"] == q)


# Opens the pool (argv[2]) on a quota (argv[3]) through the library (argv[1]), the key from
# CXLPOOL_QUOTA_KEY: exit 0 when it opened.
PROBE = r"""
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
pp = ctypes.c_void_p()
assert lib.cxlpool_shared_params_create(ctypes.byref(pp)) == 0
assert lib.cxlpool_shared_params_set_quota(pp, sys.argv[3].encode()) == 0
p = ctypes.c_void_p()
st = lib.cxlpool_shared_pool_open(sys.argv[2].encode(), pp, ctypes.byref(p))
lib.cxlpool_last_error_message.restype = ctypes.c_char_p
print(st, lib.cxlpool_last_error_message().decode())
sys.exit(0 if st == 0 else 1)
"""


def invariant(s):
    return sum(max(q["granted_extents"], q["used_extents"]) for q in s["quotas"]) <= s["extents_total"]


try:
    r = subprocess.run([pool_tool, "create", dev, "--size", "40M", "--extent", "1M", "--quota", "a=8M",
                        "--quota", "b=8M", "--heartbeat-ms", "5", "--timeout-ms", "200"],
                       capture_output=True, text=True, timeout=60)
    check(r.returncode == 0, f"create a pool with quotas a and b ({r.stderr.strip()})")
    code, s, r = state()
    n = s["extents_total"] if s else 0
    check(code == 0 and s["extents_unassigned"] == 0 and quota(s, "a")["granted_extents"] == 8 and
          quota(s, "a")["reserved_extents"] == 8 and not quota(s, "a")["grant_set"],
          "list --json: the quotas as created, nothing unassigned")
    r = run("list", dev)
    check(r.returncode == 0 and "unassigned" in r.stdout and " a " in r.stdout, "list: a table")

    r = run("grant", dev, "a", "1M")
    check(r.returncode == 1 and "CXLPOOL_E_CAPACITY" in r.stderr and "0 of" in r.stderr,
          "grant with nothing unassigned: exit 1, says how much is")
    r = run("reclaim", dev, "default", "4M", "--json")
    out = json.loads(r.stdout) if r.returncode == 0 else {}
    check(r.returncode == 0 and out.get("reclaimed_extents") == 4 and out.get("extents_unassigned") == 4,
          "reclaim from an idle quota: done at once")
    r = run("grant", dev, "a", "4", "--extents", "--json")
    out = json.loads(r.stdout) if r.returncode == 0 else {}
    check(r.returncode == 0 and out.get("granted_extents") == 12 and out.get("extents_unassigned") == 0,
          "grant --extents: a now 12")
    for args, what in ((["grant", dev, "nope", "1M"], "an unknown quota"),
                       (["grant", dev, "a", "1536K", "--json"], "a size that is not whole extents"),
                       (["grant", dev, "a", "0", "--extents"], "nothing"),
                       (["reclaim", dev, "a", "100", "--extents"], "more than the grant"),
                       (["grant", dev, "a"], "no amount"),
                       (["grant", dev, "a", "1M", "--deadline", "3"], "a reclaim's option on grant"),
                       (["frob", dev], "an unknown command")):
        before = run("list", dev, "--json").stdout
        r = run(*args)
        check(r.returncode == 1 and r.stdout == "" and run("list", dev, "--json").stdout == before,
              f"{what}: exit 1, nothing printed on stdout, nothing changed ({r.stderr.strip().splitlines()[0]})")
    r = run("list", f"shm:{name}-missing")
    check(r.returncode == 3 and not os.path.exists(f"{path}-missing"), "no such pool: exit 3, nothing created")

    # A program of quota a holding blocks: a reclaim takes only what it gives back.
    libs = subprocess.run(["ldd", lib], capture_output=True, text=True).stdout
    sanitized = "libasan" in libs or "libtsan" in libs
    if sanitized:
        print("skip  holder scenario: sanitizer build (python cannot load the library)")
    else:
        prog = ("import ctypes,sys\n"
                f"lib=ctypes.CDLL({lib!r})\n"
                "class P(ctypes.Structure): pass\n"
                "pp=ctypes.c_void_p(); assert lib.cxlpool_shared_params_create(ctypes.byref(pp))==0\n"
                "assert lib.cxlpool_shared_params_set_quota(pp,b'a')==0\n"
                f"p=ctypes.c_void_p(); assert lib.cxlpool_shared_pool_open({dev.encode()!r},pp,ctypes.byref(p))==0\n"
                "held=[]\n"
                "for i in range(10):\n"
                "  b=ctypes.c_void_p(); assert lib.cxlpool_shared_alloc(p,ctypes.c_size_t(1<<20),ctypes.byref(b))==0\n"
                "  ctypes.memset(b,0x5a,1<<20); held.append(b)\n"
                "print('ready',flush=True)\n"
                "for line in sys.stdin:\n"
                "  for b in held[:int(line)]: assert lib.cxlpool_shared_free(p,b)==0\n"
                "  held=held[int(line):]\n"
                "  ok=all(ctypes.string_at(b,1<<20)==b'\\x5a'*(1<<20) for b in held)\n"
                "  print('intact' if ok else 'DAMAGED',flush=True)\n")
        holder = subprocess.Popen([sys.executable, "-c", prog], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True)
        check(holder.stdout.readline().strip() == "ready", "a program of quota a holds 10 extents")
        r = run("reclaim", dev, "a", "4", "--extents", "--deadline", "0", "--json")
        out = json.loads(r.stdout) if r.stdout else {}
        check(r.returncode == 2 and "still held" in r.stderr and out.get("granted_extents") == 10,
              "reclaim of extents in use: exit 2 at the deadline, the grant covers what is held "
              f"({r.stderr.strip().splitlines()[-1] if r.stderr else ''})")
        holder.stdin.write("3\n")
        holder.stdin.flush()
        check(holder.stdout.readline().strip() == "intact", "the holder's blocks are intact")
        r = run("reclaim", dev, "a", "4", "--extents", "--deadline", "0", "--json")
        out = json.loads(r.stdout) if r.stdout else {}
        check(r.returncode == 2 and out.get("reclaimed_extents") == 3 and out.get("granted_extents") == 7,
              f"three freed: the reclaim takes those three ({r.stdout.strip()})")
        holder.stdin.write("7\n")
        holder.stdin.flush()
        holder.stdout.readline()
        r = run("reclaim", dev, "a", "7", "--extents", "--deadline", "60", "--json")
        out = json.loads(r.stdout) if r.stdout else {}
        check(r.returncode == 0 and out.get("granted_extents") == 0, "all freed: the rest is reclaimed")
        holder.stdin.close()
        holder.wait(timeout=60)
        r = run("grant", dev, "a", "8", "--extents")
        check(r.returncode == 0, "and granted back")

    # A policy, then a daemon: idle quotas give back what they do not use, but not below their
    # minimum.
    r = run("policy", "set", dev, "a", "--min", "3M", "--priority", "7", "--json")
    out = json.loads(r.stdout) if r.returncode == 0 else {}
    check(out.get("min_extents") == 3 and out.get("priority") == 7 and out.get("max_extents") == 0,
          f"policy set: minimum and priority ({r.stdout.strip()}{r.stderr.strip()})")
    r = run("policy", "set", dev, "a", "--max", "2M")
    check(r.returncode == 1 and "above maximum" in r.stderr, "policy set: a maximum below the minimum is refused")
    r = run("policy", "set", dev, "b", "--min", "1000", "--extents")
    check(r.returncode == 1 and "above the pool" in r.stderr, "policy set: a minimum above the pool is refused")
    r = run("policy", "set", dev, "b")
    check(r.returncode == 1 and "nothing to set" in r.stderr, "policy set: nothing to set is a usage error")
    r = run("daemon", dev, "--period", "20", "--hold-ms", "100", "--for", "1", "--json")
    moves = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    code, s, _ = state()
    check(r.returncode == 0 and any(m["why"] == "idle" for m in moves) and s and
          quota(s, "a")["granted_extents"] == 3 and quota(s, "b")["granted_extents"] == 0,
          f"daemon --for 1: idle grants go back, a keeps its minimum ({len(moves)} changes)")
    r = run("list", dev)
    check(r.returncode == 0 and "priority" in r.stdout, "list shows the policy")
    r = run("reclaim", dev, "a", "3", "--extents")
    r = run("grant", dev, "default", str(s["extents_unassigned"] + 3 if s else 0), "--extents")
    check(r.returncode == 0, "everything granted back to default by hand")

    # A quota whose name begins with '-' is a quota like any other (QUOTA is positional).
    dash = f"shm:{name}-dash"
    r = subprocess.run([pool_tool, "create", dash, "--size", "16M", "--extent", "1M", "--quota", "-x=4M"],
                       capture_output=True, text=True, timeout=60)
    r2 = run("reclaim", dash, "-x", "1", "--extents", "--json")
    r3 = run("grant", dash, "-x", "1M", "--json")
    check(r.returncode == 0 and r2.returncode == 0 and r3.returncode == 0 and '"granted_extents": 4' in r3.stdout,
          f"a quota named -x: reclaimed and granted ({r2.stderr.strip()}{r3.stderr.strip()})")
    if os.path.exists(f"/dev/shm/{name}-dash"):
        os.unlink(f"/dev/shm/{name}-dash")

    # Another user: root's pool (mode 0600) cannot be opened, nothing changes.
    before = open(path, "rb").read(4096)
    r = run("grant", dev, "a", "1M", prefix=("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"))
    if r.returncode in (126, 127) or "setpriv" in r.stderr:
        print(f"skip  nobody cannot run the tool here ({r.stderr.strip()[:120]})")
    else:
        check(r.returncode == 3 and "CXLPOOL_E_PERMISSION" in r.stderr and open(path, "rb").read(4096) == before,
              f"nobody's grant on root's pool: exit 3, permission, nothing changed ({r.stderr.strip()[-120:]})")

    # Quota keys and CDI specs (docs/compose.md, "Containers").
    import shutil
    import stat as stat_mod
    import tempfile
    cdi = tempfile.mkdtemp(prefix="cxlpool-cdi-")
    try:
        r = run("lock", dev, "a", "--json")
        key = json.loads(r.stdout)["key"] if r.returncode == 0 else ""
        check(r.returncode == 0 and len(key) == 32 and quota(state()[1], "a")["locked"],
              f"lock --json: a key of 32 digits, the quota shown locked ({r.stderr.strip()})")
        r = run("list", dev)
        check(r.returncode == 0 and "locked" in r.stdout, "list shows the lock")
        r = run("unlock", dev, "a")
        check(r.returncode == 0 and not quota(state()[1], "a")["locked"], "unlock")
        r = run("lock", dev, "nope")
        check(r.returncode == 1 and "nope" in r.stderr, "lock of an unknown quota: exit 1, named")

        r = run("cdi", dev, "--quota", "a", "--quota", "b=kv-b", "--dir", cdi, "--kind", "example.com/cxl", "--json")
        out = json.loads(r.stdout) if r.returncode == 0 else {}
        specfile = out.get("spec", "")
        spec = json.load(open(specfile)) if specfile and os.path.exists(specfile) else {}
        devs = {d["name"]: d for d in spec.get("devices", [])}
        env_a = devs.get(f"{name}-a", {}).get("containerEdits", {}).get("env", [])
        check(r.returncode == 0 and spec.get("cdiVersion") == "0.5.0" and spec.get("kind") == "example.com/cxl" and
              set(devs) == {f"{name}-a", "kv-b"} and f"CXLPOOL_POOL={dev}" in env_a and "CXLPOOL_QUOTA=a" in env_a and
              f"CXLPOOL_DEVICES=cxlpool:backing=pool:a@{dev}" in env_a and
              devs["kv-b"]["containerEdits"]["mounts"][0]["hostPath"] == path and
              stat_mod.S_IMODE(os.stat(specfile).st_mode) == 0o600,
              f"cdi: a spec of two devices, their environment and the pool's file, mode 0600 ({r.stderr.strip()})")
        keys = [e.split("=", 1)[1] for d in devs.values() for e in d["containerEdits"]["env"]
                if e.startswith("CXLPOOL_QUOTA_KEY=")]
        s = state()[1]
        check(len(set(keys)) == 2 and quota(s, "a")["locked"] and quota(s, "b")["locked"] and
              not quota(s, "default")["locked"], "each device has its own key; both quotas locked, default not")
        r = run("cdi", dev, "--quota", "a", "--print")
        check(r.returncode == 0 and json.loads(r.stdout)["devices"][0]["name"] == f"{name}-a",
              "cdi --print: the spec on standard output")
        r = run("cdi", dev, "--quota", "a", "--dir", cdi, "--kind", "example.com/cxl")
        check(r.returncode == 0 and "--device example.com/cxl=" in r.stdout, "cdi again replaces its own spec")
        # What is not ours is left alone: a file of someone else's, a link.
        foreign = os.path.join(cdi, os.path.basename(specfile))
        os.unlink(foreign)
        with open(foreign, "w") as f:
            f.write('{"cdiVersion": "0.5.0", "kind": "example.com/cxl", "devices": []}')
        r = run("cdi", dev, "--quota", "a", "--dir", cdi, "--kind", "example.com/cxl")
        r2 = run("cdi", dev, "--remove", "--dir", cdi, "--kind", "example.com/cxl")
        check(r.returncode == 1 and "not a spec cxlpool-compose wrote" in r.stderr and r2.returncode == 1 and
              open(foreign).read().startswith('{"cdiVersion"'),
              f"another's file at the spec's name: refused, untouched ({r.stderr.strip()[:160]})")
        os.unlink(foreign)
        target = os.path.join(cdi, "target")
        with open(target, "w") as f:
            f.write("precious")
        os.symlink(target, foreign)
        r = run("cdi", dev, "--quota", "a", "--dir", cdi, "--kind", "example.com/cxl")
        check(r.returncode == 1 and os.path.islink(foreign) and open(target).read() == "precious",
              f"a link at the spec's name: refused, its target untouched ({r.stderr.strip()[:160]})")
        os.unlink(foreign)
        r = run("cdi", dev, "--quota", "a", "--dir", cdi + "/missing")
        check(r.returncode == 1 and "must exist" in r.stderr, "a missing directory: exit 1, said")
        # A failed cdi changes no key: the spec deployed before keeps working.
        r = run("cdi", dev, "--quota", "a", "--dir", cdi, "--kind", "example.com/cxl", "--json")
        spec_a = json.load(open(json.loads(r.stdout)["spec"])) if r.returncode == 0 else {}
        key_a = next((e.split("=", 1)[1] for d in spec_a.get("devices", []) for e in d["containerEdits"]["env"]
                      if e.startswith("CXLPOOL_QUOTA_KEY=")), "")
        for args in (("--quota", "a", "--dir", cdi + "/missing"), ("--quota", "a", "--quota", "nosuch", "--dir", cdi),
                     ("--quota", "a", "--kind", "a/b", "--dir", cdi)):
            run("cdi", dev, *args)
        if sanitized:
            print("skip  the deployed key checked by opening: sanitizer build (python cannot load the library)")
        else:
            r = subprocess.run([sys.executable, "-c", PROBE, lib, dev, "a"], capture_output=True, text=True,
                               timeout=60, env=dict(os.environ, CXLPOOL_QUOTA_KEY=key_a))
            check(r.returncode == 0, f"failed cdi runs changed no key: the deployed key still opens a "
                  f"({r.stdout.strip()}{r.stderr.strip()[-200:]})")
        # Two pools whose names look alike get specs of their own; the same device name is refused.
        other = f"{name}-x"
        subprocess.run([pool_tool, "create", f"shm:{other}", "--size", "16M", "--extent", "1M", "--quota", "a=4M"],
                       capture_output=True, timeout=60)
        r = run("cdi", f"shm:{other}", "--quota", "a=" + f"{name}-a", "--dir", cdi, "--kind", "example.com/cxl")
        r2 = run("cdi", f"shm:{other}", "--quota", "a", "--dir", cdi, "--kind", "example.com/cxl", "--json")
        check(r.returncode == 1 and "another spec's" in r.stderr and r2.returncode == 0 and
              r2.stdout and len([f for f in os.listdir(cdi) if f.endswith(".json")]) == 2,
              f"another pool: its own spec file; a device name another spec uses refused ({r.stderr.strip()[:160]})")
        run("cdi", f"shm:{other}", "--remove", "--dir", cdi, "--kind", "example.com/cxl")
        subprocess.run([pool_tool, "rm", f"shm:{other}"], capture_output=True, timeout=60)
        # A spec file of another user, a directory others can write: left alone.
        specname = os.path.basename(json.loads(run("cdi", dev, "--quota", "a", "--dir", cdi, "--kind",
                                                   "example.com/cxl", "--json").stdout)["spec"])
        os.chown(os.path.join(cdi, specname), 65534, 65534)
        r = run("cdi", dev, "--quota", "a", "--dir", cdi, "--kind", "example.com/cxl")
        r2 = run("cdi", dev, "--remove", "--dir", cdi, "--kind", "example.com/cxl")
        check(r.returncode == 1 and r2.returncode == 1 and os.path.exists(os.path.join(cdi, specname)),
              f"a spec file owned by another user: not replaced, not removed ({r.stderr.strip()[:120]})")
        os.unlink(os.path.join(cdi, specname))
        os.chmod(cdi, 0o777)
        r = run("cdi", dev, "--quota", "a", "--dir", cdi)
        check(r.returncode == 1 and "writable by others" in r.stderr, "a directory others can write: refused")
        os.chmod(cdi, 0o755)
        # A temporary spec left by a killed run (its pid gone) is swept by the next one.
        stale = os.path.join(cdi, ".cxlpool-cdi.999999999.0")
        with open(stale, "w") as f:
            f.write("CXLPOOL_QUOTA_KEY=00")
        os.utime(stale, (time.time() - 3600, time.time() - 3600))  # left an hour ago
        fresh = os.path.join(cdi, ".cxlpool-cdi.999999998.0")  # perhaps another pid namespace's run
        with open(fresh, "w") as f:
            f.write("CXLPOOL_QUOTA_KEY=00")
        run("cdi", dev, "--quota", "a", "--dir", cdi, "--kind", "example.com/cxl")
        check(not os.path.exists(stale) and os.path.exists(fresh),
              "a dead run's temporary spec left an hour ago is removed, a recent one is not")
        os.unlink(fresh)
        r = subprocess.run(f"{tool} lock {dev} a > /dev/full", shell=True, capture_output=True, text=True, timeout=60)
        check(r.returncode == 1 and "key nobody got" in r.stderr, f"lock to a full output: exit 1, said ({r.stderr.strip()})")
        run("unlock", dev, "a")
        r = run("cdi", "shm:back\\slash", "--quota", "a", "--dir", cdi)
        check(r.returncode == 1 and "backslash" in r.stderr, "a location with a backslash: refused")
        # The way back from a lost key: reset-keys, without joining.
        r = run("lock", dev, "default")
        r2 = run("list", dev)
        r3 = run("reset-keys", dev, "--json")
        r4 = run("list", dev, "--json")
        check(r.returncode == 0 and r2.returncode == 3 and "is locked" in r2.stderr and r3.returncode == 0 and
              json.loads(r3.stdout)["unlocked"] >= 2 and r4.returncode == 0 and
              not any(q["locked"] for q in json.loads(r4.stdout)["quotas"]),
              f"default locked and its key lost: list refused, reset-keys unlocks every quota ({r3.stdout.strip()})")
        for args, what in [(("--quota", "a", "--kind", "nokind"), "a kind without a class"),
                           (("--quota", "a", "--kind", "a/b"), "a kind podman's parser cannot take"),
                           (("--quota", "a", "--kind", "cxlpool.io/po.ol"), "a class with a dot"),
                           (("--quota", "a=x:y"), "a device name with ':'"),
                           (("--quota", "a=bad name"), "a bad device name"),
                           (("--quota", "a", "--quota", "a"), "a quota given twice"),
                           ((), "no quota"),
                           (("--remove", "--quota", "a"), "--remove with --quota")]:
            r = run("cdi", dev, *args, "--dir", cdi)
            check(r.returncode == 1 and "usage:" in r.stderr, f"cdi refuses {what}")
        r = run("cdi", "shm:x,y", "--quota", "a", "--dir", cdi)
        check(r.returncode == 1 and "CXLPOOL_DEVICES cannot carry" in r.stderr, "a location CXLPOOL_DEVICES cannot carry")
        run("cdi", dev, "--remove", "--dir", cdi, "--kind", "example.com/cxl")
        r = run("cdi", dev, "--remove", "--dir", cdi, "--kind", "example.com/cxl")
        check(r.returncode == 1, "--remove of a spec that is not there: exit 1")
        r = run("cdi", dev, "--quota", "a", "--dir", cdi, "--kind", "example.com/cxl")
        r2 = run("cdi", dev, "--remove", "--dir", cdi, "--kind", "example.com/cxl")
        check(r.returncode == 0 and r2.returncode == 0 and not os.path.exists(foreign), "--remove deletes its spec")
        r = run("unlock", dev, "a")
        r2 = run("unlock", dev, "b")
        check(r.returncode == 0 and r2.returncode == 0, "both unlocked again")
    finally:
        shutil.rmtree(cdi, ignore_errors=True)

    # The tool killed anywhere: joining, holding the compose claim, between its stores.
    rng = random.Random(os.getpid())
    for i in range(100):
        q = rng.choice(["default", "a", "b"])
        cmd = rng.choice(["grant", "reclaim"])
        p = subprocess.Popen([tool, cmd, dev, q, str(1 + rng.randrange(4)), "--extents", "--deadline", "0"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.random() * 0.03)
        p.send_signal(signal.SIGKILL)
        p.wait()
    code, s, r = state()
    check(code == 0 and invariant(s) and not s["overcommitted"] and
          not any(q["grant_damaged"] for q in s["quotas"]),
          f"after 100 kills: grants within the pool, none damaged ({r.stdout.strip()[:200]})")
    if s and s["extents_unassigned"]:
        r = run("grant", dev, "b", str(s["extents_unassigned"]), "--extents")
        check(r.returncode == 0, "a new composer grants what was unassigned")
    code, s, r = state()
    check(code == 0 and s["extents_unassigned"] == 0 and
          sum(q["granted_extents"] for q in s["quotas"]) == n, "every extent granted once: none lost")
    r = subprocess.run([pool_tool, "check", dev, "--repair", "--json"], capture_output=True, text=True, timeout=120)
    rep = json.loads(r.stdout) if r.stdout else {}
    check(r.returncode == 0 and rep.get("words_repaired") == 0 and rep.get("words_reset") == 0,
          f"check: consistent, nothing to repair ({r.stdout.strip()[:200]})")
finally:
    if os.path.exists(path):
        os.unlink(path)

print(f"{failures} failures")
sys.exit(1 if failures else 0)
