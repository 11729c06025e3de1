#!/usr/bin/env bash
# Expert parallelism against plain data parallelism on the same 2 ranks: `brigade bench
# parallel` on the shape of scripts/hf_moe_train_step.py (Qwen2-MoE, 8 experts, 2 a token,
# hidden 512, 4 layers; batch 4 x seq 256), layouts dp=2 and dp=2,ep=2 (each rank then holds 4
# of the 8 experts), ROUNDS runs on an idle machine. Prints the medians: tokens/s, optimizer
# seconds and peak MiB per rank of each, and the ratios ep / dp.
# Usage: scripts/bench_moe_ep.sh PYTHON   (PYTHON: the peers' venv, to write the config; env ROUNDS=3)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=$1 ROUNDS=${ROUNDS:-3}
PEERS=$(realpath "${PEERS:-../shared/peers}")
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
LOG=$work/ep.jsonl
"$PY" scripts/hf_moe_train_step.py --write-config "$work/shape"
BRIGADE=$(realpath target/release/brigade)
for _ in $(seq "$ROUNDS"); do
  python3 "$PEERS/runq.py" --log "$LOG" --retries 2 -- \
    "$BRIGADE" bench parallel --model "$work/shape" --seq 256 --batch 4 --steps 3 --layouts "dp=2;dp=2,ep=2" --json
done
python3 - "$LOG" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{") and '"bench": "parallel"' in l]
def med(layout, key):
    return statistics.median(r[key] for run in runs for r in run["rows"] if r["layout"] == layout)
out = {"summary": "dp=2,ep=2 against dp=2 (Qwen2-MoE shape, 8 experts, top-2), batch 4 x seq 256", "rounds": len(runs)}
for l in ["dp=2", "dp=2,ep=2"]:
    out[l] = {k: round(med(l, k), 3) for k in ["tokens_per_s", "optimizer_s", "peak_mib_per_rank"]}
out["tokens_per_s_ratio"] = round(out["dp=2,ep=2"]["tokens_per_s"] / out["dp=2"]["tokens_per_s"], 3)
out["peak_mib_ratio"] = round(out["dp=2,ep=2"]["peak_mib_per_rank"] / out["dp=2"]["peak_mib_per_rank"], 3)
print(json.dumps(out))
PY
