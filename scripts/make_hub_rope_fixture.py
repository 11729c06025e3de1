#!/usr/bin/env python3
"""The rotary inverse frequencies transformers computes for each published config.json in
crates/brigade/tests/fixtures/hub_configs/published (its own RotaryEmbedding class, from the
config as AutoConfig reads it), and for Llama 3.1's config with each rope parameter changed in
turn — written to rope_inv_freq.json there. tests/hf_llama_fixture.rs holds brigade's to them.

    target/peers-venv/.venv/bin/python scripts/make_hub_rope_fixture.py
"""
import copy, importlib, json, os, tempfile
import transformers
from transformers import AutoConfig

root = os.path.join(os.path.dirname(__file__), "..", "crates", "brigade", "tests", "fixtures", "hub_configs",
                    "published")


def inv_freq(cfg_json):
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg_json, f)
        cfg = AutoConfig.from_pretrained(d)
    mt = cfg.model_type
    mod = importlib.import_module(f"transformers.models.{mt}.modeling_{mt}")
    cls = next(getattr(mod, n) for n in dir(mod) if n.endswith("RotaryEmbedding"))
    return [float(x) for x in cls(cfg).inv_freq.tolist()]


out = {"transformers": transformers.__version__, "models": {}, "llama3_1_varied": []}
for name in sorted(os.listdir(root)):
    p = os.path.join(root, name, "config.json")
    if os.path.isfile(p):
        out["models"][name] = inv_freq(json.load(open(p)))
base = json.load(open(os.path.join(root, "Llama-3.1-8B-Instruct", "config.json")))
for key, value in [("factor", 4.0), ("low_freq_factor", 2.0), ("high_freq_factor", 8.0),
                   ("original_max_position_embeddings", 4096), ("rope_theta", 250000.0)]:
    c = copy.deepcopy(base)
    if key == "rope_theta":
        c[key] = value
    else:
        c["rope_scaling"][key] = value
    out["llama3_1_varied"].append({"key": key, "value": value, "inv_freq": inv_freq(c)})
with open(os.path.join(root, "rope_inv_freq.json"), "w") as f:
    json.dump(out, f, indent=1)
print({k: len(v) for k, v in out["models"].items()})
