#!/usr/bin/env bash
# brigade serve against llama.cpp's llama-server, side by side on the same random-weight models
# of published shapes with real tokenizers (qwen2.5-0.5b with the Qwen2 tokenizer, gpt2-small):
# f32 against f32 GGUF, and brigade --weights int8 (and int8-channel) against q8_0; the same load
# from `brigade bench serve` (32-token prompts, 64 tokens out, ignore_eos, streamed, concurrency 1
# and 32), 2 threads each (`--threads 2` / `-t 2 -tb 2`), alternated ROUNDS times, each run on an
# idle machine (../shared/peers/runq.py). Prints every run and the ratios of medians.
#
# Needs llama.cpp built by ../shared/peers/llamacpp/setup.sh (W=/tmp/llamacpp) and the peers'
# venv (make_hf_model.py and the GGUF converter). Models are made once under $MODELS.
# Mixtures of experts: MODELS_LIST="olmoe-4l" (OLMoE-1B-7B's layers, 4 of them) or "qwen3-moe-2l"
# (scripts/make_moe_serve_model.py); the weight-read limit counts the experts a token uses.
# Usage: scripts/bench_serve_vs_llamacpp.sh  (env: ROUNDS=2, MODELS_LIST="qwen2.5-0.5b gpt2-small",
#        WEIGHTS="f32 int8 int8-channel" (brigade's formats run), LLAMA_WEIGHTS="f32 q8_0" (llama-server's),
#        MODELS=/tmp/brigade-llamacpp-models, PY=the peers venv's python, W=/tmp/llamacpp, PEERS=../shared/peers,
#        SERVER=$W/build/bin/llama-server)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-2}
MODELS_LIST=${MODELS_LIST:-"qwen2.5-0.5b gpt2-small"}
MODELS=${MODELS:-/tmp/brigade-llamacpp-models}
WEIGHTS=${WEIGHTS:-"f32 int8 int8-channel"}
LLAMA_WEIGHTS=${LLAMA_WEIGHTS:-"f32 q8_0"}
W=${W:-/tmp/llamacpp}
PEERS=$(realpath "${PEERS:-../shared/peers}")
PY=${PY:-$PEERS/.venv/bin/python}
# SERVER: another llama-server (scripts/build_llamacpp_noamx.sh's, where llama.cpp's AMX q8_0
# kernels fault)
SERVER=${SERVER:-$W/build/bin/llama-server}
[ -x "$SERVER" ] || { echo "llama-server not built at $SERVER: run W=$W bash $PEERS/llamacpp/setup.sh (or scripts/build_llamacpp_noamx.sh for SERVER=$W/build-noamx/bin/llama-server)" >&2; exit 1; }
cargo build --release -q
BRIGADE=$(realpath target/release/brigade)
LOG=$(mktemp -d)
mkdir -p "$MODELS"
for m in $MODELS_LIST; do
  d="$MODELS/$m"
  if [ ! -f "$d/config.json" ]; then
    case "$m" in
      olmoe-*|qwen3-moe-*) "$PY" scripts/make_moe_serve_model.py "$m" "$d" ;;
      *) "$PY" "$PEERS/llamacpp/make_hf_model.py" "$m" "$d" ;;
    esac
  fi
  [ -f "$d.q8_0.gguf" ] || W="$W" PY="$PY" bash "$PEERS/llamacpp/convert.sh" "$d" >/dev/null
done
load=(--concurrency 1,32 --prompt-len 32 --output-len 64 --threads 2 --json)
llama() { # model gguf log
  local port=$((18000 + RANDOM % 1000))
  "$SERVER" -m "$2" -t 2 -tb 2 -c 8192 -np 32 --host 127.0.0.1 --port "$port" --no-webui >"$LOG/llama-server.log" 2>&1 &
  local pid=$!
  for _ in $(seq 600); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.1; done
  # no retries: runq.py counts llama-server's own work as foreign CPU (~97%), and retried each
  # run three times for it
  python3 "$PEERS/runq.py" --log "$3" -- "$BRIGADE" bench serve --checkpoint "$MODELS/$1" \
    --url "http://127.0.0.1:$port" "${load[@]}"
  kill "$pid"; wait "$pid" 2>/dev/null || true
}
for _ in $(seq "$ROUNDS"); do
  for m in $MODELS_LIST; do
    for w in $WEIGHTS; do
      python3 "$PEERS/runq.py" --log "$LOG/$m.brigade.$w.jsonl" --retries 2 -- "$BRIGADE" bench serve \
        --checkpoint "$MODELS/$m" --weights "$w" "${load[@]}"
    done
    for w in $LLAMA_WEIGHTS; do
      llama "$m" "$MODELS/$m.$w.gguf" "$LOG/$m.llama.$w.jsonl"
    done
  done
done
python3 - "$LOG" $MODELS_LIST <<'PY'
import glob, json, os, statistics, sys
log, models = sys.argv[1], sys.argv[2:]
med = statistics.median
def runs(m, who, fmt):
    rows = []
    for l in open(os.path.join(log, f"{m}.{who}.{fmt}.jsonl")):
        if l.startswith("{") and '"bench": "serve"' in l or l.startswith('{"bench"'):
            rows.append(json.loads(l))
    return [r for r in rows if r.get("bench") == "serve"]
def at(rs, c, key):
    return med(next(x for x in r["rows"] if x["concurrency"] == c)[key] for r in rs)
for m in models:
    out = {"summary": f"{m} shape, random weights, prompt 32, 64 out, ignore_eos, 2 threads, output tokens/s"}
    for who, fmt in [("brigade", "f32"), ("brigade", "int8"), ("brigade", "int8-channel"), ("llama", "f32"), ("llama", "q8_0")]:
        if not os.path.exists(os.path.join(log, f"{m}.{who}.{fmt}.jsonl")):
            continue
        rs = runs(m, who, fmt)
        if who == "brigade":
            out[f"brigade_{fmt}_1_weight_read_fraction"] = round(at(rs, 1, "weight_read_limit_fraction"), 3)
        for c in (1, 32):
            out[f"{who}_{fmt}_{c}"] = round(at(rs, c, "output_tokens_per_s"), 1)
        out[f"{who}_{fmt}_itl_p99_over_p50_32"] = round(at(rs, 32, "itl_p99_ms") / at(rs, 32, "itl_p50_ms"), 2)
        if who == "brigade" and fmt == "f32":
            out["brigade_f32_32_matmul_fraction"] = round(at(rs, 32, "matmul_limit_fraction"), 3)
    for ours, theirs in [("f32", "f32"), ("int8", "q8_0"), ("int8-channel", "q8_0")]:
        if f"brigade_{ours}_1" not in out or f"llama_{theirs}_1" not in out:
            continue
        for c in (1, 32):
            out[f"ratio_{ours}_vs_{theirs}_{c}"] = round(out[f"brigade_{ours}_{c}"] / out[f"llama_{theirs}_{c}"], 2)
    print(json.dumps(out))
PY
