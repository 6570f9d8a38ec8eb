"""Tracking: flatten / edit_rows / scrub as pure functions, the null tracker, and one offline W&B
run whose files are read back (wandb offline writes its history into the binary ``.wandb`` log,
read here record by record, and tables as JSON under ``files/media/table``)."""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from coevo.evolution.meta_agent import TokenLedger
from coevo.evolution.types import IMPLICATED
from coevo.harness.defaults import base_harness
from coevo.harness.edits import Edit
from coevo.report.tracking import (
    EDIT_COLUMNS,
    REDACTED,
    NullTracker,
    Tracker,
    WandbTracker,
    edit_rows,
    flatten,
    make_tracker,
    resolve_mode,
    run_id_for,
    scrub,
)
from coevo.rundir.evolve_records import Cluster, Digest, EvolveReport, Outcome, Proposal, QualityReport, Verdict
from coevo.rundir.records import GRPOMetrics, RoundRecord, StepMetrics

PLANTED_KEY = "sk-coevo-test-" + "q" * 32  # a fake API key, planted in the environment and a config


# ------------------------------------------------------------------------------ a RoundRecord
def _verdict(variant: str, ship: bool, gate: str, reason: str, f2p: list[str], p2f: list[str]) -> Verdict:
    proposal = Proposal(
        hypothesis="a worked example fixes the answer format",
        edits=[
            Edit("insert", "few_shot", spec={"kind": "few_shot", "name": "few_shot", "params": {}}),
            Edit("set_param", "sampling", param="temperature", value=0.7),
        ],
        dimension="context_assembly",
        cluster="format_error",
        variant=variant,
    )
    return Verdict(proposal=proposal, parent_id="p0", candidate_id="c1" if ship else None, variant=variant,
                   outcome=Outcome.SHIP if ship else Outcome.REJECT, reason=reason, quality=QualityReport(True, 0.0, 0.1), before={"t1": [False, False]},
                   after={"t1": [True, True]}, fail_to_pass=f2p, pass_to_fail=p2f, gate=gate, round=1)


def _digest(variant: str, clusters: list[tuple[str, int]], raw: int, small: int) -> Digest:
    return Digest(
        round=1, variant=variant, harness_id="h-" + variant, n_traces=8, n_failed=sum(n for _, n in clusters),
        pass_rate=0.5,
        clusters=[Cluster(c, IMPLICATED[c], n, 0.5, ["t1"], ["tr1"], ["excerpt"]) for c, n in clusters],
        raw_tokens=raw, digest_tokens=small,
    )


def round_record(round: int = 1) -> RoundRecord:
    """A RoundRecord as the loop writes it (docs/run-directory.md), built from the real producers."""
    ledger = TokenLedger()
    ledger.record("plan", prompt_tokens=100, completion_tokens=20, seconds=1.5)
    ledger.record("plan", prompt_tokens=50, completion_tokens=10, cached=True)
    report = EvolveReport(
        round=round,
        digests=[_digest("base", [("format_error", 3), ("loop", 1)], 4000, 400),
                 _digest("v1", [("format_error", 2)], 1000, 500)],
        verdicts=[
            _verdict("base", True, "seesaw", "no regressions", ["t1", "t2"], []),
            _verdict("base", False, "seesaw", "t3 regressed", ["t1"], ["t3"]),
            _verdict("v1", False, "quality", "leaks the answer", [], []),
        ],
        shipped=[base_harness().id], warnings=["drift"], stopped=None,
        seconds={"digest": 0.1},
    )
    return RoundRecord.from_dict({
        "round": round,
        "mode": "coevolve",
        "model_version": 4,
        "seconds": {"rollout": 10.0, "grpo": 2.5, "total": 13.0, "other": 0.5},
        "train": {"pass_rate": 0.5, "mean_reward": 0.25, "n_traces": 16, "outcomes": {"t1": [True, False]}},
        "val": {"pass_at_1": 0.75, "pass_at_k": 1.0, "k": 2, "outcomes": {"t9": [True, True]}},
        "test": None,
        "variants": {"base": "c1", "v1": "h-v1"},
        "by_variant": {"base": {"pass_rate": 0.5, "n_traces": 12}, "v1": {"pass_rate": 0.25, "n_traces": 4}},
        "evolve": report.to_dict(),
        "grpo": GRPOMetrics(buffer_traces=16, steps=[STEP], reward_mean=0.25, reward_std=0.5,
                            zero_variance_fraction=0.5).to_dict(),
        "meta_tokens": ledger.as_dict(),
        "buffer": {"size": 32, "lag": 1},
    })


