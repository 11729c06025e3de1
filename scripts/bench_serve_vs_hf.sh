#!/usr/bin/env bash
# Serving, gpt2-small shape with random weights, prompt 32, 64 tokens out, 2 threads:
# `brigade bench serve` (HTTP server in process on loopback, streamed requests at concurrency
# 1 and 32) vs Hugging Face generate() (../shared/peers/bench_hf_generate.py: one request, and
# a static batch of 32), alternated ROUNDS times on an idle machine (runq.py waits for one).
# Prints each run and the ratios of medians.
# Usage: scripts/bench_serve_vs_hf.sh   (env: ROUNDS=2, PEERS=../shared/peers)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-2}
PEERS=$(realpath "${PEERS:-../shared/peers}")
LOG=$(mktemp -d)/serve.jsonl
cargo build --release -q
BRIGADE=$(realpath target/release/brigade)
for _ in $(seq "$ROUNDS"); do
  python3 "$PEERS/runq.py" --log "$LOG" --retries 2 -- "$BRIGADE" bench serve --model gpt2-small \
    --concurrency 1,32 --prompt-len 32 --output-len 64 --threads 2 --json
  (cd "$PEERS" && python3 runq.py --log "$LOG" --retries 2 -- \
    .venv/bin/python bench_hf_generate.py --threads 2 --prompt-len 32 --new 64 --batch 1 32)
done
python3 - "$LOG" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
ours = [r for r in rows if r.get("bench") == "serve"]
hf = [r for r in rows if "batch" in r and "output_tokens_per_s" in r]
med = statistics.median
def at(c, key):
    return med(next(x for x in r["rows"] if x["concurrency"] == c)[key] for r in ours)
one, many = at(1, "output_tokens_per_s"), at(32, "output_tokens_per_s")
hf1 = med(r["output_tokens_per_s"] for r in hf if r["batch"] == 1)
hf32 = med(r["output_tokens_per_s"] for r in hf if r["batch"] == 32)
print(json.dumps({"summary": "serving gpt2-small shape, prompt 32, 64 out, 2 threads",
    "brigade_1_tokens_per_s": round(one, 1), "brigade_32_tokens_per_s": round(many, 1),
    "hf_generate_1_tokens_per_s": round(hf1, 1), "hf_generate_32_tokens_per_s": round(hf32, 1),
    "ratio_1": round(one / hf1, 2), "ratio_32": round(many / hf32, 2), "brigade_32_over_1": round(many / one, 2),
    "itl_p50_ms_32": round(at(32, "itl_p50_ms"), 1), "itl_p99_ms_32": round(at(32, "itl_p99_ms"), 1),
    "itl_p99_over_p50_32": round(at(32, "itl_p99_ms") / at(32, "itl_p50_ms"), 2),
    "ttft_p50_ms_1": round(at(1, "ttft_p50_ms"), 1), "ttft_p50_ms_32": round(at(32, "ttft_p50_ms"), 1),
    "weight_read_fraction_1": round(at(1, "weight_read_limit_fraction"), 3),
    "matmul_fraction_32": round(at(32, "matmul_limit_fraction"), 3),
    "read_gbps": round(med(r["limits"]["read_gbps"] for r in ours), 1),
    "matmul_gflops": round(med(r["limits"]["matmul_gflops"] for r in ours), 1)}))
PY
