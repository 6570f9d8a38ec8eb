"""Every multi-process test, launched again and again beside a CPU hog: does any rank ever abort?

    python scripts/stress_launches.py                      # 20 rounds of every multi-process test, hog on
    python scripts/stress_launches.py --repeats 5 --hog 6  # fewer rounds; 6 busy processes
    python scripts/stress_launches.py --probe-only         # only the gloo probe (a minute): the abort's mechanism

A multi-process run that leaves its gloo process group to interpreter shutdown can abort after its
work is done ("terminate called without an active exception", exit -6), and more often on a loaded
machine. Each round runs the two-rank tests (DDP, FSDP2 and ZeRO-3, full and LoRA, checkpoint and
resume, ``train.py`` under ZeRO-3) through pytest while ``--hog`` busy-looping processes keep the load
above twice the cores, and counts, per test, passes, failures and aborts (a failure whose output
names the abort). Before the rounds, the probe launches two gloo ranks that gather asynchronously
and exit, ``--probe-repeats`` times each with and without ``coevo.loop.launch.torn_down_on_exit``:
the arm without it shows that this machine and load reproduce the abort at all, so zero aborts in
the tests mean something.

Writes ``OUT/stress.json`` and ``OUT/stress.md`` (the table docs/RELIABILITY.md quotes); progress on stdout.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ["tests/trainers/test_distributed.py", "tests/trainers/test_fsdp.py", "tests/trainers/test_zero3.py"]
ABORT = re.compile(r"terminate called|exitcode: -6|SIGABRT")


def busy() -> None:
    while True:
        pass


def probe_rank(teardown: bool) -> None:
    """One rank of the probe (started by torchrun): a few async all-gathers and an all-reduce on gloo, then exit."""
    import torch
    import torch.distributed as dist
    from accelerate import Accelerator

    from coevo.loop.launch import torn_down_on_exit

    accelerator = Accelerator(cpu=True)  # gloo under torchrun, as the tests' launches

    def work() -> None:
        x = torch.randn(4096)
        outs = [torch.empty(4096) for _ in range(dist.get_world_size())]
        for handle in [dist.all_gather(outs, x, async_op=True) for _ in range(4)]:
            handle.wait()
        dist.all_reduce(x)

    if teardown:
        with torn_down_on_exit(accelerator):
            work()
    else:
        work()


def run_probe(repeats: int, port: int) -> dict[str, dict[str, int]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    counts = {}
    for arm, flag in (("without teardown", "--probe-rank-bare"), ("torn_down_on_exit", "--probe-rank")):
        aborts = failures = 0
        for i in range(repeats):
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                   str(port + i % 50), __file__, flag]
            done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
            if done.returncode != 0:
                failures += 1
                aborts += bool(ABORT.search(done.stderr))
        counts[arm] = {"launches": repeats, "aborts": aborts, "failures": failures}
        print(f"probe {arm}: {aborts} aborts, {failures} failures in {repeats} launches", flush=True)
    return counts


def run_round(tests: list[str], keyword: str | None, xml: Path) -> list[dict]:
    """One pytest run of the multi-process tests; per test: name, outcome, abort, seconds."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}", *tests]
    if keyword:
        cmd += ["-k", keyword]
    subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    rows = []
    for case in ET.parse(xml).getroot().iter("testcase"):
        failed = case.find("failure") is not None or case.find("error") is not None
        skipped = case.find("skipped") is not None
        text = "".join((e.text or "") + (e.get("message") or "") for e in case)
        module = (case.get("classname") or "").rsplit(".", 1)[-1]  # junit's classname: tests.trainers.test_zero3
        rows.append({"test": f"{module}::{case.get('name')}",
                     "outcome": "skipped" if skipped else "failed" if failed else "passed",
                     "abort": bool(failed and ABORT.search(text)), "seconds": float(case.get("time", 0))})
    return rows


