#!/usr/bin/env python3
"""Runs the README's CLI tour as written and fails on any error.

Every command of the ```sh block under "## CLI tour" is run, in order, in a scratch
directory laid out like a checkout beside ../shared: `brigade` is the built binary on PATH,
`examples/` is the repository's, and the files the tour names are made first (corpus.txt
and docs.txt from the repository's own text, tokenizer.json the shared GPT-2 tokenizer,
*.jsonl documents and chat.jsonl conversations, `M` the shared all-MiniLM-L6-v2). `path/to/hf-gpt2` and `path/to/hf-llama`
are the tour's own checkpoints runs/text and runs/llama (brigade writes Hugging Face
folders). A `brigade serve` line starts the server in the background and waits for /ready;
the servers are stopped at the end. `brigade route` and `mpirun … brigade serve` lines are
servers too. A `curl` line gets `-sS --fail-with-body` (an HTTP error
fails it). A comment `# → TEXT` is checked: the command's output must contain TEXT.
mpirun gets Open MPI's run-as-root and oversubscribe settings through the environment.

Nothing is skipped silently: `--skip-bench` leaves out the `brigade bench` lines (CI measures
them elsewhere), `--skip-mpi` the mpirun lines, and each left-out line is printed.

Usage: scripts/readme_tour.py [--bin target/release/brigade] [--skip-bench] [--skip-mpi]
"""

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def split_comment(line):
    """(code, comment): the comment starts at a '#' that begins a word outside quotes."""
    quote = None
    for i, c in enumerate(line):
        if quote:
            if c == quote:
                quote = None
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i], line[i + 1 :].strip()
    return line, ""


def tour_commands(readme):
    """(command text, argv, trailing comment) for each command of the tour's sh block."""
    text = open(readme, encoding="utf-8").read()
    start = text.index("## CLI tour")
    block = text[text.index("```sh\n", start) + 6 :]
    block = block[: block.index("```")]
    logical, cur = [], ""
    for line in block.splitlines():
        if cur:
            cur += " " + line.strip()
        else:
            cur = line
        if cur.rstrip().endswith("\\"):
            cur = cur.rstrip()[:-1]
            continue
        logical.append(cur)
        cur = ""
    out = []
    for line in logical:
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        code, comment = split_comment(line)
        argv = shlex.split(code)
        if argv:
            out.append((code.strip(), argv, comment))
    return out


def corpus_text():
    parts = [open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()]
    docs = os.path.join(ROOT, "docs")
    for name in sorted(os.listdir(docs)):
        if name.endswith(".md"):
            parts.append(open(os.path.join(docs, name), encoding="utf-8").read())
    return "\n".join(parts)


