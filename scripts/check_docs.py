"""Fail when prose states a figure that can drift: a test count or a running time outside the records
that carry their own command and commit (docs/PERF.md, docs/RESULTS.md, docs/RELIABILITY.md).

Measured figures live in those records, next to the command that measured them, so rerunning the
command is how they are checked; everywhere else (README, CONTRIBUTING, the other docs, train.py's
usage, the configs' comments and hence docs/config.md) points at them instead of quoting them. Run
by ``make lint``:

    python scripts/check_docs.py
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORDS = {"docs/PERF.md", "docs/RESULTS.md", "docs/RELIABILITY.md"}
"""The measurement records: every figure in them sits beside its command (and the commit it ran at)."""
DRIFTING = [
    (re.compile(r"\b\d[\d,]*\s+tests\b"), "a test count"),
    (re.compile(r"\b\d[\d,]*\s+passed\b"), "a test count"),
    (re.compile(r"(~|≈|about |under |within |<\s?)\d+(\.\d+)?\s*(s|sec|seconds?|min|minutes?|h|hours?)\b",
                re.IGNORECASE), "a running time"),
    (re.compile(r"\b\d+(\.\d+)?\s*(to|-|–)\s*\d+(\.\d+)?\s*(minutes|min)\b"), "a running time"),
    (re.compile(r"under a minute", re.IGNORECASE), "a running time"),
]


def checked_files(root: Path = ROOT) -> list[Path]:
    """README, CONTRIBUTING, train.py, docs/*.md but the records, and every config file."""
    files = [root / "README.md", root / "CONTRIBUTING.md", root / "train.py"]
    files += [p for p in sorted((root / "docs").glob("*.md")) if str(p.relative_to(root)) not in RECORDS]
    files += sorted((root / "configs").rglob("*.yaml"))
    return [p for p in files if p.is_file()]


def drifting_figures(text: str) -> list[tuple[int, str, str]]:
    """(line number, what, the matched text) of every figure ``DRIFTING`` finds in ``text``."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for pattern, what in DRIFTING:
            found += [(number, what, m.group(0)) for m in pattern.finditer(line)]
    return found


def main(root: Path = ROOT) -> int:
    problems = [f"{path.relative_to(root)}:{number}: {what} ({text!r}); put it in a record "
                f"({', '.join(sorted(RECORDS))}) beside its command and point there"
                for path in checked_files(root) for number, what, text in drifting_figures(path.read_text())]
    for line in problems:
        print(line, file=sys.stderr)
    print(f"check_docs: {len(problems)} figure(s) that can drift", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
