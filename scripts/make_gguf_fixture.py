#!/usr/bin/env python3
"""Makes crates/brigade/tests/fixtures/gguf_blocks.json: for each tensor type brigade reads, a
few blocks of a tensor as llama.cpp's own `llama-quantize --pure` wrote it from SmolLM2-135M-
Instruct's f32 GGUF (llama.cpp's converter), the values gguf-py's reference
(`gguf.quants.dequantize`) gives them, as f32 bit patterns, and the f32 values they were
quantized from. `tests/gguf_read.rs` holds brigade's dequantization to them bit for bit, and
its quantizers (Q8_0, Q4_0) to llama-quantize's bytes.

    PYTHONPATH=$L/gguf-py target/peers-venv/.venv/bin/python scripts/make_gguf_fixture.py \
        target/smollm2/smollm2.f32.gguf /tmp/llamacpp/build/bin/llama-quantize OUT.json

($L: the llama.cpp sources of ../shared/peers/llamacpp/setup.sh.)
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize
from gguf.constants import GGML_QUANT_SIZES

src, quantize, out = sys.argv[1:4]
TYPES = ["F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"]
BLOCKS = 6
fixture = {"source": os.path.basename(src), "made_by": "llama-quantize --pure, gguf-py dequantize", "types": {}}
source = GGUFReader(src)
with tempfile.TemporaryDirectory() as d:
    for name in TYPES:
        q = os.path.join(d, f"{name}.gguf")
        subprocess.run([quantize, "--pure", src, q, name], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        r = GGUFReader(q)
        t = next(t for t in r.tensors if t.tensor_type.name == name and len(t.shape) == 2)
        per, size = GGML_QUANT_SIZES[t.tensor_type]
        raw = np.asarray(t.data).reshape(-1).view(np.uint8)[: BLOCKS * size].copy()
        values = dequantize(raw, t.tensor_type).astype(np.float32).reshape(-1)
        assert values.size == BLOCKS * per
        s = next(x for x in source.tensors if x.name == t.name)
        src_values = np.asarray(s.data).reshape(-1).astype(np.float32)[: BLOCKS * per]
        fixture["types"][name] = {
            "id": int(t.tensor_type),
            "tensor": t.name,
            "bytes": raw.tobytes().hex(),
            "values_bits": values.view(np.uint32).tolist(),
            "source_bits": src_values.view(np.uint32).tolist(),
        }
        print(name, t.name, values[:4], flush=True)
        os.remove(q)
with open(out, "w") as f:
    json.dump(fixture, f)
