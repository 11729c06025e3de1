#!/usr/bin/env python3
"""What constraining tool calls costs: the same chat request with 5 tools asked with
`tool_choice: "required"` (every token masked by the call grammar) and with `"none"` (no
grammar), at 1 and 32 concurrent requests, on one server — output tokens/s of each and their
ratio, and the time to the first token at 1 (where the grammar's compile shows: it is built
for every request).

Usage: python3 ../shared/peers/runq.py -- python3 scripts/bench_tools.py BRIGADE HF_FOLDER
(HF_FOLDER: e.g. target/smollm2/hf from ../shared/models/smollm2-135m-instruct/get.sh --hf.)
"""

import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

TOOLS = [{"type": "function", "function": {"name": n, "description": d, "parameters": {
    "type": "object", "properties": {a: {"type": "string"} for a in args}, "required": args[:1],
    "additionalProperties": False}}} for n, d, args in [
    ("get_weather", "The weather in a city.", ["city", "unit"]),
    ("get_time", "The local time in a city.", ["city"]),
    ("search_web", "Searches the web.", ["query"]),
    ("send_email", "Sends an email.", ["to", "subject", "body"]),
    ("convert_currency", "Converts an amount.", ["amount", "from_currency", "to_currency"]),
]]


def start(cmd):
    log = tempfile.NamedTemporaryFile("w+", delete=False)
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    for _ in range(600):
        m = re.search(r"listening on (http://[0-9.:]+)", open(log.name).read())
        if m:
            try:
                urllib.request.urlopen(m.group(1) + "/ready", timeout=5)
                return p, m.group(1)
            except Exception:
                pass
        time.sleep(0.2)
    sys.exit("the server did not start")


def ask(url, choice, k):
    body = {"model": "m", "messages": [{"role": "user", "content": f"Question {k}: what is the weather in Paris?"}],
            "tools": TOOLS, "tool_choice": choice, "max_tokens": 160, "temperature": 0.8, "seed": k}
    req = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(), {"content-type": "application/json"})
    t0 = time.perf_counter()
    r = json.load(urllib.request.urlopen(req, timeout=600))
    return time.perf_counter() - t0, r["usage"]["completion_tokens"], r["choices"][0]["finish_reason"]


def rate(url, choice, conc, requests):
    t0 = time.perf_counter()
    with ThreadPoolExecutor(conc) as ex:
        out = list(ex.map(lambda k: ask(url, choice, k), range(requests)))
    wall = time.perf_counter() - t0
    return sum(o[1] for o in out) / wall, statistics.median(o[0] for o in out), out


def main():
    bin_, folder = sys.argv[1], sys.argv[2]
    p, url = start([bin_, "serve", "--checkpoint", folder, "--served-model-name", "m", "--port", "0", "--threads", "2"])
    try:
        rate(url, "none", 1, 2)  # warm
        for conc, n in [(1, 6), (32, 64)]:
            rows = {}
            for choice in ["none", "required", "none", "required"]:
                r, lat, out = rate(url, choice, conc, n)
                rows.setdefault(choice, []).append((r, lat, out))
            med = {c: statistics.median(x[0] for x in v) for c, v in rows.items()}
            lat = {c: statistics.median(x[1] for x in v) for c, v in rows.items()}
            calls = sum(o[2] == "tool_calls" for x in rows["required"] for o in x[2])
            total = sum(len(x[2]) for x in rows["required"])
            print(f"{conc} concurrent: none {med['none']:.1f} output tokens/s (latency p50 {lat['none'] * 1e3:.0f} ms), "
                  f"required {med['required']:.1f} ({lat['required'] * 1e3:.0f} ms): {med['required'] / med['none']:.2f}x; "
                  f"{calls}/{total} required answers were tool calls")
    finally:
        p.terminate()
        p.wait()


if __name__ == "__main__":
    main()
