#!/usr/bin/env bash
# Serving with 8-bit weights against f32, side by side: `brigade bench serve --weights f32`
# and `--weights int8` (and int8-channel) alternated ROUNDS times on an idle machine (runq.py
# waits for one), on random-weight models of published shapes (qwen2.5-0.5b, gpt2-small),
# prompt 32, 64 tokens out, concurrency 1 and 32, 2 threads. Prints each run and the ratios
# of medians (int8 / f32 output tokens/s).
# Usage: scripts/bench_serve_int8.sh   (env: ROUNDS=2, MODELS="qwen2.5-0.5b gpt2-small", PEERS=../shared/peers)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-2}
MODELS=${MODELS:-"qwen2.5-0.5b gpt2-small"}
PEERS=$(realpath "${PEERS:-../shared/peers}")
LOG=$(mktemp -d)/int8.jsonl
cargo build --release -q
BRIGADE=$(realpath target/release/brigade)
for _ in $(seq "$ROUNDS"); do
  for m in $MODELS; do
    for w in f32 int8 int8-channel; do
      python3 "$PEERS/runq.py" --log "$LOG" --retries 2 -- "$BRIGADE" bench serve --model "$m" --weights "$w" \
        --concurrency 1,32 --prompt-len 32 --output-len 64 --threads 2 --json
    done
  done
done
python3 - "$LOG" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
runs = [r for r in rows if r.get("bench") == "serve"]
med = statistics.median
def at(model, w, c, key):
    return med(next(x for x in r["rows"] if x["concurrency"] == c)[key]
               for r in runs if r["model"] == model and r["weights"] == w)
for model in sorted({r["model"] for r in runs}):
    out = {"summary": f"serving {model} shape, prompt 32, 64 out, 2 threads, random weights"}
    for w in ["F32", "Int8", "Int8Channel"]:
        for c in (1, 32):
            out[f"{w}_{c}_tokens_per_s"] = round(at(model, w, c, "output_tokens_per_s"), 1)
        out[f"{w}_itl_p99_over_p50_32"] = round(at(model, w, 32, "itl_p99_ms") / at(model, w, 32, "itl_p50_ms"), 2)
    for w in ["Int8", "Int8Channel"]:
        for c in (1, 32):
            out[f"{w}_over_f32_{c}"] = round(out[f"{w}_{c}_tokens_per_s"] / out[f"F32_{c}_tokens_per_s"], 2)
    print(json.dumps(out))
PY
