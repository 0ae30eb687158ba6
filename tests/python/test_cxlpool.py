#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# The Python module cxlpool (python/cxlpool_module.cpp) as a Python inference stack would use
# it, and as a careless one would: geometry and its errors; pools that exist, do not, or are
# not ours; blocks written and read in place through memoryviews (the consumer's memoryview
# sees a later write of the producer: no copy); objects released while their blocks are alive
# in Python (refused, never a dangling memoryview); forged, damaged, short and stale handles;
# capacity; token ids that are not 32-bit ints; 200 random handoffs to another process with
# hashes equal; a fork child; the example (examples/python/kv_handoff.py).
# Run by CTest with PYTHONPATH set to the module's directory.
import hashlib
import os
import random
import subprocess
import sys
import unittest
import uuid

import cxlpool

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def name():
    return f"shm:cxlpool-pytest-{uuid.uuid4().hex[:10]}"


class Pool:
    """A pool of this test, unlinked afterwards."""

    def __init__(self, size=64 << 20, leases=None):
        self.device = name()
        self.pool = cxlpool.SharedPool.create(self.device, size, leases)

    def __enter__(self):
        return self.pool

    def __exit__(self, *exc):
        try:
            self.pool.close()
        finally:
            cxlpool.SharedPool.unlink(self.device)


G = cxlpool.Geometry(2, 2, 64)  # 1 KiB per token, 16 KiB per block


