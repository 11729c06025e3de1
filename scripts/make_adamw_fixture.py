"""Makes tests/fixtures/adamw_hf: six optimizer steps of a small random GPT-2 trained by
PyTorch — `torch.optim.AdamW`, `clip_grad_norm_`, warmup + cosine learning rate, two
micro-batches per step with a ragged number of ignored targets — saving the batches, the
learning rate, the gradient norm (before clipping), the loss and every weight after each step.

brigade's test `adamw_fixture` starts its own trainer from the same weights (loaded from this
save_pretrained output), feeds it the same batches and must match every step: weights to 1e-5
relative, learning rates to 1e-6, gradient norms and losses to 1e-5.

The settings below are the fixture's contract with the test (it reads them from settings.json):
weight decay only on matrices and embeddings (as brigade), a clipping threshold between the
gradient norms of different steps so that some steps clip and some do not, and an Adam eps
larger than the rounding noise of the gradients that are zero in exact arithmetic (the key
bias: softmax ignores a per-row constant, so its gradient is only float noise, ~1e-9 to 1e-8, which
Adam would otherwise blow up to a ±lr step whose sign no two implementations share).

Run from the repository root with the peers' environment (../shared/peers/setup_venv.sh):
    ../shared/peers/.venv/bin/python scripts/make_adamw_fixture.py
"""
import json
import math
import os

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from transformers import GPT2Config, GPT2LMHeadModel

OUT = "crates/brigade/tests/fixtures/adamw_hf"
S = dict(
    steps=6, batch=4, micro_batch=2, seq=11, lr=1e-2, min_lr=1e-3, warmup=2,
    beta1=0.9, beta2=0.95, eps=1e-4, weight_decay=0.1, grad_clip=1.2,
)
torch.manual_seed(0)
cfg = GPT2Config(
    n_layer=2, n_head=2, n_embd=16, vocab_size=256, n_positions=16,
    resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    activation_function="gelu_new", layer_norm_epsilon=1e-5, tie_word_embeddings=True,
)
model = GPT2LMHeadModel(cfg).float()
model.config._attn_implementation = "eager"
with torch.no_grad():  # every parameter visibly away from its init, as in make_gpt2_fixture.py
    for p in model.parameters():
        p.add_(0.15 * torch.randn_like(p))
os.makedirs(OUT, exist_ok=True)
model.save_pretrained(OUT, safe_serialization=True)

named = {n.removeprefix("transformer."): p for n, p in model.named_parameters()}
# Decay on matrices and embeddings (2-D), not on biases or LayerNorm (1-D); the LM head is wte.
decay = [p for n, p in named.items() if p.dim() == 2]
no_decay = [p for n, p in named.items() if p.dim() < 2]
opt = torch.optim.AdamW(
    [{"params": decay, "weight_decay": S["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}],
    lr=S["lr"], betas=(S["beta1"], S["beta2"]), eps=S["eps"],
)


def lr_at(step):
    """Linear warmup over `warmup` steps, then cosine from lr to min_lr at `steps`."""
    if step < S["warmup"]:
        return S["lr"] * (step + 1) / S["warmup"]
    progress = min((step - S["warmup"]) / max(S["steps"] - S["warmup"], 1), 1.0)
    return S["min_lr"] + 0.5 * (1 + math.cos(math.pi * progress)) * (S["lr"] - S["min_lr"])


g = torch.Generator().manual_seed(2)
out = {}
b, t, mb = S["batch"], S["seq"], S["micro_batch"]
for step in range(S["steps"]):
    x = torch.randint(0, cfg.vocab_size, (b, t), generator=g)
    y = torch.randint(0, cfg.vocab_size, (b, t), generator=g)
    # ragged: sequence i of step s ignores its first (i + s) % 5 targets
    for i in range(b):
        y[i, : (i + step) % 5] = -100
    count = int((y != -100).sum())
    opt.zero_grad()
    loss_sum = 0.0
    for k in range(0, b, mb):
        logits = model(input_ids=x[k:k + mb]).logits
        loss = F.cross_entropy(logits.reshape(-1, cfg.vocab_size), y[k:k + mb].reshape(-1),
                               ignore_index=-100, reduction="sum")
        loss_sum += loss.item()
        (loss / count).backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), S["grad_clip"])
    lr = lr_at(step)
    for group in opt.param_groups:
        group["lr"] = lr
    opt.step()
    out[f"step{step}.x"] = x.to(torch.int64)
    out[f"step{step}.y"] = y.to(torch.int64)
    out[f"step{step}.lr"] = torch.tensor([lr], dtype=torch.float64)
    out[f"step{step}.grad_norm"] = torch.tensor([norm.item()], dtype=torch.float64)
    out[f"step{step}.loss"] = torch.tensor([loss_sum / count], dtype=torch.float64)
    for n, p in named.items():
        out[f"step{step}.{n}"] = p.detach().clone().contiguous()
    print(f"step {step}: loss {loss_sum / count:.5f} grad norm {norm.item():.4f} "
          f"({'clipped' if norm.item() > S['grad_clip'] else 'not clipped'}) lr {lr:.5f}")
save_file(out, os.path.join(OUT, "expected.safetensors"))
with open(os.path.join(OUT, "settings.json"), "w") as f:
    json.dump(S, f, indent=1)
print("wrote", OUT)
