#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# A decode process for test_cxlpool.py: opens the pool DEVICE, then for each line "HEX" of
# stdin imports the handle, hashes every block in place (hashlib reads the memoryview, no copy)
# and answers "ok TOKENS DIGEST" or "error NAME MESSAGE"; "hold HEX" imports and keeps the view.
import hashlib
import sys

import cxlpool

held = []
with cxlpool.SharedPool.open(sys.argv[1]) as pool:
    print("ready", flush=True)
    for line in sys.stdin:
        words = line.split()
        try:
            view = cxlpool.import_view([pool], bytes.fromhex(words[-1]))
        except cxlpool.Error as e:
            print("error", e.name, str(e).replace("\n", " "), flush=True)
            continue
        if words[0] == "hold":
            held.append(view)
            print("held", flush=True)
            continue
        h = hashlib.blake2b(digest_size=16)
        for b in range(view.blocks):
            h.update(memoryview(view.block(b)))
        tokens = view.tokens
        view.release()
        print("ok", tokens, h.hexdigest(), flush=True)
    for view in held:
        view.release()
