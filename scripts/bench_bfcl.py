#!/usr/bin/env python3
"""BFCL v4 function calling against OpenAI-compatible servers, scored by BFCL's own AST checker.

The questions, functions and possible answers are BFCL v4's, as PyPI's `bfcl-eval` ships them
(`bfcl_eval/data`); the functions become OpenAI tools as BFCL's OpenAI function-calling handler
makes them (`convert_to_tool` with `GORILLA_TO_OPENAPI`: dots in names become `_`, `dict` is
`object`, `float` is `number`, a missing type is `string`), the calls come back as
`message.tool_calls` and are scored by `bfcl_eval.eval_checker.ast_eval.ast_checker` itself
(a model config with `underscore_to_dot`, as BFCL's FC handlers have), irrelevance as BFCL's
relevance runner scores it (correct when the answer holds no call). Besides accuracy, every
returned call is checked against its function's `parameters` schema (`jsonschema`):
"schema-valid" is the share of returned calls that name an offered function and whose
arguments parse and validate.

    bench_bfcl.py --target NAME URL MODE [--target …] [--categories …] [--limit N] [--out F]

MODE is the `tool_choice` sent ("auto" or "required"), with `:parallel` or `:single` to send
`parallel_tool_calls` true or false (BFCL sends neither: OpenAI's default is true,
llama-server's false). Needs `openai`, `jsonschema` and
`bfcl-eval` (installed without its dependencies: only its data and checker are used).
"""

import argparse
import concurrent.futures as cf
import copy
import json
import os
import re
import sys
import time
import types

# BFCL's checker asks its model table whether the model's names had their dots made `_`;
# the table imports every vendor's SDK, so it is replaced by the one entry this needs
_config = types.ModuleType("bfcl_eval.constants.model_config")


class _Fc:
    underscore_to_dot = True


_config.MODEL_CONFIG_MAPPING = {"brigade-bench": _Fc()}
sys.modules["bfcl_eval.constants.model_config"] = _config

import bfcl_eval  # noqa: E402
import jsonschema  # noqa: E402
from bfcl_eval.constants.enums import Language  # noqa: E402
from bfcl_eval.constants.type_mappings import GORILLA_TO_OPENAPI  # noqa: E402
from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker  # noqa: E402
from openai import OpenAI  # noqa: E402

CATEGORIES = {
    "simple": "simple_python",
    "multiple": "multiple",
    "parallel": "parallel",
    "parallel_multiple": "parallel_multiple",
    "irrelevance": "irrelevance",
}
DATA = os.path.join(os.path.dirname(bfcl_eval.__file__), "data")


def load(name):
    with open(os.path.join(DATA, name)) as f:
        return [json.loads(line) for line in f if line.strip()]


def cast(properties):
    """BFCL's `_cast_to_openai_type` with `GORILLA_TO_OPENAPI` (the OpenAI handler's)."""
    for key, value in properties.items():
        if "type" not in value:
            value["type"] = "string"
        else:
            t = value["type"]
            if t == "float":
                value["format"] = "float"
                value["description"] = value.get("description", "") + " This is a float type value."
            value["type"] = GORILLA_TO_OPENAPI.get(t, "string")
        if value["type"] in ("array", "object"):
            if "properties" in value:
                value["properties"] = cast(value["properties"])
            elif "items" in value:
                value["items"]["type"] = GORILLA_TO_OPENAPI[value["items"]["type"]]
                inner = value["items"]
                if inner["type"] == "array" and "items" in inner:
                    inner["items"]["type"] = GORILLA_TO_OPENAPI[inner["items"]["type"]]
                elif inner["type"] == "object" and "properties" in inner:
                    inner["properties"] = cast(inner["properties"])
    return properties


def tools_of(functions):
    """BFCL's `convert_to_tool` for OpenAI chat completions."""
    out = []
    for f in copy.deepcopy(functions):
        f["name"] = re.sub(r"\.", "_", f["name"])
        f["parameters"]["type"] = "object"
        f["parameters"]["properties"] = cast(f["parameters"]["properties"])
        out.append({"type": "function", "function": f})
    return out


def ask(client, model, entry, mode, max_tokens):
    tools = tools_of(entry["function"])
    choice, _, par = mode.partition(":")
    extra = {"parallel_tool_calls": par == "parallel"} if par else {}
    t0 = time.time()
    try:
        r = client.chat.completions.create(
            model=model,
            messages=entry["question"][0],
            tools=tools,
            tool_choice=choice,
            temperature=0.0,
            max_tokens=max_tokens,
            **extra,
        )
    except Exception as e:  # a refused request counts as no answer, and is reported
        return {"error": f"{type(e).__name__}: {e}", "calls": None, "seconds": time.time() - t0}
    m = r.choices[0].message
    calls = [(c.function.name, c.function.arguments) for c in (m.tool_calls or [])]
    return {
        "calls": calls,
        "content": m.content,
        "finish": r.choices[0].finish_reason,
        "tokens": r.usage.completion_tokens if r.usage else None,
        "seconds": time.time() - t0,
        "tools": tools,
    }


