"""mypy over the core packages, held to a checked-in baseline that can only shrink.

The core still has type errors mypy reports (most from before it was checked). Failing CI on all of
them would stop every other change, and checking nothing lets them grow. So each file's count is
held to ``scripts/type_baseline.json``: a file whose count grows, or a new file with errors, fails
the check with its errors printed; a count that shrank is reported, and ``--update`` writes the
smaller baseline (never a larger one).

    python scripts/check_types.py            # exit 1 when a file has more errors than its baseline
    python scripts/check_types.py --update   # after fixing some: lower the baseline to what is left
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASELINE = ROOT / "scripts" / "type_baseline.json"
PACKAGES = ("coevo", "trainers", "buffers", "kernels")
ERROR = re.compile(r"^(?P<file>[^:\s]+\.py):\d+: error: ")


def run_mypy() -> tuple[Counter[str], list[str]]:
    """(errors per file, mypy's error lines); the settings are pyproject.toml's [tool.mypy]."""
    out = subprocess.run([sys.executable, "-m", "mypy", *PACKAGES], cwd=ROOT, capture_output=True, text=True)
    if out.returncode not in (0, 1):  # 2: mypy itself failed (a bad config, a crash)
        sys.exit(f"mypy failed to run (exit {out.returncode}):\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    lines = [line for line in out.stdout.splitlines() if ERROR.match(line)]
    return Counter(ERROR.match(line)["file"] for line in lines), lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--update", action="store_true", help="lower the baseline to the counts found now")
    args = parser.parse_args()
    counts, lines = run_mypy()
    baseline: dict[str, int] = json.loads(BASELINE.read_text()) if BASELINE.exists() else {}
    grown = {f: (baseline.get(f, 0), n) for f, n in counts.items() if n > baseline.get(f, 0)}
    shrunk = {f: (n, counts.get(f, 0)) for f, n in baseline.items() if counts.get(f, 0) < n}
    if grown:
        for f, (was, now) in sorted(grown.items()):
            print(f"{f}: {now} type errors, baseline {was}")
            print("\n".join(f"  {line}" for line in lines if line.startswith(f + ":")))
        sys.exit(f"check_types: {len(grown)} file(s) have more mypy errors than scripts/type_baseline.json allows")
    if shrunk:
        print("fewer type errors than the baseline in: " + ", ".join(f"{f} ({a} -> {b})" for f, (a, b) in
                                                                 sorted(shrunk.items())))
        if args.update:
            BASELINE.write_text(json.dumps({f: n for f, n in sorted(counts.items())}, indent=1) + "\n")
            print(f"wrote {BASELINE.relative_to(ROOT)}")
        else:
            print("lower the baseline with: python scripts/check_types.py --update")
    print(f"check_types: {sum(counts.values())} mypy errors in {len(counts)} files, none above the baseline")


if __name__ == "__main__":
    main()
