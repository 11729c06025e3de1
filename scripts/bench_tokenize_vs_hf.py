"""`brigade tokenize` beside the `tokenizers` library's own batch encoding from Python: the
Shakespeare corpus ×20 (860 documents, ~31M tokens with GPT-2's tokenizer), the same tokenizer,
the same 2 cores, alternated ROUNDS times, each run after ../shared/peers/runq.py finds the
machine idle. brigade's time is the whole job (scan and hash the input, tokenize, write the
Megatron shards and manifest); the library's is `encode_batch` alone on texts already in memory.
Prints each run and one JSON summary line with the medians and their ratio (goal ≥ 1).

Usage: python3 scripts/bench_tokenize_vs_hf.py [--rounds 5] [--tokenizer gpt2] [--copies 20]
(the peers' venv supplies `tokenizers`: ../shared/peers/.venv or target/peers-venv/.venv)
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(ROOT, "..", "shared")
PY_PEER = r'''
import json, os, sys, time
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[1])
texts = [open(os.path.join(sys.argv[2], f), encoding="utf-8").read() for f in sorted(os.listdir(sys.argv[2]))]
t0 = time.perf_counter()
enc = tok.encode_batch(texts, add_special_tokens=False)
dt = time.perf_counter() - t0
n = sum(len(e.ids) for e in enc)
print(json.dumps({"bench": "tokenizers_encode_batch", "tokens": n, "wall_s": dt, "tokens_per_s": n / dt}))
'''


def peers_python():
    for p in [os.path.join(SHARED, "peers", ".venv", "bin", "python"),
              os.path.join(ROOT, "target", "peers-venv", ".venv", "bin", "python")]:
        if os.access(p, os.X_OK):
            return p
    sys.exit("no peers venv with `tokenizers` (../shared/peers/.venv or target/peers-venv/.venv)")


def runq(cmd, log):
    out = subprocess.run([sys.executable, os.path.join(SHARED, "peers", "runq.py"), "--log", log, "--retries", "2",
                          "--"] + cmd, capture_output=True, text=True, check=True)
    return [json.loads(l) for l in out.stdout.splitlines() if l.startswith("{")][-1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokenizer", default="gpt2")
    ap.add_argument("--copies", type=int, default=20)
    ap.add_argument("--brigade", default=os.path.join(ROOT, "target", "release", "brigade"))
    a = ap.parse_args()
    tok_dir = os.path.join(SHARED, "tokenizers", a.tokenizer)
    tmp = tempfile.mkdtemp()
    try:
        corpus = os.path.join(tmp, "corpus")
        os.makedirs(corpus)
        src = os.path.join(SHARED, "data", "shakespeare")
        for c in range(a.copies):
            for f in sorted(os.listdir(src)):
                shutil.copy(os.path.join(src, f), os.path.join(corpus, f"{c:02d}-{f}"))
        peer_script = os.path.join(tmp, "peer.py")
        open(peer_script, "w").write(PY_PEER)
        log = os.path.join(tmp, "log.jsonl")
        ours, theirs = [], []
        for r in range(a.rounds):
            out = os.path.join(tmp, "out")
            shutil.rmtree(out, ignore_errors=True)
            b = runq([a.brigade, "tokenize", "--tokenizer", tok_dir, "--input", corpus, "--output", out,
                      "--workers", "2", "--shard-size", "20", "--json"], log)
            p = runq([peers_python(), peer_script, os.path.join(tok_dir, "tokenizer.json"), corpus], log)
            ours.append(b["tokens_per_s"])
            theirs.append(p["tokens_per_s"])
            print(f"round {r + 1}: brigade tokenize {b['tokens_per_s']:.0f} tokens/s ({b['totals']['tokens']} tokens, "
                  f"{b['wall_s']:.2f} s, foreign cpu {b.get('foreign_cpu_frac', 0):.3f}); tokenizers encode_batch "
                  f"{p['tokens_per_s']:.0f} tokens/s ({p['tokens']} tokens, {p['wall_s']:.2f} s)", flush=True)
        mo, mt = statistics.median(ours), statistics.median(theirs)
        print(json.dumps({"summary": f"tokenize shakespeare x{a.copies} with {a.tokenizer}, 2 cores",
                          "brigade_tokens_per_s": round(mo), "tokenizers_tokens_per_s": round(mt),
                          "ratio": round(mo / mt, 3), "goal_ratio": 1.0, "rounds": a.rounds}))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
