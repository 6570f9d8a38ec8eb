"""Run a command and sample the resident memory of its whole process tree every ``--every`` seconds.

The loop records each phase's exact peak itself (``rounds.jsonl``'s ``peak_rss_mb``); this is the
outside view: one line per sample (seconds since start, MB of the tree) in ``--out``, and the peak
printed when the command ends, with its exit status passed on.

    python scripts/rss_trace.py --out runs/X/rss.tsv -- python train.py experiment=distill_nearest seed=3
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path


def tree_rss_mb(root: int) -> float:
    """Resident MB (10^6 bytes) of ``root`` and every descendant, read from /proc."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid, ppid, pages = int(entry), int(fields[1]), int(fields[21])
        children.setdefault(ppid, []).append(pid)
        rss[pid] = pages
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        todo += children.get(pid, [])
    return total * os.sysconf("SC_PAGE_SIZE") / 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="where the samples go (seconds, MB per line)")
    parser.add_argument("--every", type=float, default=1.0, help="seconds between samples (default 1)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given (put it after --)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    start, peak = time.monotonic(), 0.0
    proc = subprocess.Popen(command)
    with args.out.open("w") as out:
        while proc.poll() is None:
            mb = tree_rss_mb(proc.pid)
            peak = max(peak, mb)
            out.write(f"{time.monotonic() - start:.1f}\t{mb:.0f}\n")
            out.flush()
            time.sleep(args.every)
    print(f"peak RSS of the process tree: {peak:.0f} MB (sampled every {args.every:g} s)", file=sys.stderr)
    return proc.returncode


if __name__ == "__main__":
    raise SystemExit(main())
