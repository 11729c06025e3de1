"""The peer for brigade's mixture-of-experts training speed: one training step (fp32, AdamW) of
transformers' own Qwen2MoeForCausalLM at a small Qwen3-MoE-like shape (8 experts, 2 a token,
renormalised, no shared expert), eager or torch.compile, random weights, the same batch every
step. With --write-config DIR it only writes that shape's config.json (for `brigade bench train
--model DIR`).

    PYTHON scripts/hf_moe_train_step.py --threads 2 [--seq 256 --batch 4 --steps 6 --compile]
Prints one JSON line.
"""
import argparse
import json
import os
import statistics
import time

import torch
from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

SHAPE = dict(vocab_size=16384, hidden_size=512, intermediate_size=1024, num_hidden_layers=4,
             num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=1024, rms_norm_eps=1e-6,
             tie_word_embeddings=False, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=1024,
             shared_expert_intermediate_size=0, norm_topk_prob=True, output_router_logits=False,
             use_sliding_window=False, qkv_bias=False, bos_token_id=None, eos_token_id=None, pad_token_id=None)

ap = argparse.ArgumentParser()
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--seq", type=int, default=256)
ap.add_argument("--batch", type=int, default=4)
ap.add_argument("--steps", type=int, default=6)
ap.add_argument("--warmup", type=int, default=2)
ap.add_argument("--compile", action="store_true")
ap.add_argument("--write-config")
ap.add_argument("--arch", choices=["qwen2_moe", "qwen3_moe"], default="qwen2_moe",
                help="qwen3_moe: the same shape with Qwen3's q/k norms (and no qkv bias)")
a = ap.parse_args()
if a.arch == "qwen3_moe":
    q3 = {k: v for k, v in SHAPE.items() if k not in ("shared_expert_intermediate_size", "qkv_bias")}
    cfg, Model = Qwen3MoeConfig(**q3, attention_bias=False, head_dim=64), Qwen3MoeForCausalLM
else:
    cfg, Model = Qwen2MoeConfig(**SHAPE), Qwen2MoeForCausalLM
if a.write_config:
    os.makedirs(a.write_config, exist_ok=True)
    cfg.save_pretrained(a.write_config)
    raise SystemExit(0)
torch.set_num_threads(a.threads)
torch.manual_seed(0)
model = Model(cfg).float()
model.config._attn_implementation = "sdpa"
model.train()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
ids = torch.randint(0, cfg.vocab_size, (a.batch, a.seq))
step_fn = model
if a.compile:
    step_fn = torch.compile(model)


def step():
    opt.zero_grad(set_to_none=True)
    out = step_fn(input_ids=ids, labels=ids)
    out.loss.backward()
    opt.step()


times = []
for i in range(a.warmup + a.steps):
    t0 = time.perf_counter()
    step()
    if i >= a.warmup:
        times.append(time.perf_counter() - t0)
med = statistics.median(times)
print(json.dumps({"bench": "hf_moe_train_step", "compiled": a.compile, "threads": a.threads, "seq": a.seq,
                  "batch": a.batch, "step_s_median": med, "tokens_per_s": a.batch * a.seq / med,
                  "params": sum(p.numel() for p in model.parameters()), "transformers": __import__("transformers").__version__}))
