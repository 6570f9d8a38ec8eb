"""Trace export: every format from a real smoke run's buffer loads with ``datasets``, the SFT file
renders through TRL's chat template, GRPO advantages are the trainer's own, filters select what
they say (and bad values are named with the allowed ones); tool turns and secret redaction on a
synthetic buffer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from coevo.agent.trace import ModelCall, ToolCallRecord, Trace
from coevo.buffers import ReplayBuffer
from coevo.report.export import FORMATS, chat_messages, export
from coevo.trainers.advantages import group_advantages

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real two-round smoke run (rounds differ, so round filters have something to select)."""
    out = tmp_path_factory.mktemp("export") / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(ROOT / "train.py"), "experiment=smoke", "rounds=2",
                           f"hydra.run.dir={out}"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def stored(run_dir: Path) -> list[tuple]:
    """(entry, trace) of every buffered trace, read directly from the buffer."""
    with ReplayBuffer(run_dir / "buffer", capacity=10**6) as buf:
        entries = buf.entries()
        return list(zip(entries, buf.load(entries), strict=True))


def load(path: Path, cache: Path):
    import datasets

    return datasets.load_dataset("json", data_files=str(path), split="train", cache_dir=str(cache))


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_loads_with_datasets(run_dir: Path, stored: list[tuple], tmp_path: Path, fmt: str) -> None:
    n = export(run_dir, tmp_path / f"{fmt}.jsonl", fmt)
    ds = load(tmp_path / f"{fmt}.jsonl", tmp_path / "cache")
    calls = sum(1 for _, t in stored for c in t.model_calls if c.completion_ids)
    assert n == len(ds) == {"sft": len(stored), "grpo": calls, "jsonl": len(stored)}[fmt]
    assert not (tmp_path / f"{fmt}.jsonl.tmp").exists()
    if fmt == "jsonl":  # the raw records are the buffer's traces, log-probs included
        got = {r["trace_id"]: r for r in lines(tmp_path / "jsonl.jsonl")}
        for entry, trace in stored:
            record = got[trace.trace_id]
            assert record["buffer"] == {"seq": entry.seq, "round": entry.round, "model_version": entry.model_version}
            assert Trace.from_dict(record).to_dict() == trace.to_dict()


def test_sft_messages_render_with_trl_chat_template(run_dir: Path, stored: list[tuple], tmp_path: Path) -> None:
    from trl.data_utils import apply_chat_template

    from coevo.policy.tiny import tiny_tokenizer

    export(run_dir, tmp_path / "sft.jsonl", "sft")
    ds = load(tmp_path / "sft.jsonl", tmp_path / "cache")
    tok = tiny_tokenizer()
    traces = {t.trace_id: t for _, t in stored}
    for row in ds:
        trace = traces[row["trace_id"]]
        assert [m["role"] for m in row["messages"]][:2] == ["system", "user"]
        last = {k: v for k, v in row["messages"][-1].items() if v is not None}  # datasets fills absent keys with None
        assert last == {"role": "assistant", "content": trace.messages[-1]["content"]}
        text = apply_chat_template(row, tok)["text"]
        assert text.count("<|im_start|>") == len(row["messages"])
        assert trace.messages[1]["content"] in text
        assert (row["reward"], row["passed"]) == (trace.reward, trace.passed)
    rendered = ds.map(apply_chat_template, fn_kwargs={"processing_class": tok})  # the way TRL's SFTTrainer maps it
    assert len(rendered) == len(ds) and "text" in rendered.column_names


def test_grpo_records_carry_exact_ids_logprobs_and_the_trainers_advantages(
        run_dir: Path, stored: list[tuple], tmp_path: Path) -> None:
    export(run_dir, tmp_path / "grpo.jsonl", "grpo")
    records = lines(tmp_path / "grpo.jsonl")
    adv, _, _ = group_advantages([t.task_id for _, t in stored], [t.reward for _, t in stored], scale_by_std=True,
                                 members=[t.trainable for _, t in stored])
    expected = {t.trace_id: a for (_, t), a in zip(stored, adv.tolist(), strict=True)}
    assert any(a != 0 for a in expected.values())
    by_id = {t.trace_id: (e, t) for e, t in stored}
    for r in records:
        entry, trace = by_id[r["trace_id"]]
        call = trace.model_calls[r["call_index"]]
        assert r["prompt_ids"] == call.prompt_ids and r["completion_ids"] == call.completion_ids
        assert r["behaviour_logprobs"] == trace.behaviour_logprobs[r["call_index"]]
        assert r["completion_mask"] == [int(call.trainable and trace.trainable)] * len(call.completion_ids)
        assert r["advantage"] == expected[trace.trace_id]
        assert (r["reward"], r["task_id"], r["harness_id"], r["model_version"], r["round"]) == (
            trace.reward, trace.task_id, trace.harness_id, entry.model_version, entry.round)


