"""Traces out of a run's replay buffer, as JSONL other trainers read (TRL, ``datasets``).

Formats (one JSON object per line; every line passes ``datasets.load_dataset("json", ...)``):

- ``sft``: one record per trace that has an assistant turn: ``messages`` in the OpenAI/TRL chat
  format (``system`` / ``user`` / ``assistant`` / ``tool`` turns, ``tool`` turns carry the tool's
  ``name``), plus ``trace_id``, ``task_id``, ``harness_id``, ``model_version``, ``round``,
  ``reward``, ``passed``. Tool calls stay in the assistant's text exactly as the model wrote them
  (``<tool_call>{...}</tool_call>``): that text is what the harness parsed, so it is the right SFT
  target, and no chat template renders a call twice. Turns after the last assistant turn are
  dropped (nothing to learn from). Every trace that matches the filters is exported, passing or
  not; select passing ones with ``passed=True`` or ``min_reward=...`` (rejection-sampling SFT).
- ``grpo``: one record per model call with completion tokens: ``prompt_ids``, ``completion_ids``
  (the exact ids the policy saw and produced), ``completion_mask`` (1 per token where the trainer
  would train it: trace and call trainable), ``behaviour_logprobs`` (cached by the buffer at
  insertion), ``reward``, ``advantage``, ``task_id``, ``harness_id``, ``model_version``, ``round``,
  ``trace_id``, ``call_index``, ``loss_weight``, ``temperature`` (the temperature the call's
  tokens were sampled at and its log-probs refer to; null for calls recorded before model calls
  kept their sampling parameters). ``advantage`` is ``group_advantages`` (the trainer's own
  function) over the *exported* trainable traces grouped by task id, with the run's
  ``trainer.scale_by_std``; traces kept out of training (crashed episodes, infrastructure failures
  among them) join no group and get advantage 0; filters therefore change the groups (a group whose
  rewards are all equal after filtering gets advantage 0), as they would in training.
- ``jsonl``: the raw trace records (``Trace.to_dict()``, behaviour log-probs included) plus
  ``buffer``: ``{seq, round, model_version}``.

``model_version`` is the buffer's: the trainer's update count when the trace was inserted (the
model whose log-probs were cached). Filters (``rounds``, ``harness_ids``, ``min_reward``,
``max_reward``, ``passed``) are applied on the buffer's in-memory index, then the selected
payloads are read batch by batch, so an export never holds the buffer in memory. A filter value
the buffer does not hold is an error that lists the values it does hold. The output is written to a
temporary file and renamed, so a failed export leaves no partial file.

Secrets: a run stores its traces with secret values already redacted, token ids included
(``coevo.safety.traces.redact_trace``), so its export has none to leak even where the variables are no
longer set. As a second line, every string written is cleared of the secret values this process
knows (``coevo.safety.secrets.secret_env_values``), and a model call whose text shows one keeps no token
ids (no tokenizer is at hand here to re-encode them, and they would decode to the key: a buffer
written before traces were redacted): ``grpo`` leaves its record out (with a warning), ``jsonl``
writes it with empty ids (``coevo.safety.traces.redact_trace`` without a tokenizer).
"""

from __future__ import annotations

import json
import logging
import math
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

from coevo.agent.trace import Trace
from coevo.buffers import BufferEntry, ReplayBuffer
from coevo.rundir.check import committed, verify_run
from coevo.rundir.run_files import read_rounds
from coevo.safety.secrets import contains_secret, redact, secret_env_values
from coevo.safety.traces import redact_trace

log = logging.getLogger("coevo.report.export")

FORMATS = ("sft", "grpo", "jsonl")
READ_BATCH = 32
"""Traces read from disk at a time."""


