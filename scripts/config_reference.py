"""Write docs/config.md, the config reference, from the schema (coevo/config/schema.py) and configs/.

    python scripts/config_reference.py           # (re)write docs/config.md
    python scripts/config_reference.py --check   # exit 1 when docs/config.md is out of date

tests/test_config_show.py fails when the file is stale, so run this after changing a field, its
help text or a config file.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from coevo.config.show import REFERENCE_DOC, reference_markdown


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check that the file is up to date")
    parser.add_argument("--out", type=Path, default=REFERENCE_DOC, help=f"where to write (default {REFERENCE_DOC})")
    args = parser.parse_args(argv)
    text = reference_markdown()
    current = args.out.read_text() if args.out.is_file() else None
    if args.check:
        if current != text:
            print(f"{args.out} is out of date; run python scripts/config_reference.py", file=sys.stderr)
            return 1
        return 0
    if current != text:
        args.out.write_text(text)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
