#!/usr/bin/env python3
"""Context-parallel prefill: `--cp 2` against one process, at the same KV memory per rank.

A long prompt's time to first token (a completion of 1 token, its prompt as token ids, the
prefill in chunks of --max-step-tokens) served by: one process of 2 threads; `--cp 2` as two
threads of one process; `--cp 2` as two MPI processes of 1 thread each. Then the largest prompt
each serves with the same --kv-cache-mib per rank (a smaller one, --small-kv-mib, so that the
largest prompt is within the model's context): the engine's blocks from /metrics, and a prompt
one block past one rank's blocks asked of each (refused by one process, served across two).
The model: a preset with random weights (default smollm2-135m: 30 layers, 8,192 positions).

Usage: python3 ../shared/peers/runq.py -- scripts/bench_serve_cp.py [--tokens 8000] [--repeats 3]
Needs a build with --features mpi for the MPI row (skipped with a printed reason otherwise).
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request


def start(cmd, log):
    p = subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT)
    for _ in range(1500):
        text = open(log).read()
        m = re.search(r"listening on (http://[0-9.:]+)", text)
        if m:
            try:
                urllib.request.urlopen(m.group(1) + "/ready", timeout=5)
                return p, m.group(1)
            except (urllib.error.URLError, ConnectionError):
                pass
        if p.poll() is not None:
            sys.exit(f"did not start: {' '.join(cmd)}\n{text}")
        time.sleep(0.2)
    sys.exit(f"did not start in 300 s: {' '.join(cmd)}")


def ask(url, model, prompt):
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0}).encode()
    req = urllib.request.Request(url + "/v1/completions", body, {"content-type": "application/json"})
    t0 = time.perf_counter()
    try:
        json.load(urllib.request.urlopen(req, timeout=1800))
        return time.perf_counter() - t0, None
    except urllib.error.HTTPError as e:
        return None, json.load(e)["error"]["message"]


def blocks(url):
    text = urllib.request.urlopen(url + "/metrics", timeout=30).read().decode()
    m = re.search(r"^brigade_kv_blocks (\d+)", text, re.M)
    return int(m.group(1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/brigade")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--tokens", type=int, default=8000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--kv-cache-mib", type=int, default=512)
    ap.add_argument("--small-kv-mib", type=int, default=128)
    ap.add_argument("--block-size", type=int, default=16)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp()
    common = [a.bin, "serve", "--model", a.model, "--port", "0", "--kv-cache-mib", str(a.kv_cache_mib),
              "--block-size", str(a.block_size), "--max-step-tokens", "512"]
    mpirun = shutil.which("mpirun")
    rows = [
        ("one process, 2 threads", common + ["--threads", "2"]),
        ("--cp 2, 2 threads of one process", common + ["--cp", "2", "--threads", "2"]),
        ("--cp 2, 2 MPI processes of 1 thread", [mpirun, "-n", "2", "--allow-run-as-root", "--oversubscribe"]
         + common + ["--backend", "mpi", "--cp", "2", "--threads", "1"]) if mpirun else None,
    ]
    # a prompt of distinct-looking ids (never a prefix-cache hit: each repeat starts elsewhere)
    prompt = lambda k, n: [(i * 7919 + k * 104729) % 40000 + 100 for i in range(n)]
    results = {}
    for k, row in enumerate(rows):
        if row is None:
            print("--cp 2 over MPI: skipped (no mpirun on this machine)")
            continue
        name, cmd = row
        p, url = start(cmd, os.path.join(tmp, f"{k}.log"))
        try:
            times = []
            for r in range(a.repeats):
                t, err = ask(url, a.model, prompt(r + 10 * k, a.tokens))
                if err:
                    sys.exit(f"{name}: the {a.tokens}-token prompt was refused: {err}")
                times.append(t)
            results[name] = (statistics.median(times), times)
        finally:
            p.terminate()
            p.wait(timeout=120)
    base = results["one process, 2 threads"][0]
    print(f"{a.model}, a {a.tokens}-token prompt, --kv-cache-mib {a.kv_cache_mib} per rank, blocks of {a.block_size}:")
    for name, (med, times) in results.items():
        print(f"  {name}: time to first token {med:.2f} s (median of {len(times)}: "
              + ", ".join(f"{t:.2f}" for t in times) + f"), {base / med:.2f}x one process's rate")
    print(f"the largest prompt at --kv-cache-mib {a.small_kv_mib} per rank:")
    per_rank = None
    for k, (name, cmd) in enumerate(rows[:2]):
        cmd = [c if c != str(a.kv_cache_mib) else str(a.small_kv_mib) for c in cmd]
        p, url = start(cmd, os.path.join(tmp, f"small{k}.log"))
        try:
            total = blocks(url)
            per_rank = per_rank or total
            # a prompt one block past one rank's cache (its first token's block included)
            past = per_rank * a.block_size
            _, err = ask(url, a.model, prompt(99, past))
            served = f"refused ({err})" if err else "served"
            print(f"  {name}: {total} blocks of {a.block_size} in all, the largest prompt {(total - 1) * a.block_size} tokens; "
                  f"a {past}-token prompt: {served}")
        finally:
            p.terminate()
            p.wait(timeout=120)


if __name__ == "__main__":
    main()
