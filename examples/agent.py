#!/usr/bin/env python3
"""An agent loop against `brigade serve` with the official `openai` client, as agent frameworks
drive a server: the model is offered two tools, asked to call them (`tool_choice: "required"`,
parallel calls allowed), the client runs the calls it gets concurrently, sends the results back
as `tool` messages, and the model writes its final answer (`tool_choice: "none"`).

Usage: python3 examples/agent.py http://127.0.0.1:8000 [model-name]
(e.g. after `brigade serve --checkpoint target/smollm2/hf --port 8000`: SmolLM2-135M-Instruct, whose
template takes no tools — brigade's generic fallback carries them.) Exits non-zero if a step
fails: no call, a call that does not parse, or no final answer.
"""

import json
import sys
from concurrent.futures import ThreadPoolExecutor

import openai

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather now in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city"}},
                       "required": ["city"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "The local time in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city"}},
                       "required": ["city"], "additionalProperties": False}}},
]


def run_tool(name, args):
    """The tools themselves (stand-ins: a real agent calls services here)."""
    city = args.get("city", "?")
    if name == "get_weather":
        return f"{city}: 18 C, sunny"
    return f"{city}: 14:05"


def main():
    url = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000"
    client = openai.OpenAI(base_url=url.rstrip("/") + "/v1", api_key="unused", max_retries=0)
    model = sys.argv[2] if len(sys.argv) > 2 else client.models.list().data[0].id
    messages = [{"role": "user", "content": "What is the weather and the local time in Paris?"}]
    first = client.chat.completions.create(model=model, messages=messages, tools=TOOLS, tool_choice="required",
                                           parallel_tool_calls=True, max_tokens=120, temperature=0)
    msg = first.choices[0].message
    calls = msg.tool_calls or []
    if first.choices[0].finish_reason != "tool_calls" or not calls:
        sys.exit(f"agent: no tool call: {first}")
    print(f"agent: the model calls {len(calls)} tool(s): "
          + ", ".join(f"{c.function.name}({c.function.arguments})" for c in calls))
    # the calls run at once, as agent frameworks run parallel calls
    with ThreadPoolExecutor(len(calls)) as ex:
        results = list(ex.map(lambda c: run_tool(c.function.name, json.loads(c.function.arguments)), calls))
    messages.append({"role": "assistant", "content": msg.content, "tool_calls": [c.model_dump() for c in calls]})
    for c, r in zip(calls, results):
        messages.append({"role": "tool", "tool_call_id": c.id, "content": r})
    final = client.chat.completions.create(model=model, messages=messages, tools=TOOLS, tool_choice="none",
                                           max_tokens=60, temperature=0)
    answer = final.choices[0].message.content or ""
    if not answer.strip() or final.choices[0].message.tool_calls:
        sys.exit(f"agent: no final answer: {final}")
    print(f"agent: tool results {results} -> final answer: {answer.strip()!r}")


if __name__ == "__main__":
    main()
