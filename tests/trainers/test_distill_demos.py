"""Context distillation of the harness's demonstrations: the runtime records where a prompt's
demonstration tokens are, and ``trainer.distill_demos`` trains a success's reply again under the
prompt without them, rated against the current policy."""

from __future__ import annotations

import copy

import pytest
import torch

from coevo.agent.demos import cut_span
from coevo.agent.runtime import run_attempts
from coevo.envs.arithmetic import ArithmeticEnv
from coevo.harness.defaults import base_harness
from coevo.harness.events import DEMO
from coevo.harness.library.context import FewShotDemos
from coevo.policy.hf import TransformersPolicy
from coevo.policy.tiny import tiny_model, tiny_tokenizer
from coevo.trainers.batch import training_sequences
from coevo.trainers.logprobs import logprob_fn
from tests.trainers.helpers import make_trainer, synthetic_traces

DEMO_TURNS = [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "<answer>4</answer>"},
              {"role": "user", "content": "What is 3 + 5?"}, {"role": "assistant", "content": "<answer>8</answer>"}]


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def test_cut_span_finds_the_one_contiguous_cut():
    assert cut_span([1, 2, 3, 4, 5, 6], [1, 2, 5, 6]) == [2, 4]
    assert cut_span([1, 2, 3, 4], [3, 4]) == [0, 2]
    assert cut_span([1, 2, 3, 4], [1, 2]) == [2, 4]
    assert cut_span([1, 2, 3, 4], [1, 3]) is None  # two cuts: not one span
    assert cut_span([1, 2, 3], [1, 2, 3]) is None and cut_span([1, 2], [9, 9, 9]) is None


def test_an_episode_records_where_its_demonstrations_sit_in_the_prompt(tok):
    harness = base_harness().insert(FewShotDemos(turns=DEMO_TURNS))
    policy = TransformersPolicy(tiny_model(tok, seed=0), tok, seed=0)
    env = ArithmeticEnv(n_tasks=6, seed=0)
    runs = run_attempts(env.tasks("train")[:2], harness, policy, env, max_steps=2)
    traces = [t for per_task in runs for t in per_task]
    calls = [c for t in traces for c in t.model_calls]
    assert calls and all(c.demo_span is not None for c in calls)
    for c in calls:
        assert sum(bool(m.get(DEMO)) for m in c.messages) == len(DEMO_TURNS)
        start, end = c.demo_span
        bare = [m for m in c.messages if not m.get(DEMO)]
        assert c.prompt_ids[:start] + c.prompt_ids[end:] == policy.prompt_ids(bare, c.reply_prefix)
        assert "2 + 2" in tok.decode(c.prompt_ids[start:end]) and "2 + 2" not in tok.decode(c.prompt_ids[:start])
    plain = run_attempts(env.tasks("train")[:1], base_harness(), policy, env, max_steps=1)[0][0]
    assert all(c.demo_span is None for c in plain.model_calls)  # no demonstrations, nothing recorded


def test_the_nearest_demonstrations_span_is_what_the_next_shed_leaves_out(tok):
    """``nearest_demo_span`` cuts from the prompt exactly the demonstration the retirement sheds next:
    the prompt without it is the one ``with_one_demonstration_fewer``'s harness renders."""
    from coevo.harness.scaffold import with_one_demonstration_fewer

    harness = base_harness().insert(FewShotDemos(turns=DEMO_TURNS))
    policy = TransformersPolicy(tiny_model(tok, seed=0), tok, seed=0)
    env = ArithmeticEnv(n_tasks=6, seed=0)
    tasks = env.tasks("train")[:2]
    full = [t for per_task in run_attempts(tasks, harness, policy, env, max_steps=1) for t in per_task]
    fewer = [t for per_task in run_attempts(tasks, with_one_demonstration_fewer(harness), policy, env, max_steps=1)
             for t in per_task]
    assert full
    for a, b in zip(full, fewer, strict=True):
        call, shed = a.model_calls[0], b.model_calls[0]
        start, end = call.nearest_demo_span
        assert call.prompt_ids[:start] + call.prompt_ids[end:] == shed.prompt_ids
        shown = tok.decode(call.prompt_ids[start:end])
        assert "3 + 5" in shown and "2 + 2" not in shown
        assert call.demo_span[0] < start and end == call.demo_span[1]  # the last of the demonstrations' tokens
        assert shed.nearest_demo_span == shed.demo_span  # one demonstration left: nearest is all


