#!/usr/bin/env bash
# all-MiniLM-L6-v2 embedding: brigade (`bench embed`: 1 and 2 workers × 1 thread, 1 worker × 2
# threads, the real job with its files) vs sentence-transformers encode() on 2 threads
# (../shared/peers/bench_minilm.py, batch 32 and 128), both on 10,000 generated documents of
# 20–40 words, alternated ROUNDS times on an idle machine (runq.py waits for one).
# Prints each run and the ratio of medians.
# Usage: scripts/bench_embed_vs_st.sh   (env: ROUNDS=2, DOCS=10000, PEERS=../shared/peers)
# BRIGADE_SIMD=avx2 measures a machine without AVX-512 on any machine: brigade keeps to its AVX2
# paths and PyTorch to its own (ATEN_CPU_CAPABILITY, oneDNN's and MKL's instruction limits), so
# neither side uses AVX-512.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-2}
DOCS=${DOCS:-10000}
PEERS=$(realpath "${PEERS:-../shared/peers}")
MODEL=$(realpath ../shared/models/all-MiniLM-L6-v2)
LOG=$(mktemp -d)/embed.jsonl
peer_env=()
if [ "${BRIGADE_SIMD:-}" = avx2 ]; then
  peer_env=(ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2)
fi
cargo build --release -q
BRIGADE=$(realpath target/release/brigade)
for _ in $(seq "$ROUNDS"); do
  python3 "$PEERS/runq.py" --log "$LOG" --retries 2 -- "$BRIGADE" bench embed --model "$MODEL" --docs "$DOCS" --json
  (cd "$PEERS" && env "${peer_env[@]}" HF_HUB_OFFLINE=1 python3 runq.py --log "$LOG" --retries 2 -- \
    .venv/bin/python bench_minilm.py bench --n "$DOCS" --batch 32 128 --threads 2)
done
python3 - "$LOG" <<'PY'
import json, os, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
ours = [r for r in rows if r.get("bench") == "embed"]
peer = [r for r in rows if r.get("bench") == "sentence_transformers_encode"]
def row(r, w, t):
    return next(x for x in r["rows"] if x["workers"] == w and x["threads"] == t)
med = statistics.median
one = med(row(r, 1, 1)["documents_per_s"] for r in ours)
two = med(row(r, 2, 1)["documents_per_s"] for r in ours)
thr = med(row(r, 1, 2)["documents_per_s"] for r in ours)
st = max(med(p["sentences_per_s"] for p in peer if p["batch_size"] == b) for b in {p["batch_size"] for p in peer})
frac = med(row(r, 2, 1)["matmul_fraction"] for r in ours)
print(json.dumps({"summary": "all-MiniLM-L6-v2 embedding, 2 cores", "documents": ours[0]["documents"],
    "simd": ours[0].get("simd"), "peer_limited_to_avx2": os.environ.get("BRIGADE_SIMD") == "avx2",
    "brigade_1x1_docs_per_s": round(one, 1), "brigade_2x1_docs_per_s": round(two, 1),
    "brigade_1x2_docs_per_s": round(thr, 1), "two_workers_over_one": round(two / one, 3),
    "sentence_transformers_docs_per_s": round(st, 1), "brigade_best_over_st": round(max(two, thr) / st, 3),
    "brigade_2x1_matmul_fraction": round(frac, 3),
    # the ceiling: 2 workers running at the product rate the same run measured
    "at_the_matmul_rate_over_st": round(two / frac / st, 3),
    "brigade_2x1_gflops": round(med(row(r, 2, 1)["gflops"] for r in ours), 1),
    "matmul_gflops_2_threads": round(med(r["matmul_gflops_2_threads"] for r in ours), 1),
    # the hard ceiling: every FLOP of the job at the cores' fused multiply-add peak
    "fma_peak_gflops_2_cores": round(med(r["fma_peak_gflops_two_1_thread"] for r in ours), 1),
    "brigade_2x1_fma_peak_fraction": round(med(row(r, 2, 1)["gflops"] / r["fma_peak_gflops_two_1_thread"] for r in ours), 3),
    "at_the_fma_peak_over_st": round(med(r["fma_peak_gflops_two_1_thread"] / r["gflop_per_document"] for r in ours) / st, 3)}))
PY
