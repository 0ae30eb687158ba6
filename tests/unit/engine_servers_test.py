#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# examples/opt_prefill_server + opt_decode_server (processes) against opt_generate (one
# process doing prefill and decode): for 20 random prompts of many lengths (1..70 tokens, 8
# tokens per block: many cross block boundaries) and seeds, the decode server's greedy tokens
# are identical to one process's; two requests sharing a 40-token prefix: the second reuses 5
# whole blocks (fewer tokens computed) and still gives one process's tokens; with UCX built,
# the same through the UCX path (the decode server fetches the blocks into a pool of its own).
# A random checkpoint is written first (opt_random_checkpoint): nothing is downloaded.
# Usage: engine_servers_test.py EXAMPLES_BINDIR [ucx]
import os
import random
import re
import subprocess
import sys
import tempfile
import time

bindir = sys.argv[1]
with_ucx = len(sys.argv) > 2 and sys.argv[2] == "ucx"
tag = f"{os.getpid()}-{random.randrange(1 << 30)}"
work = tempfile.mkdtemp(prefix="cxlpool-engine-servers-")
model = os.path.join(work, "model")
common = ["--block-tokens", "8", "--threads", "2"]
failures = []


def run(args, env=None):
    p = subprocess.run(args, capture_output=True, text=True, timeout=300, env=env)
    if p.returncode != 0:
        print(p.stdout, p.stderr)
        raise SystemExit(f"FAILED: {' '.join(args)} exited {p.returncode}")
    return p.stdout


def bin(name):
    return os.path.join(bindir, name)


def one_process(prompts):
    """opt_generate over every prompt, no prefix cache: the baseline."""
    path = os.path.join(work, "prompts.txt")
    with open(path, "w") as f:
        f.write("".join(" ".join(map(str, p)) + "\n" for p in prompts))
    out = run([bin("opt_generate"), "--model", model, "--pool", f"shm:cxlpool-eng-gen-{tag}", "--pool-mib", "64",
               "--prompts", path, "--generate", "12", "--prefix-cache", "0"] + common)
    return re.findall(r"^tokens: (.*)$", out, re.M)


class PrefillServer:
    def __init__(self, requests, ucx):
        self.sock = os.path.join(work, f"prefill-{ucx}.sock")
        self.pool = f"shm:cxlpool-eng-prefill-{ucx}-{tag}"
        args = [bin("opt_prefill_server"), "--model", model, "--socket", self.sock, "--pool", self.pool,
                "--pool-mib", "64", "--requests", str(requests)] + common
        if ucx:
            args += ["--ucx-listen", "127.0.0.1:0"]
        self.log = open(os.path.join(work, f"prefill-{ucx}.log"), "w+")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, env=ucx_env())
        for _ in range(600):  # its socket appears when it listens (60 s at most: a hang guard)
            if os.path.exists(self.sock):
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        self.log.seek(0)
        raise SystemExit("FAILED: the prefill server did not start:\n" + self.log.read())

    def decode(self, prompt, ucx):
        args = [bin("opt_decode_server"), "--model", model, "--socket", self.sock, "--prompt",
                " ".join(map(str, prompt)), "--generate", "12"] + common
        args += ["--ucx", "1", "--own-pool", f"shm:cxlpool-eng-decode-{tag}", "--pool-mib", "64"] if ucx else \
            ["--pool", self.pool]
        out = run(args, env=ucx_env())
        stats = re.search(r"^prefill: (\d+) tokens, (\d+) reused from the prefix cache, (\d+) computed", out, re.M)
        tokens = re.search(r"^tokens: (.*)$", out, re.M)
        if not stats or not tokens:
            raise SystemExit("FAILED: decode server output:\n" + out)
        return tuple(int(x) for x in stats.groups()), tokens.group(1)

    def finish(self):
        rc = self.proc.wait(timeout=120)
        self.log.seek(0)
        log = self.log.read()
        if rc != 0:
            failures.append(f"prefill server exited {rc}:\n{log}")
        if os.path.exists(self.sock):
            failures.append("prefill server left its socket behind")
        if os.path.exists("/dev/shm/" + self.pool[4:]):
            failures.append("prefill server left its pool behind")
        return log


