#!/usr/bin/env python3
"""transformers' generate() with a repetition penalty, on the random-weight Llama 3 and Qwen2
fixtures (crates/brigade/tests/fixtures/{llama3_hf,qwen2_hf}, made by make_llama_fixture.py):
greedy tokens with repetition_penalty 1.3 (HF's RepetitionPenaltyLogitsProcessor over the
prompt and the tokens generated so far) and without, written to `repetition.safetensors` beside
each fixture, with one row of logits before and after HF's processor for a unit check.

    target/peers-venv/.venv/bin/python scripts/make_repetition_fixture.py
"""
import os
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM
from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

root = os.path.join(os.path.dirname(__file__), "..", "crates", "brigade", "tests", "fixtures")
for name in ["llama3_hf", "qwen2_hf"]:
    d = os.path.join(root, name)
    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(3)
    prompt = torch.randint(0, vocab, (1, 7), generator=g)
    out = {"prompt_ids": prompt.to(torch.int64)}
    with torch.no_grad():
        for key, penalty in [("plain_ids", 1.0), ("penalized_ids", 1.3)]:
            gen = model.generate(prompt, max_new_tokens=32, do_sample=False, pad_token_id=0, eos_token_id=None,
                                 repetition_penalty=penalty, use_cache=True)
            out[key] = gen[:, prompt.shape[1]:].to(torch.int64).contiguous()
        logits = model(input_ids=prompt).logits[:, -1, :].contiguous()
        out["logits"] = logits
        out["processed_logits"] = RepetitionPenaltyLogitsProcessor(1.3)(prompt, logits.clone()).contiguous()
    assert not torch.equal(out["plain_ids"], out["penalized_ids"]), name + ": the penalty changed nothing"
    save_file(out, os.path.join(d, "repetition.safetensors"))
    print(name, "plain", out["plain_ids"].tolist(), "penalized", out["penalized_ids"].tolist())
