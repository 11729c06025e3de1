#!/usr/bin/env bash
# The quick start's recipe (`brigade train` with no arguments) over seeds × matmul kernels:
# every run must reach 99% held-out accuracy. Prints one line per run and a table, and exits 1
# if any run falls short. Each run is the full default recipe (~25–100 s on 2 cores).
# Usage: scripts/quickstart_matrix.sh [seeds...]   (default 0 1 2 3 4; env THREADS=2)
set -uo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q
bin=target/release/brigade
seeds=("$@"); [ ${#seeds[@]} -gt 0 ] || seeds=(0 1 2 3 4)
fail=0
printf "%-6s %-11s %-10s %s\n" seed kernel accuracy seconds
for k in brigade gemm-crate; do
  for s in "${seeds[@]}"; do
    start=$(date +%s.%N)
    out=$(BRIGADE_MATMUL=$k "$bin" train --seed "$s" --threads "${THREADS:-2}" 2>/dev/null)
    secs=$(echo "$(date +%s.%N) - $start" | bc)
    acc=$(echo "$out" | grep -oE "accuracy [0-9.]+%" | grep -oE "[0-9.]+" | tail -1)
    printf "%-6s %-11s %-10s %.1f\n" "$s" "$k" "${acc:-?}%" "$secs"
    if [ -z "$acc" ] || ! awk -v a="$acc" 'BEGIN { exit !(a >= 99.0) }'; then fail=1; fi
  done
done
[ "$fail" = 0 ] && echo "quick start: every run reached 99%" || echo "quick start: a run fell short of 99%"
exit $fail
