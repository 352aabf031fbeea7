"""Checks the Makefile and the shell scripts for a pipe into a reader that may stop early
(`| grep -q`, `| grep -m`, `| head`): under `set -o pipefail` (the Makefile's .SHELLFLAGS,
every script's `set -euo pipefail`) the pipeline fails when the writer dies of SIGPIPE after
the reader has gone, though the text matched; a loaded machine makes that race likely.
Capture the output first, then match: `out=$(cmd); grep -q X <<<"$out"`.
Run from anywhere: python3 tests/check_pipes.py"""

import glob
import os
import re
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
EARLY_READER = re.compile(r"\|\s*(grep\s+(-\w*[qm]\w*)|head\b)")


def problems():
    files = ["Makefile"] + sorted(
        os.path.relpath(p, ROOT)
        for pattern in ("**/*.sh", ".ci/*")
        for p in glob.glob(os.path.join(ROOT, pattern), recursive=True)
        if "/target/" not in p and "/.venv" not in p
    )
    found = []
    for name in files:
        with open(os.path.join(ROOT, name), encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if line.lstrip().startswith("#"):
                    continue
                if EARLY_READER.search(line):
                    found.append(f"{name}:{number}: a pipe into a reader that may stop early: {line.strip()}")
    return found


if __name__ == "__main__":
    found = problems()
    for p in found:
        print(p, file=sys.stderr)
    sys.exit(1 if found else 0)
