"""Every substitution rule, positive and negative; each error names the processor and rule."""

import pytest

from coevo.harness import (
    DuplicateNameError,
    EventTypeError,
    Harness,
    HookMismatchError,
    OrderingError,
    ParamError,
    SingletonConflictError,
    UnknownProcessorError,
)
from coevo.harness.defaults import base_harness
from coevo.harness.library import (
    FewShotDemos,
    JsonToolCallParser,
    ParseRetry,
    SelfVerification,
    SlidingWindowMemory,
    SummaryMemory,
    SystemPrompt,
    TemperatureSchedule,
    TokenAnnotation,
)


@pytest.fixture
def base():
    return base_harness()


def test_insert_appends_to_its_hook_and_records_lineage(base):
    h = base.insert(SlidingWindowMemory())
    assert h.at("before_model")[-1].name == "sliding_window"
    assert h.parent_id == base.id and h.id != base.id
    assert h.edit.op == "insert" and h.edit.processor == "sliding_window"
    assert "sliding_window" not in base  # the original is unchanged


def test_insert_at_index_and_after(base):
    h = base.insert(FewShotDemos(demos=["q", "a"]), after="system_prompt")
    names = [p.name for p in h.at("task_start")]
    assert names[names.index("system_prompt") + 1] == "few_shot"
    h2 = base.insert(TemperatureSchedule(), index=0)
    assert h2.at("before_model")[0].name == "temperature_schedule"


def test_insert_at_wrong_hook_is_refused(base):
    with pytest.raises(HookMismatchError, match=r"\[same_hook\] processor 'sliding_window'"):
        base.insert(SlidingWindowMemory(), hook="after_model")
    with pytest.raises(HookMismatchError, match="sliding_window"):
        base.insert(SlidingWindowMemory(), after="system_prompt")  # system_prompt is at task_start


def test_insert_out_of_range_index_is_refused(base):
    with pytest.raises(UnknownProcessorError, match="index 99"):
        base.insert(TemperatureSchedule(), index=99)


def test_event_type_chain_refuses_consumer_before_producer(base):
    # ParseRetry consumes ParsedOutputEvent, which only exists after the parser ran.
    with pytest.raises(EventTypeError, match=r"\[event_type\] processor 'early_retry'.*ParsedOutputEvent"):
        base.insert(ParseRetry(name="early_retry"), index=0)


def test_removing_the_parser_breaks_the_chain(base):
    # its consumers no longer receive ParsedOutputEvent...
    with pytest.raises(EventTypeError, match="processor 'answer_extraction': consumes ParsedOutputEvent"):
        base.remove("json_tool_parser")
    # ...and without consumers the hook itself no longer delivers what the runtime needs
    bare = base.remove("parse_retry").remove("answer_extraction")
    with pytest.raises(EventTypeError, match="after_model must deliver ParsedOutputEvent"):
        bare.remove("json_tool_parser")


def test_replace_with_compatible_processor(base):
    h = base.replace("json_tool_parser", JsonToolCallParser(name="json_tool_parser", lenient=False))
    assert h.get("json_tool_parser").config["lenient"] is False
    assert [p.name for p in h.at("after_model")] == [p.name for p in base.at("after_model")]
    assert h.edit.op == "replace"


def test_replace_across_hooks_is_refused(base):
    with pytest.raises(HookMismatchError, match=r"processor 'system_prompt'.*cannot replace 'json_tool_parser'"):
        base.replace("json_tool_parser", SystemPrompt())


def test_replace_with_incompatible_event_type_is_refused(base):
    # A parser's place (ModelOutputEvent in) cannot take a processor that needs parsed output.
    with pytest.raises(EventTypeError, match="processor 'verify2': consumes ParsedOutputEvent"):
        base.replace("json_tool_parser", SelfVerification(name="verify2"))


def test_singleton_group_conflict(base):
    h = base.insert(SlidingWindowMemory())
    with pytest.raises(SingletonConflictError, match=r"\[singleton_group\] processor 'summary_memory'.*'sliding_window'"):
        h.insert(SummaryMemory())
    with pytest.raises(SingletonConflictError, match="system_prompt"):
        base.insert(SystemPrompt(name="second_prompt"))
    # replacing within the group is the legal way to swap
    swapped = h.replace("sliding_window", SummaryMemory())
    assert "summary_memory" in swapped and "sliding_window" not in swapped


def test_ordering_constraint(base):
    # parse_retry must run after answer_extraction; putting it first at after_model (after the parser) fails
    h = base.remove("parse_retry")
    with pytest.raises(OrderingError, match=r"\[ordering\] processor 'parse_retry'.*answer_extraction"):
        h.insert(ParseRetry(), after="json_tool_parser")
    ok = h.insert(ParseRetry())
    assert ok.at("after_model")[-1].name == "parse_retry"
    # self_verification between answer_extraction and parse_retry is fine...
    h3 = base.insert(SelfVerification(), after="answer_extraction")
    assert [p.name for p in h3.at("after_model")][-2:] == ["self_verification", "parse_retry"]
    # ...before answer_extraction it is not; after parse_retry neither (parse_retry runs after it)
    with pytest.raises(OrderingError, match="processor 'self_verification'.*answer_extraction"):
        base.insert(SelfVerification(), after="json_tool_parser")
    with pytest.raises(OrderingError, match="processor 'parse_retry'.*self_verification"):
        base.insert(SelfVerification())


def test_duplicate_names_refused(base):
    with pytest.raises(DuplicateNameError, match=r"\[unique_name\] processor 'token_annotation'"):
        base.insert(TokenAnnotation())


def test_set_param_typed(base):
    h = base.set_param("step_budget", "max_steps", 3)
    assert h.get("step_budget").config["max_steps"] == 3
    assert h.edit.op == "set_param" and h.edit.param == "max_steps"
    with pytest.raises(ParamError, match=r"\[param_type\] processor 'step_budget'.*expects int"):
        base.set_param("step_budget", "max_steps", "three")
    with pytest.raises(ParamError, match="unknown parameter"):
        base.set_param("step_budget", "budget", 3)
    with pytest.raises(ParamError, match="must be one of"):
        base.set_param("loop_detection", "action", "explode")
    with pytest.raises(UnknownProcessorError, match="no_such"):
        base.set_param("no_such", "x", 1)


def test_remove_and_unknown(base):
    h = base.remove("loop_detection")
    assert "loop_detection" not in h and h.edit.op == "remove"
    with pytest.raises(UnknownProcessorError):
        base.remove("loop_detection_typo")


def test_harness_is_immutable(base):
    with pytest.raises(AttributeError):
        base.name = "x"
    with pytest.raises(TypeError):
        base.get("step_budget").config["max_steps"] = 1


def test_apply_edit_replays_lineage(base):
    from coevo.harness import apply_edit

    h1 = base.insert(SlidingWindowMemory(keep_last=2)).set_param("step_budget", "max_steps", 4)
    replay = apply_edit(apply_edit(base, base.insert(SlidingWindowMemory(keep_last=2)).edit), h1.edit)
    assert replay.id == h1.id


def test_empty_harness_needs_a_parser():
    with pytest.raises(EventTypeError, match="after_model"):
        Harness([])
    assert Harness([JsonToolCallParser()]).at("after_model")[0].kind == "json_tool_parser"
