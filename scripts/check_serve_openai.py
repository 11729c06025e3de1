"""`brigade serve` driven by the official `openai` Python client, as a user would.

Trains a tiny checkpoint on README.md and docs/*.md with the BPE fixture tokenizer (30 steps),
starts the server on a free port, and checks: /v1/models; completions greedy and seeded, whole
and streamed (with usage), n, lists of prompts, token-id prompts, logprobs, stop, vLLM's
ignore_eos / return_token_ids via extra_body; OpenAI errors raised as the client's exception classes. Then chat completions on a
Llama-family checkpoint trained with the real Qwen2 tokenizer (../shared/tokenizers/qwen2, its
own chat template): whole and streamed (role first, usage), n, seed, logprobs/top_logprobs,
max_completion_tokens, tool calls (required and named: calls that parse, streamed equal to whole, a tool
result answered), and the refusals (unknown role, duplicate tools, response_format). Exits non-zero
on the first mismatch. CI runs it (after `pip install openai`).

    python3 scripts/check_serve_openai.py [path/to/brigade]
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import openai

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def prose_corpus(path):
    """Writes the repository's prose to `path`: README.md, then docs/*.md in file-name order,
    joined by newlines (the training text of the serving tests and the README tour)."""
    names = ["README.md"] + [os.path.join("docs", n) for n in sorted(os.listdir(os.path.join(ROOT, "docs")))
                             if n.endswith(".md")]
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(open(os.path.join(ROOT, n), encoding="utf-8").read() for n in names))
    return path
BRIGADE = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target/release/brigade")
TOKENIZER = os.path.join(ROOT, "crates/brigade-serve/tests/data/bpe-tokenizer.json")


def check(cond, what):
    if not cond:
        print("FAIL:", what, file=sys.stderr)
        sys.exit(1)
    print("ok:", what)


with tempfile.TemporaryDirectory() as tmp:
    ckpt = os.path.join(tmp, "tiny-bpe")
    subprocess.run([BRIGADE, "train", "--data", prose_corpus(os.path.join(tmp, "corpus.txt")), "--tokenizer", TOKENIZER,
                    "--steps", "30", "--threads", "1", "--out", ckpt], check=True, capture_output=True)
    srv = subprocess.Popen([BRIGADE, "serve", "--checkpoint", ckpt, "--port", "0", "--threads", "1"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = srv.stdout.readline().strip().rsplit(" ", 1)[-1]
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        for _ in range(600):
            try:
                if client.models.list().data:
                    import urllib.request
                    if urllib.request.urlopen(url + "/ready").status == 200:
                        break
            except Exception:
                pass
            time.sleep(0.05)
        models = client.models.list().data
        check([m.id for m in models] == ["tiny-bpe"], "models.list() names the checkpoint")

        r = client.completions.create(model="tiny-bpe", prompt="The planner", max_tokens=12, temperature=0)
        check(r.object == "text_completion" and len(r.choices) == 1, "a completion with one choice")
        check(r.choices[0].finish_reason in ("length", "stop"), "finish_reason")
        check(r.usage.completion_tokens <= 12 and r.usage.prompt_tokens > 0
              and r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens, "usage adds up")

        kw = dict(model="tiny-bpe", prompt="Data parallelism — naïve 🚀", max_tokens=20, temperature=1.1, seed=7,
                  logprobs=2, extra_body={"return_token_ids": True})
        whole = client.completions.create(**kw)
        again = client.completions.create(**kw)
        check(whole.choices[0].text == again.choices[0].text, "a seed makes sampling repeatable")
        ids = whole.choices[0].model_extra["token_ids"]
        check(len(ids) == whole.usage.completion_tokens, "return_token_ids gives every generated token")
        lp = whole.choices[0].logprobs
        check(len(lp.tokens) == len(ids) and len(lp.token_logprobs) == len(ids)
              and all(1 <= len(t) <= 2 for t in lp.top_logprobs), "logprobs=2: a value and 2 alternatives per token")
        text, streamed_ids, usage, finish = "", [], None, None
        for chunk in client.completions.create(stream=True, stream_options={"include_usage": True}, **kw):
            if chunk.usage is not None:
                usage = chunk.usage
            for c in chunk.choices:
                text += c.text
                streamed_ids += c.model_extra["token_ids"]
                finish = c.finish_reason or finish
        check(text == whole.choices[0].text, "the streamed pieces add up to the whole text")
        check(streamed_ids == ids, "streamed tokens equal the whole response's")
        check(usage is not None and usage.completion_tokens == whole.usage.completion_tokens, "stream usage chunk")
        check(finish == whole.choices[0].finish_reason, "stream finish_reason")

        r = client.completions.create(model="tiny-bpe", prompt=["The mesh", "A pipeline"], n=2, max_tokens=8,
                                      temperature=1.0, seed=1)
        check(sorted(c.index for c in r.choices) == [0, 1, 2, 3], "two prompts × n=2: four choices")
        r = client.completions.create(model="tiny-bpe", prompt=[5, 6, 7, 8], max_tokens=16, temperature=0,
                                      extra_body={"ignore_eos": True, "return_token_ids": True})
        check(len(r.choices[0].model_extra["token_ids"]) == 16 and r.choices[0].finish_reason == "length",
              "token-id prompt with ignore_eos runs to max_tokens")
        full = client.completions.create(model="tiny-bpe", prompt="The", max_tokens=24, temperature=1.0, seed=3)
        t = full.choices[0].text
        stop = next((ch for ch in t[2:] if not ch.isspace()), None)
        if stop is not None:
            r = client.completions.create(model="tiny-bpe", prompt="The", max_tokens=24, temperature=1.0, seed=3,
                                          stop=[stop])
            check(r.choices[0].text == t[:t.index(stop)] and r.choices[0].finish_reason == "stop",
                  f"stop={stop!r} ends the text before it")

        for what, call, exc in [
            ("negative max_tokens", lambda: client.completions.create(model="tiny-bpe", prompt="x", max_tokens=-1),
             openai.BadRequestError),
            ("echo is refused", lambda: client.completions.create(model="tiny-bpe", prompt="x", echo=True),
             openai.BadRequestError),
            ("a prompt beyond the context", lambda: client.completions.create(model="tiny-bpe", prompt="x y " * 100),
             openai.BadRequestError),
            ("an unknown model", lambda: client.completions.create(model="gpt-9", prompt="x"),
             openai.NotFoundError),
        ]:
            try:
                call()
                check(False, what)
            except exc as e:
                check(e.body is not None and "message" in e.body, f"{what}: {type(e).__name__}: {e.body['message']}")
    finally:
        srv.send_signal(signal.SIGTERM)
        rc = srv.wait(timeout=60)
    check(rc == 0, "SIGTERM: the server exits 0")


def serve(ckpt):
    srv = subprocess.Popen([BRIGADE, "serve", "--checkpoint", ckpt, "--port", "0", "--threads", "1",
                            "--served-model-name", "chat"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = srv.stdout.readline().strip().rsplit(" ", 1)[-1]
    import urllib.request
    for _ in range(1200):
        try:
            if urllib.request.urlopen(url + "/ready").status == 200:
                break
        except Exception:
            pass
        time.sleep(0.05)
    return srv, openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


QWEN2 = os.path.join(ROOT, "..", "shared", "tokenizers", "qwen2")
if not os.path.isdir(QWEN2):
    if os.environ.get("BRIGADE_REQUIRE_SHARED"):
        check(False, f"{QWEN2} is absent and BRIGADE_REQUIRE_SHARED is set")
    print("skipping the chat checks:", QWEN2, "is absent")
else:
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = os.path.join(tmp, "qwen-chat")
        subprocess.run([BRIGADE, "train", "--model", "llama-tiny", "--data", prose_corpus(os.path.join(tmp, "corpus.txt")),
                        "--tokenizer", QWEN2, "--steps", "2", "--block-size", "512", "--seq", "64", "--threads", "1", "--out", ckpt],
                       check=True, capture_output=True)
        srv, client = serve(ckpt)
        try:
            msgs = [{"role": "system", "content": "You answer briefly."},
                    {"role": "user", "content": [{"type": "text", "text": "What is data parallelism?"}]}]
            kw = dict(model="chat", messages=msgs, max_completion_tokens=10, temperature=0.8, seed=5, logprobs=True,
                      top_logprobs=2, extra_body={"ignore_eos": True, "return_token_ids": True})
            r = client.chat.completions.create(**kw)
            c = r.choices[0]
            check(r.object == "chat.completion" and c.message.role == "assistant", "a chat completion")
            check(len(c.model_extra["token_ids"]) == 10 and c.finish_reason == "length", "max_completion_tokens")
            check(len(c.logprobs.content) == 10 and all(len(t.top_logprobs) == 2 for t in c.logprobs.content),
                  "logprobs in the chat shape, 2 alternatives each")
            pids = r.model_extra["prompt_token_ids"]
            check(pids[0] == 151644 and r.usage.prompt_tokens == len(pids), "the template's ids begin <|im_start|>")
            again = client.chat.completions.create(**kw)
            check(again.choices[0].message.content == c.message.content, "a seed makes chat sampling repeatable")
            text, role, usage = "", None, None
            for chunk in client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw):
                if chunk.usage is not None:
                    usage = chunk.usage
                for d in chunk.choices:
                    role = role or d.delta.role
                    text += d.delta.content or ""
            check(role == "assistant" and text == c.message.content, "streamed deltas add up to the message")
            check(usage is not None and usage.completion_tokens == 10, "stream usage chunk")
            r = client.chat.completions.create(model="chat", messages=msgs, n=2, max_tokens=3, seed=2,
                                               extra_body={"ignore_eos": True})
            check(sorted(ch.index for ch in r.choices) == [0, 1], "n=2: two choices")
            # structured output: the client's own response_format, a message that parses
            schema = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"enum": [1, 2, 3]}},
                      "required": ["ok", "n"], "additionalProperties": False}
            r = client.chat.completions.create(model="chat", messages=msgs, max_tokens=40, temperature=0.9, seed=4,
                                               response_format={"type": "json_schema",
                                                                "json_schema": {"name": "v", "schema": schema}})
            try:
                v = json.loads(r.choices[0].message.content)
                ok = isinstance(v.get("ok"), bool) and v.get("n") in (1, 2, 3) and len(v) == 2
            except ValueError:
                ok = False
            check(ok and r.choices[0].finish_reason == "stop", f"response_format json_schema: {r.choices[0].message.content!r}")
            # tools: the model's template (Qwen2.5's) takes them; a required call always parses,
            # streamed or whole, as the client reads it
            weather = {"type": "function", "function": {"name": "get_weather", "description": "The weather now.",
                       "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
                                      "required": ["city"], "additionalProperties": False}}}
            clock = {"type": "function", "function": {"name": "get-time", "parameters": {"type": "object",
                     "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}}, "required": ["zone"],
                     "additionalProperties": False}}}
            tkw = dict(model="chat", messages=msgs, tools=[weather, clock], tool_choice="required", max_tokens=80,
                       temperature=1.0, seed=3)
            r = client.chat.completions.create(**tkw)
            calls = r.choices[0].message.tool_calls or []
            ok = r.choices[0].finish_reason == "tool_calls" and len(calls) >= 1
            for c in calls:
                args = json.loads(c.function.arguments)
                ok &= c.type == "function" and c.function.name in ("get_weather", "get-time") and set(args) <= {"city", "zone"}
            check(ok, f"tool_choice=required: {len(calls)} call(s) that parse, e.g. {calls[0].function.name if calls else None}"
                      f"({calls[0].function.arguments if calls else ''})")
            streamed = {}
            for chunk in client.chat.completions.create(stream=True, **tkw):
                for d in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
                    e = streamed.setdefault(d.index, {"name": "", "arguments": ""})
                    e["name"] += (d.function.name or "") if d.function else ""
                    e["arguments"] += (d.function.arguments or "") if d.function else ""
            check([streamed[k] for k in sorted(streamed)] == [{"name": c.function.name, "arguments": c.function.arguments} for c in calls],
                  "streamed tool calls add up to the whole response's")
            r = client.chat.completions.create(**{**tkw, "tool_choice": {"type": "function", "function": {"name": "get-time"}},
                                                  "parallel_tool_calls": False})
            calls = r.choices[0].message.tool_calls or []
            check(len(calls) == 1 and calls[0].function.name == "get-time", "a named tool_choice: one call to it")
            # the call answered: the conversation goes on with the result
            follow = msgs + [{"role": "assistant", "content": None, "tool_calls": [c.model_dump() for c in calls]},
                             {"role": "tool", "tool_call_id": calls[0].id, "content": "14:05"}] if calls else msgs
            r = client.chat.completions.create(model="chat", messages=follow, tools=[weather, clock], max_tokens=5)
            check(r.choices[0].finish_reason in ("length", "stop", "tool_calls"), "a tool result in the conversation")
            for what, call in [
                ("an unknown role", lambda: client.chat.completions.create(
                    model="chat", messages=[{"role": "wizard", "content": "x"}])),
                ("two tools of one name", lambda: client.chat.completions.create(
                    model="chat", messages=msgs,
                    tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}] * 2)),
                ("a guided_regex that does not compile", lambda: client.chat.completions.create(
                    model="chat", messages=msgs, extra_body={"guided_regex": "("})),
                ("empty messages", lambda: client.chat.completions.create(model="chat", messages=[])),
            ]:
                try:
                    call()
                    check(False, what)
                except openai.BadRequestError as e:
                    check(e.body is not None and e.body.get("param"), f"{what}: 400 naming {e.body.get('param')}")
        finally:
            srv.send_signal(signal.SIGTERM)
            rc = srv.wait(timeout=60)
        check(rc == 0, "SIGTERM: the chat server exits 0")
print("check_serve_openai: all passed")
