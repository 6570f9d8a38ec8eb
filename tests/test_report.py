"""The run report against synthetic run directories written to the spec in docs/run-directory.md.

``fabricate_run`` writes five rounds of a coevolve run with two variants (``v1`` spawned in round
1), shipped, spawned and rejected verdicts, validation on rounds 1 and 4 and a final test record.
It also returns what each verdict is meant to be, so the expected counts do not go through the
report's own classification.
"""

from __future__ import annotations

import io
import json
import math
import random
import re
import struct
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from coevo.harness.edits import Edit
from coevo.report.data import Run, lineage_layout, load_run, task_matrix
from coevo.report.summary import round_table, write_report
from coevo.rundir.evolve_records import Outcome, Proposal, QualityReport, Verdict
from coevo.rundir.records import GRPOMetrics, LineageRow, RoundRecord, StepMetrics

H0, H1, H2, H3, H4 = (c * 16 for c in "abcde")
PHASES = ("rollout", "logprobs", "digest", "plan", "critic", "grpo", "eval", "checkpoint", "other")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _outcomes(rng: random.Random, task_ids: list[str], attempts: int) -> dict[str, list[bool]]:
    return {t: [rng.random() < 0.5 for _ in range(attempts)] for t in task_ids}


def _evaluation(outcomes: dict[str, list[bool]], k: int) -> dict[str, Any]:
    n = len(outcomes)
    return {"pass_at_1": sum(sum(o) / len(o) for o in outcomes.values()) / n,
            "pass_at_k": sum(any(o) for o in outcomes.values()) / n, "k": k, "outcomes": outcomes}


def _verdict(r: int, variant: str, parent: str, candidate: str | None, ship: bool, gate: str, edit: Edit,
             reason: str, f2p: list[str], p2f: list[str]) -> dict[str, Any]:
    proposal = {"hypothesis": f"fix {gate} round {r}", "dimension": "context_assembly", "cluster": "wrong_answer",
                "target_tasks": f2p, "predicted_flips": f2p, "at_risk": [], "source": "rule", "revision": 0,
                "edits": [edit.to_dict()], "variant": variant}
    return {"proposal": proposal, "parent_id": parent, "candidate_id": candidate, "variant": variant, "ship": ship,
            "reason": reason, "quality": None, "before": {}, "after": {}, "fail_to_pass": f2p, "pass_to_fail": p2f,
            "gate": gate, "round": r}


LONG_REASON = "leaked answer | " + "the prompt grew past the bloat threshold " * 6

# round -> [(status, verdict)] ; status is what the fabricated verdict is meant to be
PLAN = {
    0: [("shipped", _verdict(0, "base", H0, H1, True, "seesaw", Edit("insert", "few_shot", spec={"kind": "few_shot"}),
                             "improves", ["t2"], [])),
        ("rejected", _verdict(0, "base", H1, "f" * 16, False, "seesaw", Edit("set_param", "step_budget",
                                                                             param="max_steps", value=4),
                              "t5 broke", ["t1"], ["t5", "t6"]))],
    1: [("spawned", _verdict(1, "base", H1, H2, False, "seesaw", Edit("insert", "calc_hint", spec={"kind": "few_shot"}),
                             "mixed; kept as variant v1 for t8", ["t8"], ["t9"])),
        ("rejected", _verdict(1, "base", H1, None, False, "quality", Edit("remove", "system_prompt"),
                              LONG_REASON, [], []))],
    2: [],
    3: [("shipped", _verdict(3, "base", H1, H4, True, "performance",
                             Edit("replace", "system_prompt", spec={"kind": "system_prompt"}), "better batch", [], [])),
        ("rejected", _verdict(3, "v1", H2, "9" * 16, False, "performance", Edit("set_param", "sampling",
                                                                                param="top_p", value=0.9),
                              "worse on recent batch", [], ["t3"]))],
    4: [("shipped", _verdict(4, "v1", H2, H3, True, "seesaw", Edit("set_param", "sampling", param="temperature",
                                                                    value=0.3), "fixes t10", ["t10"], []))],
}
VARIANTS = {0: {"base": H1}, 1: {"base": H1, "v1": H2}, 2: {"base": H1, "v1": H2}, 3: {"base": H4, "v1": H2},
            4: {"base": H4, "v1": H3}}