def test_distilling_under_the_nearest_shed_cuts_only_that_demonstration(tok):
    traces = demo_traces(tok, tiny_model(tok, seed=0))
    for t in traces:
        for c in t.model_calls:
            c.nearest_demo_span = [c.demo_span[0] + 5, c.demo_span[1]]
    adv = torch.tensor([1.0 if t.reward > 0 else -1.0 for t in traces])
    seqs = training_sequences(traces, adv, distill_demos=True, distill_prompt="nearest")
    extra = [s for s in seqs if all(v != v for v in s.old_logp)]
    assert extra
    for s in extra:
        call = next(c for c in traces[s.trace_index].model_calls if c.completion_ids == s.completion_ids)
        start, end = call.nearest_demo_span
        assert s.prompt_ids == call.prompt_ids[:start] + call.prompt_ids[end:]
    with pytest.raises(ValueError, match="distill_prompt='last'"):
        training_sequences(traces, adv, distill_demos=True, distill_prompt="last")


def test_distilling_under_both_prompts_trains_a_copy_under_each_and_one_when_they_agree(tok):
    """``both``: each successful demonstrated reply is trained under the next shed's prompt and under
    the prompt without any demonstration, in that order; where one demonstration is left the two
    prompts are the same, so one copy."""
    traces = demo_traces(tok, tiny_model(tok, seed=0))
    last = traces[0].model_calls[0]  # a call whose prompt shows one demonstration: nearest is all
    for t in traces:
        for c in t.model_calls:
            c.nearest_demo_span = list(c.demo_span) if c is last else [c.demo_span[0] + 5, c.demo_span[1]]
    adv = torch.tensor([1.0 if t.reward > 0 else -1.0 for t in traces])
    seqs = training_sequences(traces, adv, distill_demos=True, distill_prompt="both")
    successes = [c for t in traces if t.reward > 0 for c in t.model_calls]
    assert successes
    for i, t in enumerate(traces):
        copies = [s for s in seqs if s.trace_index == i and all(v != v for v in s.old_logp)]
        calls = [c for c in t.model_calls if t.reward > 0]
        spans = [[c.demo_span] if c is last else [c.nearest_demo_span, c.demo_span] for c in calls]
        # every call under the next shed's prompt, then every call under the prompt without any
        expected = [c.prompt_ids[: sp[j][0]] + c.prompt_ids[sp[j][1]:] for j in (0, 1)
                    for c, sp in zip(calls, spans, strict=True) if j < len(sp)]
        assert [s.prompt_ids for s in copies] == expected
    alone = training_sequences(traces, adv, distill_demos=True, distill_prompt="nearest")
    assert len(seqs) - len(alone) == len(successes) - (last in successes)


def test_the_copies_of_a_chained_episode_pack_into_one_row_per_prompt():
    """A two-call episode whose second prompt continues the first: under ``both`` its four distilled
    copies are two chains (one per prompt), so they pack into two rows, as the episode's own calls
    pack into one."""
    from coevo.agent.trace import ModelCall, Trace
    from coevo.trainers.batch import PackedSequence, pack_calls

    head, demos, question = [5, 6, 7], list(range(40, 52)), [60, 61]
    first = head + demos + question
    reply, tool = [70, 71, 72], [80, 81]
    calls = [ModelCall(0, [], first, reply, None, "", "stop", temperature=1.0),
             ModelCall(1, [], first + reply + tool, [90, 91], None, "", "stop", temperature=1.0)]
    for c in calls:
        c.demo_span, c.nearest_demo_span = [3, 15], [9, 15]  # two demonstrations of six tokens
    trace = Trace("t", "task", "env", "train", "h", "base", "0", model_calls=calls, reward=1.0, passed=True)
    trace.behaviour_logprobs = [[-1.0] * len(c.completion_ids) for c in calls]
    seqs = training_sequences([trace], torch.tensor([1.0]), distill_demos=True, distill_prompt="both")
    assert len(seqs) == 6
    rows = pack_calls(seqs)
    assert len(rows) == 3 and all(isinstance(r, PackedSequence) and len(r.parts) == 2 for r in rows)
    assert [len(r.parts[0].prompt_ids) for r in rows] == [len(first), len(first) - 6, len(first) - 12]


def demo_traces(tok, model, demo_len: int = 12):
    """Synthetic traces whose prompts open with the same ``demo_len`` demonstration tokens (after a
    3-token head), their behaviour log-probs from ``model`` under those prompts."""
    traces = synthetic_traces(model, tok, n_tasks=2, per_task=4, calls=2, system=3)
    demo = list(range(40, 40 + demo_len))
    for t in traces:
        for c in t.model_calls:
            c.prompt_ids = c.prompt_ids[:3] + demo + c.prompt_ids[3:]
            c.demo_span = [3, 3 + demo_len]
    fn = logprob_fn(model, tok.pad_token_id, temperature=1.0, batch_size=8)
    rows = iter(fn([(c.prompt_ids, c.completion_ids) for t in traces for c in t.model_calls]))
    for t in traces:
        t.behaviour_logprobs = [next(rows) for _ in t.model_calls]
    return traces


