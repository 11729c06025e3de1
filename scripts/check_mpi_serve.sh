#!/usr/bin/env bash
# Serving over MPI processes equals one process: a llama-tiny trained here for a few steps (so its
# tokens are not a random model's repeats) is served by one process of 2 threads, by
# `mpirun -n 2 brigade serve --backend mpi --tp 2` and by `… --pp 2` (a process per rank or
# stage, 1 thread each); 8 concurrent greedy completions with log-probabilities must agree bit
# for bit (text, tokens, every log-probability). `… --cp 2` (each sequence's cache striped over
# the two processes in blocks of 4 tokens, prompts of 30-40 tokens) must give the same text and
# tokens, its log-probabilities within 2e-5 (its attention merges the ranks' partial results:
# another order of additions). Bad starts are one line and a non-zero exit: --backend mpi
# outside mpirun, and a world that is not --tp processes.
# Needs a build with --features mpi (`cargo build --release -p brigade-cli --features mpi`).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$PWD/target/release/brigade
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
mpi=(mpirun --allow-run-as-root --oversubscribe)
"$bin" train --model llama-tiny --data README.md --seq 64 --batch 8 --steps 150 --lr 3e-3 --threads 2 --eval-every 0 --no-sample --out "$tmp/llama" >/dev/null 2>&1
# bad starts: one line each, no hang
if "$bin" serve --backend mpi --tp 2 --checkpoint "$tmp/llama" >/dev/null 2>"$tmp/err"; then
  echo "serve: --backend mpi outside mpirun was accepted" >&2; exit 1
fi
grep -q "mpirun" "$tmp/err" || { echo "serve: unclear error outside mpirun: $(cat "$tmp/err")" >&2; exit 1; }
if timeout 60 "${mpi[@]}" -n 3 "$bin" serve --backend mpi --tp 2 --checkpoint "$tmp/llama" --port 0 >/dev/null 2>"$tmp/err"; then
  echo "serve: 3 processes for --tp 2 were accepted" >&2; exit 1
fi
grep -q "needs 2 processes but mpirun started 3" "$tmp/err" || { echo "serve: unclear error for 3 processes: $(cat "$tmp/err")" >&2; exit 1; }
start() {  # log, then the command; sets $url (not in a subshell: the cleanup needs the pid)
  local log=$1; shift
  : >"$log"
  "$@" >"$log" 2>&1 &
  pids+=($!)
  for _ in $(seq 1 300); do
    # ready: the engine built, not only the port open (a request before it gets a 503)
    if grep -q "loaded; ready" "$log"; then
      url=$(grep -o 'http://[0-9.:]*' "$log" | head -1)
      return
    fi
    sleep 0.2
  done
  echo "serve: did not start: $*" >&2; cat "$log" >&2; exit 1
}
start "$tmp/one.log" "$bin" serve --checkpoint "$tmp/llama" --port 0 --threads 2 --kv-cache-mib 256
one=$url
start "$tmp/two.log" "${mpi[@]}" -n 2 "$bin" serve --backend mpi --tp 2 --checkpoint "$tmp/llama" --port 0 --threads 1 --kv-cache-mib 256
two=$url
start "$tmp/pp.log" "${mpi[@]}" -n 2 "$bin" serve --backend mpi --pp 2 --checkpoint "$tmp/llama" --port 0 --threads 1 --kv-cache-mib 256
pp=$url
start "$tmp/cp.log" "${mpi[@]}" -n 2 "$bin" serve --backend mpi --cp 2 --checkpoint "$tmp/llama" --port 0 --threads 1 --block-size 4 --kv-cache-mib 256
cp=$url
python3 - "$one" "$two" "$pp" "$cp" <<'PY'
import json, sys, urllib.request
from concurrent.futures import ThreadPoolExecutor
one, split, cp = sys.argv[1], {"--tp 2": sys.argv[2], "--pp 2": sys.argv[3]}, sys.argv[4]
prompts = ["The ring", "brigade trains", "Every layout", "A rank holds", "keys and values", "The planner", "tokens per", "one worker"]
def ask(url, p):
    body = json.dumps({"model": "llama", "prompt": p, "max_tokens": 16, "temperature": 0, "logprobs": 2}).encode()
    req = urllib.request.Request(url + "/v1/completions", body, {"content-type": "application/json"})
    c = json.load(urllib.request.urlopen(req, timeout=120))["choices"][0]
    return c["text"], c["logprobs"]["tokens"], c["logprobs"]["token_logprobs"], c["logprobs"]["top_logprobs"]
with ThreadPoolExecutor(8) as ex:
    want = list(ex.map(lambda p: ask(one, p), prompts))
    for how, url in split.items():
        got = list(ex.map(lambda p: ask(url, p), prompts))
        for p, x, y in zip(prompts, want, got):
            assert x == y, f"{p!r}: one process {x} vs {how} over MPI {y}"
        print(f"serve: {how} over 2 MPI processes gives one process's tokens and log-probabilities bit for bit on {len(prompts)} concurrent prompts, e.g. {prompts[0]!r} -> {want[0][0]!r}")
    longer = [p + ": every layout is one worker" for p in prompts]
    want = list(ex.map(lambda p: ask(one, p), longer))
    got = list(ex.map(lambda p: ask(cp, p), longer))
    worst = 0.0
    for p, x, y in zip(longer, want, got):
        assert x[:2] == y[:2], f"{p!r}: one process {x[:2]} vs --cp 2 over MPI {y[:2]}"
        for a, b in zip(x[2], y[2]):
            worst = max(worst, abs(a - b) / max(1.0, abs(a)))
    assert worst <= 2e-5, f"--cp 2: a log-probability differs by {worst:.2e} (relative) from one process's"
    print(f"serve: --cp 2 over 2 MPI processes gives one process's text and tokens on {len(longer)} concurrent {len(longer[0])}-byte prompts (log-probabilities within {worst:.1e}), e.g. -> {want[0][0]!r}")
PY
kill -TERM "${pids[3]}" "${pids[2]}"
# SIGTERM to mpirun: rank 0 drains, ends its followers' loops, and every process exits
kill -TERM "${pids[1]}"
for _ in $(seq 1 100); do
  pgrep -f "serve --backend mpi --tp 2 --checkpoint $tmp/llama" >/dev/null || break
  sleep 0.2
done
if pgrep -f "serve --backend mpi --tp 2 --checkpoint $tmp/llama" >/dev/null; then
  echo "serve: a rank outlived the service 20 s after SIGTERM" >&2; pkill -9 -f "serve --backend mpi --tp 2 --checkpoint $tmp/llama"; exit 1
fi
grep -q "stopped" "$tmp/two.log" || { echo "serve: rank 0 did not stop cleanly:"; cat "$tmp/two.log"; exit 1; } >&2
echo "serve: every rank exited after SIGTERM"
