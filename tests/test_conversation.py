"""Multi-turn function-calling conversations under the built-in harnesses: a BFCL-shaped example
env (examples/function_calling_env.py) replayed by its gold policy, and each harness default a
conversation needs, checked where it lives."""

from __future__ import annotations

import dataclasses

import pytest

from coevo.agent.gold import GoldPolicy
from coevo.agent.rollouts import RolloutService
from coevo.harness.defaults import BUILTIN_HARNESSES, base_harness, with_step_cap
from coevo.harness.events import (
    EpisodeState,
    ParsedOutputEvent,
    StepEndEvent,
    TaskView,
    ToolSpec,
    harness_note,
    is_harness_note,
)
from coevo.harness.library import AnswerExtraction, LoopDetection, ParseRetry
from coevo.harness.library.tools import tool_hint_line
from examples.function_calling_env import TOOLS, FunctionCallingEnv

STEPS = 12


def replay(harness_name: str, tasks, env) -> list:
    policy = GoldPolicy(tasks, answer=env.gold_answer)
    service = RolloutService(policy, env, batch_size=len(tasks), max_steps=STEPS, workers=2, seed=0)
    harness = with_step_cap(BUILTIN_HARNESSES[harness_name](), STEPS)
    return service.run(harness, tasks, attempts=1, phase=None).traces


@pytest.fixture(scope="module")
def env():
    return FunctionCallingEnv(n_tasks=16)


def test_gold_replay_of_plain_text_turns_passes_under_the_function_calling_harness(env):
    """Five user turns, two of them talk only, every reply the same plain "Done.": the
    function_calling harness takes each reply as the turn's and the loop detector counts per turn.
    The base harness asks for a format the benchmark does not use and ends with no action."""
    tasks = env.tasks("train")[:5]
    traces = replay("function_calling", tasks, env)
    assert [t.passed for t in traces] == [True] * len(tasks)
    for t in traces:
        assert t.replies == ["Done."] * 4 and t.final_answer == "Done." and t.stop_reason == "answer"
        assert not any(is_harness_note(m) for m in t.messages)  # no reminder interrupted the user
    assert {t.stop_reason for t in replay("base", tasks, env)} == {"no_action"}


def test_repeated_replies_across_user_turns_are_no_loop(env):
    """The same reply with answer tags to three user turns in a row ("Done." twice to talk-only
    turns): the conversational harness's default loop detector (window 3) lets the episode go on."""
    tasks = [dataclasses.replace(t, metadata={**t.metadata, "plain_replies": False}) for t in env.tasks("train")[:3]]
    traces = replay("conversational", tasks, env)
    assert [(t.passed, t.stop_reason) for t in traces] == [(True, "answer")] * 3


def loop_step(state: EpisodeState, actions: list[str]) -> None:
    LoopDetection().process(StepEndEvent(state, actions=actions))


def test_loop_detection_counts_within_a_user_turn():
    state = EpisodeState(task=TaskView("t", "e", "do it", "train"))
    for _ in range(2):
        loop_step(state, ["reply Done."])
        state.replies.append("Done.")  # the env answered with a new user turn
    loop_step(state, ["reply Done."])
    assert not state.done
    for _ in range(3):  # the same call three times in one turn, same (no) result: a loop
        loop_step(state, ["ls()"])
    assert state.done and state.stop_reason == "loop"


def parsed(text: str, **kw) -> ParsedOutputEvent:
    return ParsedOutputEvent(EpisodeState(task=TaskView("t", "e", "x", "train")), text, "stop", 0, **kw)


@pytest.mark.parametrize(("text", "answer"), [
    ("I will provide a tool call with a final answer.", None),  # the phrase, not an answer
    ("The final answer is 42", "42"),
    ("Final answer: 7 apples", "7 apples"),
    ("final answer: .", None),
    ("Answer: Paris", "Paris"),
    ("<answer></answer>", ""),  # an explicit empty answer is still an answer
])
def test_answer_patterns_need_an_answer_not_the_phrase(text, answer):
    assert AnswerExtraction().process(parsed(text)).answer == answer


def test_plain_text_is_the_turns_reply_but_a_broken_tool_call_is_not():
    plain = AnswerExtraction(plain_text=True)
    assert plain.process(parsed("  Sure, the folder is ready.  ")).answer == "Sure, the folder is ready."
    assert plain.process(parsed("<tool_call>{bad", parse_error="could not parse")).answer is None
    assert plain.process(parsed("   ")).answer is None
    assert AnswerExtraction().process(parsed("Sure, the folder is ready.")).answer is None


def test_harness_reminders_are_marked_apart_from_the_user():
    from coevo.policy.chat import to_template_messages

    out = ParseRetry().process(parsed("hmm"))
    (note,) = out.followup
    assert is_harness_note(note) and note["role"] == "user"
    user = {"role": "user", "content": "Please create a folder."}
    rendered = to_template_messages([user, note, harness_note("Summary")], tool_role=False)
    assert rendered[0] == user
    assert rendered[1]["content"].startswith("[harness] I could not find a tool call")
    assert rendered[2] == {"role": "user", "content": "[harness] Summary"}


def test_a_tools_result_schema_reaches_the_hint():
    assert tool_hint_line(TOOLS["mkdir"]).endswith('. Returns: {"type": "object", "properties": {"result": '
                                                   '{"type": "string"}}}')
    assert "Returns" not in tool_hint_line(ToolSpec("x", "No schema.", {}))


def test_the_base_harness_is_unchanged_by_the_conversation_harness():
    fc, base = BUILTIN_HARNESSES["function_calling"](), base_harness()
    assert fc.get("answer_extraction").config["plain_text"] and not base.get("answer_extraction").config["plain_text"]
    assert [p.kind for p in fc] == [p.kind for p in base]


def test_every_builtin_env_is_named_in_the_cli_help():
    from coevo.cli.options import ENV_HELP
    from coevo.envs import ENVS

    assert all(name in ENV_HELP for name in ENVS) and "office" in ENV_HELP


def test_a_bfcl_sized_listing_keeps_the_gold_replay_and_compacts_to_distinct_lines():
    """With 40 tools of other APIs (BFCL lists a whole API whatever the turn needs) the listing is
    BFCL's size, the gold replay still passes, a call to another API's tool is an error result, and the
    compact listing tells every tool apart though each class's descriptions open alike."""
    from coevo.harness.library.tools import compact_listing

    big = FunctionCallingEnv(n_tasks=8, api_tools=40)
    tasks = big.tasks("train")[:2]
    session = big.reset(tasks[0])
    assert len(session.tools) == len(TOOLS) + 40
    assert session.call_tool("message_get_contact", {}).error
    assert [t.passed for t in replay("function_calling", tasks, big)] == [True, True]
    extra = [spec for name, spec in session.tools.items() if name not in TOOLS]
    openings = {spec.description.split(". ")[0] for spec in extra}
    assert len(openings) == 4  # four API classes, one boilerplate opening each
    lines = compact_listing(extra)
    said = [line.split("): ", 1)[1] for line in lines]
    assert len(set(said)) == len(said) and not any(s in openings for s in said)
    with pytest.raises(ValueError, match="api_tools >= 0"):
        FunctionCallingEnv(api_tools=-1)
