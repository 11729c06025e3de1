#!/usr/bin/env bash
# GGUF files served as stored by brigade beside llama.cpp's llama-server on the same files:
# the published SmolLM2-135M-Instruct (Q4_1, Q8_0 head) and Q8_0, Q4_0, Q4_K_M made by
# llama-quantize from its f32 (written by `brigade quantize`); the same load from `brigade bench
# serve` (32-token prompts, 64 out, concurrency 1 and 32; and a 512-token prompt alone, its
# time to first token), 2 threads each, each run on an idle machine (../shared/peers/runq.py).
# Prints output tokens/s, the median TTFT of the 512-token prompt, and the ratios. llama-server runs
# Q4_0 with --no-repack (this llama.cpp crashes repacking Q4_0 on AVX-512).
#
#   scripts/bench_gguf_vs_llamacpp.sh MODEL.gguf [TYPES…]   (env: W=/tmp/llamacpp, PEERS)
set -euo pipefail
cd "$(dirname "$0")/.."
model=$(realpath "$1")
shift
types=("$@")
[ ${#types[@]} -gt 0 ] || types=(Q8_0 Q4_0 Q4_K_M)
W=${W:-/tmp/llamacpp}
PEERS=$(realpath "${PEERS:-../shared/peers}")
SERVER="$W/build/bin/llama-server" QUANTIZE="$W/build/bin/llama-quantize"
[ -x "$SERVER" ] && [ -x "$QUANTIZE" ] || { echo "llama.cpp not built: run W=$W bash $PEERS/llamacpp/setup.sh" >&2; exit 1; }
BRIGADE=$(realpath target/release/brigade)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export BRIGADE_CACHE="$work/cache"
"$BRIGADE" quantize "$model" "$work/ref.f32.gguf" --type f32 >/dev/null
files=("$model")
for t in "${types[@]}"; do
  "$QUANTIZE" "$work/ref.f32.gguf" "$work/$t.gguf" "$t" >/dev/null 2>&1
  files+=("$work/$t.gguf")
done
load=(--concurrency 1,32 --prompt-len 32 --output-len 64 --threads 2 --json)
# prompt processing: a 512-token prompt alone, its time to first token (median)
prefill=(--concurrency 1 --requests 5 --prompt-len 512 --output-len 1 --threads 2 --json)
ttft() { # jsonl
  python3 -c 'import json,sys
rows=[json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
print([r for r in rows if r.get("bench")=="serve"][-1]["rows"][0]["ttft_p50_ms"])' "$1"
}
rate() { # jsonl concurrency
  python3 -c 'import json,sys
rows=[json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
r=[r for r in rows if r.get("bench")=="serve"][-1]
print(next(x["output_tokens_per_s"] for x in r["rows"] if x["concurrency"]==int(sys.argv[2])))' "$1" "$2"
}
printf '%-34s %10s %10s %7s %10s %10s %7s %12s %12s %7s\n' file "brigade@1" "llama@1" ratio "brigade@32" "llama@32" ratio \
  "b TTFT512ms" "l TTFT512ms" "l/b"
for f in "${files[@]}"; do
  name=$(basename "$f" .gguf)
  python3 "$PEERS/runq.py" --log "$work/$name.b.jsonl" --retries 2 -- "$BRIGADE" bench serve --checkpoint "$f" \
    --weights stored "${load[@]}" >/dev/null
  python3 "$PEERS/runq.py" --log "$work/$name.bp.jsonl" --retries 2 -- "$BRIGADE" bench serve --checkpoint "$f" \
    --weights stored "${prefill[@]}" >/dev/null
  extra=()
  [ "$name" = Q4_0 ] && extra=(--no-repack)
  port=$((18000 + RANDOM % 1000))
  "$SERVER" -m "$f" -t 2 -tb 2 -c 17408 -np 32 --host 127.0.0.1 --port "$port" --no-webui "${extra[@]}" >"$work/server.log" 2>&1 &
  pid=$!
  for _ in $(seq 600); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.1; done
  # the load generator alone (runq would count the server's own work as foreign and retry)
  "$BRIGADE" bench serve --checkpoint "$f" --url "http://127.0.0.1:$port" "${load[@]}" >"$work/$name.l.jsonl"
  "$BRIGADE" bench serve --checkpoint "$f" --url "http://127.0.0.1:$port" "${prefill[@]}" >"$work/$name.lp.jsonl"
  kill "$pid"; wait "$pid" 2>/dev/null || true
  b1=$(rate "$work/$name.b.jsonl" 1) l1=$(rate "$work/$name.l.jsonl" 1)
  b32=$(rate "$work/$name.b.jsonl" 32) l32=$(rate "$work/$name.l.jsonl" 32)
  bp=$(ttft "$work/$name.bp.jsonl") lp=$(ttft "$work/$name.lp.jsonl")
  python3 -c 'import sys; n,b1,l1,b32,l32,bp,lp=sys.argv[1],*map(float,sys.argv[2:]); print("%-34s %10.1f %10.1f %7.2f %10.1f %10.1f %7.2f %12.0f %12.0f %7.2f" % (n,b1,l1,b1/l1,b32,l32,b32/l32,bp,lp,lp/bp))' \
    "$name" "$b1" "$l1" "$b32" "$l32" "$bp" "$lp"
done