def test_distilled_sequences_are_the_successes_replies_under_the_bare_prompt(tok):
    traces = demo_traces(tok, tiny_model(tok, seed=0))
    adv = torch.tensor([1.0 if t.reward > 0 else -1.0 for t in traces])
    plain = training_sequences(traces, adv)
    seqs = training_sequences(traces, adv, distill_demos=True)
    winners = [i for i, t in enumerate(traces) if t.reward > 0]
    assert len(seqs) == len(plain) + 2 * len(winners)  # every call of every success, once more
    extra = [s for s in seqs if all(v != v for v in s.old_logp)]
    assert sorted({s.trace_index for s in extra}) == winners
    for s in extra:
        call = next(c for c in traces[s.trace_index].model_calls if c.completion_ids == s.completion_ids)
        start, end = call.demo_span
        assert s.prompt_ids == call.prompt_ids[:start] + call.prompt_ids[end:] and s.advantage > 0
        assert s.sampler_logp is None or all(v != v for v in s.sampler_logp)
    # a trace's copies come after its own calls, so its chained calls stay adjacent
    order = [(s.trace_index, all(v != v for v in s.old_logp)) for s in seqs]
    for i in winners:
        mine = [forced for t, forced in order if t == i]
        assert mine == [False, False, True, True]


def test_distillation_raises_the_bare_prompts_likelihood_of_successful_replies(tok):
    """One SGD step on the same traces: the step trains the distilled copies too (its token count
    grows by the successes' reply tokens), and the successes' replies gain more likelihood under the
    prompt without the demonstrations than the plain step gives them through shared weights."""
    base = tiny_model(tok, seed=0)
    traces = demo_traces(tok, base)
    winners = [t for t in traces if t.reward > 0]

    def bare_logp(model) -> float:
        score = logprob_fn(model, tok.pad_token_id, temperature=1.0, batch_size=8)
        pairs = [(c.prompt_ids[:c.demo_span[0]] + c.prompt_ids[c.demo_span[1]:], c.completion_ids)
                 for t in winners for c in t.model_calls]
        return sum(sum(r) for r in score(pairs))

    before, gains, tokens = bare_logp(base), {}, {}
    for distill in (False, True):
        model = copy.deepcopy(base)
        m = make_trainer(model, tok, optimizer="sgd", lr=0.5, weight_decay=0.0, distill_demos=distill).step(traces)
        assert m.loss == m.loss and m.ratio_max == pytest.approx(1.0, abs=1e-4)  # distilled tokens: ratio 1
        gains[distill], tokens[distill] = bare_logp(model) - before, m.tokens
    assert tokens[True] - tokens[False] == sum(len(c.completion_ids) for t in winners for c in t.model_calls)
    assert gains[True] > gains[False] + 2.0, gains  # measured: +21.5 against +17.5 nats


@pytest.mark.slow
@pytest.mark.parametrize("prompt", ["all", "both"])
def test_the_distillation_preset_trains_distilled_replies_in_a_tiny_run(tmp_path, monkeypatch, prompt):
    """The smoke run from a harness with two demonstrations and ``trainer.distill_demos=true``: the
    buffered calls carry their demonstration spans and the GRPO steps train distilled copies
    (behaviour log-probs all FORCED, prompts without the span); under ``both`` each reply twice,
    under two prompts of different lengths (one demonstration fewer, and none)."""
    from pathlib import Path

    import coevo
    from coevo.trainers import grpo
    from tests.test_loop import smoke

    demos = Path(__file__).resolve().parents[2] / "examples" / "harnesses" / "lenient_tool_choice_demos.yaml"
    trained = []
    original = grpo.training_sequences

    def spy(*args, **kwargs):
        seqs = original(*args, **kwargs)
        forced = [s for s in seqs if s.old_logp and all(v != v for v in s.old_logp)]
        trained.append((kwargs.get("distill_demos"), forced))
        return seqs

    monkeypatch.setattr(grpo, "training_sequences", spy)
    coevo.run(smoke(tmp_path / "run", f"harness.start={demos}", "trainer.distill_demos=true", "rollout.attempts=4",
                    f"trainer.distill_prompt={prompt}"))
    assert trained and all(flag for flag, _ in trained)
    distilled = [s for _, seqs in trained for s in seqs]
    assert distilled and all(s.advantage > 0 for s in distilled)
    prompts: dict[tuple, set[int]] = {}  # (step, trace, reply) -> the prompt lengths it was distilled under
    for step, (_, seqs) in enumerate(trained):
        for s in seqs:
            prompts.setdefault((step, s.trace_index, tuple(s.completion_ids)), set()).add(len(s.prompt_ids))
    assert {len(lengths) for lengths in prompts.values()} == ({1} if prompt == "all" else {2})
