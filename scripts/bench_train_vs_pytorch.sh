#!/usr/bin/env bash
# GPT-2-small training step: brigade vs PyTorch eager fp32 (../shared/peers/bench_gpt_train.py),
# and with COMPILE=1 also torch.compile (inductor's fused C++ kernels), same shape (batch 4 x
# seq 256) and thread count, alternated ROUNDS times on an idle machine (runq.py waits for one
# and records foreign CPU use). Prints each run and the ratios of medians.
# Usage: scripts/bench_train_vs_pytorch.sh [threads]   (env: ROUNDS=3, COMPILE=0, PEERS=../shared/peers)
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=${1:-2}
ROUNDS=${ROUNDS:-3}
COMPILE=${COMPILE:-0}
PEERS=$(realpath "${PEERS:-../shared/peers}")
LOG=$(mktemp -d)/train.jsonl
cargo build --release -q
BRIGADE=$(realpath target/release/brigade)
for _ in $(seq "$ROUNDS"); do
  python3 "$PEERS/runq.py" --log "$LOG" --retries 2 -- \
    "$BRIGADE" bench train --model gpt2-small --seq 256 --batch 4 --threads "$THREADS" --steps 5 --json
  (cd "$PEERS" && python3 runq.py --log "$LOG" --retries 2 -- \
    .venv/bin/python bench_gpt_train.py --config gpt2-small --threads "$THREADS")
  if [ "$COMPILE" = 1 ]; then
    (cd "$PEERS" && python3 runq.py --log "$LOG" --retries 2 -- \
      .venv/bin/python bench_gpt_train.py --config gpt2-small --threads "$THREADS" --compile)
  fi
done
python3 - "$LOG" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
ours = [r for r in rows if r.get("bench") == "train"]
peer = [r for r in rows if r.get("bench") == "gpt_train_step" and not r.get("compiled")]
comp = [r for r in rows if r.get("bench") == "gpt_train_step" and r.get("compiled")]
med = lambda rs, k: statistics.median(r[k] for r in rs)
b, p = med(ours, "tokens_per_s"), med(peer, "tokens_per_s")
extra = {}
if comp:
    c = med(comp, "tokens_per_s")
    extra = {"torch_compile_tokens_per_s": round(c, 1), "ratio_vs_compile": round(b / c, 3)}
print(json.dumps({"summary": "gpt2-small train step", "threads": ours[0]["threads"],
                  "brigade_tokens_per_s": round(b, 1), "pytorch_tokens_per_s": round(p, 1),
                  "ratio": round(b / p, 3), **extra, "brigade_mfu": round(med(ours, "mfu"), 3),
                  "brigade_matmul_gflops": round(med(ours, "matmul_gflops_per_s"), 1),
                  "brigade_matmul_kernel": ours[0].get("matmul_kernel"),
                  "pytorch_model_gflops": round(med(peer, "model_gflops_per_s"), 1),
                  "max_foreign_cpu_frac": round(max(r.get("foreign_cpu_frac", 0) for r in rows), 3)}))
PY
