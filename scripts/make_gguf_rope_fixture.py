"""Makes crates/brigade/tests/fixtures/gguf_rope_factors.json: the `rope_freqs.weight` factors
llama.cpp's own converter (`convert_hf_to_gguf.py` of the llama.cpp that llama-cpp-python 0.3.36
vendors, as ../shared/peers/llamacpp/setup.sh fetches it) writes for Llama 3's frequency scaling,
for the published Llama 3.1 8B and 3.2 1B parameters and for one set no published model uses
(other bands, original context and base), each on a one-layer model of that head size with the
real Llama 3 tokenizer. brigade's GGUF export must write these factors and its import must name
these parameters from them (tests/gguf_export.rs, `rope_factors_as_llama_cpp_writes_them`).

Run from the repository root in the peers' environment (torch, transformers), after fetching
llama.cpp's sources (`W=/tmp/llamacpp bash ../shared/peers/llamacpp/setup.sh` fetches and builds;
only the sources are used here):
    .venv/bin/python scripts/make_gguf_rope_fixture.py /tmp/llamacpp/llama_cpp_python-0.3.36/vendor/llama.cpp
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import torch
from transformers import LlamaConfig, LlamaForCausalLM

LLAMA_CPP = sys.argv[1]
TOKENIZER = "../shared/tokenizers/llama3"
OUT = "crates/brigade/tests/fixtures/gguf_rope_factors.json"
sys.path.insert(0, os.path.join(LLAMA_CPP, "gguf-py"))
from gguf import GGUFReader  # noqa: E402

CASES = [
    ("Llama-3.1-8B", 128, 500000.0, dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                         original_max_position_embeddings=8192)),
    ("Llama-3.2-1B", 64, 500000.0, dict(factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                        original_max_position_embeddings=8192)),
    ("unpublished", 128, 10000.0, dict(factor=4.0, low_freq_factor=2.0, high_freq_factor=8.0,
                                       original_max_position_embeddings=4096)),
]

vocab = len(json.load(open(os.path.join(TOKENIZER, "tokenizer.json")))["model"]["vocab"]) + 256
cases = []
with tempfile.TemporaryDirectory() as tmp:
    for name, head_dim, theta, scaling in CASES:
        d = os.path.join(tmp, name)
        cfg = LlamaConfig(
            vocab_size=vocab, hidden_size=2 * head_dim, num_attention_heads=2, num_key_value_heads=1,
            head_dim=head_dim, intermediate_size=32, num_hidden_layers=1, max_position_embeddings=131072,
            rope_theta=theta, rope_scaling=dict(rope_type="llama3", **scaling), tie_word_embeddings=True,
            bos_token_id=128000, eos_token_id=128009,
        )
        torch.manual_seed(0)
        LlamaForCausalLM(cfg).save_pretrained(d, safe_serialization=True)
        for f in ["tokenizer.json", "tokenizer_config.json"]:
            shutil.copy(os.path.join(TOKENIZER, f), d)
        out = os.path.join(tmp, name + ".gguf")
        subprocess.run([sys.executable, os.path.join(LLAMA_CPP, "convert_hf_to_gguf.py"), d,
                        "--outtype", "f32", "--outfile", out], check=True,
                       env=dict(os.environ, PYTHONPATH=os.path.join(LLAMA_CPP, "gguf-py"), HF_HUB_OFFLINE="1"))
        r = GGUFReader(out)
        t = next(t for t in r.tensors if t.name == "rope_freqs.weight")
        factors = [float(x) for x in t.data]
        assert len(factors) == head_dim // 2, (name, len(factors))
        cases.append(dict(name=name, head_dim=head_dim, rope_theta=theta, rope_scaling=scaling, factors=factors))
        print(name, len(factors), "factors:", min(factors), "…", max(factors),
              sum(1 for f in factors if f == 1.0), "at 1,", sum(1 for f in factors if f == scaling["factor"]), "at factor")
with open(OUT, "w") as f:
    json.dump(dict(source="llama.cpp convert_hf_to_gguf.py (llama-cpp-python 0.3.36's vendor/llama.cpp), rope_freqs.weight",
                   cases=cases), f, indent=1)
print("wrote", OUT)
