#!/usr/bin/env bash
# A model split over two MPI processes (1 thread each) beside the same service in one process of
# 2 threads: `tp` (the default) sets `--tp 2` over MPI beside `--tp 2` over two threads; `pp`
# sets `--pp 2` over MPI beside one unsplit process. gpt2-small with random weights, `brigade
# bench serve --url` at 1, 32 and 64 concurrent streams. Needs a build with --features mpi.
# Usage: python3 ../shared/peers/runq.py -- scripts/bench_serve_mpi.sh [tp|pp]
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-tp}" in
  tp) base=(--tp 2) split=(--tp 2) what="--tp 2 over threads" ;;
  pp) base=() split=(--pp 2) what="one process, 2 threads" ;;
  *) echo "usage: $0 [tp|pp]" >&2; exit 2 ;;
esac
bin=$PWD/target/release/brigade
tmp=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$tmp"' EXIT
ready() { for _ in $(seq 1 300); do curl -sf "localhost:$1/ready" >/dev/null && return; sleep 0.2; done; echo "server on $1 not ready" >&2; exit 1; }
"$bin" serve --model gpt2-small "${base[@]}" --threads 2 --port 18011 >"$tmp/threads.log" 2>&1 &
pid=$!
ready 18011
"$bin" bench serve --url http://127.0.0.1:18011 --model gpt2-small --concurrency 1,32,64 >"$tmp/threads.txt" 2>&1
kill -TERM "$pid"; wait "$pid" || true
mpirun -n 2 --allow-run-as-root --oversubscribe "$bin" serve --backend mpi --model gpt2-small "${split[@]}" --threads 1 --port 18012 >"$tmp/mpi.log" 2>&1 &
pid=$!
ready 18012
"$bin" bench serve --url http://127.0.0.1:18012 --model gpt2-small --concurrency 1,32,64 >"$tmp/mpi.txt" 2>&1
kill -TERM "$pid"; wait "$pid" || true
pid=
echo "$what:"; grep concurrent: "$tmp/threads.txt"
echo "${split[*]} over MPI processes:"; grep concurrent: "$tmp/mpi.txt"
python3 - "$tmp/threads.txt" "$tmp/mpi.txt" "${split[*]} over MPI / $what" <<'PY'
import re, sys
rate = lambda f: {int(m[0]): float(m[1]) for m in re.findall(r"(\d+) concurrent: .*?, ([\d.]+) output tokens/s", open(f).read())}
t, m = rate(sys.argv[1]), rate(sys.argv[2])
for c in sorted(t):
    print(f"{c} concurrent: {sys.argv[3]} = {m[c] / t[c]:.2f}x output tokens/s")
PY
