#!/usr/bin/env bash
# BFCL v4 (simple, multiple, parallel, parallel_multiple, irrelevance) on SmolLM2-135M-Instruct:
# brigade serving the Hugging Face folder, and llama-server --jinja serving the same weights as an
# f32 GGUF (llama.cpp's own converter), side by side, scored by BFCL's AST checker
# (scripts/bench_bfcl.py). Greedy, max 256 tokens, 8 requests at once.
#   bash scripts/bench_bfcl.sh HF_DIR [LIMIT]     # LIMIT questions a category (default 50; 0: all)
# Needs: target/release/brigade; llama.cpp from ../shared/peers/llamacpp/setup.sh (W=/tmp/llamacpp)
# and HF_DIR's f32 GGUF from its convert.sh (HF_DIR/../smollm2.f32.gguf, or GGUF=…).
set -euo pipefail
hf="${1:?usage: bench_bfcl.sh HF_DIR [LIMIT]}"; limit="${2:-50}"
W="${W:-/tmp/llamacpp}"; gguf="${GGUF:-$(dirname "$hf")/smollm2.f32.gguf}"
[ -f "$gguf" ] || { echo "no $gguf: make it with ../shared/peers/llamacpp/convert.sh $hf $(dirname "$hf")/smollm2" >&2; exit 1; }
venv=target/bfcl-venv
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import bfcl_eval, openai, jsonschema" 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q openai jsonschema
  # only BFCL's data and checker are used: its many vendor SDKs are not installed
  "$venv/bin/pip" install -q --no-deps bfcl-eval
fi
target/release/brigade serve --checkpoint "$hf" --port 8311 --max-running 8 > target/bfcl-brigade.log 2>&1 &
b=$!
"$W/build/bin/llama-server" -m "$gguf" --jinja -t 2 -c 32768 -np 8 --host 127.0.0.1 --port 8312 --no-webui > target/bfcl-llamacpp.log 2>&1 &
l=$!
trap 'kill $b $l 2>/dev/null || true' EXIT
# each ready once its model is loaded (brigade: /ready; llama-server: /health)
for url in http://127.0.0.1:8311/ready http://127.0.0.1:8312/health; do
  for _ in $(seq 300); do curl -sf "$url" >/dev/null && break; sleep 1; done
  curl -sf "$url" >/dev/null || { echo "$url never became ready" >&2; exit 1; }
done
"$venv/bin/python" scripts/bench_bfcl.py --limit "$limit" --out target/bfcl.json \
  --target brigade http://127.0.0.1:8311 auto \
  --target llama.cpp http://127.0.0.1:8312 auto \
  --target brigade http://127.0.0.1:8311 auto:single \
  --target brigade http://127.0.0.1:8311 required \
  --target llama.cpp http://127.0.0.1:8312 required