LINEAGE = [
    {"id": H0, "parent_id": None, "round": -1, "variant": "base", "how": "start", "edits": [], "hypothesis": ""},
    {"id": H1, "parent_id": H0, "round": 0, "variant": "base", "how": "shipped",
     "edits": ["insert few_shot"], "hypothesis": "fix seesaw round 0"},
    {"id": H2, "parent_id": H1, "round": 1, "variant": "v1", "how": "spawned",
     "edits": ["insert calc_hint (few_shot)"], "hypothesis": "fix seesaw round 1"},
    {"id": H4, "parent_id": H1, "round": 3, "variant": "base", "how": "shipped",
     "edits": ["replace system_prompt (system_prompt)"], "hypothesis": "fix performance round 3"},
    {"id": H3, "parent_id": H2, "round": 4, "variant": "v1", "how": "shipped",
     "edits": ["set_param sampling.temperature"], "hypothesis": "fix seesaw round 4"},
]
VAL_ROUNDS = (1, 4)
LOSSLESS_ROUND = 3  # its GRPO dict has no loss (no step ran)


def fabricate_records(n_val_tasks: int = 10, seed: int = 0) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    records = []
    for r in range(5):
        batch = [f"t{(6 * r + i) % 12 + 1}" for i in range(6)]
        train = _outcomes(rng, batch, 3)
        if r == 2:
            train["t4"] = [False, True, True]
        variants = VARIANTS[r]
        if r < 2:  # v1 is spawned in round 1, so only base ran rounds 0 and 1
            split = {"base": batch}
        else:
            split = {"base": batch[0::2], "v1": batch[1::2]}
        by_variant = {v: {"pass_rate": sum(sum(train[t]) for t in ts) / (3 * len(ts)), "n_traces": 3 * len(ts)}
                      for v, ts in split.items()}
        val = test = None
        seconds = {k: round(rng.uniform(0.5, 20.0), 3) for k in ("rollout", "digest", "plan", "critic", "checkpoint")}
        seconds["logprobs"] = 1.25 * (r + 1)
        seconds["grpo"] = 10.0 + r
        if r in VAL_ROUNDS:
            tasks = [f"val-{i}" for i in range(1, n_val_tasks + 1 if r == 1 else n_val_tasks + 2)]
            outcomes = _outcomes(rng, tasks, 3)
            outcomes["val-3"] = [True, False, True] if r == 1 else [False, False, False]
            val = _evaluation(outcomes, 3)
            seconds["eval"] = 7.5
        if r == 4:
            test = _evaluation(_outcomes(rng, [f"test-{i}" for i in range(6)], 3), 3)
            seconds["eval"] += 4.0
        seconds["other"] = 0.75
        seconds["total"] = sum(seconds.values())
        evolve = {"round": r, "digests": [], "verdicts": [v for _, v in PLAN[r]],
                  "shipped": [v["candidate_id"] for s, v in PLAN[r] if s == "shipped"],
                  "spawned": ["v1"] if r == 1 else [], "warnings": [], "stopped": None, "seconds": {}}
        step = StepMetrics(loss=0.5 / (r + 1), clip_fraction=0.1, kl=0.01, ratio_mean=1.0, ratio_min=0.9,
                           ratio_max=1.1, advantage_mean=0.0, advantage_std=1.0, zero_variance_fraction=0.2,
                           excluded_traces=0, infra_traces=0, sequences=18, tokens=900, tokens_per_s=50.0,
                           grad_norm=0.3, lr=1e-5, staleness={0: 18})
        grpo = GRPOMetrics(buffer_traces=18, steps=[] if r == LOSSLESS_ROUND else [step]).to_dict()
        meta = {"plan": {"calls": r + 1, "cached": 0, "prompt_tokens": 100 * (r + 1), "completion_tokens": 40 * (r + 1),
                         "seconds": 0.5 * (r + 1)},
                "revise": {"calls": 1, "cached": 1, "prompt_tokens": 30, "completion_tokens": 10, "seconds": 0.25}}
        meta["total_tokens"] = sum(u["prompt_tokens"] + u["completion_tokens"] for u in meta.values())
        records.append({
            "round": r, "mode": "coevolve", "model_version": r, "seconds": seconds,
            "train": {"pass_rate": sum(map(sum, train.values())) / 18, "mean_reward": 0.4, "n_traces": 18,
                      "outcomes": train},
            "val": val, "test": test, "variants": dict(variants), "by_variant": by_variant, "evolve": evolve,
            "grpo": grpo, "meta_tokens": meta, "buffer": {"size": 18 * (r + 1), "lag": min(r, 2)},
        })
    return json.loads(json.dumps(records))  # a deep copy: tests mutate records, PLAN stays as written