def ucx_env():
    env = dict(os.environ)
    env.setdefault("UCX_TLS", "tcp")
    env.setdefault("UCX_NET_DEVICES", "lo")
    return env


run([bin("opt_random_checkpoint"), model, "--seed", "23", "--layers", "2", "--hidden", "32", "--heads", "4",
     "--ffn", "64", "--vocab", "97", "--max-pos", "128", "--dtype", "f16"])

# 20 prompts: lengths around block boundaries (8 tokens per block) and random ones, random seeds.
rng = random.Random(2023)
lengths = [1, 7, 8, 9, 15, 16, 17, 24, 31, 33, 40, 47, 63, 64, 65, 70]
lengths += [rng.randrange(1, 71) for _ in range(20 - len(lengths))]
prompts = []
for i, n in enumerate(lengths):
    r = random.Random(1000 + i)  # each prompt its own seed
    prompts.append([r.randrange(97) for _ in range(n)])
# The prefix pair: 40 shared tokens (5 whole blocks), then different tails.
prefix = [rng.randrange(97) for _ in range(40)]
pair = [prefix + [rng.randrange(97) for _ in range(11)], prefix + [rng.randrange(97) for _ in range(6)]]

want = one_process(prompts + pair)
assert len(want) == len(prompts) + 2, want

modes = [False] + ([True] if with_ucx else [])
for ucx in modes:
    name = "ucx" if ucx else "pool"
    server = PrefillServer(len(prompts) + 2, ucx)
    distinct = set()
    for i, p in enumerate(prompts):
        (n, reused, computed), got = server.decode(p, ucx)
        distinct.add(got)
        if n != len(p) or got != want[i]:
            failures.append(f"{name}: prompt {i} ({len(p)} tokens): decode server {got!r}, one process {want[i]!r}")
    # Greedy tokens of a degenerate model would say little: they depend on the prompt here.
    if len(distinct) < 10:
        failures.append(f"{name}: only {len(distinct)} distinct outputs for 20 prompts")
    (n1, r1, c1), got1 = server.decode(pair[0], ucx)
    (n2, r2, c2), got2 = server.decode(pair[1], ucx)
    if (r1, c1) != (0, n1):
        failures.append(f"{name}: first prefix request reused {r1}, computed {c1} of {n1}")
    if r2 != 40 or c2 != n2 - 40 or c2 >= c1:
        failures.append(f"{name}: second request reused {r2}, computed {c2} of {n2} (expected 40 reused)")
    if got1 != want[-2] or got2 != want[-1]:
        failures.append(f"{name}: prefix pair tokens {got1!r} / {got2!r}, one process {want[-2]!r} / {want[-1]!r}")
    log = server.finish()
    print(f"{name}: 20 prompts ({min(lengths)}..{max(lengths)} tokens) identical to one process; prefix pair: "
          f"second request computed {c2} of {n2} tokens ({r2} reused)")
    print(log)

# Generation past the model's 128 positions stops there and keeps what it made: a 100-token
# prompt leaves room for 28 positions, so 29 tokens (the last one needs no position).
long_prompt = " ".join(str(rng.randrange(97)) for _ in range(100))
out = run([bin("opt_generate"), "--model", model, "--pool", f"shm:cxlpool-eng-long-{tag}", "--pool-mib", "64",
           "--prompt", long_prompt, "--generate", "500"] + common)
made = re.findall(r"^tokens: (.*)$", out, re.M)
if len(made) != 1 or len(made[0].split()) != 29:
    failures.append(f"--generate 500 past 128 positions: {made!r} (expected 29 tokens)")

subprocess.run(["rm", "-rf", work])
for f in failures:
    print("FAILED:", f)
sys.exit(1 if failures else 0)
