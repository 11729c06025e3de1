#!/usr/bin/env python3
"""`brigade export --gguf` against llama.cpp's own converter (`convert_hf_to_gguf.py`), read
back with llama.cpp's gguf-py.

For a Hugging Face folder HF_DIR, brigade writes f32, f16 and q8_0 files and llama.cpp's
converter writes its f32 file of the same folder. Checked: the same tensors under the same
names, shapes and order of dimensions; the f32 data bit-equal to the converter's (so GPT-2's
transposes and the Llama architecture's q/k row order are llama.cpp's); every metadata key
the converter writes present with the same value (tokens, token types, merges, special ids,
the pre-tokenizer's name, chat template, hyperparameters), bar the file's name; and each f16 or
Q8_0 tensor byte-equal to gguf-py's own encoding (numpy's float16, gguf-py's Q8_0 quantizer)
of the converter's f32 data.

Besides HF_DIR, three small random models of the other architectures are made with
transformers and checked the same way: GPT-2 (GPT-2's tokenizer: Conv1D weights transposed),
Qwen2 (Qwen2.5's tokenizer: q/k/v biases, the `qwen2` architecture, a vocabulary padded past the
tokenizer's), and Llama with Llama 3's rope scaling (Llama 3's tokenizer: `rope_freqs.weight`).

Usage: check_gguf_export.py BRIGADE HF_DIR LLAMA_CPP_DIR   (run with a Python that has torch,
transformers and numpy: the peers' venv; LLAMA_CPP_DIR is the vendored llama.cpp of
../shared/peers/llamacpp/setup.sh's download; tokenizers from ../shared/tokenizers)
"""

import json
import os
import subprocess
import sys
import tempfile

import time

import numpy as np

brigade, hf, llama = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path.insert(0, os.path.join(llama, "gguf-py"))
from gguf import GGUFReader, GGMLQuantizationType  # noqa: E402
from gguf.quants import quantize  # noqa: E402

# keys whose value is the file's, not the model's: the converter names the file after the folder
# (or after config.json's _name_or_path when that has at most one slash: a folder made as
# `target/smollm2` gets the organization "Target") and guesses a size label from the parameter count
SKIP = {"general.name", "general.size_label", "general.file_type", "general.quantization_version",
        "general.organization", "general.basename", "general.finetune", "general.version"}


def fields(r):
    out = {}
    for k, f in r.fields.items():
        if k.startswith("GGUF."):
            continue
        out[k] = f.contents()
    return out


def tensors(r):
    return {t.name: t for t in r.tensors}


TOKENIZERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "tokenizers")


def small_models(root):
    """Random small models of GPT-2, Qwen2 and Llama (Llama 3 rope scaling), each with a real tokenizer."""
    import shutil
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(0)
    made = []
    for name, model, tok in [
        ("gpt2", GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=50257, n_positions=128)), "gpt2"),
        ("qwen2", Qwen2ForCausalLM(Qwen2Config(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                                num_attention_heads=4, num_key_value_heads=2, vocab_size=151936,
                                                max_position_embeddings=128, tie_word_embeddings=True)), "qwen2"),
        ("llama3", LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                                 num_attention_heads=4, num_key_value_heads=2, vocab_size=128256,
                                                 max_position_embeddings=256, rope_theta=500000.0,
                                                 rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                                               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                               "original_max_position_embeddings": 32})), "llama3"),
    ]:
        d = os.path.join(root, name)
        model.float().save_pretrained(d)
        if name == "gpt2":
            # GPT-2's published config.json has n_ctx (transformers no longer writes it; the converter reads it)
            cfg_path = os.path.join(d, "config.json")
            cfg = json.load(open(cfg_path))
            cfg["n_ctx"] = cfg["n_positions"]
            json.dump(cfg, open(cfg_path, "w"))
        for f in os.listdir(os.path.join(TOKENIZERS, tok)):
            if f.startswith("tokenizer") or f.endswith(".jinja"):
                shutil.copy(os.path.join(TOKENIZERS, tok, f), d)
        made.append(d)
    return made


