"""Checks that a brigade checkpoint loads in Hugging Face `transformers` and computes the same
thing: trains a small model with brigade on a text file, then compares brigade's greedy
continuation of a prompt with GPT2LMHeadModel.from_pretrained(checkpoint).generate().

Run from the repository root with the peers' environment:
    ../shared/peers/.venv/bin/python scripts/check_hf_loads_brigade.py
"""
import subprocess
import tempfile
from pathlib import Path

import torch
from transformers import GPT2LMHeadModel

tmp = Path(tempfile.mkdtemp())
text = "".join(f"{i} bottles of beer on the wall, {i} bottles of beer.\n" for i in range(99, 0, -1))
(tmp / "t.txt").write_text(text)
brigade = ["cargo", "run", "--release", "-q", "--"]
subprocess.run(brigade + ["train", "--data", str(tmp / "t.txt"), "--seq", "48", "--steps", "150", "--batch", "16",
                          "--eval-every", "0", "--out", str(tmp / "ck")], check=True)
prompt, n = "42 bottles of", 40
ours = subprocess.run(brigade + ["sample", "--checkpoint", str(tmp / "ck"), "--prompt", prompt,
                                 "--max-tokens", str(n)], check=True, capture_output=True, text=True).stdout
# `sample` ends its output with one newline of its own; the model's own newlines are kept
assert ours.endswith("\n"), repr(ours)
ours = ours[:-1]
model = GPT2LMHeadModel.from_pretrained(tmp / "ck").eval()
ids = torch.tensor([list(prompt.encode())])
with torch.no_grad():
    out = model.generate(ids, max_new_tokens=n, do_sample=False, pad_token_id=0)
theirs = bytes(out[0].tolist()).decode("utf-8", errors="replace")
print("brigade     :", repr(ours))
print("transformers:", repr(theirs))
assert ours == theirs, "greedy continuations differ"
print("OK: Hugging Face loads the brigade checkpoint and continues the prompt identically")
