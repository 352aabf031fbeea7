"""Checks README.md and docs/*.md: every relative link resolves to a file (and a heading, for
`file.md#anchor`), no line over 400 characters, no process language or references to files
outside the repository. Run from anywhere: python3 tests/check_docs.py"""

import os
import re
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
MAX_LINE = 400
FORBIDDEN = re.compile(r"\bthis (work|session)\b|throwaway|the final code|FACTS\.md|shared/", re.I)
FENCE = re.compile(r"```.*?```", re.S)


def slug(heading):
    """GitHub's anchor for a heading: lower case, backticks dropped, spaces to '-'."""
    text = heading.strip().lower().replace("`", "")
    return "".join(c if c.isalnum() or c in "-_" else "-" if c == " " else "" for c in text)


def anchors(path):
    with open(path, encoding="utf-8") as f:
        text = FENCE.sub("", f.read())
    return {slug(h) for h in re.findall(r"^#+\s+(.*)$", text, re.M)}


def problems():
    docs = os.path.join(ROOT, "docs")
    files = ["README.md"] + sorted(
        os.path.join("docs", f) for f in os.listdir(docs) if f.endswith(".md")
    )
    for name in files:
        path = os.path.join(ROOT, name)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for n, line in enumerate(text.splitlines(), 1):
            if len(line) > MAX_LINE:
                yield f"{name}:{n}: {len(line)} characters (at most {MAX_LINE})"
            if FORBIDDEN.search(line):
                yield f"{name}:{n}: {FORBIDDEN.search(line).group()!r}: say what the product does"
        for target in re.findall(r"\]\(([^)\s]+)\)", FENCE.sub("", text)):
            if re.match(r"[a-z]+:", target):
                continue
            file_part, _, fragment = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
            if not os.path.exists(dest):
                yield f"{name}: link {target}: no such file"
            elif fragment and dest.endswith(".md") and fragment not in anchors(dest):
                yield f"{name}: link {target}: no such heading"


if __name__ == "__main__":
    found = list(problems())
    for p in found:
        print(p, file=sys.stderr)
    sys.exit(1 if found else 0)