def check(hf, tmp, failed, types=("f32", "f16", "q8_0")):
    t0 = time.time()
    ref_path = os.path.join(tmp, "ref.f32.gguf")
    env = dict(os.environ, PYTHONPATH=os.path.join(llama, "gguf-py"), HF_HUB_OFFLINE="1")
    r = subprocess.run([sys.executable, os.path.join(llama, "convert_hf_to_gguf.py"), hf, "--outtype", "f32",
                        "--outfile", ref_path], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        sys.exit(f"llama.cpp's converter failed on {hf}: {r.stderr[-2000:]}")
    ref = GGUFReader(ref_path)
    ref_t = tensors(ref)
    ref_f = fields(ref)
    print(f"llama.cpp's converter: {time.time() - t0:.1f} s")
    for ty in types:
        t0 = time.time()
        path = os.path.join(tmp, f"brigade.{ty}.gguf")
        r = subprocess.run([brigade, "export", hf, "--gguf", path, "--type", ty], capture_output=True, text=True)
        if r.returncode != 0:
            failed.append(f"{hf}: brigade export --type {ty} failed: {r.stderr.strip()}")
            return
        print(r.stdout.strip())
        mine = GGUFReader(path)
        mine_t = tensors(mine)
        if set(mine_t) != set(ref_t):
            failed.append(f"{ty}: tensors only brigade's {sorted(set(mine_t) - set(ref_t))[:5]}, "
                          f"only llama.cpp's {sorted(set(ref_t) - set(mine_t))[:5]}")
            continue
        worst = 0
        for name, t in mine_t.items():
            want = ref_t[name]
            if list(t.shape) != list(want.shape):
                failed.append(f"{ty}: {name} shape {list(t.shape)} vs llama.cpp's {list(want.shape)}")
                continue
            ref_data = np.asarray(want.data, dtype=np.float32)
            if t.tensor_type == GGMLQuantizationType.F32:
                ok = np.array_equal(np.asarray(t.data).view(np.uint32), ref_data.view(np.uint32))
            elif t.tensor_type == GGMLQuantizationType.F16:
                ok = np.array_equal(np.asarray(t.data).view(np.uint16), ref_data.astype(np.float16).view(np.uint16))
            else:
                q = quantize(ref_data, t.tensor_type)
                ok = np.array_equal(np.asarray(t.data).view(np.uint8).reshape(-1), q.view(np.uint8).reshape(-1))
            if not ok:
                worst += 1
                if worst <= 5:
                    failed.append(f"{ty}: {name} ({t.tensor_type.name}) differs from llama.cpp's f32 data so encoded")
        if ty == "f32":
            mine_f = fields(mine)
            for k, v in ref_f.items():
                if k in SKIP:
                    continue
                if k not in mine_f:
                    failed.append(f"metadata {k} missing (llama.cpp writes {str(v)[:60]})")
                elif mine_f[k] != v and not (isinstance(v, float) and abs(mine_f[k] - v) <= 1e-6 * abs(v)):
                    failed.append(f"metadata {k}: brigade {str(mine_f[k])[:60]} vs llama.cpp {str(v)[:60]}")
        print(f"{ty}: {len(mine_t)} tensors checked ({time.time() - t0:.1f} s)")

failed = []
with tempfile.TemporaryDirectory() as tmp:
    # the real model in f32 and f16 (its q8_0 encoded by gguf-py in Python took most of this
    # script's minutes; the Q8_0 and Q4_0 encoders are held to llama-quantize's bytes in
    # tests/gguf_read.rs); the small ones each add what they show (GPT-2's transposed Conv1D
    # weights in every type, Qwen2's padded vocabulary and biases, Llama 3's rope scaling
    # quantized) — their tokenizers' 128-150K tokens make each export and read take seconds
    everything = ("f32", "f16", "q8_0")
    small = small_models(os.path.join(tmp, "small"))
    for d, types in [(hf, ("f32", "f16")), (small[0], everything), (small[1], ("f32",)), (small[2], ("f32", "q8_0"))]:
        print(f"== {d}")
        check(d, tmp, failed, types)
if failed:
    sys.exit("check_gguf_export: " + "; ".join(failed))
print("check_gguf_export: brigade's GGUF is llama.cpp's converter's (tensors, metadata; f16 and q8_0 as gguf-py encodes)")