def write_run(run_dir: Path, records: list[dict[str, Any]], lineage: list[dict[str, Any]] = LINEAGE) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run_dir / "lineage.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lineage))
    return run_dir


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    records = fabricate_records()
    shuffled = [records[i] for i in (3, 0, 4, 1, 2)]  # the reader sorts by round
    return write_run(tmp_path_factory.mktemp("run"), shuffled)


@pytest.fixture(scope="module")
def report_dir(run_dir: Path) -> Path:
    return write_report(run_dir)


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


# ------------------------------------------------------------------------------------------ loading
def test_load_run_sorts_rounds_and_keeps_lineage(run_dir: Path):
    run = load_run(run_dir)
    assert run.rounds == [0, 1, 2, 3, 4]
    assert run.modes == ["coevolve"]
    assert [e.id for e in run.lineage] == [H0, H1, H2, H4, H3]
    assert run.records[4].test.k == 3
    assert run.records == [RoundRecord.from_dict(r) for r in fabricate_records()]
    assert [e.to_dict() for e in run.lineage] == LINEAGE


def test_missing_or_empty_rounds_say_no_completed_round(tmp_path: Path):
    with pytest.raises(ValueError, match="no completed round yet"):
        load_run(tmp_path)
    (tmp_path / "rounds.jsonl").write_text("\n  \n")
    with pytest.raises(ValueError, match="no completed round yet"):
        load_run(tmp_path)
    with pytest.raises(ValueError, match="does not exist"):
        load_run(tmp_path / "nope")


def test_missing_lineage_file_reads_as_empty_lineage(tmp_path: Path):
    write_run(tmp_path, fabricate_records())
    (tmp_path / "lineage.jsonl").unlink()
    assert load_run(tmp_path).lineage == []


def _broken(tmp_path: Path, line: int, change) -> Path:
    records = fabricate_records()
    change(records[line - 1])
    return write_run(tmp_path, records)


@pytest.mark.parametrize("line, change, message", [
    (2, lambda r: r.pop("train"), "required field 'train' is missing"),
    (3, lambda r: r["train"].pop("outcomes"), "required field 'train.outcomes' is missing"),
    (1, lambda r: r.update(mode="solo"),
     "field 'mode' must be one of ('coevolve', 'harness_only', 'model_only', 'static'), got 'solo'"),
    (4, lambda r: r["train"].update(pass_rate="0.5"), "field 'train.pass_rate' must be int or float, got str"),
    (5, lambda r: r["val"].pop("pass_at_1"), "required field 'val.pass_at_1' is missing"),
    (1, lambda r: r["evolve"]["verdicts"][1].pop("ship"), "required field 'evolve.verdicts[1].ship' is missing"),
    (2, lambda r: r["evolve"]["verdicts"][0]["proposal"]["edits"][0].update(op="rename"),
     "field 'evolve.verdicts[0].proposal.edits[0]' is not an edit"),
    (3, lambda r: r["seconds"].update(rollout=True), "field 'seconds.rollout' must be int or float, got bool"),
    (4, lambda r: r["train"]["outcomes"].update(t1=[1, 0]), "field 'train.outcomes.t1[0]' must be bool, got int"),
    (2, lambda r: r.update(round=0), "round 0 repeats the record on line 1"),
    (3, lambda r: r.update(model_version=2.0), "field 'model_version' must be int, got float"),
    (4, lambda r: r["infra_failures"].update(count=-1) if r.get("infra_failures") else r.update(
        infra_failures={"count": -1, "by_source": {}, "trace_ids": []}), "field 'infra_failures.count' must be >= 0"),
    (1, lambda r: r["evolve"]["verdicts"][0].update(undecided=True),
     "field 'evolve.verdicts[0]' is both shipped and undecided"),
    (1, lambda r: r["evolve"]["verdicts"][0]["proposal"].pop("edits"),
     "required field 'evolve.verdicts[0].proposal.edits' is missing"),
])
def test_bad_round_record_names_file_line_and_field(tmp_path: Path, line: int, change, message: str):
    run_dir = _broken(tmp_path, line, change)
    with pytest.raises(ValueError, match=re.escape(f"{run_dir / 'rounds.jsonl'}:{line}: {message}")):
        load_run(run_dir)