def test_filters_select_what_they_say(run_dir: Path, stored: list[tuple], tmp_path: Path) -> None:
    def ids(**filters) -> set[str]:
        export(run_dir, tmp_path / "out.jsonl", "sft", **filters)
        return {r["trace_id"] for r in lines(tmp_path / "out.jsonl")}

    rewards = sorted(t.reward for _, t in stored)
    middle = rewards[len(rewards) // 2]
    assert {e.round for e, _ in stored} == {0, 1}
    assert ids(rounds=1) == {t.trace_id for e, t in stored if e.round == 1}
    assert ids(rounds=[0, 1]) == {t.trace_id for _, t in stored}
    assert ids(min_reward=middle) == {t.trace_id for _, t in stored if t.reward >= middle}
    assert ids(max_reward=middle) == {t.trace_id for _, t in stored if t.reward <= middle}
    assert ids(rounds=0, min_reward=middle) == {t.trace_id for e, t in stored if e.round == 0 and t.reward >= middle}
    harness = stored[0][1].harness_id
    assert ids(harness_ids=harness) == {t.trace_id for _, t in stored if t.harness_id == harness}
    assert ids(passed=False) == {t.trace_id for _, t in stored if not t.passed}
    assert export(run_dir, tmp_path / "none.jsonl", "grpo", min_reward=2.0) == 0
    assert (tmp_path / "none.jsonl").read_text() == ""


def test_grpo_advantages_are_recomputed_over_the_exported_groups(run_dir: Path, stored: list[tuple],
                                                                 tmp_path: Path) -> None:
    export(run_dir, tmp_path / "r1.jsonl", "grpo", rounds=1, scale_by_std=False)
    kept = [t for e, t in stored if e.round == 1]
    adv, _, _ = group_advantages([t.task_id for t in kept], [t.reward for t in kept], scale_by_std=False,
                                 members=[t.trainable for t in kept])
    expected = {t.trace_id: a for t, a in zip(kept, adv.tolist(), strict=True)}
    assert {r["trace_id"]: r["advantage"] for r in lines(tmp_path / "r1.jsonl")} == expected


@pytest.mark.parametrize(("filters", "message"), [
    ({"rounds": 7}, r"rounds=\[7\]: the buffer holds rounds \[0, 1\]"),
    ({"rounds": ["0"]}, r"the buffer holds rounds \[0, 1\]"),
    ({"rounds": True}, r"rounds=\[True\]: the buffer holds rounds \[0, 1\]"),  # a bool is no round
    ({"harness_ids": "nope"}, r"harness_ids=\['nope'\]: the buffer holds harness ids \['[0-9a-f]{16}'"),
    ({"min_reward": float("nan")}, r"min_reward=nan must be a finite number \(rewards in the buffer span \["),
    ({"max_reward": "high"}, r"max_reward='high' must be a finite number"),
    ({"min_reward": 0.5, "max_reward": 0.1}, r"min_reward=0.5 is above max_reward=0.1"),
    ({"passed": "yes"}, r"passed='yes' must be True, False or None"),
])
def test_bad_filters_are_named_with_the_allowed_values(run_dir: Path, tmp_path: Path, filters: dict,
                                                       message: str) -> None:
    with pytest.raises(ValueError, match=message):
        export(run_dir, tmp_path / "bad.jsonl", "sft", **filters)
    assert not (tmp_path / "bad.jsonl").exists()


def test_bad_format_and_missing_buffer_are_named(run_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"fmt='csv' is not a format; choose one of \['sft', 'grpo', 'jsonl'\]"):
        export(run_dir, tmp_path / "x", "csv")
    with pytest.raises(FileNotFoundError, match="has no replay buffer"):
        export(tmp_path, tmp_path / "x", "sft")
    assert not (tmp_path / "buffer").exists()  # export never creates a buffer


def test_export_leaves_the_buffer_as_it_was(run_dir: Path, stored: list[tuple], tmp_path: Path) -> None:
    before = sorted(p.name for p in (run_dir / "buffer").iterdir())
    export(run_dir, tmp_path / "all.jsonl", "jsonl")
    assert sorted(p.name for p in (run_dir / "buffer").iterdir()) == before
    with ReplayBuffer(run_dir / "buffer", capacity=10**6) as buf:
        assert [e.trace_id for e in buf.entries()] == [t.trace_id for _, t in stored]


# ------------------------------------------------------------------------------ a synthetic buffer with tool turns
SECRET = "sk-coevo-export-test-4f1d9a7c2b8e6d3f0a5c"


def tool_trace(trace_id: str, task_id: str, reward: float) -> Trace:
    """Two model calls around a calculator call; the tool output quotes a secret, as a tool that
    printed its environment would."""
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>'
    messages = [{"role": "system", "content": "Solve it."}, {"role": "user", "content": "What is 2+3?"},
                {"role": "assistant", "content": call},
                {"role": "tool", "name": "calculator", "content": f"5 (OPENAI_API_KEY={SECRET})"},
                {"role": "assistant", "content": "<answer>5</answer>"},
                {"role": "user", "content": "[loop guard] stop"}]
    model_calls = [ModelCall(step=s, messages=messages[: 2 + 2 * s], prompt_ids=[1, 2, 3 + s], completion_ids=[4, 5],
                             sampler_logprobs=[-0.5, -0.25], text=messages[2 + 2 * s]["content"], finish_reason="stop")
                   for s in range(2)]
    return Trace(trace_id=trace_id, task_id=task_id, env="arithmetic", split="train", harness_id="h" * 16,
                 variant="base", model_version="0", model_calls=model_calls, messages=messages,
                 tool_calls=[ToolCallRecord(0, "calculator", {"expression": "2+3"}, "5", None, 0.01)],
                 final_answer="5", reward=reward, passed=reward == 1.0)


@pytest.fixture
def tool_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    run = tmp_path / "run"
    with ReplayBuffer(run / "buffer", capacity=8) as buf:
        buf.add([tool_trace("a", "t1", 1.0), tool_trace("b", "t1", 0.0), tool_trace("c", "t2", 1.0)], round=0,
                model_version=0, logprob_fn=lambda queries: [[-1.0] * len(q.completion_ids) for q in queries])
    return run


def test_sft_keeps_tool_calls_in_the_assistant_text_and_tool_turns_named(tool_run: Path, tmp_path: Path) -> None:
    from trl.data_utils import apply_chat_template

    from coevo.policy.tiny import tiny_tokenizer

    trace = tool_trace("a", "t1", 1.0)
    messages = chat_messages(trace)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant"]  # trailing user cut
    assert messages[2]["content"].startswith("<tool_call>") and messages[3]["name"] == "calculator"
    assert export(tool_run, tmp_path / "sft.jsonl", "sft", passed=True) == 2
    ds = load(tmp_path / "sft.jsonl", tmp_path / "cache")
    text = apply_chat_template(ds[0], tiny_tokenizer())["text"]
    assert "<|im_start|>tool\n5 (OPENAI_API_KEY=<redacted>)<|im_end|>" in text


def test_exports_redact_secret_environment_values(tool_run: Path, tmp_path: Path) -> None:
    for fmt in FORMATS:
        export(tool_run, tmp_path / f"{fmt}.jsonl", fmt)
        data = (tmp_path / f"{fmt}.jsonl").read_bytes()
        assert SECRET.encode() not in data, fmt
    assert b"OPENAI_API_KEY=<redacted>" in (tmp_path / "jsonl.jsonl").read_bytes()
    grpo = lines(tmp_path / "grpo.jsonl")  # numbers untouched by redaction
    # the second call of each trace was shown the tool turn holding the key: its prompt ids would decode to it
    # (this buffer was written directly, not through a run, which redacts ids before storing them)
    assert [r["call_index"] for r in grpo] == [0, 0, 0]
    assert [r["completion_ids"] for r in grpo] == [[4, 5]] * 3 and grpo[0]["behaviour_logprobs"] == [-1.0, -1.0]
    assert [r["advantage"] for r in grpo if r["task_id"] == "t2"] == [0.0]  # a singleton group: no signal
    for record in lines(tmp_path / "jsonl.jsonl"):  # raw traces: that call is written without its ids
        assert [c["prompt_ids"] for c in record["model_calls"]] == [[1, 2, 3], []]
        assert record["behaviour_logprobs"] == [[-1.0, -1.0], []] and not record["model_calls"][1]["trainable"]


def test_grpo_export_leaves_infrastructure_failures_out_of_the_groups_and_names_temperatures(tmp_path: Path) -> None:
    """As in training: a crashed episode (reward 0 from the machine) joins no group, so task t1's
    baseline is its two real traces; each record says the temperature its log-probs refer to."""
    traces = [tool_trace("a", "t1", 1.0), tool_trace("b", "t1", 0.0), tool_trace("c", "t1", 0.0)]
    traces[2].error, traces[2].error_source, traces[2].trainable = "env reset: ConnectionError: down", "env", False
    for call in traces[0].model_calls:
        call.temperature = 0.3
    traces[1].model_calls[1].temperature = 0.0  # greedy: log-probs at T = 1
    with ReplayBuffer(tmp_path / "run" / "buffer", capacity=8) as buf:
        buf.add(traces, round=0, model_version=0,
                logprob_fn=lambda queries: [[-1.0] * len(q.completion_ids) for q in queries])
    export(tmp_path / "run", tmp_path / "grpo.jsonl", "grpo", scale_by_std=False)
    got = {(r["trace_id"], r["call_index"]): (r["advantage"], r["temperature"]) for r in lines(tmp_path / "grpo.jsonl")}
    assert got == {("a", 0): (0.5, 0.3), ("a", 1): (0.5, 0.3), ("b", 0): (-0.5, None), ("b", 1): (-0.5, 1.0),
                   ("c", 0): (0.0, None), ("c", 1): (0.0, None)}


def test_export_command_writes_the_filtered_traces(run_dir: Path, stored: list[tuple], tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from coevo.cli.main import app

    out = tmp_path / "r1.jsonl"
    result = CliRunner().invoke(app, ["export", str(run_dir), "--format", "grpo", "--round", "1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert {r["trace_id"] for r in lines(out)} == {t.trace_id for e, t in stored if e.round == 1}
    bad = CliRunner().invoke(app, ["export", str(run_dir), "--format", "parquet", "--out", str(out)])
    assert bad.exit_code != 0 and "sft" in bad.output