STEP = StepMetrics(loss=-0.125, clip_fraction=0.0, kl=0.0, ratio_mean=1.0, ratio_min=1.0, ratio_max=1.0,
                   advantage_mean=0.0, advantage_std=1.0, zero_variance_fraction=0.25, excluded_traces=0,
                   infra_traces=0, sequences=16, tokens=640, tokens_per_s=100.0, grad_norm=0.5, lr=1e-5,
                   staleness={0: 12, 1: 4}, reward_mean=0.125, reward_std=0.25)

EXPECTED_FLAT = {
    "round": 1, "mode": "coevolve", "model_version": 4,
    "seconds/rollout": 10.0, "seconds/grpo": 2.5, "seconds/total": 13.0, "seconds/other": 0.5,
    "generation_seconds": 0.0,  # defaults of fields the record above leaves out
    "train/pass_rate": 0.5, "train/mean_reward": 0.25, "train/n_traces": 16, "train/tokens": 0,
    "train/tool_use_rate": 0.0, "train/prompt_tokens": 0,
    "val/pass_at_1": 0.75, "val/pass_at_k": 1.0, "val/k": 2, "val/tool_use_rate": 0.0,
    "variants/base": "c1", "variants/v1": "h-v1",
    "by_variant/base/pass_rate": 0.5, "by_variant/base/n_traces": 12,
    "by_variant/v1/pass_rate": 0.25, "by_variant/v1/n_traces": 4,
    "evolve/verdicts": 3, "evolve/accepted": 1, "evolve/rejected": 2, "evolve/undecided": 0, "evolve/shipped": 1,
    "evolve/spawned": 0,
    "evolve/warnings": 1, "evolve/rejected_by/quality": 1, "evolve/rejected_by/seesaw": 1,
    "evolve/failures/format_error": 5, "evolve/failures/loop": 1,
    "evolve/compression/base": 10.0, "evolve/compression/v1": 2.0,
    "grpo/loss": -0.125, "grpo/clip_fraction": 0.0, "grpo/kl": 0.0, "grpo/ratio_mean": 1.0, "grpo/ratio_min": 1.0,
    "grpo/ratio_max": 1.0, "grpo/advantage_mean": 0.0, "grpo/advantage_std": 1.0, "grpo/excluded_traces": 0,
    "grpo/infra_traces": 0, "grpo/tokens_per_s": 100.0, "grpo/grad_norm": 0.5, "grpo/lr": 1e-5,
    "grpo/approx_kl": 0.0, "grpo/entropy": 0.0, "grpo/sampler_tokens": 0,
    # the round's, over its whole batch, where the step's own are 0.125, 0.25 and 0.25
    "grpo/reward_mean": 0.25, "grpo/reward_std": 0.5, "grpo/zero_variance_fraction": 0.5,
    "grpo/sequences": 16, "grpo/tokens": 640, "grpo/staleness/0": 12, "grpo/staleness/1": 4, "grpo/buffer_traces": 16,
    "meta_tokens/plan/calls": 2, "meta_tokens/plan/cached": 1, "meta_tokens/plan/prompt_tokens": 150,
    "meta_tokens/plan/completion_tokens": 30, "meta_tokens/plan/seconds": 1.5, "meta_tokens/total_tokens": 180,
    "buffer/size": 32, "buffer/lag": 1,
}

EXPECTED_ROWS = [
    {"round": 1, "variant": "base", "edits": "insert few_shot; set_param sampling.temperature",
     "gate": "seesaw", "ship": True, "fail_to_pass": 2, "pass_to_fail": 0, "reason": "no regressions"},
    {"round": 1, "variant": "base", "edits": "insert few_shot; set_param sampling.temperature",
     "gate": "seesaw", "ship": False, "fail_to_pass": 1, "pass_to_fail": 1, "reason": "t3 regressed"},
    {"round": 1, "variant": "v1", "edits": "insert few_shot; set_param sampling.temperature",
     "gate": "quality", "ship": False, "fail_to_pass": 0, "pass_to_fail": 0, "reason": "leaks the answer"},
]