def fill(seq, seed, first=0):
    for b in range(first, seq.info()["blocks"]):
        m = memoryview(seq.block(b))
        pattern = hashlib.blake2b(f"{seed}/{b}".encode(), digest_size=64).digest()
        m[:] = pattern * (len(m) // len(pattern))
        del m


def digest(blocks_of):
    h = hashlib.blake2b(digest_size=16)
    for b in blocks_of():
        h.update(memoryview(b))
    return h.hexdigest()


def seq_digest(seq):
    return digest(lambda: (seq.block(i) for i in range(seq.info()["blocks"])))


class GeometryTest(unittest.TestCase):
    def test_presets(self):
        self.assertEqual(cxlpool.Geometry.preset("opt-6.7b").bytes_per_token, 512 << 10)
        self.assertEqual(cxlpool.Geometry.preset("llama-3-8b").bytes_per_token, 128 << 10)
        self.assertEqual(cxlpool.Geometry.preset("opt-6.7b", 16).bytes_per_block, 8 << 20)
        self.assertEqual(G, cxlpool.Geometry(2, 2, 64, "fp16", 16))
        self.assertNotEqual(G, cxlpool.Geometry(2, 2, 64, "bf16", 16))
        self.assertEqual(G.block_offset(1, 1, 15), G.bytes_per_block - 2 * 64 * 2)

    def test_errors_name_the_bad_part(self):
        with self.assertRaises(cxlpool.Error) as e:
            cxlpool.Geometry.preset("gpt-5")
        self.assertEqual(e.exception.name, "CXLPOOL_E_NOT_FOUND")
        self.assertIn("opt-6.7b", str(e.exception))
        with self.assertRaises(cxlpool.Error) as e:
            cxlpool.Geometry(2, 2, 64, dtype="fp12")
        self.assertIn("fp12", str(e.exception))
        with self.assertRaises(cxlpool.Error) as e:
            cxlpool.Geometry(0, 2, 64)
        self.assertEqual(e.exception.status, -1)
        self.assertIn("layers", str(e.exception))
        with self.assertRaises(cxlpool.Error):
            G.block_offset(2, 0, 0)
        for bad in ((-1, 2, 64), (True, 2, 64), (2, 2.0, 64), (2, 2, 2**32), (2, 2, "64")):
            with self.assertRaises(cxlpool.Error):
                cxlpool.Geometry(*bad)
        for bad in (True, -1, 1.5, 2**32):
            with self.assertRaises(cxlpool.Error):
                cxlpool.Geometry.preset("opt-6.7b", bad)


class PoolTest(unittest.TestCase):
    def test_names_that_exist_or_are_not_ours(self):
        with Pool() as p:
            with self.assertRaises(cxlpool.Error) as e:
                cxlpool.SharedPool.create(p.device, 64 << 20)
            self.assertEqual(e.exception.name, "CXLPOOL_E_EXISTS")
            self.assertGreater(p.info()["size"], 0)
        with self.assertRaises(cxlpool.Error) as e:
            cxlpool.SharedPool.open(name())
        self.assertEqual(e.exception.name, "CXLPOOL_E_NOT_FOUND")
        # A file in /dev/shm that is not a cxlpool pool: never adopted, never unlinked.
        foreign = "cxlpool-pytest-foreign-" + uuid.uuid4().hex[:8]
        with open("/dev/shm/" + foreign, "wb") as f:
            f.write(b"not a pool" * 1000)
        try:
            with self.assertRaises(cxlpool.Error):
                cxlpool.SharedPool.open("shm:" + foreign)
            with self.assertRaises(cxlpool.Error):
                cxlpool.SharedPool.create("shm:" + foreign, 64 << 20)
            with self.assertRaises(cxlpool.Error):
                cxlpool.SharedPool.unlink("shm:" + foreign)
            with open("/dev/shm/" + foreign, "rb") as f:
                self.assertEqual(f.read(), b"not a pool" * 1000)
        finally:
            os.unlink("/dev/shm/" + foreign)

    def test_close_waits_for_its_users(self):
        with Pool() as p:
            arena = cxlpool.KvArena(G, [p])
            with self.assertRaises(cxlpool.Error) as e:
                p.close()
            self.assertEqual(e.exception.name, "CXLPOOL_E_BUSY")
            arena.destroy()
        with self.assertRaises(cxlpool.Error):
            cxlpool.KvArena(G, [])
        with self.assertRaises(cxlpool.Error):
            cxlpool.KvArena(G, ["shm:x"])
        closed = cxlpool.SharedPool.create(name(), 64 << 20)
        device = closed.device
        closed.close()
        cxlpool.SharedPool.unlink(device)
        with self.assertRaises(cxlpool.Error):
            closed.info()
        with self.assertRaises(cxlpool.Error):
            cxlpool.KvArena(G, [closed])


class ArenaTest(unittest.TestCase):
    def test_in_place_both_ways(self):
        with Pool() as p:
            arena = cxlpool.KvArena(G, [p])
            seq = arena.sequence()
            self.assertEqual(seq.append(range(40)), 0)
            fill(seq, 1)
            seq.seal(40)
            handle = seq.export()
            self.assertEqual(len(handle), 48)
            view = cxlpool.import_view([p], handle, G)
            self.assertEqual((view.tokens, view.blocks), (40, 3))
            self.assertEqual(view.info()["geometry"], G)
            self.assertEqual(digest(lambda: (view.block(i) for i in range(3))), seq_digest(seq))
            consumer = memoryview(view.block(2))
            self.assertTrue(consumer.readonly)
            with self.assertRaises(TypeError):
                consumer[0] = 1
            # The consumer's memoryview is the producer's block: a later write shows through.
            producer = memoryview(seq.block(2))
            producer[100:104] = b"\x01\x02\x03\x04"
            self.assertEqual(bytes(consumer[100:104]), b"\x01\x02\x03\x04")
            # Nothing is released under a live memoryview.
            with self.assertRaises(cxlpool.Error) as e:
                view.release()
            self.assertEqual(e.exception.name, "CXLPOOL_E_BUSY")
            with self.assertRaises(cxlpool.Error):
                seq.destroy()
            del consumer, producer
            # A block object keeps its view alive after the name is gone.
            block = view.block(0)
            first = bytes(memoryview(block)[:64])
            del view
            self.assertEqual(bytes(memoryview(block)[:64]), first)
            del block
            view = cxlpool.import_view([p], handle)
            view.release()
            with self.assertRaises(cxlpool.Error):
                view.block(0)
            view.release()  # twice: nothing left to do
            with self.assertRaises(cxlpool.Error):
                arena.destroy()  # a sequence lives
            seq.destroy()
            with self.assertRaises(cxlpool.Error) as e:
                cxlpool.import_view([p], handle)
            self.assertEqual(e.exception.name, "CXLPOOL_E_STALE")
            arena.destroy()

    def test_prefix_sharing_and_capacity(self):
        with Pool(16 << 20) as p:
            with cxlpool.KvArena(G, [p]) as arena:
                a = arena.sequence()
                a.append(range(64))
                fill(a, 7)
                a.seal(64)
                b = arena.sequence()
                self.assertEqual(b.append(list(range(48)) + [9999] * 16), 48)
                self.assertEqual(b.info()["shared_blocks"], 3)
                self.assertEqual(arena.stats()["prefix_hits"], 3)
                self.assertEqual(bytes(memoryview(b.block(1))), bytes(memoryview(a.block(1))))
                c = arena.sequence()
                with self.assertRaises(cxlpool.Error) as e:
                    c.append(range(100000, 100000 + 20000))  # 20 MB of blocks in a 16 MiB pool
                self.assertEqual(e.exception.name, "CXLPOOL_E_CAPACITY")
                self.assertEqual(c.info()["tokens"], 0)
                for bad in ([1, "2"], [2**31], [-2**31 - 1], [1.5]):
                    with self.assertRaises(cxlpool.Error):
                        c.append(bad)
                self.assertEqual(c.info()["tokens"], 0)
                for s in (a, b, c):
                    s.destroy()

    def test_forged_damaged_and_short_handles(self):
        with Pool() as p:
            with cxlpool.KvArena(G, [p]) as arena:
                seq = arena.sequence()
                seq.append(range(100))
                fill(seq, 3)
                seq.seal(100)
                handle = seq.export()
                rng = random.Random(11)
                for bit in range(0, len(handle) * 8, 5):
                    b = bytearray(handle)
                    b[bit // 8] ^= 1 << (bit % 8)
                    with self.assertRaises(cxlpool.Error):
                        cxlpool.import_view([p], bytes(b))
                for _ in range(100):
                    with self.assertRaises(cxlpool.Error):
                        cxlpool.import_view([p], bytes(rng.randrange(256) for _ in handle))
                for short in (b"", handle[:-1], handle + b"\0"):
                    with self.assertRaises(cxlpool.Error) as e:
                        cxlpool.import_view([p], short)
                    self.assertEqual(e.exception.name, "CXLPOOL_E_INVALID_ARGUMENT")
                with self.assertRaises(cxlpool.Error):
                    cxlpool.import_view([p], handle, cxlpool.Geometry(2, 2, 64, "bf16"))
                self.assertEqual(p.info()["leases_held"], 0)
                seq.destroy()


class HostileTest(unittest.TestCase):
    """The hostile review's findings, each kept as a regression test."""

    def test_objects_python_must_not_make(self):
        for cls in (cxlpool.SharedPool, cxlpool.Sequence, cxlpool.View, cxlpool.Block):
            with self.assertRaises(TypeError):
                cls.__new__(cls)
            with self.assertRaises(TypeError):
                cls()
        # Constructible classes made without __init__: every method refuses, nothing crashes.
        arena = cxlpool.KvArena.__new__(cxlpool.KvArena)
        for call in (arena.stats, arena.destroy, arena.sequence, lambda: arena.geometry):
            with self.assertRaises((TypeError, RuntimeError)):
                call()
        g = cxlpool.Geometry.__new__(cxlpool.Geometry)
        with self.assertRaises((TypeError, RuntimeError)):
            g.block_offset(0, 0, 0)

    def test_a_pool_closed_while_its_list_is_read(self):
        with Pool() as p1, Pool() as p2:
            class Evil:
                def __len__(self):
                    return 2

                def __getitem__(self, i):
                    if i == 1:
                        p1.close()  # not yet in use: allowed
                        return p2
                    if i == 0:
                        return p1
                    raise IndexError
            with self.assertRaises(cxlpool.Error) as e:
                cxlpool.KvArena(G, Evil())
            self.assertIn("is closed", str(e.exception))
            self.assertEqual(p2.info()["leases_held"], 0)
            p2.close()  # nothing counts it as used
            reopened = cxlpool.SharedPool.open(p1.device)  # so that Pool.__exit__ can close both
            p1_device = p1.device
        del reopened, p1_device

    def test_shared_and_sealed_blocks_are_read_only(self):
        with Pool() as p:
            with cxlpool.KvArena(G, [p]) as arena:
                a = arena.sequence()
                a.append(range(40))
                fill(a, 1)
                a.seal(40)
                self.assertFalse(a.block(0).writable)  # sealed whole: the cache may share it
                self.assertTrue(a.block(2).writable)   # tokens 32..47, 40..47 not sealed
                with self.assertRaises(TypeError):
                    memoryview(a.block(0))[0] = 1
                b = arena.sequence()
                self.assertEqual(b.append(list(range(16)) + [7] * 4), 16)
                self.assertFalse(b.block(0).writable)  # shared from a
                self.assertTrue(b.block(1).writable)
                for s in (a, b):
                    s.destroy()

    def test_seal_refused_while_a_writable_view_of_a_block_it_seals_lives(self):
        with Pool() as p:
            with cxlpool.KvArena(G, [p]) as arena:
                a = arena.sequence()
                a.append(range(40))  # blocks 0 and 1 whole, block 2 holds tokens 32..39
                fill(a, 3)
                before = memoryview(a.block(0))  # taken before the seal, writable
                self.assertFalse(before.readonly)
                kept = a.block(1)  # a Block object makes writable memoryviews later
                with self.assertRaises(cxlpool.Error) as e:
                    a.seal(40)
                self.assertEqual(e.exception.name, "CXLPOOL_E_BUSY")
                self.assertIn("2 writable block(s)", str(e.exception))
                self.assertEqual(a.info()["sealed_tokens"], 0)  # nothing sealed, nothing shared
                partial = memoryview(a.block(2))  # 40..47 stay to be written: not in the way
                del kept
                with self.assertRaises(cxlpool.Error) as e:
                    a.seal(40)
                self.assertIn("1 writable block(s)", str(e.exception))
                with self.assertRaises(cxlpool.Error):
                    a.seal(16)  # completes block 0, still held
                del before
                a.seal(40)
                self.assertTrue(memoryview(a.block(0)).readonly)
                self.assertTrue(memoryview(a.block(1)).readonly)
                with self.assertRaises(TypeError):
                    memoryview(a.block(1))[0] = 0
                self.assertFalse(partial.readonly)
                del partial
                want = seq_digest(a)
                # The importer and a sequence sharing the prefix read exactly what was sealed.
                view = cxlpool.import_view([p], a.export(32))
                b = arena.sequence()
                self.assertEqual(b.append(range(32)), 32)
                self.assertEqual(digest(lambda: (view.block(i) for i in range(2))),
                                 digest(lambda: (a.block(i) for i in range(2))))
                self.assertEqual(seq_digest(b), digest(lambda: (a.block(i) for i in range(2))))
                self.assertEqual(seq_digest(a), want)
                view.release()
                for s in (a, b):
                    s.destroy()

    def test_strict_arguments(self):
        with Pool() as p:
            with cxlpool.KvArena(G, [p]) as arena:
                s = arena.sequence()
                for bad in ([True], [2**64], [-2**63 - 1], [1.0], [b"x"]):
                    with self.assertRaises(cxlpool.Error):
                        s.append(bad)
                s.append(range(20))
                for bad in (-1, True, 2**64, 1.0, "0", None):
                    with self.assertRaises(cxlpool.Error):
                        s.block(bad)
                    with self.assertRaises(cxlpool.Error):
                        s.seal(bad)
                for bad in ("x", [1.5], [-1], 5):
                    with self.assertRaises(cxlpool.Error):
                        cxlpool.KvArena(G, [p], max_blocks=bad)
                for bad in ("shm:x", None, 3):
                    with self.assertRaises(cxlpool.Error):
                        cxlpool.KvArena(G, bad)
                fill(s, 2)
                s.seal(20)
                h = s.export()
                for form in (h, bytearray(h), memoryview(h)):  # any buffer holds a handle
                    cxlpool.import_view([p], form).release()
                for bad in ("x" * 48, 48, None):
                    with self.assertRaises(cxlpool.Error):
                        cxlpool.import_view([p], bad)
                with self.assertRaises(cxlpool.Error):
                    cxlpool.import_view([p], h, expected="fp16")
                s.destroy()
        for bad in (-1, True, 2**64, 1.5):
            with self.assertRaises(cxlpool.Error):
                cxlpool.SharedPool.create(name(), bad)
        for call in (lambda: cxlpool.SharedPool.open("shm:cxlpool-pytest\0other"),
                     lambda: cxlpool.SharedPool.unlink("shm:cxlpool-pytest\0other"),
                     lambda: cxlpool.SharedPool.create("shm:cxlpool-pytest\0other", 1 << 20),
                     lambda: cxlpool.Geometry.preset("opt-6.7b\0junk")):
            with self.assertRaises(cxlpool.Error) as e:
                call()
            self.assertIn("NUL", str(e.exception))

    def test_memory_runs_out(self):
        # Sequences under a low RLIMIT_AS until memory runs out: an exception, never a crash.
        if "libasan" in os.environ.get("LD_PRELOAD", ""):
            self.skipTest("AddressSanitizer's shadow memory does not fit under a low RLIMIT_AS")
        script = """
import cxlpool, resource, sys
dev = sys.argv[1]
p = cxlpool.SharedPool.create(dev, 8 << 20)
cxlpool.SharedPool.unlink(dev)
a = cxlpool.KvArena(cxlpool.Geometry(2, 2, 64), [p])
vm = next(int(l.split()[1]) << 10 for l in open("/proc/self/status") if l.startswith("VmSize"))
resource.setrlimit(resource.RLIMIT_AS, (vm + (32 << 20), resource.RLIM_INFINITY))
keep = []
try:
    for i in range(400000):
        keep.append(a.sequence())
    print("no failure")
except (MemoryError, cxlpool.Error) as e:
    print("out of memory after", len(keep), type(e).__name__)
"""
        r = subprocess.run([sys.executable, "-c", script, name()], capture_output=True, text=True, timeout=120)
        self.assertGreaterEqual(r.returncode, 0, r.stderr[-2000:])  # not killed by a signal
        self.assertIn("out of memory after", r.stdout + r.stderr[-2000:])


class ProcessTest(unittest.TestCase):
    def test_handoffs_to_another_process(self):
        with Pool(256 << 20) as p:
            with cxlpool.KvArena(G, [p]) as arena:
                consumer = subprocess.Popen([sys.executable, os.path.join(HERE, "kv_consumer.py"), p.device],
                                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                try:
                    self.assertEqual(consumer.stdout.readline().strip(), "ready")
                    rng = random.Random(20261202)
                    for i in range(200):
                        tokens = rng.randint(1, 600)
                        seq = arena.sequence()
                        seq.append(rng.randrange(1 << 30) for _ in range(tokens))
                        fill(seq, i)
                        seq.seal(tokens)
                        consumer.stdin.write(seq.export().hex() + "\n")
                        consumer.stdin.flush()
                        self.assertEqual(consumer.stdout.readline().split(), ["ok", str(tokens), seq_digest(seq)],
                                         f"handoff {i}")
                        seq.destroy()
                    consumer.stdin.close()
                    self.assertEqual(consumer.wait(30), 0)
                finally:
                    if consumer.poll() is None:
                        consumer.kill()
                    consumer.stdout.close()
                self.assertEqual(p.info()["leases_held"], 0)

    def test_fork_child(self):
        with Pool() as p:
            with cxlpool.KvArena(G, [p]) as arena:
                seq = arena.sequence()
                seq.append(range(20))
                fill(seq, 5)
                seq.seal(20)
                handle = seq.export()
                want = seq_digest(seq)
                r, w = os.pipe()
                pid = os.fork()
                if pid == 0:  # no exec: the parent's objects are here, the pool is not the child's
                    os.close(r)
                    try:
                        view = cxlpool.import_view([p], handle)
                        view.release()
                        answer = b"imported"
                    except cxlpool.Error as e:
                        answer = e.name.encode()
                    except BaseException as e:  # noqa: BLE001 - report anything to the parent
                        answer = repr(e).encode()
                    os.write(w, answer)
                    os._exit(0)
                os.close(w)
                answer = os.read(r, 200)
                os.close(r)
                _, status = os.waitpid(pid, 0)
                self.assertEqual(status, 0)
                print(f"fork child without exec: {answer.decode()}", file=sys.stderr)
                self.assertTrue(answer.startswith(b"CXLPOOL_E_") or answer == b"imported", answer)
                # The parent is untouched.
                view = cxlpool.import_view([p], handle)
                self.assertEqual(digest(lambda: (view.block(i) for i in range(view.blocks))), want)
                view.release()
                seq.destroy()

    def test_example(self):
        r = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "python", "kv_handoff.py"), "--tokens",
                            "300"], capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("32 reused from the prefix cache", r.stdout)
        self.assertIn("prefill: done", r.stdout)
        self.assertEqual(r.stdout.count("decode says: ok"), 2, r.stdout)


if __name__ == "__main__":
    unittest.main()
