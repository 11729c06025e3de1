"""Writes a large Megatron-LM indexed dataset (PREFIX.bin of uint16 tokens + PREFIX.idx, the
layout megatron-core's IndexedDatasetBuilder writes; the reader is checked against that writer
in tests/corpus_fixtures.rs) of random tokens below 49152 (SmolLM2's vocabulary) in documents of
200 to 2,000 tokens, for `brigade bench train --data` (the loader's time per step and resident
memory on a corpus far larger than a process would hold as a Vec).

    PYTHON scripts/make_token_corpus.py PREFIX [TOKENS]   (default 1e9 tokens: 2 GB; PYTHON with numpy)
"""
import sys

import numpy as np

prefix, n = sys.argv[1], int(float(sys.argv[2])) if len(sys.argv) > 2 else 10**9
rng = np.random.default_rng(0)
lengths = []
total = 0
while total < n:
    l = int(min(rng.integers(200, 2001), n - total))
    lengths.append(l)
    total += l
lengths = np.array(lengths, dtype=np.int32)
with open(prefix + ".bin", "wb") as f:
    left = n
    while left:
        k = min(left, 1 << 24)
        f.write(rng.integers(0, 49152, size=k, dtype=np.uint16).tobytes())
        left -= k
pointers = np.zeros(len(lengths), dtype=np.int64)
pointers[1:] = np.cumsum(lengths[:-1].astype(np.int64) * 2)
with open(prefix + ".idx", "wb") as f:
    f.write(b"MMIDIDX\x00\x00")
    f.write(np.array([1], dtype=np.uint64).tobytes())  # version
    f.write(np.array([8], dtype=np.uint8).tobytes())  # uint16 tokens
    f.write(np.array([len(lengths), len(lengths) + 1], dtype=np.uint64).tobytes())
    f.write(lengths.tobytes())
    f.write(pointers.tobytes())
    f.write(np.arange(len(lengths) + 1, dtype=np.int64).tobytes())
print(f"{prefix}.bin/.idx: {n} tokens in {len(lengths)} documents")
