"""Makes tests/fixtures/llama3_hf and tests/fixtures/qwen2_hf: small random-weight Llama-family
models from Hugging Face `transformers`, an input batch, and the logits, loss, every parameter's
gradient and greedy continuations that PyTorch computes for them.

- llama3_hf: LlamaForCausalLM, GQA 4:1 (8 query heads, 2 key/value heads), head_dim 16 with
  hidden 64 (head_dim x heads != hidden), Llama 3 rope scaling (factor 8 over 32 original
  positions, so a 100-token prompt reaches every band), rope_theta 500000, untied head.
- qwen2_hf: Qwen2ForCausalLM, q/k/v biases, tied head, rope_theta 1e6, GQA 3:1, saved as a
  sharded checkpoint (model.safetensors.index.json), and an RMSNorm epsilon of 0.05, large
  enough that a misread epsilon shows in the logits (at 1e-6 it would not, beside 1e-4).

brigade's test `hf_llama_fixture` loads the folders and must match logits and gradients to 1e-4
relative and the continuations exactly.

Run from the repository root with the peers' environment (../shared/peers/setup_venv.sh):
    ../shared/peers/.venv/bin/python scripts/make_llama_fixture.py
"""
import os

import torch
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

ROOT = "crates/brigade/tests/fixtures"


def make(name, model, vocab, shard=None):
    out = os.path.join(ROOT, name)
    model = model.float()
    model.config._attn_implementation = "eager"
    # the 0.02 init makes near-uniform logits that hide mistakes; perturb every parameter
    # (norm scales and biases too) so that each path carries a visible signal
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.15 * torch.randn_like(p))
    model.eval()
    os.makedirs(out, exist_ok=True)
    if shard:
        model.save_pretrained(out, safe_serialization=True, max_shard_size=shard)
    else:
        model.save_pretrained(out, safe_serialization=True)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (3, 11), generator=g)
    res = model(input_ids=ids, labels=ids)
    res.loss.backward()
    tensors = {"input_ids": ids.to(torch.int64), "logits": res.logits.detach().contiguous(),
               "loss": res.loss.detach().reshape(1)}
    for n, p in model.named_parameters():
        tensors["grad." + n] = p.grad.detach().clone().contiguous()
    # a prompt longer than one attention tile, past the original rope context
    long_ids = torch.randint(0, vocab, (2, 100), generator=g)
    with torch.no_grad():
        tensors["long_input_ids"] = long_ids.to(torch.int64)
        tensors["long_logits"] = model(input_ids=long_ids).logits.contiguous()
        prompt = torch.randint(0, vocab, (1, 9), generator=g)
        gen = model.generate(prompt, max_new_tokens=24, do_sample=False, pad_token_id=0,
                             eos_token_id=None, use_cache=True)
    tensors["prompt_ids"] = prompt.to(torch.int64)
    tensors["greedy_ids"] = gen[:, prompt.shape[1]:].to(torch.int64).contiguous()
    save_file(tensors, os.path.join(out, "expected.safetensors"))
    print(name, "loss", res.loss.item(), "params", sum(p.numel() for p in model.parameters()))


torch.manual_seed(0)
llama = LlamaConfig(
    vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
    num_attention_heads=8, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
    rms_norm_eps=1e-5, tie_word_embeddings=False, attention_bias=False, hidden_act="silu",
    rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                     "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 32},
    bos_token_id=None, eos_token_id=None, pad_token_id=None,
)
make("llama3_hf", LlamaForCausalLM(llama), llama.vocab_size)

torch.manual_seed(1)
qwen = Qwen2Config(
    vocab_size=89, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
    num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=256,
    rms_norm_eps=0.05, tie_word_embeddings=True, hidden_act="silu",
    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    use_sliding_window=False, bos_token_id=None, eos_token_id=None, pad_token_id=None,
)
make("qwen2_hf", Qwen2ForCausalLM(qwen), qwen.vocab_size, shard="40KB")
