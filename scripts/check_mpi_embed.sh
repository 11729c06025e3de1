#!/usr/bin/env bash
# `brigade embed` under MPI: 2 and 3 ranks write byte for byte the output of one local worker;
# a 2-rank job killed with SIGKILL (mpirun and every rank) after some shards, then started
# again with the same command, finishes with the same bytes; --workers under mpirun is refused.
# Needs a build with --features mpi and ../shared/models/all-MiniLM-L6-v2.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
bin=$PWD/target/release/brigade
model=$(realpath ../shared/models/all-MiniLM-L6-v2)
tmp=$(mktemp -d)
trap 'pkill -9 -f "$tmp" 2>/dev/null || true; rm -rf "$tmp"' EXIT
cd "$tmp"
python3 - <<'PY' > corpus.txt
words = "shard rank vector model resume kill token encoder parallel machine corpus naïve 東京 🙂".split()
for i in range(400):
    k = 400 if i % 97 == 5 else 3 + (i * 7) % 38
    print(" ".join(words[(i * 31 + j * 17) % len(words)] for j in range(k)))
PY
args=(embed --model "$model" --input corpus.txt --shard-size 20 --max-batch-tokens 400)
"$bin" "${args[@]}" --output ref --workers 1 --threads 2 >/dev/null
mpi() {  # ranks out
  timeout 300 mpirun -n "$1" --allow-run-as-root --oversubscribe "$bin" "${args[@]}" --backend mpi --output "$2"
}
for n in 2 3; do
  mpi "$n" "mpi$n" >"mpi$n.log" 2>&1 || { echo "mpi: embed on $n ranks failed:"; cat "mpi$n.log"; exit 1; } >&2
  diff -r ref "mpi$n" >/dev/null || { echo "mpi: $n ranks wrote other bytes than one worker" >&2; exit 1; }
  grep -q "worker 1:" "mpi$n.log" || { echo "mpi: the summary lists no second worker" >&2; cat "mpi$n.log"; exit 1; }
done
# SIGKILL everything after 5 shards, then resume with the same command
mpi 2 killed >/dev/null 2>&1 &
for _ in $(seq 3000); do
  [ "$(ls killed 2>/dev/null | grep -c '\.ids$')" -ge 5 ] && break
  sleep 0.01
done
pkill -9 -f "$tmp/killed" 2>/dev/null || true
pkill -9 -f "output killed" 2>/dev/null || true
wait || true
done_before=$(ls killed | grep -c '\.ids$' || true)
[ "$done_before" -lt 20 ] || { echo "mpi: the job finished before it could be killed" >&2; exit 1; }
mpi 2 killed >killed.log 2>&1 || { echo "mpi: resume failed:"; cat killed.log; exit 1; } >&2
grep -q "resumed:" killed.log || { echo "mpi: the second run did not resume" >&2; cat killed.log; exit 1; }
diff -r ref killed >/dev/null || { echo "mpi: killed and resumed output differs from one worker's" >&2; exit 1; }
"$bin" embed --verify killed >/dev/null
if timeout 60 mpirun -n 2 --allow-run-as-root --oversubscribe "$bin" "${args[@]}" --backend mpi --workers 2 --output x >/dev/null 2>err; then
  echo "mpi: --workers under mpirun was accepted" >&2; exit 1
fi
grep -q "every rank is one worker" err || { echo "mpi: unclear error for --workers: $(cat err)" >&2; exit 1; }
# brigade tokenize runs on the same sharded-job machinery: 2 ranks write one worker's bytes
tok=$(realpath "$root/../shared/tokenizers/gpt2")
targs=(tokenize --tokenizer "$tok" --input "$root/../shared/data/shakespeare" --shard-size 5)
"$bin" "${targs[@]}" --output tref --workers 1 >/dev/null
timeout 300 mpirun -n 2 --allow-run-as-root --oversubscribe "$bin" "${targs[@]}" --backend mpi --output tmpi >tmpi.log 2>&1 \
  || { echo "mpi: tokenize on 2 ranks failed:"; cat tmpi.log; exit 1; } >&2
grep -q "worker 1:" tmpi.log || { echo "mpi: tokenize's summary lists no second worker" >&2; cat tmpi.log; exit 1; }
diff -r tref tmpi >/dev/null || { echo "mpi: tokenize on 2 ranks wrote other bytes than one worker" >&2; exit 1; }
echo "mpi embed: 2 and 3 ranks equal one worker; killed after $done_before shards and resumed, byte-identical; tokenize on 2 ranks = one worker"
