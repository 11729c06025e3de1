"""Writes a large llm.c token file (GPT-2 layout: magic 20240520, version 1, u16 tokens) of random
tokens below 49152 in documents of 200 to 2,000 tokens, each beginning with <|endoftext|>
(50256), for `brigade bench train --data` (the loader's time per step and resident memory on a
corpus far larger than memory would hold as a Vec).

    PYTHON scripts/make_token_corpus.py OUT.bin [TOKENS]   (default 1e9 tokens: 2 GB; PYTHON with numpy)
"""
import sys

import numpy as np

out, n = sys.argv[1], int(float(sys.argv[2])) if len(sys.argv) > 2 else 10**9
rng = np.random.default_rng(0)
header = np.zeros(256, dtype=np.int32)
header[0], header[1], header[2] = 20240520, 1, n
with open(out, "wb") as f:
    f.write(header.tobytes())
    left = n
    while left:
        k = min(left, 1 << 24)
        toks = rng.integers(0, 49152, size=k, dtype=np.uint16)
        starts = np.cumsum(rng.integers(200, 2000, size=k // 200 + 1))
        toks[starts[starts < k]] = 50256
        if left == n:
            toks[0] = 50256
        f.write(toks.tobytes())
        left -= k
print(f"{out}: {n} tokens")
