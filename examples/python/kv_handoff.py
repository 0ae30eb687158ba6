#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# A prefill process and a decode process handing a prompt's KV cache over through a shared
# pool, in Python (module cxlpool, docs/python.md). The prefill side writes each block's keys
# and values in place (a memoryview of the pool's memory: here 16-bit words through
# memoryview.cast("H"); numpy.frombuffer(block, numpy.float16) gives the same bytes as fp16),
# exports the sequence and passes the 48-byte handle to the decode process over a pipe; the
# decode process imports it and reads the blocks in place (no copy), checks every value and
# prints the time to its first token's worth of data. A second prompt sharing the first 32
# tokens reuses their blocks from the prefix cache.
#   PYTHONPATH=build/python python3 examples/python/kv_handoff.py [--model llama-3-8b] [--tokens 200]
import argparse
import os
import subprocess
import sys
import time

import cxlpool


def value(seq_id, block, i):
    # A deterministic 16-bit word for element i of a block.
    return (seq_id * 131 + block * 7 + i * 3) & 0xFFFF


def fill(seq, geometry, seq_id, first_block):
    for b in range(first_block, seq.info()["blocks"]):
        m = memoryview(seq.block(b)).cast("H")  # the block's bytes as 16-bit words, in place
        n = len(m)
        step = max(1, n // 4096)  # write a sample of the block: every step-th value, and the rest 0
        for i in range(0, n, step):
            m[i] = value(seq_id, b, i)
        del m


def prefill(args):
    g = cxlpool.Geometry.preset(args.model, 16)
    device = f"shm:cxlpool-pyexample-{os.getpid()}"
    size = 2 * (args.tokens + 16) * g.bytes_per_token + (64 << 20)
    with cxlpool.SharedPool.create(device, size) as pool:
        try:
            with cxlpool.KvArena(g, [pool]) as arena:
                decode = subprocess.Popen([sys.executable, __file__, "--decode", device, args.model],
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                prompt = list(range(1000, 1000 + args.tokens))
                second = prompt[:32] + list(range(5000, 5000 + args.tokens - 32))
                seqs = []
                for seq_id, tokens in ((1, prompt), (2, second)):
                    seq = arena.sequence()
                    reused = seq.append(tokens)
                    fill(seq, g, seq_id, reused // g.tokens_per_block)
                    seq.seal(len(tokens))
                    handle = seq.export()
                    t0 = time.perf_counter()
                    decode.stdin.write(f"{seq_id} {reused} {handle.hex()}\n")
                    decode.stdin.flush()
                    answer = decode.stdout.readline().strip()
                    print(f"prefill: prompt {seq_id}: {len(tokens)} tokens, {reused} reused from the prefix cache; "
                          f"decode says: {answer} ({(time.perf_counter() - t0) * 1e3:.2f} ms round trip)")
                    if not answer.startswith("ok"):
                        raise SystemExit(f"prefill: decode failed: {answer}")
                    seqs.append(seq)
                decode.stdin.close()
                if decode.wait() != 0:
                    raise SystemExit("prefill: decode exited with an error")
                for seq in seqs:
                    seq.destroy()
        finally:
            cxlpool.SharedPool.unlink(device)
    print("prefill: done")


def decode(device, model):
    g = cxlpool.Geometry.preset(model, 16)
    with cxlpool.SharedPool.open(device) as pool:
        for line in sys.stdin:
            seq_id, reused, hexhandle = line.split()
            seq_id, reused = int(seq_id), int(reused)
            t0 = time.perf_counter()
            with cxlpool.import_view([pool], bytes.fromhex(hexhandle), g) as view:
                t_import = time.perf_counter() - t0
                bad = 0
                for b in range(view.blocks):
                    m = memoryview(view.block(b)).cast("H")
                    step = max(1, len(m) // 4096)
                    # The first prompt's blocks: its own values; the second's shared blocks are
                    # the first prompt's (the prefix cache), the rest its own.
                    owner = 1 if (seq_id == 1 or b < reused // g.tokens_per_block) else seq_id
                    for i in range(0, len(m), step):
                        bad += m[i] != value(owner, b, i)
                    del m
                t_read = time.perf_counter() - t0
            print(f"ok {view.tokens} tokens in {view.blocks} blocks, import {t_import * 1e3:.2f} ms, "
                  f"read in place {t_read * 1e3:.2f} ms" if bad == 0 else f"bad {bad} values", flush=True)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--decode":
        decode(sys.argv[2], sys.argv[3])
    else:
        p = argparse.ArgumentParser(description=__doc__)
        p.add_argument("--model", default="llama-3-8b")
        p.add_argument("--tokens", type=int, default=200)
        prefill(p.parse_args())
