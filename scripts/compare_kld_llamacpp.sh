#!/usr/bin/env bash
# KL divergence of quantized GGUF files from their f32 reference, measured by brigade
# (`brigade eval kld`, the files served as stored) and by llama.cpp (`llama-perplexity
# --kl-divergence`) on the same files and text, with llama.cpp's method: chunks of 512 tokens,
# the second half of each scored. Prints one row per type and the ratio brigade / llama.cpp.
#
#   scripts/compare_kld_llamacpp.sh BRIGADE LLAMA_BIN_DIR MODEL.gguf TEXT [CHUNKS] [TYPES…]
#
# MODEL.gguf: the published file (SmolLM2-135M-Instruct.Q4_1.gguf); its dequantized weights,
# written as f32 by `brigade quantize`, are the reference, and `llama-quantize` makes each type
# from that reference (TYPES default: Q8_0 Q6_K Q5_K_M Q4_K_M Q4_0). The published file itself
# is measured too, and with $BRIGADE_TYPES (e.g. "q4_k q4_0") the files `brigade quantize`
# writes from the same reference. LLAMA_BIN_DIR holds llama-quantize and llama-perplexity
# (../shared/peers/llamacpp/setup.sh's build, with `--target llama-perplexity`).
set -euo pipefail
bin=$(realpath "$1") lbin=$(realpath "$2") model=$(realpath "$3") text=$(realpath "$4") chunks=${5:-8}
shift $(( $# < 5 ? $# : 5 ))
types=("$@")
[ ${#types[@]} -gt 0 ] || types=(Q8_0 Q6_K Q5_K_M Q4_K_M Q4_0)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export BRIGADE_CACHE="$work/cache"
ref="$work/ref.f32.gguf"
"$bin" quantize "$model" "$ref" --type f32 >/dev/null
"$lbin/llama-perplexity" -m "$ref" -f "$text" -c 512 -b 512 --chunks "$chunks" -t 2 \
  --kl-divergence-base "$work/base.kld" >"$work/base.log" 2>&1 || { tail -20 "$work/base.log"; exit 1; }
files=("$(basename "$model" .gguf)=$model")
for t in "${types[@]}"; do
  "$lbin/llama-quantize" "$ref" "$work/$t.gguf" "$t" >/dev/null 2>&1
  files+=("$t=$work/$t.gguf")
done
# files `brigade quantize` writes from the same reference ($BRIGADE_TYPES, e.g. "q4_k q4_0")
for t in ${BRIGADE_TYPES:-}; do
  "$bin" quantize "$ref" "$work/brigade-$t.gguf" --type "$t" >/dev/null
  files+=("brigade quantize $t=$work/brigade-$t.gguf")
done
printf '%-34s %12s %12s %8s %10s %10s\n' file "brigade KLD" "llama KLD" ratio "b top-1" "l top-1"
for f in "${files[@]}"; do
  name=${f%%=*} path=${f#*=}
  out=$("$lbin/llama-perplexity" -m "$path" -f "$text" -c 512 -b 512 --chunks "$chunks" -t 2 \
    --kl-divergence-base "$work/base.kld" --kl-divergence 2>&1) || { echo "$out" | tail -20; exit 1; }
  l_kld=$(echo "$out" | awk '/^Mean +KLD:/ {print $3; exit}')
  l_top=$(echo "$out" | awk '/^Same top p:/ {print $4; exit}')
  j=$("$bin" eval kld --reference "$ref" --model "$path" --text "$text" --ctx 512 --chunks "$chunks" --json)
  b_kld=$(python3 -c 'import json,sys; print("%.6f" % json.loads(sys.argv[1])["mean_kld"])' "$j")
  b_top=$(python3 -c 'import json,sys; print("%.3f" % (100 * json.loads(sys.argv[1])["top1_agreement"]))' "$j")
  ratio=$(python3 -c "import sys; b, l = float(sys.argv[1]), float(sys.argv[2]); print('%.3f' % (b / l) if l > 0 else '-')" "$b_kld" "$l_kld")
  printf '%-34s %12s %12s %8s %9s%% %9s%%\n' "$name" "$b_kld" "$l_kld" "$ratio" "$b_top" "$l_top"
done
