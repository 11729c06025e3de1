#!/usr/bin/env bash
# The agent example against the real SmolLM2-135M-Instruct served by brigade: examples/agent.py
# with the official openai client (tools offered, calls made and run concurrently by the client,
# results returned, a final answer). Its template takes no tools: brigade's generic fallback.
# Usage: scripts/check_agent.sh BRIGADE HF_FOLDER PYTHON (a Python with the openai package)
set -euo pipefail
bin=$1 folder=$2 py=$3
log=$(mktemp)
"$bin" serve --checkpoint "$folder" --port 0 --threads 2 >"$log" 2>&1 &
pid=$!
trap 'kill -TERM "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; rm -f "$log"' EXIT
url=
for _ in $(seq 1 300); do
  url=$(grep -o 'http://[0-9.:]*' "$log" | head -1 || true)
  [ -n "$url" ] && curl -sf "$url/ready" >/dev/null && break
  sleep 0.2
done
[ -n "$url" ] || { echo "agent: the server did not start:"; cat "$log"; exit 1; } >&2
"$py" "$(dirname "$0")/../examples/agent.py" "$url"
