"""Fine-tuning SmolLM2-135M from its published weights: `brigade train --init` beside Hugging
Face transformers' own training step on the same model, batch and threads (after
../shared/peers/bench_llama_train.py, but loading the weights): seq 1024, batch 8 as 2
micro-batches of 4, fp32 AdamW, 2 threads, on the Shakespeare corpus tokenized by
`brigade tokenize` with the model's tokenizer. Reports each side's median step time (steps
after the first), tokens/s and peak resident memory (the process's maximum RSS), alternated
ROUNDS times, each run after ../shared/peers/runq.py finds the machine idle; one JSON summary
line with the ratio (goal ≥ 1.5).

Usage: python3 scripts/bench_finetune_vs_hf.py HF_DIR [--rounds 2] [--steps 4] [--threads 2]
(HF_DIR: ../shared/models/smollm2-135m-instruct/get.sh DEST --hf PYTHON makes DEST/hf)
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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(ROOT, "..", "shared")

HF_STEP = r'''
import json, resource, statistics, sys, time
import numpy as np, torch
from transformers import AutoModelForCausalLM
hf, tokens, threads, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
torch.set_num_threads(threads)
torch.manual_seed(0)
model = AutoModelForCausalLM.from_pretrained(hf, torch_dtype=torch.float32)
model.train()
opt = torch.optim.AdamW(model.parameters(), lr=2e-5, betas=(0.9, 0.95), weight_decay=0.1)
data = np.fromfile(tokens, dtype=np.uint16)
rng = np.random.default_rng(0)
times = []
for s in range(steps):
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    for _ in range(2):
        starts = rng.integers(0, len(data) - 1025, size=4)
        x = torch.from_numpy(np.stack([data[a:a + 1024] for a in starts]).astype(np.int64))
        loss = model(input_ids=x, labels=x).loss / 2
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    times.append(time.perf_counter() - t0)
med = statistics.median(times[1:])
print(json.dumps({"bench": "hf_finetune", "step_s": times, "median_step_s": med, "tokens_per_s": 8192 / med,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "threads": threads}))
'''

# runs a command, then prints its peak RSS (the children's maximum) as JSON after its output
RSS = r'''
import json, resource, subprocess, sys
r = subprocess.run(sys.argv[1:], capture_output=True, text=True)
sys.stdout.write(r.stdout)
sys.stderr.write(r.stderr)
print(json.dumps({"bench": "rss", "rc": r.returncode, "stderr": r.stderr[-20000:],
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))
'''


def peers_python():
    for p in [os.path.join(SHARED, "peers", ".venv", "bin", "python"),
              os.path.join(ROOT, "target", "peers-venv", ".venv", "bin", "python")]:
        if os.access(p, os.X_OK):
            return p
    sys.exit("no peers venv (../shared/peers/.venv or target/peers-venv/.venv)")


def runq(cmd, log):
    out = subprocess.run([sys.executable, os.path.join(SHARED, "peers", "runq.py"), "--log", log, "--retries", "1",
                          "--"] + cmd, capture_output=True, text=True)
    rows = [json.loads(l) for l in out.stdout.splitlines() if l.startswith("{")]
    if out.returncode != 0 or not rows:
        sys.exit(f"{cmd[0]} failed: {out.stderr[-3000:]}")
    return rows


def brigade_steps(stderr):
    """Seconds of each step after the first, from the step lines' elapsed times."""
    el = [float(m.group(2)) for m in re.finditer(r"^step (\d+)/\d+ .* ([\d.]+)s elapsed$", stderr, re.M)]
    return [b - a for a, b in zip(el, el[1:])]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("hf")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--brigade", default=os.path.join(ROOT, "target", "release", "brigade"))
    a = ap.parse_args()
    tmp = tempfile.mkdtemp()
    try:
        toks = os.path.join(tmp, "toks")
        subprocess.run([a.brigade, "tokenize", "--tokenizer", a.hf, "--input", os.path.join(SHARED, "data", "shakespeare"),
                        "--output", toks, "--workers", "2", "--shard-size", "50"], check=True, capture_output=True)
        rss, hf_step = os.path.join(tmp, "rss.py"), os.path.join(tmp, "hf_step.py")
        open(rss, "w").write(RSS)
        open(hf_step, "w").write(HF_STEP)
        log = os.path.join(tmp, "log.jsonl")
        ours, theirs = [], []
        for r in range(a.rounds):
            b = runq([sys.executable, rss, a.brigade, "train", "--init", a.hf, "--data", toks, "--seq", "1024",
                      "--batch", "8", "--micro-batch", "4", "--steps", str(a.steps), "--threads", str(a.threads),
                      "--lr", "2e-5", "--eval-every", "0"], log)[-1]
            if b["rc"] != 0:
                sys.exit(f"brigade train failed: {b['stderr'][-3000:]}")
            steps = brigade_steps(b["stderr"])
            med = statistics.median(steps)
            ours.append({"median_step_s": med, "tokens_per_s": 8192 / med, "peak_rss_mb": b["peak_rss_mb"]})
            h = runq([peers_python(), hf_step, a.hf, os.path.join(toks, "shard-00000.bin"), str(a.threads),
                      str(a.steps)], log)[-1]
            theirs.append(h)
            print(f"round {r + 1}: brigade {8192 / med:.1f} tokens/s (steps {', '.join(f'{s:.1f}' for s in steps)} s; "
                  f"peak RSS {b['peak_rss_mb']:.0f} MB); transformers {h['tokens_per_s']:.1f} tokens/s (steps "
                  f"{', '.join(f'{s:.1f}' for s in h['step_s'][1:])} s; peak RSS {h['peak_rss_mb']:.0f} MB)", flush=True)
        m = lambda rows, k: statistics.median(x[k] for x in rows)
        print(json.dumps({"summary": "fine-tune smollm2-135m from its weights, seq 1024, batch 8 = 2 x 4, fp32 AdamW",
                          "threads": a.threads, "brigade_tokens_per_s": round(m(ours, "tokens_per_s"), 1),
                          "transformers_tokens_per_s": round(m(theirs, "tokens_per_s"), 1),
                          "ratio": round(m(ours, "tokens_per_s") / m(theirs, "tokens_per_s"), 3), "goal_ratio": 1.5,
                          "brigade_peak_rss_mb": round(m(ours, "peak_rss_mb")),
                          "transformers_peak_rss_mb": round(m(theirs, "peak_rss_mb")), "rounds": a.rounds}))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
