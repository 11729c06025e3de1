#!/usr/bin/env bash
# `brigade quantize` against llama.cpp's own `llama-quantize`: HF_DIR quantized by brigade, and
# HF_DIR converted by llama.cpp's convert_hf_to_gguf.py to f32 then quantized by llama-quantize,
# to TYPE (q8_0, q4_0); every tensor's bytes compared (gguf-py reads both files).
#
#   scripts/check_quantize_vs_llamacpp.sh BRIGADE HF_DIR PYTHON [TYPE]
#   (PYTHON: the peers' venv (torch, transformers, numpy); llama.cpp under $W, default
#    /tmp/llamacpp, from ../shared/peers/llamacpp/setup.sh)
set -euo pipefail
bin=$(realpath "$1") hf=$(realpath "$2") py=$3 ty=${4:-q4_0}
W=${W:-/tmp/llamacpp}; L="$W/llama_cpp_python-0.3.36/vendor/llama.cpp"
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
"$bin" quantize "$hf" "$work/brigade.gguf" --type "$ty" >/dev/null
PYTHONPATH="$L/gguf-py" HF_HUB_OFFLINE=1 "$py" "$L/convert_hf_to_gguf.py" "$hf" --outtype f32 --outfile "$work/f32.gguf" >/dev/null 2>&1
"$W/build/bin/llama-quantize" "$work/f32.gguf" "$work/llama.gguf" "${ty^^}" >/dev/null 2>&1
PYTHONPATH="$L/gguf-py" "$py" - "$work/brigade.gguf" "$work/llama.gguf" <<'PY'
import sys
import numpy as np
from gguf import GGUFReader
a, b = (GGUFReader(p) for p in sys.argv[1:3])
tb = {t.name: t for t in b.tensors}
bad = []
for t in a.tensors:
    u = tb.get(t.name)
    x = np.asarray(t.data).view(np.uint8).reshape(-1)
    y = None if u is None else np.asarray(u.data).view(np.uint8).reshape(-1)
    if u is None or t.tensor_type != u.tensor_type or x.shape != y.shape or (x != y).any():
        bad.append(t.name)
print(f"{len(a.tensors) - len(bad)} of {len(a.tensors)} tensors byte for byte llama-quantize's ({len(b.tensors)} in its file)")
if bad or len(a.tensors) != len(b.tensors):
    sys.exit(f"differ: {bad[:10]}")
PY
