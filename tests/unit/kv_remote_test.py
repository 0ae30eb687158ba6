#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# The KV cache handoff between processes that share no pool (libcxlpool_ucx), one CTest test
# per mode, with both ends as real processes (kv_remote_peer):
#   selftest  the API's argument checks (addresses named token by token, NULLs, foreign and
#             stopped handles, a port already taken, nobody listening, landing views)
#   tcp       1,000 handoffs of random sizes over UCX tcp on loopback, checksums equal; one
#             OPT-6.7B-sized sequence; the server holds no lease afterwards
#   sm        the same through shared memory (CXLPOOL_KV_REMOTE_SAME_HOST on both ends,
#             UCX_TLS=sm,tcp): the consumer's path is "same host" (sysv + cma) and the server
#             counts it; a consumer asking a server that does not offer it gets tcp, saying why
#   netns     the same between two network namespaces joined by a veth pair this test creates
#             (UCX tcp pinned to the veth with UCX_NET_DEVICES); a consumer there asking for
#             the same-host path is refused it (no shared memory reaches it) and still works
#   hostile   forged and damaged handles refused with the import's status; a sequence the
#             producer destroyed while a consumer holds it still reads back; a consumer killed
#             with SIGKILL while holding views: the server drops its leases; the server stopping
#             under a connected consumer: the consumer's next import fails cleanly
#   hostile-sm the same on the shared-memory path
# Usage: kv_remote_test.py KV_REMOTE_PEER MODE
import os
import random
import signal
import subprocess
import sys
import time
import uuid

peer, mode = sys.argv[1], sys.argv[2]
failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
        print("FAILED:", what, flush=True)


class Proc:
    def __init__(self, argv, env=None, prefix=()):
        self.argv = list(prefix) + argv
        self.p = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, env=env)

    def line(self, timeout=120):  # a hang guard: a sanitizer build on a loaded machine is slow
        import select
        r, _, _ = select.select([self.p.stdout], [], [], timeout)
        if not r:
            raise RuntimeError(f"{self.argv[-3:]}: no answer within {timeout} s")
        out = self.p.stdout.readline()
        if not out:
            raise RuntimeError(f"{self.argv[-3:]}: exited ({self.p.wait()}): {self.p.stderr.read()[-2000:]}")
        return out.strip()

    def ask(self, text, timeout=120):
        self.p.stdin.write(text + "\n")
        self.p.stdin.flush()
        return self.line(timeout)

    def quit(self):
        try:
            self.p.stdin.write("Q\n")
            self.p.stdin.flush()
        except BrokenPipeError:
            pass
        try:
            out, err = self.p.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.p.kill()
            out, err = self.p.communicate()
        return self.p.returncode, out, err


def ucx_env(tls, dev=None):
    env = dict(os.environ)
    env["UCX_TLS"] = tls
    if dev:
        env["UCX_NET_DEVICES"] = dev
    env.setdefault("UCX_LOG_LEVEL", "error")
    return env


created = []  # pool names of this run: a killed peer cannot unlink its own


def names():
    tag = uuid.uuid4().hex[:8]
    created.extend([f"cxlpool-kvr-p-{tag}", f"cxlpool-kvr-c-{tag}"])
    return f"shm:cxlpool-kvr-p-{tag}", f"shm:cxlpool-kvr-c-{tag}"


def handoffs(prod, cons, count, rng, max_tokens=400):
    bad = 0
    for i in range(count):
        tokens = rng.randint(1, max_tokens)
        h = prod.ask(f"S {tokens} {rng.randrange(1 << 40)}")
        if not h.startswith("H "):
            check(False, f"export {i}: {h}")
            return
        answer = cons.ask(h)
        if answer != "ok":
            bad += 1
            if bad <= 5:
                check(False, f"handoff {i} ({tokens} tokens): {answer}")
    check(bad == 0, f"{count} handoffs: {bad} bad")


def stats(prod):
    s = prod.ask("L").split()
    return {"views": int(s[1]), "fetches": int(s[2]), "refused": int(s[3]), "disconnects": int(s[4]),
            "leases": int(s[5]), "same_host": int(s[6])}


