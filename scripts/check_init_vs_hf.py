"""brigade train --init on a real published model (SmolLM2-135M-Instruct) against transformers:
the first step's loss on each layout equals the loss transformers computes for the same batch,
the same chat template and the same assistant-only mask (relative 1e-4).

The batch is made deterministic by the data: every conversation of the .jsonl is the same one,
so each packed sequence is that conversation repeated and cut at seq + 1 tokens, whichever
conversations the run draws. transformers renders it with the model's own template, masks
the assistant's tokens (the text the template adds for the assistant message: between the
conversation with the generation prompt and the conversation through the message), and
computes the mean cross-entropy over them.

  PYTHON scripts/check_init_vs_hf.py BRIGADE HF_DIR [LAYOUT ...]
  (PYTHON: the peers' venv, with torch and transformers; default layouts dp=1 dp=2 tp=3 pp=2,mb=1)
"""
import json
import os
import subprocess
import sys
import tempfile

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

brigade, hf = sys.argv[1], sys.argv[2]
layouts = sys.argv[3:] or ["dp=1", "dp=2", "tp=3", "pp=2,mb=1"]
SEQ, BATCH = 96, 2
conv = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Who wrote Hamlet?"},
    {"role": "assistant", "content": "William Shakespeare wrote Hamlet, around 1600."},
]

tok = AutoTokenizer.from_pretrained(hf)
full = tok.apply_chat_template(conv, tokenize=False)
prompt = tok.apply_chat_template(conv[:2], tokenize=False, add_generation_prompt=True)
assert full.startswith(prompt)
enc = tok(full, add_special_tokens=False, return_offsets_mapping=True)
ids = enc["input_ids"]
trained = [len(prompt) <= s < len(full) for s, _ in enc["offset_mapping"]]
reps = (SEQ + 1) // len(ids) + 1
seq_ids, seq_mask = (ids * reps)[: SEQ + 1], (trained * reps)[: SEQ + 1]
x = torch.tensor([seq_ids[:-1]] * BATCH)
labels = torch.tensor([[t if m else -100 for t, m in zip(seq_ids[1:], seq_mask[1:])]] * BATCH)
model = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32)
with torch.no_grad():
    logits = model(x).logits.double()
want = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100).item()
print(f"transformers: loss {want:.6f} over {(labels != -100).sum().item()} assistant tokens")

failed = []
with tempfile.TemporaryDirectory() as tmp:
    data = os.path.join(tmp, "chat.jsonl")
    with open(data, "w") as f:
        for _ in range(20):
            f.write(json.dumps({"messages": conv}) + "\n")
    for layout in layouts:
        out = os.path.join(tmp, layout.replace(",", "_").replace("=", ""))
        cmd = [brigade, "train", "--init", hf, "--data", data, "--chat", "--layout", layout, "--steps", "1",
               "--batch", str(BATCH), "--seq", str(SEQ), "--eval-every", "0", "--out", out]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            failed.append(f"{layout}: brigade failed: {r.stderr.strip().splitlines()[-1:]}")
            continue
        got = json.loads(open(os.path.join(out, "metrics.jsonl")).readline())["loss"]
        rel = abs(got - want) / want
        print(f"{layout:>12}: brigade loss {got:.6f}  relative {rel:.1e}")
        if rel > 1e-4:
            failed.append(f"{layout}: loss {got} vs transformers' {want} ({rel:.1e})")
if failed:
    sys.exit("check_init_vs_hf: " + "; ".join(failed))
print("check_init_vs_hf: every layout's first loss is transformers' (relative 1e-4)")
