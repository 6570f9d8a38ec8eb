"""What the python tool's bubblewrap jail costs per cell, side by side with running it unconfined.

    python scripts/bench_python_tool.py            # 20 cells per mode, each mode twice, interleaved

Each cell is a trivial print, so the figure is the fixed cost of starting an isolated interpreter
(docs/PERF.md records it; coevo/safety/sandbox/jail.py says what the jail isolates).
"""

from __future__ import annotations

import argparse
import os
import time

from coevo.safety.sandbox import python_tool


def seconds_per_cell(mode: str, cells: int) -> float:
    os.environ["COEVO_PYTHON_ISOLATION"] = mode
    python_tool.isolation.cache_clear()
    python_tool.run_python("pass")  # the probe and a warm start
    start = time.perf_counter()
    for _ in range(cells):
        if python_tool.run_python("print(sum(range(1000)))").stdout != "499500\n":
            raise RuntimeError(f"the cell failed in mode {mode}")
    return (time.perf_counter() - start) / cells


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=20)
    args = parser.parse_args()
    figures: dict[str, list[float]] = {}
    for mode in ("unconfined", "bwrap", "unconfined", "bwrap"):
        figures.setdefault(mode, []).append(seconds_per_cell(mode, args.cells))
    for mode, values in figures.items():
        print(f"{mode}: " + ", ".join(f"{1000 * v:.0f} ms" for v in values) + " per cell")


if __name__ == "__main__":
    main()