def export(
    run_dir: str | Path,
    out_path: str | Path,
    fmt: str,
    rounds: int | Iterable[int] | None = None,
    harness_ids: str | Iterable[str] | None = None,
    min_reward: float | None = None,
    max_reward: float | None = None,
    *,
    passed: bool | None = None,
    scale_by_std: bool | None = None,
    partial: bool = False,
) -> int:
    """Write the buffered traces of ``run_dir`` that match every given filter to ``out_path`` as
    ``fmt`` (``sft`` | ``grpo`` | ``jsonl``); returns the number of records written.

    ``rounds`` / ``harness_ids``: one value or several (None: all); ``min_reward`` /
    ``max_reward``: inclusive bounds; ``passed``: only passing (True) or failing (False) traces.
    ``scale_by_std`` (grpo): None takes the run's ``trainer.scale_by_std`` from its config.yaml.

    The buffer is first checked against the run's checkpoint (``coevo.rundir.check.verify_run``): every
    trace it counts present, every payload's CRC, ``rounds.jsonl`` holding its rounds. A damaged
    payload is a ``CheckpointError`` naming the segment file; missing traces or rounds are one too,
    unless ``partial`` asks for what is intact (then they warn).
    """
    if fmt not in FORMATS:
        raise ValueError(f"fmt={fmt!r} is not a format; choose one of {list(FORMATS)}")
    run_dir, out_path = Path(run_dir), Path(out_path)
    buffer_dir = run_dir / "buffer"
    if not buffer_dir.is_dir():
        raise FileNotFoundError(f"{run_dir} has no replay buffer ({buffer_dir}); runs in mode harness_only or "
                                "static keep none")
    # read-only: an export never changes the run directory (no lock file, recovery or eviction)
    with ReplayBuffer(buffer_dir, capacity=sys.maxsize, read_only=True) as buffer:
        check_against_checkpoint(run_dir, buffer, partial=partial)
        selected = select(buffer.entries(), rounds=rounds, harness_ids=harness_ids, min_reward=min_reward,
                          max_reward=max_reward, passed=passed)
        advantages: dict[int, float] = {}
        if fmt == "grpo":
            std = run_scale_by_std(run_dir) if scale_by_std is None else bool(scale_by_std)
            advantages = entry_advantages(selected, scale_by_std=std)
        secrets = secret_env_values()
        out_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = out_path.with_name(out_path.name + ".tmp")
        written = dropped = 0
        try:
            with tmp.open("w", encoding="utf-8") as f:
                for entry, trace in _stream(buffer, selected):
                    if fmt == "jsonl" and secrets:
                        trace = redact_trace(trace, None, secrets)
                    for record in RECORDS[fmt](trace, entry, advantages.get(entry.seq, 0.0)):
                        if fmt == "grpo" and secrets and _shows_secret(trace, record["call_index"], secrets):
                            dropped += 1
                            continue
                        f.write(json.dumps(redact(record, secrets), ensure_ascii=False) + "\n")
                        written += 1
            tmp.replace(out_path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    if dropped:
        log.warning("%s: left out %d model call(s) whose text holds the value of a secret environment variable "
                    "(their token ids would decode to it)", out_path, dropped)
    return written


def check_against_checkpoint(run_dir: Path, buffer: ReplayBuffer, *, partial: bool) -> None:
    """The run's buffer and ``rounds.jsonl`` against its checkpoint, when it has one: an export of a
    damaged run says so instead of exporting fewer traces without a word, or dying mid-file on a
    payload that fails its CRC."""
    found = committed(run_dir)
    if found is None:
        return
    rounds_path = run_dir / "rounds.jsonl"
    rounds = [r.round for r in read_rounds(rounds_path)] if rounds_path.is_file() else []
    verify_run(run_dir, *found, buffer=buffer, rounds=rounds, partial=partial)


def _shows_secret(trace: Trace, k: int, secrets: Sequence[str]) -> bool:
    call = trace.model_calls[k]
    return contains_secret([call.messages, call.reply_prefix, call.text], secrets)


# ---------------------------------------------------------------------------------- selection
def _as_list(value: int | str | Iterable[int | str] | None) -> list[int | str] | None:
    """One filter value or several as a list (a bool stays one value, which the filter then refuses by name)."""
    if value is None:
        return None
    if isinstance(value, (str, int)):
        return [value]
    return list(value)


def select(
    entries: Sequence[BufferEntry],
    *,
    rounds: int | Iterable[int] | None = None,
    harness_ids: str | Iterable[str] | None = None,
    min_reward: float | None = None,
    max_reward: float | None = None,
    passed: bool | None = None,
) -> list[BufferEntry]:
    """The entries matching every given filter, in buffer order. A round or harness id the buffer
    does not hold, or reward bounds that are not numbers with ``min <= max``, raise ValueError
    naming the filter and the values the buffer holds."""
    wanted_rounds = _as_list(rounds)
    if wanted_rounds is not None:
        held = sorted({e.round for e in entries})
        bad = [r for r in wanted_rounds if isinstance(r, bool) or not isinstance(r, int) or r not in held]
        if bad or not wanted_rounds:
            raise ValueError(f"rounds={wanted_rounds!r}: the buffer holds rounds {held}")
    wanted_ids = _as_list(harness_ids)
    if wanted_ids is not None:
        held_ids = sorted({e.harness_id for e in entries})
        bad = [h for h in wanted_ids if h not in held_ids]
        if bad or not wanted_ids:
            raise ValueError(f"harness_ids={wanted_ids!r}: the buffer holds harness ids {held_ids}")
    for name, bound in (("min_reward", min_reward), ("max_reward", max_reward)):
        if bound is not None and (isinstance(bound, bool) or not isinstance(bound, (int, float))
                                  or not math.isfinite(bound)):
            raise ValueError(f"{name}={bound!r} must be a finite number (rewards in the buffer span "
                             f"{_reward_span(entries)})")
    if min_reward is not None and max_reward is not None and min_reward > max_reward:
        raise ValueError(f"min_reward={min_reward} is above max_reward={max_reward}")
    if passed is not None and not isinstance(passed, bool):
        raise ValueError(f"passed={passed!r} must be True, False or None")
    return [
        e for e in entries
        if (wanted_rounds is None or e.round in wanted_rounds)
        and (wanted_ids is None or e.harness_id in wanted_ids)
        and (min_reward is None or e.reward >= min_reward)
        and (max_reward is None or e.reward <= max_reward)
        and (passed is None or e.passed == passed)
    ]


def _reward_span(entries: Sequence[BufferEntry]) -> str:
    if not entries:
        return "nothing: the buffer is empty"
    rewards = [e.reward for e in entries]
    return f"[{min(rewards)}, {max(rewards)}]"


def _stream(buffer: ReplayBuffer, entries: list[BufferEntry]) -> Iterator[tuple[BufferEntry, Trace]]:
    """(entry, trace) in buffer order, ``READ_BATCH`` payloads read at a time."""
    batches = buffer.iter_batches(READ_BATCH, entries=entries) if entries else iter(())
    start = 0
    for batch in batches:
        yield from zip(entries[start : start + len(batch)], batch, strict=True)
        start += len(batch)


# ---------------------------------------------------------------------------------- advantages
def run_scale_by_std(run_dir: Path) -> bool:
    """The run's ``trainer.scale_by_std`` (config.yaml), True when the run does not say."""
    path = run_dir / "config.yaml"
    if not path.is_file():
        return True
    trainer = (yaml.safe_load(path.read_text()) or {}).get("trainer") or {}
    return bool(trainer.get("scale_by_std", True))


def entry_advantages(entries: Sequence[BufferEntry], *, scale_by_std: bool = True) -> dict[int, float]:
    """Entry seq → its GRPO advantage among ``entries`` grouped by task id (``group_advantages``);
    only trainable entries join a group, as in the trainer.

    The rewards come from the buffer's index, so advantages are known before any payload is read."""
    if not entries:
        return {}
    from coevo.trainers.advantages import group_advantages

    adv, _, _ = group_advantages([e.task_id for e in entries], [e.reward for e in entries], scale_by_std=scale_by_std,
                                 members=[e.trainable for e in entries])
    return {e.seq: float(a) for e, a in zip(entries, adv.tolist(), strict=True)}


# ---------------------------------------------------------------------------------- records
def chat_messages(trace: Trace) -> list[dict[str, str]]:
    """The trace's conversation in the OpenAI/TRL chat format, up to its last assistant turn
    (empty when the model never answered)."""
    out = []
    for m in trace.messages:
        message = {"role": str(m["role"]), "content": str(m.get("content") or "")}
        if message["role"] == "tool":
            message["name"] = str(m.get("name") or "tool")
        out.append(message)
    last = max((i for i, m in enumerate(out) if m["role"] == "assistant"), default=-1)
    return out[: last + 1]


def _meta(trace: Trace, entry: BufferEntry) -> dict[str, Any]:
    return {"trace_id": trace.trace_id, "task_id": trace.task_id, "harness_id": trace.harness_id,
            "model_version": entry.model_version, "round": entry.round}


def sft_records(trace: Trace, entry: BufferEntry, advantage: float) -> list[dict[str, Any]]:
    messages = chat_messages(trace)
    if not messages:
        return []
    return [{"messages": messages, **_meta(trace, entry), "reward": float(trace.reward), "passed": bool(trace.passed)}]


def grpo_records(trace: Trace, entry: BufferEntry, advantage: float) -> list[dict[str, Any]]:
    if trace.behaviour_logprobs is None:
        raise ValueError(f"trace {trace.trace_id} has no behaviour log-probs; was it inserted through the buffer?")
    out = []
    for k, call in enumerate(trace.model_calls):
        if not call.completion_ids:
            continue
        mask = 1 if trace.trainable and call.trainable else 0
        out.append({
            "prompt_ids": list(call.prompt_ids),
            "completion_ids": list(call.completion_ids),
            "completion_mask": [mask] * len(call.completion_ids),
            "behaviour_logprobs": [float(x) for x in trace.behaviour_logprobs[k]],
            "reward": float(trace.reward),
            "advantage": float(advantage),
            **_meta(trace, entry),
            "call_index": k,
            "loss_weight": float(call.loss_weight),
            "temperature": call.logprob_temperature(),
        })
    return out


def raw_records(trace: Trace, entry: BufferEntry, advantage: float) -> list[dict[str, Any]]:
    return [{**trace.to_dict(), "buffer": {"seq": entry.seq, "round": entry.round,
                                           "model_version": entry.model_version}}]


RECORDS = {"sft": sft_records, "grpo": grpo_records, "jsonl": raw_records}
"""Format → the records of one trace."""
