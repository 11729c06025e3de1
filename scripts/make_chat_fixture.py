"""Makes crates/brigade/tests/fixtures/chat_templates.json: conversations rendered by
`transformers`' `apply_chat_template` with the real Llama 3 and Qwen2 tokenizer folders of
../shared/tokenizers (their own Jinja chat templates), the rendered text and its token ids
(tokenize=True, as a server tokenizes it). brigade's test `chat_templates` renders the same
conversations through minijinja and must give the same text and ids. The conversations with
tools (one tool, several, an assistant's calls with their arguments as objects — as vLLM passes
them — tool results and a follow-up) are rendered with `apply_chat_template(messages, tools=…)`.

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

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city, now.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "The city, e.g. Paris"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get-time", "description": "The time in a time zone.",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}
CALL2 = {"id": "call_2", "type": "function", "function": {"name": "get-time", "arguments": {"zone": "Europe/Paris"}}}
TOOL_CONVERSATIONS = [
    ([{"role": "user", "content": "Weather in Paris?"}], [WEATHER], True),
    ([{"role": "system", "content": "You help."}, {"role": "user", "content": "Weather and time in Paris?"}],
     [WEATHER, TIME], True),
    ([{"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": None, "tool_calls": [CALL]},
      {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"}], [WEATHER], True),
    ([{"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": None, "tool_calls": [CALL]},
      {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
      {"role": "assistant", "content": "It is 18 C and sunny."},
      {"role": "user", "content": "And the time?"}], [WEATHER, TIME], True),
]
QWEN_ONLY = [
    # parallel calls in one assistant turn (Llama 3.x templates take one call a turn)
    ([{"role": "user", "content": "Weather and time in Paris?"},
      {"role": "assistant", "content": "", "tool_calls": [CALL, CALL2]},
      {"role": "tool", "tool_call_id": "call_1", "content": "18 C"},
      {"role": "tool", "tool_call_id": "call_2", "content": "14:05"}], [WEATHER, TIME], True),
]

cases = []
for name in ["llama3", "qwen2"]:
    tok = AutoTokenizer.from_pretrained(os.path.join(SHARED, name))
    todo = [(m, None, g) for m, g in CONVERSATIONS] + TOOL_CONVERSATIONS + (QWEN_ONLY if name == "qwen2" else [])
    for messages, tools, gen in todo:
        kw = {"tools": tools} if tools else {}
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen, **kw)
        ids = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=gen, return_dict=False, **kw)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        case = {"tokenizer": name, "messages": messages, "add_generation_prompt": gen, "text": text,
                "ids": list(map(int, ids))}
        if tools:
            case["tools"] = tools
        cases.append(case)
os.makedirs(os.path.dirname(OUT), exist_ok=True)
with open(OUT, "w") as f:
    json.dump(cases, f, indent=1, ensure_ascii=False)
    f.write("\n")
print(len(cases), "cases")
