#!/usr/bin/env bash
# llama.cpp runs what `brigade export --gguf` writes: the GGUF of HF_DIR (f32, or TYPE) is
# loaded by llama-server and greedy-generates, for each prompt, the text brigade generates
# (`brigade sample`, greedy) from the checkpoint itself (f32) or from the same quantized file
# (brigade reads GGUF) — same tokens, so same text.
#
#   scripts/check_gguf_llamacpp.sh BRIGADE HF_DIR LLAMA_SERVER [TOKENS] [TYPE]
#   (LLAMA_SERVER: ../shared/peers/llamacpp/setup.sh builds it, ~6 min on 2 cores)
set -euo pipefail
bin=$(realpath "$1") hf=$(realpath "$2") server_bin=$(realpath "$3") n=${4:-24} ty=${5:-f32}
work=$(mktemp -d)
server=
trap '[ -n "$server" ] && kill "$server" 2>/dev/null; rm -rf "$work"' EXIT
"$bin" export "$hf" --gguf "$work/model.gguf" --type "$ty"
# f32: brigade from the checkpoint; a quantized type: from the very file llama.cpp runs
src="$hf"; [ "$ty" = f32 ] || src="$work/model.gguf"
port=$((20000 + RANDOM % 20000))
# this llama.cpp build (llama-cpp-python 0.3.36's) crashes repacking Q4_0 weights on an
# AVX-512 CPU — llama-quantize's own Q4_0 file as well — so they are run as stored
extra=(); [ "$ty" = q4_0 ] && extra=(--no-repack)
"$server_bin" -m "$work/model.gguf" -t 2 -c 512 --host 127.0.0.1 --port "$port" --no-webui "${extra[@]}" > "$work/server.log" 2>&1 &
server=$!
for _ in $(seq 240); do
  curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
  sleep 0.5
done
curl -sf "http://127.0.0.1:$port/health" >/dev/null || { tail -20 "$work/server.log"; echo "llama-server did not start" >&2; exit 1; }
fail=0
for prompt in "The quick brown fox" "Once upon a time, in a small village," "def fibonacci(n):"; do
  ours=$("$bin" sample --checkpoint "$src" --prompt "$prompt" --max-tokens "$n" --threads 2)
  theirs=$(curl -sf "http://127.0.0.1:$port/completion" -H 'Content-Type: application/json' \
    -d "$(python3 -c 'import json,sys; print(json.dumps({"prompt": sys.argv[1], "n_predict": int(sys.argv[2]), "temperature": 0, "top_k": 1, "cache_prompt": False}))' "$prompt" "$n")" |
    python3 -c 'import json,sys; print(sys.argv[1] + json.load(sys.stdin)["content"])' "$prompt")
  if [ "$ours" == "$theirs" ]; then
    echo "same: $(printf %q "$ours")"
  else
    echo "DIFFERENT for $(printf %q "$prompt"):"; echo "  brigade:   $(printf %q "$ours")"; echo "  llama.cpp: $(printf %q "$theirs")"
    fail=1
  fi
done
[ "$fail" = 0 ] || { echo "check_gguf_llamacpp: llama.cpp generates other text from the exported GGUF" >&2; exit 1; }
echo "check_gguf_llamacpp ($ty): llama-server greedy-generates from the GGUF what brigade does"