def summarise(rounds: list[list[dict]]) -> dict[str, dict]:
    table: dict[str, dict] = {}
    for rows in rounds:
        for r in rows:
            t = table.setdefault(r["test"], {"runs": 0, "passed": 0, "failed": 0, "aborts": 0, "seconds": 0.0})
            t["runs"] += r["outcome"] != "skipped"
            t["passed"] += r["outcome"] == "passed"
            t["failed"] += r["outcome"] == "failed"
            t["aborts"] += r["abort"]
            t["seconds"] += r["seconds"]
    return table


def markdown(table: dict[str, dict], probe: dict, load: list[float], hog: int, command: str) -> str:
    lines = [f"`{command}`: {hog} busy processes beside the tests on {os.cpu_count()} cores; 1-minute load "
             f"average sampled each round: min {min(load, default=0):.1f}, mean {sum(load) / max(len(load), 1):.1f}.",
             "", "| launch | runs | passed | failed | aborts | mean s |", "|---|---|---|---|---|---|"]
    for arm, c in probe.items():
        lines.append(f"| gloo probe, {arm} | {c['launches']} | {c['launches'] - c['failures']} | {c['failures']} | "
                     f"{c['aborts']} | |")
    for name, t in table.items():
        lines.append(f"| `{name}` | {t['runs']} | {t['passed']} | {t['failed']} | {t['aborts']} | "
                     f"{t['seconds'] / max(t['runs'], 1):.0f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    if len(sys.argv) == 2 and sys.argv[1] in ("--probe-rank", "--probe-rank-bare"):
        return probe_rank(teardown=sys.argv[1] == "--probe-rank")
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=20, help="rounds of every multi-process test")
    ap.add_argument("--hog", type=int, default=2 * (os.cpu_count() or 1) + 2,
                    help="busy-looping processes beside the tests (0: none)")
    ap.add_argument("--probe-repeats", type=int, default=20)
    ap.add_argument("--probe-only", action="store_true")
    ap.add_argument("-k", dest="keyword", help="pytest -k expression to run a subset of the tests")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "stress")
    args = ap.parse_args()
    if args.repeats < 1 or args.hog < 0 or args.probe_repeats < 0:
        ap.error("--repeats must be >= 1, --hog and --probe-repeats >= 0")
    args.out.mkdir(parents=True, exist_ok=True)
    command = "python scripts/stress_launches.py " + " ".join(sys.argv[1:])
    hogs = [multiprocessing.Process(target=busy, daemon=True) for _ in range(args.hog)]
    for h in hogs:
        h.start()
    rounds: list[list[dict]] = []
    load: list[float] = []
    try:
        time.sleep(5 if hogs else 0)  # let the load average climb before the first launch
        load.append(os.getloadavg()[0])
        probe = run_probe(args.probe_repeats, 29800) if args.probe_repeats else {}
        load.append(os.getloadavg()[0])
        for i in range([args.repeats, 0][args.probe_only]):
            start = time.time()
            rows = run_round(TESTS, args.keyword, args.out / f"round{i}.xml")
            load.append(os.getloadavg()[0])
            rounds.append(rows)
            bad = [r["test"] for r in rows if r["outcome"] == "failed"]
            print(f"round {i + 1}/{args.repeats}: {sum(r['outcome'] == 'passed' for r in rows)} passed, "
                  f"{len(bad)} failed ({sum(r['abort'] for r in rows)} aborts) in {time.time() - start:.0f} s, "
                  f"load {load[-1]:.1f}{': ' + ', '.join(bad) if bad else ''}", flush=True)
            table = summarise(rounds)
            (args.out / "stress.json").write_text(json.dumps({"command": command, "hog": args.hog, "load": load,
                                                              "probe": probe, "tests": table}, indent=1))
            (args.out / "stress.md").write_text(markdown(table, probe, load, args.hog, command))
        if args.probe_only:
            (args.out / "stress.md").write_text(markdown({}, probe, load, args.hog, command))
    finally:
        for h in hogs:
            h.terminate()
    print((args.out / "stress.md").read_text())


if __name__ == "__main__":
    main()
