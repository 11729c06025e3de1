"""Makes crates/brigade/tests/fixtures/corpora/: token corpora written by the tools users make
them with, and conversations rendered by transformers, for tests/corpus_fixtures.rs.

- megatron_u16.{bin,idx}, megatron_i32.{bin,idx}: Megatron-LM indexed datasets written by
  megatron-core's own IndexedDatasetBuilder (uint16 and int32 tokens; one document of two
  sequences, so documents and sequences differ).
- megatron_plain_u16.{bin,idx}, megatron_plain_i32.{bin,idx}: the same builder, one sequence a
  document (what brigade tokenize's shards are: brigade's writer must give these bytes).
- llmc_gpt2.bin, llmc_llama3.bin: llm.c token files in its two header formats (magic 20240520
  version 1, u16 tokens; magic 20240801 version 7, u32 tokens), written with numpy as llm.c's
  dev/data/data_common.py `write_datafile` lays them out (llm.c is not a package to import);
  each document begins with the delimiter llm.c puts there (<|endoftext|> 50256; Llama 3's
  <|begin_of_text|> 128000).
- nanogpt.bin: nanoGPT's prepare.py output (u16 GPT-2 tokens, no header, <|endoftext|> after
  each document).
- chat_qwen2.json, chat_llama3.json: conversations rendered with transformers'
  apply_chat_template and the real tokenizers in ../shared/tokenizers, with the mask of the
  assistant's tokens: a token is trained on when its text starts inside what the template adds
  between the conversation before an assistant message (with the generation prompt) and the
  conversation through it.
- expected.json: every corpus's documents, as lists of token ids.

Run from the repository root with the peers' venv (megatron-core installed into it):
    target/peers-venv/.venv/bin/pip install --no-deps megatron-core==0.16.1
    target/peers-venv/.venv/bin/python scripts/make_corpus_fixtures.py
"""
import json
import os

import numpy as np
import torch
from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
from transformers import AutoTokenizer

OUT = "crates/brigade/tests/fixtures/corpora"
os.makedirs(OUT, exist_ok=True)
rng = np.random.default_rng(7)
expected = {}


def docs(n, vocab, lo=5, hi=60):
    return [rng.integers(0, vocab, size=int(rng.integers(lo, hi))).tolist() for _ in range(n)]


# Megatron: documents of one sequence, and one document of two sequences
for name, dtype, vocab in [("megatron_u16", np.uint16, 50000), ("megatron_i32", np.int32, 150000)]:
    b = IndexedDatasetBuilder(f"{OUT}/{name}.bin", dtype=dtype)
    ds = docs(30, vocab)
    for i, d in enumerate(ds):
        if i == 4:  # two sequences, one document
            b.add_item(torch.tensor(d[: len(d) // 2]))
            b.add_item(torch.tensor(d[len(d) // 2 :]))
        else:
            b.add_item(torch.tensor(d))
        b.end_document()
    b.finalize(f"{OUT}/{name}.idx")
    expected[name] = ds


def llmc(path, toks, magic, version, dtype):
    header = np.zeros(256, dtype=np.int32)
    header[0], header[1], header[2] = magic, version, len(toks)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.array(toks, dtype=dtype).tobytes())


for name, magic, version, dtype, delim, vocab in [
    ("llmc_gpt2", 20240520, 1, np.uint16, 50256, 50256),
    ("llmc_llama3", 20240801, 7, np.uint32, 128000, 128000),
]:
    ds = [[delim] + d for d in docs(25, vocab)]
    llmc(f"{OUT}/{name}.bin", [t for d in ds for t in d], magic, version, dtype)
    expected[name] = ds

# nanoGPT: the tokens of each document then <|endoftext|>, u16, no header; read as documents
# that begin at each <|endoftext|> but the first
ds = docs(20, 50256)
flat = [t for d in ds for t in d + [50256]]
np.array(flat, dtype=np.uint16).tofile(f"{OUT}/nanogpt.bin")
cuts = [0] + [i for i, t in enumerate(flat) if t == 50256 and i > 0] + [len(flat)]
expected["nanogpt"] = [flat[a:b] for a, b in zip(cuts, cuts[1:]) if b > a]

conversations = [
    [{"role": "user", "content": "What is the capital of France?"},
     {"role": "assistant", "content": "The capital of France is Paris."}],
    [{"role": "system", "content": "You answer in one word."},
     {"role": "user", "content": "Colour of the sky?"},
     {"role": "assistant", "content": "Blue."},
     {"role": "user", "content": "And grass?"},
     {"role": "assistant", "content": "Green — usually. Ünïcödé ✓"}],
]
for name in ["qwen2", "llama3"]:
    tok = AutoTokenizer.from_pretrained(f"../shared/tokenizers/{name}")
    rows = []
    for conv in conversations:
        full = tok.apply_chat_template(conv, tokenize=False)
        spans = []
        for i, m in enumerate(conv):
            if m["role"] != "assistant":
                continue
            prompt = tok.apply_chat_template(conv[:i], tokenize=False, add_generation_prompt=True)
            upto = tok.apply_chat_template(conv[: i + 1], tokenize=False)
            assert upto.startswith(prompt) and full.startswith(upto)
            # byte offsets, as brigade's tokenizer reports them
            spans.append((len(prompt.encode()), len(upto.encode())))
        enc = tok(full, add_special_tokens=False, return_offsets_mapping=True)
        # transformers' offsets are in characters: turn them into bytes
        byte_at = [len(full[:i].encode()) for i in range(len(full) + 1)]
        mask = [any(a <= byte_at[s] < b for a, b in spans) for s, _ in enc["offset_mapping"]]
        rows.append({"messages": conv, "text": full, "ids": enc["input_ids"], "trained": mask})
    json.dump(rows, open(f"{OUT}/chat_{name}.json", "w"), ensure_ascii=False, indent=1)

# Megatron, one sequence a document (as preprocess_data.py writes a corpus, and as brigade
# tokenize writes its shards): brigade's writer must give these bytes
for name, dtype, vocab in [("megatron_plain_u16", np.uint16, 50000), ("megatron_plain_i32", np.int32, 150000)]:
    b = IndexedDatasetBuilder(f"{OUT}/{name}.bin", dtype=dtype)
    ds = docs(12, vocab, lo=1)
    for d in ds:
        b.add_item(torch.tensor(d))
        b.end_document()
    b.finalize(f"{OUT}/{name}.idx")
    expected[name] = ds

json.dump(expected, open(f"{OUT}/expected.json", "w"))
print("wrote", sorted(os.listdir(OUT)))
