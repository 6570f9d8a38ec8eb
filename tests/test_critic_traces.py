"""Cross-harness groups from the gate's evidence and the evolution schedule: the Critic's paired
parent/candidate re-runs enter the buffer with exact behaviour log-probs and join their task's
GRPO group; only tasks whose gold answer no demonstration of the round can show are kept; rounds
without evolution still train."""

from __future__ import annotations

from pathlib import Path

import torch

import coevo
from coevo.buffers import ReplayBuffer
from coevo.buffers.replay import behaviour_logprobs
from coevo.loop.round_plan import round_batches
from coevo.policy.tiny import tiny_model, tiny_tokenizer
from coevo.trainers.logprobs import logprob_fn
from tests.test_loop import records, smoke


def _critic_entries(run_dir: Path):
    with ReplayBuffer(run_dir / "buffer", capacity=512) as buf:
        entries = buf.entries()
        critic = [e for e in entries if e.variant == "critic"]
        return entries, critic, buf.load(critic)


def test_the_critics_re_runs_train_beside_the_rollouts_with_exact_behaviour_logprobs(tmp_path):
    run_dir = Path(coevo.run(smoke(tmp_path / "run", "mode=coevolve", "rounds=2")))
    entries, critic, traces = _critic_entries(run_dir)
    assert critic, "the stat gate re-ran parent and candidate: their traces are in the buffer"
    for r in {e.round for e in critic}:  # the candidate's episodes join groups of the parent's: cross-harness
        tasks = {e.task_id for e in critic if e.round == r}
        assert len({e.harness_id for e in entries if e.task_id in tasks and e.round == r}) >= 2

    # leakage: a critic trace is kept only for a task that round r or a later one trains on (no
    # demonstration of round r can show its gold answer); val and test tasks never reach the Critic
    from coevo.envs.load import make_env

    env = make_env("arithmetic", {"n_tasks": 30, "max_terms": 3, "max_operand": 3, "partial_credit": True})
    batches = round_batches(env.tasks("train"), 4, 0, 2)
    for e in critic:
        later = {t.task_id for b in batches[e.round :] for t in b}
        assert e.task_id in later, (e.round, e.task_id)

    # exact behaviour log-probs: round 0's critic traces ran on the initial weights (version 0)
    tok = tiny_tokenizer()
    model = tiny_model(tok, seed=0)
    first = [t for t, e in zip(traces, critic, strict=True) if e.round == 0 and e.model_version == 0]
    assert first
    fresh = behaviour_logprobs(first, logprob_fn(model, tok.pad_token_id, temperature=1.0, batch_size=8))
    for trace, row in zip(first, fresh, strict=True):
        stored = [lp for call in trace.behaviour_logprobs for lp in call]
        assert torch.allclose(torch.tensor(stored), torch.tensor([lp for call in row for lp in call]), atol=1e-5)

    # the round's GRPO groups took them: more traces than the round's own rollouts (4 tasks x 2)
    recs = records(run_dir)
    rounds_with_critic = {e.round for e in critic}
    for rec in recs:
        rollouts = sum(1 for e in entries if e.round <= rec["round"] and e.variant != "critic")
        if rec["round"] in rounds_with_critic and rec["evolve"] is not None:
            assert rec["grpo"]["buffer_traces"] > min(rollouts, 8)
            assert rec["grpo"]["critic_traces"] == sum(e.round == rec["round"] for e in critic)
            assert 0.0 <= rec["grpo"]["zero_variance_without_critic"] <= 1.0


def test_without_critic_traces_the_buffer_holds_rollouts_only(tmp_path):
    run_dir = Path(coevo.run(smoke(tmp_path / "run", "mode=coevolve", "rounds=1", "buffer.critic_traces=false")))
    entries, critic, _ = _critic_entries(run_dir)
    assert entries and not critic
    assert records(run_dir)[0]["grpo"]["buffer_traces"] == 8


def test_the_schedule_evolves_early_and_on_its_cadence_and_trains_every_round(tmp_path):
    run_dir = Path(coevo.run(smoke(tmp_path / "run", "mode=coevolve", "rounds=4", "evolution.early_rounds=1",
                                   "evolution.every=2")))
    recs = records(run_dir)
    assert [r["evolve"] is not None for r in recs] == [True, False, True, False]  # round 0, then 0 + 2
    assert all(r["grpo"] is not None and r["grpo"]["steps"] for r in recs)
    assert [len(r["grpo"]["steps"]) for r in recs] == [1, 1, 1, 1]
