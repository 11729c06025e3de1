#!/usr/bin/env bash
# A benchmark of two binaries of brigade, before and after a change, alternating them so that
# they share the machine's state, each run under ../shared/peers/runq.py (which waits for an
# idle machine and reports the CPU other processes used). Prints each run's tokens/s, then the
# medians and their ratio.
#   scripts/bench_ab.sh OLD_BINARY NEW_BINARY [ROUNDS] [-- BENCH ARGS...]
# `bench engine` rows (output tokens/s per concurrency) and `bench embed` rows (tokens/s per
# workers × threads) are compared the same way.
# BENCH ARGS default to the single worker's step as `bench train` times it (the model's pass,
# clipping and AdamW): train --model gpt2-small --seq 256 --batch 4 --threads 2. The trainer's
# own step (data, the executor, the gradient's sums, the optimizer) is
#   parallel --model gpt2-small --seq 256 --batch 4 --threads 2 --layouts dp=1 --steps 5
set -euo pipefail
old=$1 new=$2 rounds=${3:-3}
shift $(( $# >= 3 ? 3 : $# ))
[ "${1:-}" = "--" ] && shift
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(train --model gpt2-small --seq 256 --batch 4 --threads 2)
runq="$(cd "$(dirname "$0")" && pwd)/../../shared/peers/runq.py"
log=$(mktemp)
for _ in $(seq "$rounds"); do
  for which in old new; do
    bin=$old; [ "$which" = new ] && bin=$new
    line=$(python3 "$runq" --wait-quiet 300 --log "$log.runq" -- "$bin" bench "${args[@]}" --json | tail -1)
    echo "$which $line" | tee -a "$log"
  done
done
python3 - "$log" <<'PY'
import json, statistics, sys
# one series per row: `bench parallel` prints a row per layout, the others one figure
tps = {}
for l in open(sys.argv[1]):
    which, j = l.split(" ", 1)
    v = json.loads(j)
    rows = v["rows"] if "rows" in v else [{"layout": v.get("bench", "run"), "tokens_per_s": v["tokens_per_s"]}]
    for r in rows:
        # `bench engine` rows: one per concurrency, its output tokens/s; `bench embed` rows:
        # one per workers × threads
        if "layout" in r:
            name = r["layout"]
        elif "workers" in r:
            name = f"{r['workers']}x{r['threads']}"
        else:
            name = f"concurrency={r['concurrency']}"
        rate = r["tokens_per_s"] if "tokens_per_s" in r else r["output_tokens_per_s"]
        tps.setdefault(name, {"old": [], "new": []})[which].append(rate)
# Beside the ratio of medians: the median of each round's own ratio (old and new ran one after
# the other, so a slow stretch of the machine hits both), and the ratio of each side's best run
# (what each does when no other tenant shares its cores: on these VMs a core's other hardware
# thread belongs to someone else, and a register-only fma loop was seen at 66-101 GFLOP/s from
# one second to the next while runq saw no other process).
for name, t in tps.items():
    o, n = statistics.median(t["old"]), statistics.median(t["new"])
    paired = [b / a for a, b in zip(t["old"], t["new"])]
    print(json.dumps({"row": name, "old_tokens_per_s": [round(x, 1) for x in t["old"]],
                      "new_tokens_per_s": [round(x, 1) for x in t["new"]],
                      "old_median": round(o, 1), "new_median": round(n, 1), "new_over_old": round(n / o, 3),
                      "paired_median": round(statistics.median(paired), 3),
                      "paired_range": [round(min(paired), 3), round(max(paired), 3)],
                      "best_over_best": round(max(t["new"]) / max(t["old"]), 3)}))
PY
# how much CPU other processes took during the runs (runq's measure; > 0.05 is a disturbed run)
python3 -c 'import json,sys; f=[json.loads(l).get("foreign_cpu_frac",0) for l in open(sys.argv[1])]; print(json.dumps({"foreign_cpu_frac_max": round(max(f),3), "runs": len(f)}))' "$log.runq"
