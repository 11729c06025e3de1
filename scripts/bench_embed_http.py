"""Embeddings over HTTP against `brigade embed`, side by side on the same texts: `brigade serve
--embedding-model M --threads 2` driven by 32 concurrent clients, each sending one sentence a
request, then `brigade embed` on a file of the same sentences (2 workers of 1 thread: its
fastest layout on 2 cores, as bench embed measures; its own documents/s, the load excluded). Alternates ROUNDS times, waits for an idle
machine each time (../shared/peers/runq.py's check), and prints documents/s of each, the
medians and their ratio. The issue's goal: HTTP ≥ 0.8 × brigade embed.

    python3 scripts/bench_embed_http.py [--docs 2000] [--rounds 2] [--concurrency 32]
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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BRIGADE = os.path.join(ROOT, "target/release/brigade")
MODEL = os.path.join(ROOT, "..", "shared", "models", "all-MiniLM-L6-v2")
RUNQ = os.path.join(ROOT, "..", "shared", "peers", "runq.py")

ap = argparse.ArgumentParser()
ap.add_argument("--docs", type=int, default=2000)
ap.add_argument("--rounds", type=int, default=2)
ap.add_argument("--concurrency", type=int, default=32)
a = ap.parse_args()

# sentences of 20-40 words from a fixed vocabulary (as `bench embed`'s generated corpus)
rng = random.Random(0)
words = ("data tensor pipeline gradient shard layer token model weight batch rank mesh cluster "
         "memory planner schedule optimizer bucket kernel cache request server vector").split()
texts = [" ".join(rng.choice(words) for _ in range(rng.randint(20, 40))) + "." for _ in range(a.docs)]


def wait_idle():
    subprocess.run([sys.executable, RUNQ, "--retries", "3", "--", "true"], check=False, capture_output=True)


def http_round():
    srv = subprocess.Popen([BRIGADE, "serve", "--embedding-model", MODEL, "--port", "0", "--threads", "2"],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        url = srv.stdout.readline().strip().rsplit(" ", 1)[-1]
        for _ in range(600):
            try:
                if urllib.request.urlopen(url + "/ready").status == 200:
                    break
            except Exception:
                time.sleep(0.05)
        nxt = iter(range(len(texts)))
        lock = threading.Lock()
        failed = []

        def client():
            while True:
                with lock:
                    i = next(nxt, None)
                if i is None:
                    return
                body = json.dumps({"input": texts[i]}).encode()
                req = urllib.request.Request(url + "/v1/embeddings", body, {"Content-Type": "application/json"})
                with urllib.request.urlopen(req) as r:
                    if r.status != 200 or len(json.loads(r.read())["data"][0]["embedding"]) != 384:
                        failed.append(i)

        t0 = time.perf_counter()
        ts = [threading.Thread(target=client) for _ in range(a.concurrency)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        dt = time.perf_counter() - t0
        assert not failed, failed[:5]
        return len(texts) / dt
    finally:
        srv.terminate()
        srv.wait()


def embed_round(tmp):
    inp = os.path.join(tmp, "texts.txt")
    with open(inp, "w") as f:
        f.write("\n".join(texts) + "\n")
    out = os.path.join(tmp, f"out-{time.time_ns()}")
    r = subprocess.run([BRIGADE, "embed", "--model", MODEL, "--input", inp, "--output", out, "--workers", "2",
                        "--threads", "1", "--shard-size", str(max(1, len(texts) // 100)), "--json"],
                       check=True, capture_output=True, text=True)
    # its own figure: documents over the embedding time, the model's load excluded
    return json.loads(r.stdout)["documents_per_s"]


with tempfile.TemporaryDirectory() as tmp:
    http, embed = [], []
    for r in range(a.rounds):
        wait_idle()
        http.append(http_round())
        wait_idle()
        embed.append(embed_round(tmp))
        print(f"round {r + 1}: HTTP {http[-1]:.1f} docs/s at {a.concurrency} concurrent single-sentence requests; "
              f"brigade embed {embed[-1]:.1f} docs/s", flush=True)
    h, e = statistics.median(http), statistics.median(embed)
    print(json.dumps({"summary": "embeddings over HTTP vs brigade embed, all-MiniLM-L6-v2, 2 threads",
                      "docs": a.docs, "concurrency": a.concurrency, "http_docs_per_s": round(h, 1),
                      "embed_docs_per_s": round(e, 1), "ratio": round(h / e, 2)}))
