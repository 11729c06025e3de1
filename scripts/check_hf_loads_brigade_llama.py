"""Checks that a brigade checkpoint of the Llama family loads in Hugging Face `transformers` as
the same model, with its tokenizer: trains llama-tiny with brigade on a text file and the real
Llama 3 tokenizer folder, then
- loads the directory alone with AutoModelForCausalLM and AutoTokenizer (so config.json, the
  weight names, tokenizer.json and tokenizer_config.json are all transformers' own),
- compares the logits of a prompt with brigade's (`brigade sample --logits-out`),
- compares brigade's greedy continuation with transformers' generate().

Run from the repository root with the peers' environment:
    ../shared/peers/.venv/bin/python scripts/check_hf_loads_brigade_llama.py [BRIGADE_BINARY]
"""
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

brigade = [sys.argv[1]] if len(sys.argv) > 1 else ["cargo", "run", "--release", "-q", "--"]
tmp = Path(tempfile.mkdtemp())
text = "".join(f"{i} bottles of beer on the wall, {i} bottles of beer.\n" for i in range(99, 0, -1))
(tmp / "t.txt").write_text(text)
tok_dir = Path(__file__).resolve().parent.parent.parent / "shared" / "tokenizers" / "llama3"
subprocess.run(brigade + ["train", "--data", str(tmp / "t.txt"), "--tokenizer", str(tok_dir), "--model",
                          "llama-tiny", "--seq", "48", "--steps", "40", "--batch", "8", "--eval-every", "0",
                          "--out", str(tmp / "ck")], check=True)
prompt, n = "42 bottles of", 30
ours = subprocess.run(brigade + ["sample", "--checkpoint", str(tmp / "ck"), "--prompt", prompt, "--max-tokens",
                                 str(n), "--ignore-eos", "--logits-out", str(tmp / "logits.npy")],
                      check=True, capture_output=True, text=True).stdout
# `sample` ends its output with one newline of its own; the model's own newlines are kept
# (--ignore-eos: generate() below is told of no end-of-sequence id either)
assert ours.endswith("\n"), repr(ours)
ours = ours[:-1]
model = AutoModelForCausalLM.from_pretrained(tmp / "ck").eval()
assert isinstance(model, LlamaForCausalLM), type(model)
tok = AutoTokenizer.from_pretrained(tmp / "ck")
ids = tok(prompt, return_tensors="pt").input_ids
assert ids[0, 0].item() == tok.bos_token_id, "the tokenizer folder's BOS is added"
with torch.no_grad():
    logits = model(input_ids=ids).logits[0].numpy()
    out = model.generate(ids, max_new_tokens=n, do_sample=False, pad_token_id=0, eos_token_id=None)
mine = np.load(tmp / "logits.npy")
assert mine.shape == logits.shape, (mine.shape, logits.shape)
err = np.abs(mine - logits).max() / np.abs(logits).max()
print(f"logits of the prompt ({ids.shape[1]} tokens): relative difference {err:.2e}")
assert err < 1e-4, "logits differ"
theirs = tok.decode(out[0], skip_special_tokens=True)
print("brigade     :", repr(ours))
print("transformers:", repr(theirs))
assert ours == theirs, "greedy continuations differ"
print("OK: transformers loads the brigade Llama checkpoint and its tokenizer, same logits and continuation")
