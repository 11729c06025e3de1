#!/usr/bin/env bash
# A mixture of experts' training step (fp32, AdamW, batch 4 x seq 256; 8 experts, 2 a token):
# brigade (`bench train --model DIR`, the shape read from the config.json transformers writes)
# beside transformers' own Qwen2MoeForCausalLM (scripts/hf_moe_train_step.py), eager and
# torch.compile, same threads, alternated ROUNDS times on an idle machine. Prints the medians
# and brigade's ratio to the faster peer.
# Usage: scripts/bench_moe_train_vs_hf.sh PYTHON [threads]   (PYTHON: the peers' venv; env ROUNDS=3;
#        ARCH=qwen3_moe for the same shape as Qwen3MoeForCausalLM, with its q/k norms)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=$1 THREADS=${2:-2} ROUNDS=${ROUNDS:-3}
export ARCH=${ARCH:-qwen2_moe}
PEERS=$(realpath "${PEERS:-../shared/peers}")
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
LOG=$work/moe.jsonl
"$PY" scripts/hf_moe_train_step.py --arch "$ARCH" --write-config "$work/shape"
BRIGADE=$(realpath target/release/brigade)
for _ in $(seq "$ROUNDS"); do
  python3 "$PEERS/runq.py" --log "$LOG" --retries 2 -- \
    "$BRIGADE" bench train --model "$work/shape" --seq 256 --batch 4 --threads "$THREADS" --steps 5 --json
  for mode in "" "--compile"; do
    python3 "$PEERS/runq.py" --log "$LOG" --retries 2 -- "$PY" scripts/hf_moe_train_step.py --arch "$ARCH" --threads "$THREADS" $mode
  done
done
python3 - "$LOG" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
ours = [r for r in rows if r.get("bench") == "train"]
eager = [r for r in rows if r.get("bench") == "hf_moe_train_step" and not r["compiled"]]
comp = [r for r in rows if r.get("bench") == "hf_moe_train_step" and r["compiled"]]
med = lambda rs: statistics.median(r["tokens_per_s"] for r in rs)
b, e, c = med(ours), med(eager), med(comp)
print(json.dumps({"summary": "MoE train step (8 experts, top-2), batch 4 x seq 256, " + __import__("os").environ.get("ARCH", "qwen2_moe"), "brigade_tokens_per_s": round(b, 1),
                  "hf_eager_tokens_per_s": round(e, 1), "hf_compile_tokens_per_s": round(c, 1),
                  "ratio_vs_faster_peer": round(b / max(e, c), 3), "goal_ratio": 1.5,
                  "brigade_fraction_of_matmul_rate": round(statistics.median(r["mfu"] for r in ours), 3),
                  "max_foreign_cpu_frac": round(max(r.get("foreign_cpu_frac", 0) for r in rows), 3)}))
PY