SAME = ["same-host"]


def consumer(cdev, where, tls, dev, prefix=(), same=False):
    cons = Proc([peer, "consume", cdev, where] + (SAME if same else []), env=ucx_env(tls, dev), prefix=prefix)
    first = cons.line()
    if not first.startswith("connected "):
        raise RuntimeError(f"consumer: {first}")
    cons.path = first[len("connected "):]
    return cons


def pair(tls, addr="127.0.0.1:0", dev=None, prod_prefix=(), cons_prefix=(), cons_dev=None, same=False,
         cons_same=None):
    pdev, cdev = names()
    prod = Proc([peer, "produce", pdev, addr] + (SAME if same else []), env=ucx_env(tls, dev), prefix=prod_prefix)
    first = prod.line()
    if not first.startswith("listening "):
        raise RuntimeError(f"producer: {first}")
    where = first.split()[1]
    cons = consumer(cdev, where, tls, cons_dev or dev, cons_prefix, same if cons_same is None else cons_same)
    return prod, cons, where


def run_handoffs(tls, count, dev=None, addr="127.0.0.1:0", prod_prefix=(), cons_prefix=(), cons_dev=None,
                 same=False, want_path="network: ", want_reason=""):
    prod, cons, where = pair(tls, addr, dev, prod_prefix, cons_prefix, cons_dev, same)
    print(f"{tls}: producer at {where}; consumer's path: {cons.path}", flush=True)
    check(cons.path.startswith(want_path) and want_reason in cons.path,
          f"the consumer's path starts with {want_path!r} ({want_reason!r}): {cons.path}")
    rng = random.Random(20261201)
    t0 = time.time()
    handoffs(prod, cons, count, rng)
    print(f"{tls}: {count} handoffs in {time.time() - t0:.1f} s", flush=True)
    # One large sequence: 2048 tokens of the test geometry (2 MiB, 128 blocks).
    handoffs(prod, cons, 1, rng, max_tokens=2048)
    # The consumer has every block before the server has seen its last send complete (a
    # rendezvous completes when the consumer's acknowledgement is processed): a moment's grace.
    for _ in range(600):  # 60 s: a hang guard
        s = stats(prod)
        if s["views"] == 0 and s["leases"] == 0:
            break
        time.sleep(0.1)
    check(s["views"] == 0 and s["leases"] == 0, f"after the handoffs the server holds nothing: {s}")
    check(s["fetches"] == count + 1, f"fetches counted: {s}")
    check(s["same_host"] == (1 if want_path.startswith("same host") else 0), f"same-host paths counted: {s}")
    rc, _, err = cons.quit()
    check(rc == 0, f"consumer exit {rc}: {err[-500:]}")
    rc, _, err = prod.quit()
    check(rc == 0, f"producer exit {rc}: {err[-500:]}")


def sh(*argv, ok=True):
    r = subprocess.run(list(argv), capture_output=True, text=True)
    if ok and r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {r.stderr.strip()}")
    return r


class Forwarder:
    """A TCP forwarder run by this (root) process: 127.0.0.1:port -> host:target."""

    def __init__(self, host, target):
        import socket
        import threading
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(8)
        self.port = self.listener.getsockname()[1]

        def pump(a, b):
            try:
                while True:
                    data = a.recv(65536)
                    if not data:
                        break
                    b.sendall(data)
            except OSError:
                pass
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

        def serve():
            while True:
                try:
                    client, _ = self.listener.accept()
                except OSError:
                    return
                upstream = socket.create_connection((host, target))
                for a, b in ((client, upstream), (upstream, client)):
                    threading.Thread(target=pump, args=(a, b), daemon=True).start()

        threading.Thread(target=serve, daemon=True).start()


