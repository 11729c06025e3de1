#!/usr/bin/env bash
# SmolLM2-135M's shape, one training step (fp32, AdamW, batch 4 x seq 256): brigade vs Hugging
# Face's own LlamaForCausalLM (../shared/peers/bench_llama_train.py), eager and torch.compile, same
# thread count, alternated ROUNDS times on an idle machine (runq.py waits for one and records
# foreign CPU use). Prints each run, then the medians, brigade's ratio to the faster peer, and
# brigade's model FLOP rate as a fraction of the matmul rate measured in the same run.
# Usage: scripts/bench_llama_train_vs_hf.sh [threads]   (env: ROUNDS=3, PEERS=../shared/peers)
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=${1:-2}
ROUNDS=${ROUNDS:-3}
PEERS=$(realpath "${PEERS:-../shared/peers}")
LOG=$(mktemp -d)/train.jsonl
cargo build --release -q
BRIGADE=$(realpath target/release/brigade)
for _ in $(seq "$ROUNDS"); do
  python3 "$PEERS/runq.py" --log "$LOG" --retries 2 -- \
    "$BRIGADE" bench train --model smollm2-135m --seq 256 --batch 4 --threads "$THREADS" --steps 5 --json
  for mode in "" "--compile"; do
    (cd "$PEERS" && python3 runq.py --log "$LOG" --retries 2 -- \
      .venv/bin/python bench_llama_train.py --config smollm2-135m --seq 256 --batch 4 --threads "$THREADS" $mode)
  done
done
python3 - "$LOG" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
ours = [r for r in rows if r.get("bench") == "train"]
eager = [r for r in rows if r.get("bench") == "llama_train_step" and not r.get("compiled")]
comp = [r for r in rows if r.get("bench") == "llama_train_step" and r.get("compiled")]
med = lambda rs, k: statistics.median(r[k] for r in rs)
b, e, c = med(ours, "tokens_per_s"), med(eager, "tokens_per_s"), med(comp, "tokens_per_s")
best = max(e, c)
print(json.dumps({"summary": "smollm2-135m train step, batch 4 x seq 256", "threads": ours[0]["threads"],
                  "brigade_tokens_per_s": round(b, 1), "hf_eager_tokens_per_s": round(e, 1),
                  "hf_compile_tokens_per_s": round(c, 1), "ratio_vs_faster_peer": round(b / best, 3),
                  "goal_ratio": 1.2, "brigade_fraction_of_matmul_rate": round(med(ours, "mfu"), 3), "goal_fraction": 0.9,
                  "brigade_matmul_gflops": round(med(ours, "matmul_gflops_per_s"), 1),
                  "brigade_matmul_kernel": ours[0].get("matmul_kernel"),
                  "max_foreign_cpu_frac": round(max(r.get("foreign_cpu_frac", 0) for r in rows), 3)}))
PY
