#!/usr/bin/env python3
"""Checks the repository's prose: every relative link in README.md, docs/*.md,
crates/*/tests/README.md and scripts/README.md names a file or folder that exists, and a
`#fragment` names a heading of that file (GitHub's slugs); README.md stays a front door of at
most 250 lines. Links out of the repository (`../shared/…`) and to the web are not followed.

Usage: python3 scripts/check_doc_links.py   (exit status 1 on the first run with a problem)
"""

import glob
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README_MAX_LINES = 250
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def anchors(path):
    text = open(path, encoding="utf-8").read()
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    return {slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", text, flags=re.M)}


def main():
    files = ["README.md"] + sorted(glob.glob("docs/*.md", root_dir=ROOT))
    files += sorted(glob.glob("crates/*/tests/README.md", root_dir=ROOT)) + ["scripts/README.md"]
    problems, checked = [], 0
    for rel in files:
        path = os.path.join(ROOT, rel)
        if not os.path.exists(path):
            problems.append(f"{rel}: missing")
            continue
        text = re.sub(r"```.*?```", "", open(path, encoding="utf-8").read(), flags=re.S)
        for m in LINK.finditer(text):
            target = m.group(1)
            if re.match(r"^[a-z]+:", target):
                continue
            file_part, _, frag = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
            if not dest.startswith(ROOT + os.sep):
                continue  # beside the checkout (../shared): not this repository's to check
            checked += 1
            if not os.path.exists(dest):
                problems.append(f"{rel}: link {target!r} names nothing ({os.path.relpath(dest, ROOT)} does not exist)")
            elif frag and (not dest.endswith(".md") or frag not in anchors(dest)):
                problems.append(f"{rel}: link {target!r}: no heading #{frag} in {os.path.relpath(dest, ROOT)}")
    lines = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read().count("\n")
    if lines > README_MAX_LINES:
        problems.append(f"README.md: {lines} lines, more than {README_MAX_LINES}")
    for p in problems:
        print(p)
    print(f"{checked} links in {len(files)} files checked; README.md {lines} lines; {len(problems)} problem(s)")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