# ------------------------------------------------------------------------------ pure functions
def test_flatten_is_exact() -> None:
    assert flatten(round_record()) == EXPECTED_FLAT


def test_flatten_of_a_round_without_evolution_or_validation() -> None:
    record = replace(round_record(), evolve=None, val=None, grpo=None)
    expected = {k: v for k, v in EXPECTED_FLAT.items() if k.split("/")[0] not in ("evolve", "val", "grpo")}
    assert flatten(record) == expected


def test_flatten_survives_a_json_round_trip() -> None:
    """What rounds.jsonl gives back (staleness keys become strings there) reads back equal and
    flattens to the same keys."""
    again = RoundRecord.from_dict(json.loads(json.dumps(round_record().to_dict())))
    assert again == round_record() and again.grpo.last_step.staleness == {0: 12, 1: 4}
    assert flatten(again) == EXPECTED_FLAT


def test_edit_rows() -> None:
    assert edit_rows(round_record()) == EXPECTED_ROWS
    assert edit_rows(replace(round_record(), evolve=None)) == []


def test_scrub_removes_secret_keys_and_pasted_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", PLANTED_KEY)
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")  # not a secret, and too short to be one
    config = {
        "name": "run",
        "meta_agent": {"api_key": "abc", "base_url": f"http://host/v1?key={PLANTED_KEY}", "model": "m"},
        "hub": [{"hf_token": "hf_x"}, {"accessToken": "a"}, PLANTED_KEY, "false"],
        "headers": {"Authorization": "Bearer x", "X-Api-Key": "y"},
        "db": {"password": {"nested": "p"}, "client_secret": "s"},
        "model": {"tokenizer": "smollm2", "max_new_tokens": 64, "total_tokens": 3},
    }
    original = json.loads(json.dumps(config))
    assert scrub(config) == {
        "name": "run",
        "meta_agent": {"api_key": REDACTED, "base_url": f"http://host/v1?key={REDACTED}", "model": "m"},
        "hub": [{"hf_token": REDACTED}, {"accessToken": REDACTED}, REDACTED, "false"],
        "headers": {"Authorization": REDACTED, "X-Api-Key": REDACTED},
        "db": {"password": REDACTED, "client_secret": REDACTED},
        "model": {"tokenizer": "smollm2", "max_new_tokens": 64, "total_tokens": 3},
    }
    assert config == original  # a copy; the input is untouched


def test_scrub_rejects_a_non_mapping() -> None:
    with pytest.raises(TypeError, match="config must be a mapping"):
        scrub(["api_key"])  # type: ignore[arg-type]


# ------------------------------------------------------------------------------ null tracker, factory
def test_null_tracker_accepts_every_call() -> None:
    tracker = make_tracker("none", project="coevo", run_dir=Path("/nonexistent"), mode="offline", tags=["x"])
    assert isinstance(tracker, NullTracker) and isinstance(tracker, Tracker)
    assert tracker.run_id is None
    tracker.log_round(round_record())
    tracker.log_edits(EXPECTED_ROWS)
    tracker.log_harness(base_harness(), round=-1, variant="base", how="start")
    tracker.finish()
    assert not Path("/nonexistent").exists()


def test_make_tracker_names_the_allowed_kinds() -> None:
    with pytest.raises(ValueError, match=r"logger kind must be one of \['none', 'wandb'\], got 'tensorboard'"):
        make_tracker("tensorboard")


# ------------------------------------------------------------------------------ credentials and mode
@pytest.fixture(scope="module")
def wandb_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """wandb confined to a temp dir: no credentials, silent, caches and staging under tmp."""
    root = tmp_path_factory.mktemp("wandb_env")
    (root / "netrc").write_text("")
    with pytest.MonkeyPatch.context() as mp:
        for var in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_MODE", "WANDB_RUN_ID", "WANDB_RESUME"):
            mp.delenv(var, raising=False)
        mp.setenv("OPENAI_API_KEY", PLANTED_KEY)
        mp.setenv("NETRC", str(root / "netrc"))
        mp.setenv("WANDB_SILENT", "true")
        for var, sub in (("WANDB_DIR", "dir"), ("WANDB_CACHE_DIR", "cache"), ("WANDB_CONFIG_DIR", "config"),
                         ("WANDB_DATA_DIR", "data"), ("WANDB_ARTIFACT_DIR", "artifacts")):
            mp.setenv(var, str(root / sub))
        yield root


