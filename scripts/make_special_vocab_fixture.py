"""Makes crates/brigade/tests/fixtures/gguf_special_vocab.json: whether gguf-py's `SpecialVocab`
(the one llama.cpp's converter uses to write `tokenizer.ggml.add_eos_token` and
`add_sep_token`) says a tokenizer appends an EOS and separates a pair's texts, for tokenizer
folders that reach each branch of its rule: no post-processor, a byte-level one, a template
whose single form ends in the EOS / in another special token / in a sequence, pairs separated by
the separator, by the EOS, by two tokens, not at all, and `tokenizer_config.json`'s
`add_eos_token` / `add_sep_token` beside (the post-processor's word wins) or alone.
brigade's export must write what gguf-py writes (`models::gguf::export`'s unit test
`eos_and_sep_as_gguf_py_reads_them`).

Run from the repository root with llama.cpp's sources (see make_gguf_rope_fixture.py):
    python3 scripts/make_special_vocab_fixture.py /tmp/llamacpp/llama_cpp_python-0.3.36/vendor/llama.cpp
"""
import json
import logging
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(sys.argv[1], "gguf-py"))
from gguf.vocab import SpecialVocab  # noqa: E402

logging.disable(logging.WARNING)
OUT = "crates/brigade/tests/fixtures/gguf_special_vocab.json"


def sp(t):
    return {"SpecialToken": {"id": t, "type_id": 0}}


def seq(x):
    return {"Sequence": {"id": x, "type_id": 0}}


def tmpl(single, pair):
    return {"type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": {}}


BYTE = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
CFG = {"bos_token": "<s>", "eos_token": "</s>", "sep_token": "<sep>"}
TOKENS = ["<s>", "</s>", "<sep>", "<eot>", "<x>"]
CASES = [
    ("no post-processor", None, CFG),
    ("byte-level (GPT-2)", BYTE, CFG),
    ("byte-level, add_eos_token true (the post-processor wins)", BYTE, {**CFG, "add_eos_token": True}),
    ("no post-processor, add_eos_token true", None, {**CFG, "add_eos_token": True}),
    ("no post-processor, add_sep_token true", None, {**CFG, "add_sep_token": True}),
    ("Llama 3: bos + A, pair bos A bos B", {"type": "Sequence", "processors": [BYTE, tmpl(
        [sp("<s>"), seq("A")], [sp("<s>"), seq("A"), sp("<s>"), seq("B")])]}, CFG),
    ("single ends in the EOS", tmpl([sp("<s>"), seq("A"), sp("</s>")],
                                   [sp("<s>"), seq("A"), sp("</s>"), seq("B"), sp("</s>")]), CFG),
    ("single ends in the EOS, add_eos_token false", tmpl([sp("<s>"), seq("A"), sp("</s>")],
                                   [sp("<s>"), seq("A"), sp("</s>"), seq("B"), sp("</s>")]), {**CFG, "add_eos_token": False}),
    ("single ends in another special token", tmpl([sp("<s>"), seq("A"), sp("<eot>")],
                                                 [sp("<s>"), seq("A"), seq("B"), sp("<eot>")]), CFG),
    ("single ends in a sequence, pair separated by sep", tmpl([sp("<s>"), seq("A")],
                                                             [sp("<s>"), seq("A"), sp("<sep>"), seq("B")]), CFG),
    ("pair separated by the EOS", tmpl([seq("A")], [seq("A"), sp("</s>"), seq("B")]), CFG),
    ("pair separated by two tokens", tmpl([seq("A")], [seq("A"), sp("</s>"), sp("<sep>"), seq("B")]), CFG),
    ("pair separated by an unknown token", tmpl([seq("A")], [seq("A"), sp("<x>"), seq("B")]), CFG),
    ("pair not separated", tmpl([seq("A")], [seq("A"), seq("B")]), CFG),
    ("pair separated by sep, add_sep_token false", tmpl([seq("A")], [seq("A"), sp("<sep>"), seq("B")]),
     {**CFG, "add_sep_token": False}),
    ("single of one token only", tmpl([sp("</s>")], [sp("</s>"), seq("B")]), CFG),
]

cases = []
with tempfile.TemporaryDirectory() as tmp:
    for k, (name, pp, cfg) in enumerate(CASES):
        d = os.path.join(tmp, str(k))
        os.makedirs(d)
        added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                  "normalized": False, "special": True} for i, t in enumerate(TOKENS)]
        tj = {"version": "1.0", "added_tokens": added, "normalizer": None, "pre_tokenizer": None,
              "post_processor": pp, "decoder": None, "model": {"type": "BPE", "vocab": {}, "merges": []}}
        json.dump(tj, open(os.path.join(d, "tokenizer.json"), "w"))
        json.dump(cfg, open(os.path.join(d, "tokenizer_config.json"), "w"))
        v = SpecialVocab(d, load_merges=False, n_vocab=len(TOKENS))
        add = {t: v.add_special_token.get(t) for t in ("eos", "sep")}
        # the tokens gguf-py names EOS and end of turn (it makes a template's trailing token the EOS)
        ids = {t: TOKENS[v.special_token_ids[t]] for t in ("eos", "eot") if t in v.special_token_ids}
        cases.append(dict(name=name, post_processor=pp, tokenizer_config=cfg, eos=add["eos"], sep=add["sep"],
                          eos_token=ids.get("eos"), eot_token=ids.get("eot")))
        print(f"{name}: eos {add['eos']}, sep {add['sep']}, tokens {ids}")
with open(OUT, "w") as f:
    json.dump(dict(source="gguf-py SpecialVocab (llama-cpp-python 0.3.36's vendor/llama.cpp)", cases=cases), f, indent=1)
print("wrote", OUT)
