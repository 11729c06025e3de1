"""A random-weight mixture-of-experts Hugging Face folder of a published shape, fewer layers, with a
real tokenizer, for serving benchmarks (brigade serve and llama.cpp's llama-server on the same
weights; scripts/bench_serve_vs_llamacpp.sh converts it with llama.cpp's own converter).

    PYTHON scripts/make_moe_serve_model.py SHAPE OUT_DIR
  olmoe-Nl:     OlmoeForCausalLM, OLMoE-1B-7B's layer (hidden 2048, 16 heads, 64 experts of 1024,
                8 a token, q/k norms, vocab 50304), N layers; tokenizer ../shared/tokenizers/gpt2
  qwen3-moe-Nl: Qwen3MoeForCausalLM, Qwen3-30B-A3B's layer (hidden 2048, 32 query heads of 128,
                4 key/value heads, 128 experts of 768, 8 a token, renormalised, vocab 151936), N
                layers; tokenizer ../shared/tokenizers/qwen2
"""
import json
import re
import sys
from pathlib import Path

import torch
from transformers import AutoTokenizer, OlmoeConfig, OlmoeForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

shape, out = sys.argv[1], Path(sys.argv[2])
m = re.fullmatch(r"(olmoe|qwen3-moe)-(\d+)l", shape)
if not m:
    sys.exit(f"unknown shape {shape!r}: olmoe-Nl or qwen3-moe-Nl (N layers)")
kind, layers = m.group(1), int(m.group(2))
TOK = Path(__file__).resolve().parents[1].parent / "shared" / "tokenizers"
torch.manual_seed(0)
if kind == "olmoe":
    cfg = OlmoeConfig(vocab_size=50304, hidden_size=2048, intermediate_size=1024, num_hidden_layers=layers,
                      num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=4096,
                      rope_theta=10000.0, rms_norm_eps=1e-5, num_experts=64, num_experts_per_tok=8,
                      norm_topk_prob=False, tie_word_embeddings=False, bos_token_id=None, eos_token_id=50256,
                      pad_token_id=1)
    model, tok = OlmoeForCausalLM(cfg), TOK / "gpt2"
else:
    cfg = Qwen3MoeConfig(vocab_size=151936, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
                         num_hidden_layers=layers, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
                         max_position_embeddings=40960, rope_theta=1000000.0, rms_norm_eps=1e-6, num_experts=128,
                         num_experts_per_tok=8, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
                         tie_word_embeddings=False, bos_token_id=151643, eos_token_id=151645)
    model, tok = Qwen3MoeForCausalLM(cfg), TOK / "qwen2"
model = model.float().eval()
out.mkdir(parents=True, exist_ok=True)
model.save_pretrained(out, safe_serialization=True)
AutoTokenizer.from_pretrained(str(tok)).save_pretrained(out)
print(json.dumps({"out": str(out), "shape": shape, "params": sum(p.numel() for p in model.parameters())}))
