#!/usr/bin/env bash
# A collective on 2 ranks: brigade's local backend vs Open MPI's own (through the mpi backend,
# no descriptor checks: MPI_Allreduce out of place, or MPI_Alltoallv), alternated ROUNDS times
# on an idle machine. Prints the medians per size and the ratios. Needs libopenmpi-dev; run as
# root it passes --allow-run-as-root.
# Usage: scripts/bench_comm_vs_mpi.sh   (env: OP=all_reduce|all_to_all_v, ROUNDS=3, MAX_BYTES,
# PEERS=../shared/peers)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
OP=${OP:-all_reduce}
MAX_BYTES=${MAX_BYTES:-268435456}
PEERS=$(realpath "${PEERS:-../shared/peers}")
LOG=$(mktemp -d)/comm.jsonl
cargo build --release -q --features mpi -p brigade-cli
B=$(realpath target/release/brigade)
for _ in $(seq "$ROUNDS"); do
  python3 "$PEERS/runq.py" --log "$LOG" --retries 2 -- "$B" bench comm --ranks 2 --backend local --op "$OP" --max-bytes "$MAX_BYTES" --json
  python3 "$PEERS/runq.py" --log "$LOG" --retries 2 -- \
    mpirun -n 2 --allow-run-as-root --oversubscribe "$B" bench comm --backend mpi --op "$OP" --max-bytes "$MAX_BYTES" --json
done
python3 - "$LOG" "$OP" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
def med(backend, key, size=None):
    rs = [r for r in runs if r.get("backend") == backend]
    if size is None:
        return statistics.median(r[key] for r in rs)
    return statistics.median(row[key] for r in rs for row in r["rows"] if row["bytes"] == size)
memcpy = med("local", "memcpy_gbps")
print(f"memcpy 2 threads 256 MiB: {memcpy:.2f} GB/s -> memcpy/2 = {memcpy/2:.2f} GB/s")
print(f"{'bytes':>10} {'local us':>9} {'mpi us':>9} {'local busbw':>12} {'mpi busbw':>10} {'ratio':>6}")
for row in [r for r in runs if r.get("backend") == "local"][0]["rows"]:
    s = row["bytes"]
    lt, mt = med("local", "time_us", s), med("mpi", "time_us", s)
    lb, mb = med("local", "busbw_gbps", s), med("mpi", "busbw_gbps", s)
    print(f"{s:>10} {lt:>9.2f} {mt:>9.2f} {lb:>12.3f} {mb:>10.3f} {lb/mb:>6.2f}x")
print(json.dumps({"summary": sys.argv[2] + " 2 ranks", "memcpy_gbps": round(memcpy, 2),
                  "local_busbw_64MiB": round(med("local", "busbw_gbps", 64 << 20), 2),
                  "goal_80pct_of_memcpy_half": round(0.8 * memcpy / 2, 2),
                  "mpi_busbw_64MiB": round(med("mpi", "busbw_gbps", 64 << 20), 2),
                  "latency_8B_us": [round(med("local", "time_us", 8), 2), round(med("mpi", "time_us", 8), 2)],
                  "latency_4KiB_us": [round(med("local", "time_us", 4096), 2), round(med("mpi", "time_us", 4096), 2)],
                  "max_foreign_cpu_frac": round(max(r.get("foreign_cpu_frac", 0) for r in runs), 3)}))
PY
