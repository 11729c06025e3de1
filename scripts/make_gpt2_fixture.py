"""Makes tests/fixtures/gpt2_hf: a small random GPT-2 from Hugging Face `transformers`, an input
batch, and the logits, loss and parameter gradients that PyTorch computes for it.

brigade's test `hf_gpt2_fixture` loads the weights (saved with save_pretrained, so in Hugging
Face's own file format and names) and must match these numbers to 1e-4 relative, including the logits of a
100-token prompt (longer than one attention tile).

Run from the repository root with the peers' environment (../shared/peers/setup_venv.sh):
    ../shared/peers/.venv/bin/python scripts/make_gpt2_fixture.py
"""
import os

import torch
from safetensors.torch import save_file
from transformers import GPT2Config, GPT2LMHeadModel

OUT = "crates/brigade/tests/fixtures/gpt2_hf"
torch.manual_seed(0)
cfg = GPT2Config(
    n_layer=2, n_head=4, n_embd=32, vocab_size=67, n_positions=128,
    resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    activation_function="gelu_new", layer_norm_epsilon=1e-5, tie_word_embeddings=True,
)
model = GPT2LMHeadModel(cfg).float()
model.config._attn_implementation = "eager"
# GPT-2's 0.02 init makes near-uniform logits that hide mistakes; perturb every parameter
# (LayerNorm scales and biases too) so that each path carries a visible signal.
with torch.no_grad():
    for p in model.parameters():
        p.add_(0.15 * torch.randn_like(p))
model.eval()  # dropout is 0 anyway
os.makedirs(OUT, exist_ok=True)
model.save_pretrained(OUT, safe_serialization=True)

g = torch.Generator().manual_seed(1)
ids = torch.randint(0, cfg.vocab_size, (3, 11), generator=g)
out = model(input_ids=ids, labels=ids)
out.loss.backward()
named = dict(model.named_parameters())
grads = {}
# every parameter's gradient (the head is the token table: one parameter)
for name, p in named.items():
    grads["grad." + name.removeprefix("transformer.")] = p.grad.detach().clone().contiguous()
# A prompt longer than one 64-row attention tile (brigade skips masked tiles block by block).
long_ids = torch.randint(0, cfg.vocab_size, (2, 100), generator=g)
with torch.no_grad():
    long_logits = model(input_ids=long_ids).logits
save_file(
    {"long_input_ids": long_ids.to(torch.int64), "long_logits": long_logits.contiguous(),
     "input_ids": ids.to(torch.int64), "logits": out.logits.detach().contiguous(),
     "loss": out.loss.detach().reshape(1), **grads},
    os.path.join(OUT, "expected.safetensors"),
)
print("wrote", OUT, "loss", out.loss.item())
