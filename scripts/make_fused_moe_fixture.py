"""Writes `fused.safetensors` beside each mixture-of-experts fixture of make_moe_fixture.py: the
same weights as transformers 5 holds them in memory and writes them from its state dict — each
layer's experts as two fused tensors, `mlp.experts.gate_up_proj` [E, 2M, C] and
`mlp.experts.down_proj` [E, C, M], Mixtral's `block_sparse_moe` renamed `mlp`.

transformers loads the fixture folder (converting the Hub's per-expert tensors), its state dict is
saved as is, and the file is checked to load back into the same class with the fixture's logits
bit for bit — so the file is a form transformers itself reads. brigade's test `hf_moe_fixture`
reads each folder with this file in place of model.safetensors and must give the same logits.

    target/peers-venv/.venv/bin/python scripts/make_fused_moe_fixture.py
"""
import os
import shutil
import tempfile

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

ROOT = "crates/brigade/tests/fixtures"

for name in ["qwen2_moe_hf", "mixtral_hf", "qwen3_moe_hf", "olmoe_hf"]:
    src = os.path.join(ROOT, name)
    model = AutoModelForCausalLM.from_pretrained(src, torch_dtype=torch.float32).eval()
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    assert any(k.endswith("mlp.experts.gate_up_proj") for k in state), sorted(state)[:8]
    assert not any(".experts.0." in k or "block_sparse_moe" in k for k in state)
    out = os.path.join(src, "fused.safetensors")
    save_file(state, out, metadata={"format": "pt"})
    expected = load_file(os.path.join(src, "expected.safetensors"))
    with tempfile.TemporaryDirectory() as d:
        for f in ["config.json", "generation_config.json"]:
            if os.path.exists(os.path.join(src, f)):
                shutil.copy(os.path.join(src, f), d)
        shutil.copy(out, os.path.join(d, "model.safetensors"))
        again = AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32).eval()
        again.config._attn_implementation = "eager"
        with torch.no_grad():
            logits = again(input_ids=expected["input_ids"]).logits
    diff = (logits - expected["logits"]).abs().max().item()
    assert diff < 1e-5, (name, diff)
    print(name, "fused tensors", len(state), "max |logit - fixture|", diff)