def test_mode_resolution(wandb_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_mode("auto") == "offline"
    for mode in ("online", "offline", "disabled"):
        assert resolve_mode(mode) == mode
    with pytest.raises(ValueError, match=r"mode must be one of \['auto', 'online', 'offline', 'disabled'\]"):
        resolve_mode("cloud")
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    assert resolve_mode("auto") == "online"
    monkeypatch.delenv("WANDB_API_KEY")
    netrc = wandb_env / "netrc_with_key"
    netrc.write_text(f"machine api.wandb.ai\n  login user\n  password {'n' * 40}\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    assert resolve_mode("auto") == "online"


# ------------------------------------------------------------------------------ one offline run, read back
def read_wandb_log(path: Path) -> list[Any]:
    """The records of a ``.wandb`` file: a 7-byte header (":W&B", magic, version) then a
    LevelDB-style log of 32 KiB blocks whose chunks (crc32, length, type) carry protobuf Records;
    a record split across blocks is a FIRST chunk, MIDDLE chunks and a LAST chunk."""
    from wandb.proto import wandb_internal_pb2

    block, header = 32768, 7
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    records, pos, pending = [], header, b""
    while pos + header <= len(data):
        if block - pos % block < header:  # a block's tail too short for a chunk header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + header])
        pending += data[pos + header : pos + header + length]
        pos += header + length
        if kind in (1, 4):  # FULL or LAST
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def history(records: list[Any]) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    for r in records:
        if r.WhichOneof("record_type") == "history":
            row = {"/".join(i.nested_key) if i.nested_key else i.key: json.loads(i.value_json) for i in r.history.item}
            out.setdefault(row["_step"], {}).update(row)
    return out


@pytest.fixture(scope="module")
def offline_run(wandb_env: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A resumed-run setup: round 0 already committed in rounds.jsonl, then a tracker in mode
    "auto" (offline: no credentials) logs round 1, its edits and two harnesses, and finishes."""
    run_dir = tmp_path_factory.mktemp("run")
    committed = round_record(0)
    (run_dir / "rounds.jsonl").write_text(json.dumps(committed.to_dict()) + "\n")
    tracker = WandbTracker("coevo-test", run_dir, name="t", group="g", tags=("a", "b"), mode="auto",
                           config={"name": "t", "meta_agent": {"api_key": "literal", "base_url": PLANTED_KEY},
                                   "trainer": {"lr": 1e-5}})
    record = round_record(1)
    tracker.log_round(record)
    tracker.log_edits(edit_rows(record))
    base = base_harness()
    child = base.set_param("sampling", "temperature", 0.7)
    tracker.log_harness(base, round=-1, variant="base", how="start")
    tracker.log_harness(child, round=1, variant="base", how="shipped")
    tracker.finish()
    tracker.finish()  # a second finish is a no-op
    [offline_dir] = sorted((run_dir / "wandb").glob("offline-run-*"))
    log = offline_dir / f"run-{tracker.run_id}.wandb"
    # the file is written by W&B's own service process; on a loaded machine its last records may
    # land a moment after finish() returns, so read it until the logged round is there (15 s at most)
    deadline = time.monotonic() + 15
    records = read_wandb_log(log)
    while not history(records) and time.monotonic() < deadline:
        time.sleep(0.25)
        records = read_wandb_log(log)
    return {"tracker": tracker, "run_dir": run_dir, "dir": offline_dir, "base": base, "child": child,
            "records": records, "committed": committed}


def test_run_id_is_written_and_reused(offline_run: dict[str, Any]) -> None:
    run_dir, tracker = offline_run["run_dir"], offline_run["tracker"]
    assert tracker.mode == "offline"
    assert (run_dir / "wandb_id").read_text().strip() == tracker.run_id
    assert offline_run["dir"].name.endswith("-" + tracker.run_id)
    again = WandbTracker("coevo-test", run_dir, mode="offline")
    try:
        assert again.run_id == tracker.run_id
    finally:
        again.finish()
    assert (run_dir / "wandb_id").read_text().strip() == tracker.run_id


def test_a_corrupt_run_id_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "wandb_id").write_text("not an id!\n")
    with pytest.raises(ValueError, match=r"wandb_id must hold a W&B run id"):
        run_id_for(tmp_path)


def test_history_holds_the_flattened_round(offline_run: dict[str, Any]) -> None:
    rows = history(offline_run["records"])
    assert sorted(rows) == [1]
    logged = {k: v for k, v in rows[1].items() if not k.startswith(("_", "edits/"))}
    assert logged == EXPECTED_FLAT


def test_run_record_carries_the_scrubbed_config(offline_run: dict[str, Any]) -> None:
    [run] = [r.run for r in offline_run["records"] if r.WhichOneof("record_type") == "run"]
    assert (run.run_id, run.project, run.display_name, run.run_group, list(run.tags)) == (
        offline_run["tracker"].run_id, "coevo-test", "t", "g", ["a", "b"])
    config = {i.key: json.loads(i.value_json) for i in run.config.update if i.key != "_wandb"}
    assert config == {"name": "t", "meta_agent": {"api_key": REDACTED, "base_url": REDACTED}, "trainer": {"lr": 1e-5}}
    leaked = [p for p in offline_run["run_dir"].rglob("*") if p.is_file() and PLANTED_KEY.encode() in p.read_bytes()]
    assert leaked == []


def test_summary_holds_the_last_round(offline_run: dict[str, Any]) -> None:
    summary: dict[str, Any] = {}
    for r in offline_run["records"]:
        if r.WhichOneof("record_type") == "summary":
            summary.update({"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in r.summary.update})
    assert {k: summary[k] for k in EXPECTED_FLAT} == EXPECTED_FLAT


def test_edits_table_holds_committed_and_new_rows(offline_run: dict[str, Any]) -> None:
    row = history(offline_run["records"])[1]
    assert (row["edits/_type"], row["edits/nrows"]) == ("table-file", 6)
    table = json.loads((offline_run["dir"] / "files" / row["edits/path"]).read_text())
    assert table["columns"] == list(EDIT_COLUMNS)
    expected = edit_rows(offline_run["committed"]) + EXPECTED_ROWS
    assert table["data"] == [[row[c] for c in EDIT_COLUMNS] for row in expected]
    assert [row[0] for row in table["data"]] == [0, 0, 0, 1, 1, 1]


def test_harness_artifacts(offline_run: dict[str, Any]) -> None:
    artifacts = [r.artifact for r in offline_run["records"]
                 if r.WhichOneof("record_type") == "artifact" and r.artifact.type == "harness"]
    base, child = offline_run["base"], offline_run["child"]
    assert [(a.name, a.type) for a in artifacts] == [("harness-base", "harness"), ("harness-base", "harness")]
    assert [json.loads(a.metadata) for a in artifacts] == [
        {"id": base.id, "round": -1, "how": "start", "parent_id": None, "variant": "base", "name": base.name},
        {"id": child.id, "round": 1, "how": "shipped", "parent_id": base.id, "variant": "base", "name": child.name},
    ]
    assert [sorted(a.aliases) for a in artifacts] == [sorted(["latest", base.id]), sorted(["latest", child.id])]
    assert [[e.path for e in a.manifest.contents] for a in artifacts] == [["harness.yaml"], ["harness.yaml"]]


def test_finished_tracker_refuses_to_log(offline_run: dict[str, Any]) -> None:
    with pytest.raises(RuntimeError, match="is finished"):
        offline_run["tracker"].log_round(round_record(2))


def test_bad_inputs_are_named(offline_run: dict[str, Any], wandb_env: Path) -> None:
    tracker = WandbTracker("coevo-test", offline_run["run_dir"] / "disabled", mode="disabled")
    try:
        with pytest.raises(TypeError, match=r"record must be a coevo.rundir.records.RoundRecord, got dict"):
            tracker.log_round({"round": 1})  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=r"edit row 0: missing fields \['reason'\], unexpected fields \['why'\]"):
            tracker.log_edits([{k: v for k, v in EXPECTED_ROWS[0].items() if k != "reason"} | {"why": "x"}])
        hows = r"\['start', 'shipped', 'spawned', 'selected', 'released'\]"
        with pytest.raises(ValueError, match=f"how must be one of {hows}"):
            tracker.log_harness(base_harness(), round=0, variant="base", how="merged")
        with pytest.raises(ValueError, match="variant must match"):
            tracker.log_harness(base_harness(), round=0, variant="a/b", how="start")
    finally:
        tracker.finish()
    with pytest.raises(ValueError, match="mode must be one of"):
        WandbTracker("coevo-test", offline_run["run_dir"], mode="cloud")