def schema_valid(calls, tools):
    """(valid, total) over the returned calls: an offered name, arguments that parse and
    validate against its parameters."""
    by_name = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    ok = 0
    for name, args in calls:
        if name not in by_name:
            continue
        try:
            jsonschema.validate(json.loads(args), by_name[name])
            ok += 1
        except Exception:
            pass
    return ok, len(calls)


def score(entry, answer, category, truth):
    calls = answer.get("calls")
    if category == "irrelevance":
        return not calls
    if not calls:
        return False
    try:
        decoded = [{name: json.loads(args)} for name, args in calls]
    except Exception:
        return False
    r = ast_checker(entry["function"], decoded, truth, Language.PYTHON, CATEGORIES[category], "brigade-bench")
    return bool(r["valid"])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", nargs=3, action="append", metavar=("NAME", "URL", "MODE"), required=True)
    ap.add_argument("--categories", default=",".join(CATEGORIES))
    ap.add_argument("--limit", type=int, default=0, help="the first N questions of each category (0: all)")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--out", help="the answers and scores as JSON")
    a = ap.parse_args()
    cats = [c for c in a.categories.split(",") if c]
    for c in cats:
        if c not in CATEGORIES:
            sys.exit(f"unknown category {c!r}; use {', '.join(CATEGORIES)}")
    data = {}
    for c in cats:
        q = load(f"BFCL_v4_{CATEGORIES[c]}.json")
        truth = {} if c == "irrelevance" else {e["id"]: e["ground_truth"] for e in load(f"possible_answer/BFCL_v4_{CATEGORIES[c]}.json")}
        data[c] = (q[: a.limit] if a.limit else q, truth)
    results = {}
    for name, url, mode in a.target:
        client = OpenAI(base_url=url.rstrip("/") + "/v1", api_key="none", timeout=600, max_retries=0)
        model = client.models.list().data[0].id
        key = f"{name} {mode}"
        results[key] = {"server": name, "url": url, "mode": mode, "model": model, "categories": {}}
        for c in cats:
            qs, truth = data[c]
            t0 = time.time()
            with cf.ThreadPoolExecutor(a.concurrency) as pool:
                answers = list(pool.map(lambda e: ask(client, model, e, mode, a.max_tokens), qs))
            right = valid = total = errors = 0
            for e, ans in zip(qs, answers):
                if ans.get("error"):
                    errors += 1
                    continue
                right += score(e, ans, c, truth.get(e["id"]))
                v, n = schema_valid(ans["calls"], ans["tools"])
                valid += v
                total += n
            row = {
                "questions": len(qs),
                "correct": right,
                "accuracy": right / len(qs),
                "calls": total,
                "schema_valid": valid,
                "refused": errors,
                "seconds": time.time() - t0,
            }
            results[key]["categories"][c] = row
            results[key].setdefault("answers", {})[c] = [
                {"id": e["id"], **{k: v for k, v in ans.items() if k != "tools"}} for e, ans in zip(qs, answers)
            ]
            sv = f"{valid}/{total}" if total else "-"
            print(
                f"{name:>16} {mode:>8} {c:>17}: {right:>3}/{len(qs):<3} right ({100 * right / len(qs):5.1f}%), "
                f"schema-valid calls {sv}, refused {errors}, {row['seconds']:.0f} s",
                flush=True,
            )
    print()
    print("| server | tool_choice | " + " | ".join(cats) + " | sum | schema-valid calls |")
    print("|---|---|" + "---|" * (len(cats) + 2))
    for name, r in results.items():
        rows = r["categories"]
        cells = [f"{rows[c]['correct']}/{rows[c]['questions']}" for c in cats]
        s = sum(rows[c]["correct"] for c in cats)
        n = sum(rows[c]["questions"] for c in cats)
        v = sum(rows[c]["schema_valid"] for c in cats)
        t = sum(rows[c]["calls"] for c in cats)
        pct = f"{100 * v / t:.1f}% ({v}/{t})" if t else "-"
        print(f"| {r['server']} | {r['mode']} | " + " | ".join(cells) + f" | **{s}/{n}** ({100 * s / n:.1f}%) | {pct} |")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