def netns():
    tag = uuid.uuid4().hex[:6]
    a, b = f"cxlkv-a-{tag}", f"cxlkv-b-{tag}"
    va, vb = f"cxa{tag}", f"cxb{tag}"
    if sh("ip", "netns", "add", a, ok=False).returncode != 0:
        print("SKIP: cannot create network namespaces here (needs root and CAP_SYS_ADMIN)", flush=True)
        sys.exit(77)
    try:
        sh("ip", "netns", "add", b)
        sh("ip", "link", "add", va, "type", "veth", "peer", "name", vb)
        sh("ip", "link", "set", va, "netns", a)
        sh("ip", "link", "set", vb, "netns", b)
        sh("ip", "-n", a, "addr", "add", "10.231.7.1/24", "dev", va)
        sh("ip", "-n", b, "addr", "add", "10.231.7.2/24", "dev", vb)
        for ns, v in ((a, va), (b, vb)):
            sh("ip", "-n", ns, "link", "set", v, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        # The namespaces share no network: the consumer reaches the producer only through the
        # veth pair.
        # Both ends ask for the same-host path: UCX has no shared-memory way across (the
        # namespaces' sockets differ; sm is allowed in UCX_TLS), so the server refuses it, says
        # why, and the blocks go over the veth.
        run_handoffs("sm,tcp", 1000, dev=va, addr="10.231.7.1:0", prod_prefix=("ip", "netns", "exec", a),
                     cons_prefix=("ip", "netns", "exec", b), cons_dev=vb, same=True,
                     want_path="network: ", want_reason="it runs in another network namespace")
    finally:
        sh("ip", "netns", "del", a, ok=False)
        sh("ip", "netns", "del", b, ok=False)


def hostile(same=False):
    tls = "sm,tcp" if same else "tcp"
    prod, cons, where = pair(tls, dev="lo", same=same)
    check(cons.path.startswith("same host: " if same else "network: "), f"the path: {cons.path}")
    rng = random.Random(7)
    h = prod.ask("S 100 42")
    hexh = h.split()[1]
    raw = bytes.fromhex(hexh)
    # Every single-bit flip of the handle is refused by the server, with its status.
    refused = 0
    for bit in range(0, len(raw) * 8, 7):
        b = bytearray(raw)
        b[bit // 8] ^= 1 << (bit % 8)
        answer = cons.ask("F " + b.hex())
        refused += answer.startswith("status -") and "refused by" in answer
    check(refused == len(range(0, len(raw) * 8, 7)), f"flipped handles refused: {refused}")
    for _ in range(50):
        answer = cons.ask("F " + bytes(rng.randrange(256) for _ in raw).hex())
        check(answer.startswith("status -"), f"random handle: {answer}")
    s = stats(prod)
    check(s["views"] == 0 and s["leases"] == 0, f"no lease kept after refusals: {s}")
    # Held by the consumer, destroyed by the producer: what was read stays correct.
    check(cons.ask("K " + hexh) == "held", "hold")
    check(prod.ask("X") == "destroyed", "destroy")
    answer = cons.ask("F " + hexh)
    check(answer.startswith("status -12"), f"a destroyed export is STALE: {answer}")
    rc, _, _ = cons.quit()
    check(rc == 0, "consumer exit")
    # A consumer stopped and then killed in the middle of reading a sequence: while it is
    # stopped the server holds its leases (the producer's blocks stay safe), once it is dead
    # they go.
    pdev, cdev = names()
    cons = consumer(cdev, where, tls, "lo", same=same)
    h = prod.ask("S 60000 43")  # 3,750 blocks, 60 MB: a read long enough to be caught in
    caught = None
    for attempt in range(20):
        cons.p.stdin.write(h.replace("H ", "K ", 1) + "\n")
        cons.p.stdin.flush()
        for _ in range(2000):
            s = stats(prod)
            if s["views"] == 1:
                cons.p.send_signal(signal.SIGSTOP)
                caught = stats(prod)
                break
        if caught and caught["views"] == 1:
            break
        caught = None
        check(cons.line() == "held", "a fetch finished before it was caught; again")
    check(caught is not None and caught["leases"] >= 3750, f"the server holds the leases of a stopped consumer: {caught}")
    time.sleep(0.5)
    s = stats(prod)
    check(s["views"] == 1, f"... still while it is stopped: {s}")
    gone_before = s["disconnects"]
    cons.p.send_signal(signal.SIGKILL)
    cons.p.wait()
    for _ in range(600):  # 60 s: a hang guard
        s = stats(prod)
        if s["views"] == 0 and s["leases"] == 0:
            break
        time.sleep(0.1)
    check(s["views"] == 0 and s["leases"] == 0 and s["disconnects"] == gone_before + 1,
          f"leases dropped after the consumer was killed: {s}")
    # The server goes away under a connected consumer: the next import fails, no hang.
    cons = consumer(cdev, where, tls, "lo", same=same)
    h = prod.ask("S 50 44")
    rc, _, err = prod.quit()
    check(rc == 0, f"producer exit {rc}: {err[-300:]}")
    t0 = time.time()
    answer = cons.ask("F " + h.split()[1], timeout=60)
    check(answer.startswith("status -15") or answer.startswith("status -6"),
          f"import from a stopped server: {answer}")
    # The consumer's timeout is 10 s; what is tested is that it ends (a hang would hit the
    # 60 s guard above), not how fast this machine gets there.
    check(time.time() - t0 < 50, f"... within the timeout ({time.time() - t0:.1f} s)")
    answer = cons.ask("F " + h.split()[1], timeout=60)
    check(answer.startswith("status -15"), f"the connection stays failed: {answer}")
    rc, _, _ = cons.quit()
    check(rc == 0, "consumer exit after the server went")


try:
    if mode == "selftest":
        env = ucx_env("tcp", "lo")
        r = subprocess.run([peer, "selftest"], capture_output=True, text=True, env=env, timeout=120)
        print(r.stdout, r.stderr[-2000:])
        check(r.returncode == 0, "selftest")
    elif mode == "tcp":
        run_handoffs("tcp", 1000, dev="lo")
    elif mode == "sm":
        run_handoffs("sm,tcp", 1000, dev="lo", same=True, want_path="same host: am sysv/memory")
        # A consumer that asks a server not offering it: tcp, and the reason in its path.
        prod, cons, _ = pair("sm,tcp", dev="lo", same=False, cons_same=True)
        check(cons.path.startswith("network: ") and "does not offer a same-host path" in cons.path,
              f"a server without the flag: {cons.path}")
        handoffs(prod, cons, 20, random.Random(3))
        cons.quit()
        prod.quit()
        # A consumer of another user asking a server that offers it: refused before anything of
        # its worker address is used (UCX's shared-memory transports would map and write what
        # it names with the server's rights): it cannot read the server's memory (the proof).
        # The same through a forwarder run by root (the socket the server sees is root's): still
        # refused; and root itself through the forwarder: its connection does not end in the
        # server.
        if os.geteuid() == 0:
            nobody = ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups")
            prod, cons, where = pair("sm,tcp", dev="lo", same=True, cons_same=True, cons_prefix=nobody)
            check(cons.path.startswith("network: ") and "could not read this process's memory" in cons.path,
                  f"another user's consumer: {cons.path}")
            handoffs(prod, cons, 20, random.Random(4))
            cons.quit()
            host, port = where.rsplit(":", 1)
            fwd = Forwarder(host, int(port))
            for prefix, want in ((nobody, "could not read this process's memory"),
                                 ((), "does not end in this process")):
                _, cdev = names()
                cons = consumer(cdev, f"127.0.0.1:{fwd.port}", "sm,tcp", "lo", prefix=prefix, same=True)
                check(cons.path.startswith("network: ") and want in cons.path,
                      f"a consumer through a root forwarder ({'nobody' if prefix else 'root'}): {cons.path}")
                handoffs(prod, cons, 5, random.Random(5))
                cons.quit()
            check(stats(prod)["same_host"] == 0, "no consumer of those is counted as same host")
            prod.quit()
    elif mode == "netns":
        netns()
    elif mode == "hostile":
        hostile()
    elif mode == "hostile-sm":
        hostile(same=True)
    else:
        sys.exit(f"unknown mode {mode}")
except RuntimeError as e:
    check(False, str(e))

for name in created:
    try:
        os.unlink("/dev/shm/" + name)
    except FileNotFoundError:
        pass

print(f"kv_remote_test {mode}: {'ok' if not failures else str(len(failures)) + ' failed'}")
sys.exit(1 if failures else 0)