def prepare(work, shared):
    os.symlink(os.path.join(ROOT, "examples"), os.path.join(work, "examples"))
    text = corpus_text()
    with open(os.path.join(work, "corpus.txt"), "w", encoding="utf-8") as f:
        f.write(text)
    lines = [l.strip() for l in text.splitlines() if len(l.strip()) > 20][:600]
    with open(os.path.join(work, "docs.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    for name, part in [("a.jsonl", lines[:200]), ("b.jsonl", lines[200:400]), ("corpus.jsonl", lines)]:
        with open(os.path.join(work, name), "w", encoding="utf-8") as f:
            for i, l in enumerate(part):
                f.write(json.dumps({"id": f"{name}:{i}", "text": l}) + "\n")
    # conversations to fine-tune on: a line of the text asked for, the next one answered
    with open(os.path.join(work, "chat.jsonl"), "w", encoding="utf-8") as f:
        for q, a in zip(lines[0:80:2], lines[1:80:2]):
            messages = [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
            f.write(json.dumps({"messages": messages}) + "\n")
    shutil.copy(os.path.join(shared, "tokenizers", "gpt2", "tokenizer.json"), os.path.join(work, "tokenizer.json"))
    os.symlink(os.path.join(shared, "models", "all-MiniLM-L6-v2"), os.path.join(work, "M"))


# folders the tour names as someone's Hugging Face models: the tour's own checkpoints
STAND_INS = {"path/to/hf-gpt2": "runs/text", "path/to/hf-llama": "runs/llama"}


def port_of(argv):
    for i, a in enumerate(argv):
        if a == "--port" and i + 1 < len(argv):
            return int(argv[i + 1])
        if a.startswith("--port="):
            return int(a.split("=", 1)[1])
    return 8000


def wait_ready(port, proc, limit=300):
    t0 = time.time()
    while time.time() - t0 < limit:
        if proc.poll() is not None:
            return f"exited with status {proc.returncode} before it was ready"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=2) as r:
                if r.status == 200:
                    return None
        except Exception:
            pass
        time.sleep(0.2)
    return f"not ready after {limit} s"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "target", "release", "brigade"))
    ap.add_argument("--skip-bench", action="store_true")
    ap.add_argument("--skip-mpi", action="store_true")
    ap.add_argument("--timeout", type=float, default=900, help="seconds one command may take")
    args = ap.parse_args()
    binary = os.path.abspath(args.bin)
    if not os.access(binary, os.X_OK):
        sys.exit(f"no brigade binary at {binary}; run cargo build --release first (or give --bin)")
    shared = os.path.abspath(os.path.join(ROOT, "..", "shared"))
    if not os.path.isdir(shared):
        sys.exit(f"the tour needs ../shared beside the checkout ({shared} is missing)")
    scratch = tempfile.mkdtemp(prefix="brigade-tour-")
    work = os.path.join(scratch, "brigade")
    os.mkdir(work)
    os.symlink(shared, os.path.join(scratch, "shared"))
    prepare(work, shared)
    bindir = os.path.join(scratch, "bin")
    os.mkdir(bindir)
    os.symlink(binary, os.path.join(bindir, "brigade"))
    env = dict(os.environ)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    env.update(
        OMPI_ALLOW_RUN_AS_ROOT="1",
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
        OMPI_MCA_rmaps_base_oversubscribe="1",
    )
    servers, results, failed = [], [], False
    try:
        for text, argv, comment in tour_commands(os.path.join(ROOT, "README.md")):
            is_bench = argv[:2] == ["brigade", "bench"]
            if (is_bench and args.skip_bench) or (argv[0] == "mpirun" and args.skip_mpi):
                print(f"skipped ({'--skip-bench' if is_bench else '--skip-mpi'}): {text}", flush=True)
                results.append((text, "skipped", 0.0))
                continue
            for a in argv:
                if a in STAND_INS and not os.path.exists(os.path.join(work, a)):
                    shutil.copytree(os.path.join(work, STAND_INS[a]), os.path.join(work, a))
            run = list(argv)
            if run[0] == "curl":
                run[1:1] = ["-sS", "--fail-with-body", "--max-time", "300"]
            print(f"$ {text}", flush=True)
            t0 = time.time()
            # servers (brigade serve, brigade route, and serve under mpirun) run in the background
            long_running = argv[:2] in (["brigade", "serve"], ["brigade", "route"]) or (
                argv[0] == "mpirun" and "serve" in argv and "brigade" in argv
            )
            if long_running:
                log = open(os.path.join(scratch, f"serve-{len(servers)}.log"), "w")
                p = subprocess.Popen(run, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT)
                servers.append(p)
                why = wait_ready(port_of(argv), p)
                ok = why is None
                out = why or "ready"
            else:
                try:
                    r = subprocess.run(run, cwd=work, env=env, capture_output=True, text=True, timeout=args.timeout)
                    out = r.stdout + r.stderr
                    ok = r.returncode == 0
                    if not ok:
                        out += f"\n(exit status {r.returncode})"
                except subprocess.TimeoutExpired as e:
                    out, ok = f"timed out after {args.timeout} s: {(e.stdout or b'')[-2000:]!r}", False
                m = re.match(r"→\s*(.+)", comment)
                if ok and m and m.group(1).strip() not in out:
                    out += f"\n(the README promises output containing {m.group(1).strip()!r})"
                    ok = False
            secs = time.time() - t0
            tail = "\n".join(out.strip().splitlines()[-6:])
            print(("  ok" if ok else "  FAILED") + f" in {secs:.1f} s\n" + "\n".join("    " + l for l in tail.splitlines()), flush=True)
            results.append((text, "ok" if ok else "FAILED", secs))
            failed |= not ok
    finally:
        for p in servers:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in servers:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
    print("\nthe README's tour:")
    for text, status, secs in results:
        print(f"  {status:8} {secs:7.1f} s  {text[:100]}")
    total = sum(s for _, _, s in results)
    print(f"{sum(1 for r in results if r[1] == 'ok')} ran, {sum(1 for r in results if r[1] == 'skipped')} skipped, "
          f"{sum(1 for r in results if r[1] == 'FAILED')} failed, {total:.0f} s")
    if failed:
        print(f"scratch directory kept: {scratch}")
        sys.exit(1)
    shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
