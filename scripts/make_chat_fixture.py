"""Makes crates/brigade/tests/fixtures/chat_templates.json: conversations rendered by
`transformers`' `apply_chat_template` with the real Llama 3 and Qwen2 tokenizer folders of
../shared/tokenizers (their own Jinja chat templates), the rendered text and its token ids
(tokenize=True, as a server tokenizes it). brigade's test `chat_templates` renders the same
conversations through minijinja and must give the same text and ids.

Run from the repository root with the peers' environment (../shared/peers/setup_venv.sh):
    ../shared/peers/.venv/bin/python scripts/make_chat_fixture.py
"""
import json
import os

from transformers import AutoTokenizer

SHARED = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "tokenizers")
OUT = "crates/brigade/tests/fixtures/chat_templates.json"

CONVERSATIONS = [
    ([{"role": "user", "content": "Hello!"}], True),
    ([{"role": "system", "content": "  Be brief.  "}, {"role": "user", "content": "What is 2+2?"},
      {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 3+3?"}], True),
    ([{"role": "user", "content": "naïve café 😀\n\nline two\t<tab>"}], False),
    ([{"role": "user", "content": "first"}, {"role": "assistant", "content": " spaced answer "}], False),
]

cases = []
for name in ["llama3", "qwen2"]:
    tok = AutoTokenizer.from_pretrained(os.path.join(SHARED, name))
    for messages, gen in CONVERSATIONS:
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
        ids = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=gen, return_dict=False)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        cases.append({"tokenizer": name, "messages": messages, "add_generation_prompt": gen,
                      "text": text, "ids": list(map(int, ids))})
os.makedirs(os.path.dirname(OUT), exist_ok=True)
with open(OUT, "w") as f:
    json.dump(cases, f, indent=1, ensure_ascii=False)
    f.write("\n")
print(len(cases), "cases")
