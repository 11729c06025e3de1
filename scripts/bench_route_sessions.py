#!/usr/bin/env python3
"""The router on a multi-turn workload: cache-aware against round-robin (and least-loaded)
over two 1-thread `brigade serve` replicas.

The workload: 32 sessions, 16 at a time, each of 6 turns; every session opens with one of 8
system prompts (256 tokens), each turn sends the whole history so far plus a new question of 64
tokens (a follow-up extends its history, as a chat client does) and asks for 16 tokens, streamed
(the time to the first token measured). Each replica's KV cache holds 144 MiB (~8,000 tokens):
about half of the sessions' histories — what a replica needs when the router keeps a session on
one replica, while round robin makes each replica hold them all. Fresh replicas for each policy. The model: a GPT-2 of 6 layers × 384 wide, its position
table 1024 (a checkpoint trained here for one step: only its shape matters), prompts as token
ids. Reported per policy: requests/s, TTFT p50 and p99, and the replicas' prefix-cache hit rate
(KV blocks reused over blocks of prompt, from their /metrics); then the ratios the issue asks
for, and the router's own added latency per request (a 1-token completion of a 4-token prompt
asked 200 times directly and through the router, median difference).

Usage: python3 ../shared/peers/runq.py -- scripts/bench_route_sessions.py [--bin target/release/brigade]
"""

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BLOCK = 16  # the replicas' KV block size


def start(argv, log):
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=open(log, "w"), text=True)
    line = p.stdout.readline()
    if "listening on" not in line:
        raise SystemExit(f"did not start: {' '.join(argv)}: {line!r}; see {log}")
    return p, line.strip().rsplit(" ", 1)[1]


def wait_ready(url):
    for _ in range(600):
        try:
            with urllib.request.urlopen(url + "/ready", timeout=2) as r:
                if r.status == 200:
                    return
        except Exception:
            pass
        time.sleep(0.1)
    raise SystemExit(f"{url} not ready")


def metric(url, name):
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    return sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines() if l.split("{")[0].split(" ")[0] == name)


def stream(url, model, prompt, max_tokens):
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True}).encode()
    req = urllib.request.Request(url + "/v1/completions", body, {"content-type": "application/json"})
    t0 = time.perf_counter()
    first = None
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            if line.startswith(b"data: ") and first is None:
                first = time.perf_counter() - t0
    return first


def workload(seed):
    rng = random.Random(seed)
    systems = [[rng.randrange(256) for _ in range(256)] for _ in range(8)]
    sessions = []
    for s in range(32):
        turns, history = [], list(systems[s % 8])
        for t in range(6):
            history = history + [rng.randrange(256) for _ in range(64)]
            turns.append(list(history))
            history = history + [rng.randrange(256) for _ in range(16)]  # the answer, as the client keeps it
        sessions.append(turns)
    return sessions


def run_policy(bin_, policy, replicas, model, tmp):
    router, url = start([bin_, "route", "--port", "0", "--policy", policy] + sum([["--replica", r] for r in replicas], []), f"{tmp}/route-{policy}.log")
    try:
        wait_ready(url)
        hits0 = sum(metric(r, "brigade_prefix_cache_hits_total") for r in replicas)
        prompt0 = sum(metric(r, "brigade_prompt_tokens_total") for r in replicas)
        ttfts = []
        lock = threading.Lock()

        def session(turns):
            for p in turns:
                t = stream(url, model, p, 16)
                with lock:
                    ttfts.append(t)

        t0 = time.perf_counter()
        with ThreadPoolExecutor(16) as ex:
            list(ex.map(session, workload(1)))
        wall = time.perf_counter() - t0
        hits = sum(metric(r, "brigade_prefix_cache_hits_total") for r in replicas) - hits0
        prompt = sum(metric(r, "brigade_prompt_tokens_total") for r in replicas) - prompt0
        ttfts.sort()
        return {
            "policy": policy,
            "requests_per_s": len(ttfts) / wall,
            "ttft_p50_ms": 1e3 * statistics.median(ttfts),
            "ttft_p99_ms": 1e3 * ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))],
            "hit_rate": hits * BLOCK / prompt,
        }
    finally:
        router.terminate()
        router.wait()


def router_overhead(bin_, replica, model, tmp):
    router, url = start([bin_, "route", "--port", "0", "--policy", "cache-aware", "--replica", replica], f"{tmp}/route-latency.log")
    try:
        wait_ready(url)
        body = json.dumps({"model": model, "prompt": [1, 2, 3, 4], "max_tokens": 1, "temperature": 0}).encode()

        def once(u):
            req = urllib.request.Request(u + "/v1/completions", body, {"content-type": "application/json"})
            t0 = time.perf_counter()
            urllib.request.urlopen(req, timeout=60).read()
            return time.perf_counter() - t0

        for u in (replica, url):
            for _ in range(20):
                once(u)
        direct, routed = [], []
        for _ in range(200):
            direct.append(once(replica))
            routed.append(once(url))
        return 1e3 * statistics.median(direct), 1e3 * statistics.median(routed)
    finally:
        router.terminate()
        router.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "target", "release", "brigade"))
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = os.path.join(tmp, "model.toml")
        with open(cfg, "w") as f:
            f.write('model = "tiny"\nn_layer = 6\nn_embd = 384\nn_head = 6\nblock_size = 1024\nsteps = 1\nbatch = 2\nseq = 64\neval_every = 0\n')
        ck = os.path.join(tmp, "m")
        subprocess.run([a.bin, "train", "--config", cfg, "--data", os.path.join(ROOT, "README.md"), "--no-sample", "--out", ck],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        model = "m"
        rows = []
        for p in ("round-robin", "least-loaded", "cache-aware", None):
            reps = []
            try:
                for i in range(2):
                    reps.append(start([a.bin, "serve", "--checkpoint", ck, "--port", "0", "--threads", "1", "--block-size", str(BLOCK),
                                       "--kv-cache-mib", "144"], f"{tmp}/replica{i}.log"))
                urls = [u for _, u in reps]
                for u in urls:
                    wait_ready(u)
                if p is None:
                    direct, routed = router_overhead(a.bin, urls[0], model, tmp)
                else:
                    rows.append(run_policy(a.bin, p, urls, model, tmp))
            finally:
                for proc, _ in reps:
                    proc.terminate()
                    proc.wait()
    print(f"{'policy':<14} {'requests/s':>10} {'TTFT p50 ms':>12} {'TTFT p99 ms':>12} {'prefix hit rate':>16}")
    for r in rows:
        print(f"{r['policy']:<14} {r['requests_per_s']:>10.2f} {r['ttft_p50_ms']:>12.1f} {r['ttft_p99_ms']:>12.1f} {100 * r['hit_rate']:>15.1f}%")
    rr, ca = rows[0], rows[2]
    print(f"cache-aware / round-robin: hit rate {ca['hit_rate'] / max(rr['hit_rate'], 1e-9):.2f}x, throughput {ca['requests_per_s'] / rr['requests_per_s']:.2f}x")
    print(f"router's added latency: {routed - direct:.3f} ms a request (median of 200: direct {direct:.3f} ms, through the router {routed:.3f} ms)")
    print(json.dumps({"bench": "route_sessions", "rows": rows, "direct_ms": direct, "routed_ms": routed}))


if __name__ == "__main__":
    sys.exit(main())
