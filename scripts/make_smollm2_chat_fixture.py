#!/usr/bin/env python3
"""What transformers does with the real SmolLM2-135M-Instruct (the Hugging Face folder that
`../shared/models/smollm2-135m-instruct/get.sh DIR --hf PY` writes) on a few chat requests:
the prompt's ids from its own chat template (add_generation_prompt) and generate()'s greedy
continuation with the folder's generation_config (ending in <|im_end|> where the model ends its
turn), written to crates/brigade-cli/tests/fixtures/smollm2_chat.json.

    target/peers-venv/.venv/bin/python scripts/make_smollm2_chat_fixture.py target/smollm2/hf
"""
import json, os, sys
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

folder = sys.argv[1]
tok = AutoTokenizer.from_pretrained(folder)
model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
conversations = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You answer in one short sentence."},
     {"role": "user", "content": "Name a primary colour."}],
    [{"role": "user", "content": "Say hello."}],
]
cases = []
for messages in conversations:
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
    if hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=48, do_sample=False)
    gen = out[0, len(ids):].tolist()
    cases.append({"messages": messages, "prompt_ids": ids, "generated_ids": gen,
                  "ended": gen[-1] == tok.convert_tokens_to_ids("<|im_end|>"),
                  "text": tok.decode(gen, skip_special_tokens=True)})
    print(cases[-1]["text"], cases[-1]["ended"], len(gen))
dest = os.path.join(os.path.dirname(__file__), "..", "crates", "brigade-cli", "tests", "fixtures", "smollm2_chat.json")
with open(dest, "w") as f:
    json.dump({"transformers": __import__("transformers").__version__, "cases": cases}, f, indent=1)