def test_malformed_json_names_file_and_line(tmp_path: Path):
    run_dir = write_run(tmp_path, fabricate_records())
    lines = (run_dir / "rounds.jsonl").read_text().splitlines()
    lines[2] = lines[2][:40]  # a record cut short by a crash
    (run_dir / "rounds.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=re.escape(f"{run_dir / 'rounds.jsonl'}:3: malformed JSON")):
        load_run(run_dir)
    (run_dir / "rounds.jsonl").write_text("[1, 2]\n")
    not_an_object = f"{run_dir / 'rounds.jsonl'}:1: a round record must be a JSON object"
    with pytest.raises(ValueError, match=re.escape(not_an_object)):
        load_run(run_dir)


@pytest.mark.parametrize("index, change, message", [
    (2, lambda e: e.pop("parent_id"), "required field 'parent_id' is missing"),
    (4, lambda e: e.update(how="forked"),
     "field 'how' must be one of ('start', 'shipped', 'spawned', 'selected', 'released'), got 'forked'"),
    (1, lambda e: e.update(edits="insert"), "field 'edits' must be list, got str"),
])
def test_bad_lineage_entry_names_file_and_line(tmp_path: Path, index: int, change, message: str):
    lineage = [dict(e) for e in LINEAGE]
    change(lineage[index])
    run_dir = write_run(tmp_path, fabricate_records(), lineage)
    with pytest.raises(ValueError, match=re.escape(f"{run_dir / 'lineage.jsonl'}:{index + 1}: {message}")):
        load_run(run_dir)


# ------------------------------------------------------------------------------------------ figures
def test_report_writes_valid_pngs_and_summary(run_dir: Path, report_dir: Path):
    assert report_dir == run_dir / "report"
    for name in ("pass_rate.png", "lineage.png", "task_matrix.png", "time_breakdown.png"):
        path = report_dir / name
        width, height = _png_size(path)
        assert width > 300 and height > 200, name
        assert path.stat().st_size > 10_000, name  # matplotlib drew something, not an empty canvas
    summary = (report_dir / "summary.md").read_text()
    for name in ("pass_rate.png", "lineage.png", "task_matrix.png", "time_breakdown.png"):
        assert f"({name})" in summary


def test_report_to_explicit_out_dir_and_run_without_val(tmp_path: Path):
    records = fabricate_records()
    for r in records:
        r["val"] = r["test"] = None
        r["evolve"] = None
    out = write_report(write_run(tmp_path / "run", records, []), tmp_path / "elsewhere")
    assert out == tmp_path / "elsewhere"
    for name in ("pass_rate.png", "lineage.png", "task_matrix.png", "time_breakdown.png"):
        _png_size(out / name)
    summary = (out / "summary.md").read_text()
    assert "- validation: not evaluated" in summary and "- test: not evaluated" in summary
    assert "No edits were judged." in summary


def test_task_matrix_figure_grows_to_stay_readable(tmp_path: Path, report_dir: Path):
    small = _png_size(report_dir / "task_matrix.png")  # 11 val tasks
    large = _png_size(write_report(write_run(tmp_path / "b", fabricate_records(100))) / "task_matrix.png")
    assert large[1] > 1300 > 2 * small[1]  # 0.16 in per task row at 100 dpi


# ------------------------------------------------------------------------------------------ summary
def _table_rows(summary: str, header: str) -> list[str]:
    lines = summary.splitlines()
    start = lines.index(header) + 2
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append(line)
    return rows


def test_summary_round_table_matches_fabricated_records(report_dir: Path):
    records = fabricate_records()
    summary = (report_dir / "summary.md").read_text()
    rows = _table_rows(summary, "| round | train pass | val pass@1 | shipped | spawned | rejected | variants | "
                                "GRPO loss | seconds |")
    assert len(rows) == 5
    for rec, row in zip(records, rows, strict=True):
        r = rec["round"]
        statuses = [s for s, _ in PLAN[r]]
        val = f"{rec['val']['pass_at_1']:.3f}" if r in VAL_ROUNDS else "—"
        loss = "—" if r == LOSSLESS_ROUND else f"{0.5 / (r + 1):.4f}"
        variants = ", ".join(f"{n}={h[:8]}" for n, h in VARIANTS[r].items())
        expected_seconds = sum(v for k, v in rec["seconds"].items() if k != "total")
        assert row == (f"| {r} | {rec['train']['pass_rate']:.3f} | {val} | {statuses.count('shipped')} | "
                       f"{statuses.count('spawned')} | {statuses.count('rejected')} | {variants} | {loss} | "
                       f"{expected_seconds:.1f} |")
    assert "- edits: 3 shipped, 1 spawned, 3 rejected" in summary


def test_summary_edits_table(report_dir: Path):
    rows = _table_rows((report_dir / "summary.md").read_text(),
                       "| round | variant | edits | gate | verdict | fail→pass | pass→fail | reason |")
    expected = [(r, s, v) for r in sorted(PLAN) for s, v in PLAN[r]]
    assert len(rows) == len(expected) == 7
    assert rows[0] == "| 0 | base | insert few_shot | seesaw | shipped | 1 | 0 | improves |"
    assert rows[1] == "| 0 | base | set_param step_budget.max_steps | seesaw | rejected | 1 | 2 | t5 broke |"
    assert rows[2].startswith("| 1 | base | insert calc_hint (few_shot) | seesaw | spawned | 1 | 1 |")
    quality = rows[3]
    assert quality.startswith("| 1 | base | remove system_prompt | quality | rejected | 0 | 0 | leaked answer \\| ")
    reason = quality.split(" | ", 7)[7][:-2]
    assert len(reason.replace("\\|", "|")) == 120 and reason.endswith("…")
    assert rows[6] == "| 4 | v1 | set_param sampling.temperature | seesaw | shipped | 1 | 0 | fixes t10 |"


def test_summary_time_shares_and_outside_share(report_dir: Path):
    records = fabricate_records()
    summary = (report_dir / "summary.md").read_text()
    totals = {k: 0.0 for k in PHASES}
    for rec in records:
        for k in PHASES:
            totals[k] += rec["seconds"].get(k, 0.0)
    grand = sum(totals.values())
    rows = _table_rows(summary, "| phase | seconds | share |")
    assert rows[:-1] == [f"| {k} | {totals[k]:.1f} | {100 * totals[k] / grand:.1f}% |" for k in PHASES]
    assert rows[-1] == f"| total | {grand:.1f} | 100.0% |"
    inside = totals["rollout"] + totals["logprobs"] + totals["critic"] + totals["grpo"] + totals["eval"]
    outside = grand - inside
    assert f"Time outside model forward/backward/generation: {100 * outside / grand:.1f}% " \
           "(inside = rollout + logprobs + critic + grpo + eval seconds" in summary


def test_summary_final_figures_and_meta_tokens(report_dir: Path):
    records = fabricate_records()
    summary = (report_dir / "summary.md").read_text()
    val, test = records[4]["val"], records[4]["test"]
    assert (f"- validation (round 4, 11 tasks): pass@1 {val['pass_at_1']:.3f}, pass@3 {val['pass_at_k']:.3f}"
            in summary)
    assert f"- test (round 4, 6 tasks): pass@1 {test['pass_at_1']:.3f}, pass@3 {test['pass_at_k']:.3f}" in summary
    # round 4's cumulative ledger: plan 500 + 200, revise 30 + 10
    assert "Total meta-agent tokens (cumulative): 740" in summary
    rows = _table_rows(summary, "| stage | calls | cached | prompt tokens | completion tokens | seconds |")
    assert rows == ["| plan | 5 | 0 | 500 | 200 | 2.5 |", "| revise | 1 | 1 | 30 | 10 | 0.2 |"]


# ----------------------------------------------------------------------------------- pure functions
def _natural_twin(task_ids: set[str]) -> list[str]:
    def key(t: str) -> tuple[str, int]:
        prefix, number = t.rsplit("-", 1) if "-" in t else (t[:1], t[1:])
        return prefix, int(number)

    return sorted(task_ids, key=key)


def _matrix_twin(run: Run) -> tuple[list[str], list[int], list[list[float | None]]]:
    source = "train"
    for rec in run.records:
        if rec.val is not None:
            source = "val"
    rounds, tasks = [], set()
    for rec in run.records:
        if getattr(rec, source) is not None:
            rounds.append(rec.round)
            tasks |= set(getattr(rec, source).outcomes)
    ordered = _natural_twin(tasks)
    values = []
    for t in ordered:
        row = []
        for rnd in rounds:
            rec = next(x for x in run.records if x.round == rnd)
            attempts = getattr(rec, source).outcomes.get(t)
            if not attempts:
                row.append(None)
            else:
                passed = 0
                for a in attempts:
                    if a:
                        passed += 1
                row.append(passed / len(attempts))
        values.append(row)
    return ordered, rounds, values


def _assert_matrix_equal(got, want) -> None:
    assert got[0] == want[0] and got[1] == want[1]
    assert got[2].shape == (len(want[0]), len(want[1]))
    for i, row in enumerate(want[2]):
        for j, w in enumerate(row):
            g = float(got[2][i, j])
            assert (math.isnan(g) and w is None) or g == pytest.approx(w), (want[0][i], want[1][j])


def test_task_matrix_uses_val_when_evaluated(run_dir: Path):
    run = load_run(run_dir)
    task_ids, rounds, values = task_matrix(run)
    assert rounds == [1, 4]
    assert task_ids == [f"val-{i}" for i in range(1, 12)]  # natural order: val-2 before val-10
    assert values[task_ids.index("val-3"), 0] == pytest.approx(2 / 3)
    assert values[task_ids.index("val-3"), 1] == 0.0
    assert math.isnan(values[task_ids.index("val-11"), 0])  # not evaluated in round 1
    _assert_matrix_equal((task_ids, rounds, values), _matrix_twin(run))


def test_task_matrix_falls_back_to_train(tmp_path: Path):
    records = fabricate_records(seed=3)
    for r in records:
        r["val"] = None
    run = load_run(write_run(tmp_path, records))
    task_ids, rounds, values = task_matrix(run)
    assert rounds == [0, 1, 2, 3, 4]
    assert task_ids == [f"t{i}" for i in range(1, 13)]
    assert values[3, 2] == pytest.approx(2 / 3)  # t4 in round 2: [False, True, True]
    assert math.isnan(values[3, 1])  # t4 was not in round 1's batch
    _assert_matrix_equal((task_ids, rounds, values), _matrix_twin(run))


def test_lineage_layout_depth_is_ancestors_and_x_is_order():
    def layout(rows):
        return lineage_layout([LineageRow.from_dict(r) for r in rows])

    assert layout(LINEAGE) == {H0: (0, 0), H1: (0, 1), H2: (0, 2), H4: (1, 2), H3: (0, 3)}
    orphan = {"id": "x" * 16, "parent_id": "unknown", "round": 2, "variant": "base", "how": "shipped",
              "edits": [], "hypothesis": ""}
    cycle = [{"id": "p", "parent_id": "q", "round": 0, "variant": "base", "how": "shipped", "edits": [],
              "hypothesis": ""},
             {"id": "q", "parent_id": "p", "round": 1, "variant": "base", "how": "shipped", "edits": [],
              "hypothesis": ""}]
    assert layout([*LINEAGE[:1], orphan]) == {H0: (0, 0), "x" * 16: (1, 0)}
    assert layout(cycle) == {"p": (0, 1), "q": (1, 1)}  # each has one ancestor before the loop closes
    assert layout([]) == {}


def test_edit_counts_per_variant():
    rec = RoundRecord.from_dict(fabricate_records()[3])
    assert rec.edit_counts() == {"shipped": 1, "spawned": 0, "rejected": 1, "undecided": 0}
    assert rec.edit_counts("v1") == {"shipped": 0, "spawned": 0, "rejected": 1, "undecided": 0}
    assert RoundRecord.from_dict(fabricate_records()[1]).edit_counts() == {"shipped": 0, "spawned": 1, "rejected": 1,
                                                                           "undecided": 0}


# -------------------------------------------------------------------------------------- round table
def _render(table) -> tuple[list[list[str]], str]:
    """The table's body and footer rows as cells (the header row uses ┃, so it is left out)."""
    console = Console(file=io.StringIO(), width=200, record=True, color_system=None)
    console.print(table)
    text = console.export_text()
    return [[c.strip() for c in line.split("│")[1:-1]] for line in text.splitlines() if line.startswith("│")], text


def test_round_table_one_row_per_variant():
    rec = fabricate_records()[3]
    rows, text = _render(round_table(RoundRecord.from_dict(rec)))
    base, v1 = rec["by_variant"]["base"], rec["by_variant"]["v1"]
    assert rows == [["base", H4[:12], f"{base['pass_rate']:.3f}", str(base["n_traces"]), "1", "0"],
                    ["v1", H2[:12], f"{v1['pass_rate']:.3f}", str(v1["n_traces"]), "0", "1"],
                    ["round", "", f"{rec['train']['pass_rate']:.3f}", "18", "1", "1"]]
    assert "round 3 (coevolve)" in text and "variant" in text and "GRPO loss —" in text
    assert f"{sum(v for k, v in rec['seconds'].items() if k != 'total'):.1f} s" in text


def test_round_table_variant_without_traces_and_bad_record():
    rec = fabricate_records()[1]  # v1 was spawned this round and ran nothing yet
    rows, text = _render(round_table(RoundRecord.from_dict(rec)))
    assert rows[1] == ["v1", H2[:12], "—", "0", "0", "0"]
    assert rows[2][-2:] == ["0", "1"]
    assert f"val pass@1 {rec['val']['pass_at_1']:.3f} · spawned 1 · GRPO loss 0.2500" in text
    rec.pop("variants")
    with pytest.raises(ValueError, match="round record 1: required field 'variants' is missing"):
        RoundRecord.from_dict(rec, "round record 1")


def test_round_table_shows_aegis_warnings_and_the_record_check_types_them():
    """A failed meta-agent call is why a round judged no edit: the table says so, brackets and all."""
    rec = fabricate_records()[1]
    rec["evolve"]["warnings"] = ["variant base: the meta-agent's plan call failed: MetaAgentError: [/v1] HTTP 500"]
    text = " ".join(_render(round_table(RoundRecord.from_dict(rec)))[1].split())  # the caption wraps at the width
    assert "warning: variant base: the meta-agent's plan call failed: MetaAgentError: [/v1] HTTP 500" in text
    assert "warning" not in _render(round_table(RoundRecord.from_dict(fabricate_records()[1])))[1]
    rec["evolve"]["warnings"] = [{"text": "not a string"}]
    with pytest.raises(ValueError, match=re.escape("round record: field 'evolve.warnings[0]' must be str, got dict")):
        RoundRecord.from_dict(rec)


def test_real_verdict_dicts_validate_and_describe_like_edit():
    """Records carry ``Verdict.to_dict()`` through JSON; the reader must accept exactly that shape."""
    edits = [Edit("insert", "few_shot", spec={"kind": "few_shot", "demos": []}, after="system_prompt"),
             Edit("set_param", "step_budget", param="max_steps", value=6)]
    proposal = Proposal(hypothesis="demos fix format", edits=edits, dimension="context_assembly", variant="base")
    verdict = Verdict(proposal=proposal, parent_id=H0, candidate_id=H1, variant="base", outcome=Outcome.SHIP, reason="ok",
                      quality=QualityReport(passed=True, leakage=0.0, bloat=0.1), fail_to_pass=["t1"], gate="seesaw")
    rec = fabricate_records()[0]
    rec["evolve"]["verdicts"] = [json.loads(json.dumps(verdict.to_dict()))]
    record = RoundRecord.from_dict(rec)
    assert record.verdicts[0].describe_edits() == "insert few_shot; set_param step_budget.max_steps"
    assert record.verdicts[0].proposal.edits == edits and record.verdicts[0] == verdict  # one type, read back whole
    assert record.edit_counts() == {"shipped": 1, "spawned": 0, "rejected": 0, "undecided": 0}
    assert record.to_dict()["evolve"]["verdicts"] == [verdict.to_dict()]  # nothing added or lost


def test_infrastructure_failures_are_validated_and_reported(tmp_path: Path):
    """Rounds count the episodes lost to the machine; the summary and the round table say so, old
    records without the count still load, and a malformed count names its field."""
    records = fabricate_records()
    records[1]["infra_failures"] = {"count": 2, "by_source": {"policy": 2}, "trace_ids": ["r0001-t1-0", "r0001-t2-1"]}
    records[3]["infra_failures"] = {"count": 0, "by_source": {}, "trace_ids": []}
    run = write_run(tmp_path / "run", records)
    summary = (write_report(run) / "summary.md").read_text()
    assert ("- infrastructure failures (policy, environment or tool crashes; in no GRPO group or failure cluster): "
            "2 traces (round 1: 2)") in summary
    _, text = _render(round_table(RoundRecord.from_dict(records[1])))
    assert "infrastructure failures 2" in text
    assert "infrastructure failures" not in _render(round_table(RoundRecord.from_dict(records[3])))[1]
    assert RoundRecord.from_dict(fabricate_records()[1]).infra_failures is None  # an old record: not counted
    assert "infrastructure failures" not in (write_report(write_run(tmp_path / "old", fabricate_records()))
                                             / "summary.md").read_text()
    records[2]["infra_failures"] = {"count": "2", "by_source": {}}
    with pytest.raises(ValueError, match=re.escape("3: field 'infra_failures.count' must be int, got str")):
        load_run(write_run(tmp_path / "bad", records))


def test_statistical_gate_verdicts_validate_and_count_as_undecided(tmp_path: Path):
    """A real undecided verdict of the stat gate goes through JSON into a record: it validates, is
    counted as undecided (neither shipped nor rejected), and shows in the summary; its evidence is
    checked field by field, and a verdict both shipped and undecided is refused."""
    from coevo.envs.base import Task
    from coevo.evolution.critic import Critic
    from coevo.harness.defaults import base_harness
    tasks = {f"t{i}": Task(f"t{i}", "synthetic", f"Task {i}", "train", answer=100 + i) for i in range(2)}
    critic = Critic(lambda h, ts, k: {t.task_id: [h.id != base_harness().id] * k for t in ts}, k=1, n_tasks=2, budget=4)
    proposal = Proposal(hypothesis="h", edits=[Edit("set_param", "sampling", param="temperature", value=0.3)],
                        dimension="model_selection")
    verdict, _ = critic.judge(proposal, base_harness(), before={t: [False] for t in tasks}, tasks=tasks)
    assert verdict.undecided
    records = fabricate_records()
    records[0]["evolve"]["verdicts"].append(json.loads(json.dumps(verdict.to_dict())))
    record = RoundRecord.from_dict(records[0])
    stat = record.verdicts[-1]
    assert record.verdict_status(stat) == "undecided" and stat.evidence.wins == 2
    assert record.edit_counts()["undecided"] == 1
    assert record.to_dict()["evolve"]["verdicts"][-1] == verdict.to_dict() and stat == verdict  # one type
    summary = (write_report(write_run(tmp_path / "run", records)) / "summary.md").read_text()
    assert "1 undecided (judged again with more evidence)" in summary and "| undecided |" in summary
    bad = json.loads(json.dumps(records[0]))
    bad["evolve"]["verdicts"][-1]["evidence"]["wins"] = "2"
    with pytest.raises(ValueError, match=r"field 'evolve.verdicts\[2\].evidence.wins' must be int, got str"):
        RoundRecord.from_dict(bad)
    bad["evolve"]["verdicts"][-1]["evidence"]["wins"] = 2
    bad["evolve"]["verdicts"][-1]["ship"] = True
    with pytest.raises(ValueError, match="both shipped and undecided"):
        RoundRecord.from_dict(bad)
