"""Each built-in processor does its job, checked directly on events."""

import json

import pytest

from coevo.harness import Dimension, ParamError
from coevo.harness import events as ev
from coevo.harness.library import (
    BUILTIN,
    AnswerExtraction,
    ArgumentGuard,
    EpisodeMetrics,
    FewShotDemos,
    InfraErrorFilter,
    InstructionTemplate,
    Journal,
    JsonToolCallParser,
    LoopDetection,
    ParseRetry,
    PythonExecutor,
    SamplingConfig,
    SelfVerification,
    SlidingWindowMemory,
    StepBudget,
    SummaryMemory,
    SystemPrompt,
    TemperatureSchedule,
    TokenAnnotation,
    ToolChoice,
    ToolRegistry,
    ToolSchemaHint,
    ToolTimeout,
    ToolWhitelist,
)
from coevo.harness.library.control import CONSECUTIVE_PARSE_FAILURES


def state(**kw):
    s = ev.EpisodeState(task=ev.TaskView("t1", "arithmetic", "What is 2 + 3?"), **kw)
    if not s.messages:
        s.messages = [{"role": "user", "content": "What is 2 + 3?"}]
    return s


def parsed(text="", **kw):
    return ev.ParsedOutputEvent(state(), text=text, **kw)


def test_at_least_two_processors_per_dimension():
    for dim in Dimension:
        assert sum(cls.dimension is dim for cls in BUILTIN) >= 2, dim


# --- model selection
def test_sampling_config_sets_params():
    s = state()
    SamplingConfig(temperature=0.7, max_new_tokens=64, stop=["</answer>"]).process(ev.TaskStartEvent(s))
    assert (s.sampling.temperature, s.sampling.max_new_tokens, s.sampling.stop) == (0.7, 64, ["</answer>"])


def test_temperature_schedule_rises_with_failures_and_caps():
    s = state()
    req = ev.ModelRequestEvent(s, messages=[], sampling=ev.SamplingParams(temperature=0.2))
    assert TemperatureSchedule().process(req).sampling.temperature == 0.2
    s.memory[CONSECUTIVE_PARSE_FAILURES] = 2
    req = ev.ModelRequestEvent(s, messages=[], sampling=ev.SamplingParams(temperature=0.2))
    assert TemperatureSchedule(increase=0.3, max_temperature=0.7).process(req).sampling.temperature == 0.7


# --- context
def test_system_prompt_instruction_and_demos_compose_in_order():
    s = state(messages=[{"role": "system", "content": "old"}, {"role": "user", "content": "raw"}])
    e = ev.TaskStartEvent(s)
    SystemPrompt(template="Solve {env} tasks.").process(e)
    InstructionTemplate(template="Task: {instruction}").process(e)
    FewShotDemos(demos=["What is 1+1?", "<answer>2</answer>"]).process(e)
    assert [m["role"] for m in s.messages] == ["system", "user", "assistant", "user"]
    assert s.messages[0]["content"] == "Solve arithmetic tasks."
    assert s.messages[-1]["content"] == "Task: What is 2 + 3?"
    assert s.messages[2]["content"] == "<answer>2</answer>"


def test_few_shot_needs_pairs():
    with pytest.raises(ParamError, match="even number"):
        FewShotDemos(demos=["only a question"])


TOOL_DEMO = [
    {"role": "user", "content": "What is 4 + 5?"},
    {"role": "assistant",
     "content": '<tool_call>{"name": "calculator", "arguments": {"expression": "4 + 5"}}</tool_call>'},
    {"role": "tool", "name": "calculator", "content": "9"},
    {"role": "assistant", "content": "<answer>9</answer>"},
]


def test_few_shot_turns_put_tool_turns_where_the_runtime_puts_them():
    """A demonstration with a tool turn: the call, the tool result in its own turn, the answer;
    after the plain pairs and before the task, and the harness spec round-trips it."""
    from coevo.harness.defaults import base_harness
    from coevo.harness.harness import Harness

    s = state(messages=[{"role": "system", "content": "sys"}, {"role": "user", "content": "What is 2 + 3?"}])
    FewShotDemos(demos=["What is 1+1?", "<answer>2</answer>"], turns=TOOL_DEMO).process(ev.TaskStartEvent(s))
    assert [m["role"] for m in s.messages] == ["system", "user", "assistant", *[t["role"] for t in TOOL_DEMO], "user"]
    # each inserted turn marked as a demonstration (coevo.agent.demos finds its tokens); the task is not
    assert s.messages[3:7] == [{**t, ev.DEMO: True} for t in TOOL_DEMO]
    assert s.messages[-1]["content"] == "What is 2 + 3?"
    assert all(m.get(ev.DEMO) for m in s.messages[1:7])
    assert not any(ev.DEMO in m for m in (s.messages[0], s.messages[-1]))
    s.messages[5]["content"] = "changed"  # the processor's own value is never handed out to be mutated
    assert FewShotDemos(turns=TOOL_DEMO).config["turns"][2]["content"] == "9"
    h = base_harness().insert(FewShotDemos(turns=TOOL_DEMO))
    assert Harness.from_yaml(h.to_yaml()).id == h.id
    assert h.get("few_shot").config["turns"] == TOOL_DEMO


@pytest.mark.parametrize("turns, match", [
    ([{"role": "user", "content": "q"}], "no assistant turn"),
    ([{"role": "assistant", "content": "a"}], "starts with a assistant turn"),
    ([{"role": "user", "content": "q"}, {"role": "tool", "name": "calculator", "content": "9"}], "no assistant turn"),
    (TOOL_DEMO[:1] + TOOL_DEMO[2:], "no assistant turn"),  # a tool result nobody asked for
    # a tool turn names its tool
    ([{"role": "user", "content": "q"}, {"role": "tool", "content": "9"}], "expects turns"),
    ([{"role": "system", "content": "q"}], "expects turns"),
    (["What is 1+1?", "<answer>2</answer>"], "expects turns"),
])
def test_few_shot_turns_refuse_what_no_episode_looks_like(turns, match):
    with pytest.raises(ParamError, match=match):
        FewShotDemos(turns=turns)


# --- memory
def _long_request():
    msgs = [{"role": "system", "content": "sys"}, {"role": "user", "content": "task"}]
    msgs += [{"role": "assistant" if i % 2 == 0 else "tool", "content": f"m{i} " + "x" * 300} for i in range(10)]
    s = state(messages=msgs, prefix_len=2)
    return ev.ModelRequestEvent(s, messages=list(msgs))


def test_sliding_window_keeps_prefix_and_last_n():
    out = SlidingWindowMemory(keep_last=3).process(_long_request())
    assert [m["content"][:3] for m in out.messages] == ["sys", "tas", "m7 ", "m8 ", "m9 "]
    assert len(out.state.messages) == 12  # history untouched


def test_summary_memory_compresses_older_messages():
    out = SummaryMemory(keep_last=2, line_chars=20).process(_long_request())
    assert len(out.messages) == 2 + 1 + 2
    summary = out.messages[2]["content"]
    assert summary.startswith("Summary of earlier steps") and summary.count("\n- ") == 8
    assert "m0 xxxxxxxxxxxxxxxxx…" in summary
    assert sum(len(m["content"]) for m in out.messages) < 1500


# --- tools
def _offered(s):
    schema = {"properties": {"x": {"type": "string"}}}
    s.available_tools = {n: ev.ToolSpec(n, f"does {n}", schema) for n in ("a", "b", "c")}


def test_tool_registry_and_schema_hint():
    s = state(messages=[{"role": "system", "content": "S"}, {"role": "user", "content": "q"}])
    _offered(s)
    e = ev.TaskStartEvent(s)
    ToolRegistry(enabled=["b", "zzz"]).process(e)
    assert list(s.tools) == ["b"]
    ToolSchemaHint().process(e)
    assert "- b: does b" in s.messages[0]["content"] and "- a:" not in s.messages[0]["content"]
    assert "<tool_call>" in s.messages[0]["content"]
    ToolRegistry().process(e)
    assert sorted(s.tools) == ["a", "b", "c"]


@pytest.mark.parametrize(
    "text,names,error",
    [
        ('<tool_call>{"name": "calc", "arguments": {"e": "1+1"}}</tool_call>', ["calc"], None),
        ('a<tool_call>{"name": "a", "arguments": {}}</tool_call> b '
         '<tool_call>{"name": "b", "arguments": "{\\"k\\": 1}"}</tool_call>', ["a", "b"], None),
        ('<tool_call>{"name": calc}</tool_call>', [], "could not parse"),
        ('I will use {"name": "calc", "arguments": {"e": "2"}} now', ["calc"], None),
        ("no call here {not json}", [], None),
    ],
)
def test_json_tool_parser(text, names, error):
    out = JsonToolCallParser().process(ev.ModelOutputEvent(state(), text=text))
    assert isinstance(out, ev.ParsedOutputEvent)
    assert [c.name for c in out.tool_calls] == names
    assert (out.parse_error is None) == (error is None)
    if error:
        assert error in out.parse_error


def test_json_tool_parser_strict_and_max_calls():
    text = '{"name": "calc", "arguments": {}}'
    assert JsonToolCallParser(lenient=False).process(ev.ModelOutputEvent(state(), text=text)).tool_calls == []
    many = "".join(f'<tool_call>{{"name": "t{i}", "arguments": {{}}}}</tool_call>' for i in range(6))
    assert len(JsonToolCallParser(max_calls=2).process(ev.ModelOutputEvent(state(), text=many)).tool_calls) == 2


def test_json_tool_parser_tells_the_model_about_dropped_calls():
    many = "".join(f'<tool_call>{{"name": "t{i}", "arguments": {{}}}}</tool_call>' for i in range(6))
    out = JsonToolCallParser(max_calls=4).process(ev.ModelOutputEvent(state(), text=many))
    assert [c.name for c in out.tool_calls] == ["t0", "t1", "t2", "t3"]
    assert "dropped 2 tool call(s) beyond max_calls=4: t4, t5" in out.parse_error  # in the trace's event log
    (note,) = out.followup  # shown to the model after the results of the calls that ran
    assert note["role"] == "user" and "first 4 of your 6 tool calls" in note["content"] and "t4, t5" in note["content"]
    within = JsonToolCallParser(max_calls=4).process(ev.ModelOutputEvent(state(), text=many[: many.index("t4") - 20]))
    assert len(within.tool_calls) == 4 and within.followup == [] and within.parse_error is None


@pytest.mark.parametrize("text", [
    '<answer>{"name": "Dana Silva", "email": "dana@example.com"}</answer>',
    'Found her. <answer>{"name": "Dana Silva", "arguments": {}}</answer>',
    '<answer>{"name": "Dana Silva", "arguments": {}}',  # an answer cut off at the token budget
])
def test_json_tool_parser_never_reads_an_answer_as_a_call(text):
    out = JsonToolCallParser().process(ev.ModelOutputEvent(state(), text=text))
    assert out.tool_calls == [] and out.parse_error is None
    call = '{"name": "lookup", "arguments": {}} '
    outside = JsonToolCallParser().process(ev.ModelOutputEvent(state(), text=call + text))
    assert [c.name for c in outside.tool_calls] == ["lookup"]  # bare JSON outside the answer still counts


def test_tool_schema_hint_names_optional_arguments():
    s = state(messages=[{"role": "system", "content": "S"}, {"role": "user", "content": "q"}])
    props = {"query": {"type": "string"}, "limit": {"type": "integer"}, "offset": {"type": "integer"}}
    s.tools = {"search": ev.ToolSpec("search", "finds mail.", {"properties": props, "required": ["query"]}),
               "calc": ev.ToolSpec("calc", "computes.", {"properties": {"e": {"type": "string"}}, "required": ["e"]})}
    ToolSchemaHint().process(ev.TaskStartEvent(s))
    system = s.messages[0]["content"]
    assert f"- search: finds mail. Arguments: {json.dumps(props)}; optional: limit, offset\n" in system
    assert '- calc: computes. Arguments: {"e": {"type": "string"}}\n' in system  # all required: as before


def test_a_compact_tool_listing_names_every_tool_in_a_fraction_of_the_schema_listing():
    """A benchmark's 30-tool classes listed with {tools_compact}: every name and argument, the first
    sentence of each description, a quarter of the characters of the full JSON schemas."""
    props = {f"arg{i}": {"type": "string", "description": f"the {i}th argument of the call, as a string"}
             for i in range(4)}
    tools = {f"tool_{n}": ev.ToolSpec(f"tool_{n}", f"Does thing {n}. It has side effects on the file system.",
                                      {"properties": props, "required": ["arg0", "arg1"]}) for n in range(30)}

    def system(template: str | None) -> str:
        s = state(messages=[{"role": "user", "content": "q"}])
        s.tools = dict(tools)
        ToolSchemaHint(**({"template": template} if template else {})).process(ev.TaskStartEvent(s))
        return s.messages[0]["content"]

    full = system(None)
    compact = system("Tools:\n{tools_compact}\nCall one as <tool_call>{...}</tool_call>.")
    assert "- tool_7(arg0, arg1, arg2?, arg3?): Does thing 7\n" in compact
    assert all(f"- tool_{n}(" in compact for n in range(30)) and '"type"' not in compact
    assert len(compact) < len(full) / 4


def test_a_compact_listing_keeps_the_sentence_that_tells_each_tool_apart():
    """BFCL-shaped: every tool of a class opens with the same boilerplate sentence; the compact line
    shows the first sentence that is the tool's own, and a tool with none keeps its first."""
    from coevo.harness.library.tools import compact_listing

    shared = "This tool belongs to the Message API, which is used to manage user-to-user messages."
    own = {"send_message": "Send a message to a user.", "delete_message": "Delete the latest message sent to a "
           "receiver.", "view_messages_sent": "View all historical messages sent by the current user."}
    specs = [ev.ToolSpec(name, f"{shared} {text} Returns a status.", {"properties": {"receiver_id": {}},
                                                                         "required": ["receiver_id"]})
             for name, text in own.items()] + [ev.ToolSpec("calc", "Computes. Returns a status.")]
    lines = compact_listing(specs)
    assert lines[:3] == [f"- {name}(receiver_id): {text.rstrip('.')}" for name, text in own.items()]
    assert lines[3] == "- calc(): Computes"
    assert len(set(line.split(": ", 1)[1] for line in lines)) == 4  # no two tools read alike
    alone = compact_listing([ev.ToolSpec("only", f"{shared} Returns a status.")])
    assert alone == ["- only(): This tool belongs to the Message API, which is used to manage user-to-user messages"]
    same = compact_listing([ev.ToolSpec("a", "Same words."), ev.ToolSpec("b", "Same words.")])
    assert same == ["- a(): Same words", "- b(): Same words"]  # nothing of its own: the first sentence


def request(step=0, tools=("calculator", "python")):
    s = state(step=step)
    s.tools = {n: ev.ToolSpec(n, "") for n in tools}
    return ev.ModelRequestEvent(s, messages=list(s.messages))


def test_tool_choice_prefills_a_call_the_parser_completes():
    named = ToolChoice(tool="calculator").process(request())
    assert named.reply_prefix == '<tool_call>{"name": "calculator", "arguments": {'
    assert ToolChoice().process(request()).reply_prefix == '<tool_call>{"name": "'
    # the model's continuation after each prefix parses as the call a tool_call_text would write
    from coevo.harness.library.tools import tool_call_text

    whole = tool_call_text(ev.ToolCall("calculator", {"expression": "2 + 3"}))
    one_arg = request()
    one_arg.state.tools["calculator"] = ev.ToolSpec("calculator", "", {
        "type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]})
    keyed = ToolChoice(tool="calculator").process(one_arg).reply_prefix
    assert keyed == '<tool_call>{"name": "calculator", "arguments": {"expression": "'  # the only argument's key too
    counted = request()
    counted.state.tools["calculator"] = ev.ToolSpec("calculator", "", {"properties": {"n": {"type": "integer"}}})
    assert ToolChoice(tool="calculator").process(counted).reply_prefix.endswith('{"n": ')  # no quote for a number
    for prefix in (named.reply_prefix, '<tool_call>{"name": "', keyed):
        assert whole.startswith(prefix)
        out = JsonToolCallParser(lenient=False).process(ev.ModelOutputEvent(state(), text=prefix + whole[len(prefix):]))
        assert [(c.name, c.arguments) for c in out.tool_calls] == [("calculator", {"expression": "2 + 3"})]


def test_tool_choice_forces_only_the_first_steps_and_only_enabled_tools():
    forced = [ToolChoice(steps=2).process(request(step=k)).reply_prefix != "" for k in range(4)]
    assert forced == [True, True, False, False]
    assert ToolChoice().process(request(step=1)).reply_prefix == ""
    assert ToolChoice(tool="calculator").process(request(tools=("python",))).reply_prefix == ""  # not enabled
    assert ToolChoice().process(request(tools=())).reply_prefix == ""  # no tool to call
    offered_only = request(tools=())
    offered_only.state.available_tools = {"calculator": ev.ToolSpec("calculator", "")}  # offered, not enabled
    assert ToolChoice(tool="calculator").process(offered_only).reply_prefix == ""


@pytest.mark.parametrize(("params", "match"), [
    ({"steps": 0}, "'steps' must be >= 1"),
    ({"steps": -2}, "'steps' must be >= 1"),
    ({"steps": 1.5}, "'steps' expects int"),
    ({"tool": 'calc", "x'}, "'tool' must be a tool name"),
    ({"tool": " calculator"}, "'tool' must be a tool name"),
    ({"tool": None}, "'tool' expects str"),
    ({"tools": "calculator"}, "unknown parameter"),
])
def test_tool_choice_params_are_validated(params, match):
    with pytest.raises(ParamError, match=match):
        ToolChoice(**params)


def test_tool_choice_composes_serialises_and_admits_one_prefix():
    from coevo.harness import Harness
    from coevo.harness.defaults import base_harness
    from coevo.harness.errors import SingletonConflictError
    from coevo.harness.library import build_processor

    h = base_harness().insert(ToolChoice(tool="python", steps=2))
    assert [p.name for p in h.at("before_model")] == ["tool_choice"]
    back = Harness.from_yaml(h.to_yaml())
    assert back.id == h.id and back.get("tool_choice").config == {"tool": "python", "steps": 2}
    assert build_processor({"kind": "tool_choice", "params": {"tool": "calculator"}}) == ToolChoice(tool="calculator")
    with pytest.raises(SingletonConflictError, match="reply_prefix"):
        h.insert(ToolChoice(name="second"))
    m = ToolChoice().manifest()
    assert (m.hook.value, m.dimension, m.group) == ("before_model", Dimension.TOOLS, "reply_prefix")


def test_tool_whitelist_blocks_with_message():
    s = state()
    s.tools = {"calc": ev.ToolSpec("calc", "")}
    ok = ToolWhitelist().process(ev.ToolCallEvent(s, call=ev.ToolCall("calc", {})))
    assert ok.result is None
    blocked = ToolWhitelist(allowed=["calc"]).process(ev.ToolCallEvent(s, call=ev.ToolCall("python", {})))
    assert "not allowed" in blocked.result.error and "calc" in blocked.result.error


# --- execution
def test_python_executor_registers_and_runs_with_limits():
    p = PythonExecutor(timeout_s=60.0)  # a cell starting under load can take seconds
    s = state()
    p.process(ev.TaskStartEvent(s))
    assert s.available_tools["python"].provider == "python_executor"
    assert p.call_tool("python", {"code": "print(6*7)"}, 60.0).output.strip() == "42"
    slow = p.call_tool("python", {"code": "while True: pass"}, 0.5)
    assert slow.error is not None and "timed out" in slow.error
    assert p.call_tool("python", {}, 1.0).error == "python needs a string argument 'code'"


def test_tool_timeout_per_tool():
    s = state()
    p = ToolTimeout(default_s=3, per_tool={"python": 1.5})
    assert p.process(ev.ToolCallEvent(s, call=ev.ToolCall("python", {}))).timeout_s == 1.5
    assert p.process(ev.ToolCallEvent(s, call=ev.ToolCall("calc", {}))).timeout_s == 3.0


# --- evaluation
@pytest.mark.parametrize(
    "text,answer",
    [
        ("so <answer> 42 </answer>", "42"),
        ("<answer>1 2\n3 4</answer>", "1 2\n3 4"),
        ("Final answer: 8\nand more text", "8"),
        ("the result is \\boxed{17}", "17"),
        ("Final answer: 8\nbye", "8"),
        ("Answer: 12", "12"),
        ("I think it is 5", None),
        ("<answer></answer>", ""),  # an empty reply, scored as such; not a format failure to retry
        ("so <answer>  \n </answer>", ""),
        ("\\boxed{}", ""),
        ("Final answer: \n", None),  # open-ended: nothing after it is no answer
    ],
)
def test_answer_extraction(text, answer):
    assert AnswerExtraction().process(parsed(text)).answer == answer


def test_answer_extraction_fallback_and_tool_calls_win():
    assert AnswerExtraction(last_number_fallback=True).process(parsed("maybe 3 or 5")).answer == "5"
    e = parsed("<answer>4</answer>", tool_calls=[ev.ToolCall("calc", {})])
    assert AnswerExtraction().process(e).answer is None
    with pytest.raises(ParamError, match="invalid regex"):
        AnswerExtraction(patterns=["(unclosed"])


def test_self_verification_holds_first_answer_only():
    e = parsed("<answer>4</answer>", answer="4")
    out = SelfVerification().process(e)
    assert out.hold_answer and "You answered 4" in out.followup[0]["content"]
    again = ev.ParsedOutputEvent(out.state, text="<answer>5</answer>", answer="5")
    assert not SelfVerification().process(again).hold_answer


# --- control
def test_step_budget():
    s = state()
    s.step = 1
    StepBudget(max_steps=3).process(ev.StepEndEvent(s))
    assert not s.done
    s.step = 2
    StepBudget(max_steps=3).process(ev.StepEndEvent(s))
    assert s.done and s.stop_reason == "step_budget"


def test_loop_detection_stop_and_warn():
    s = state()
    for _ in range(3):
        LoopDetection(window=3).process(ev.StepEndEvent(s, actions=["calc(e='1')"]))
    assert s.stop_reason == "loop"
    s2 = state()
    for a in ["x", "y", "y"]:
        LoopDetection(window=2, action="warn").process(ev.StepEndEvent(s2, actions=[a]))
    assert not s2.done and "repeating" in s2.messages[-1]["content"]


def loop_step(s, action, result):
    """One step as the runtime leaves it: the assistant's call, the tool's result, then step_end."""
    s.messages += [{"role": "assistant", "content": f"<tool_call>{action}</tool_call>"},
                   {"role": "tool", "name": "examine", "content": result}]
    return ev.StepEndEvent(s, actions=[action])


def test_loop_detection_ignores_repeated_calls_whose_results_change():
    s, detector = state(), LoopDetection(window=3)
    for t in range(5):  # waiting in a simulator: the same call, the world moves on
        detector.process(loop_step(s, "examine()", f"the kettle is at {20 + 10 * t} C"))
    assert not s.done
    for _ in range(3):  # the same call and the same result three times: a loop
        detector.process(loop_step(s, "examine()", "the kettle is boiling"))
    assert s.stop_reason == "loop"
    assert "result changed" in LoopDetection.description


def test_parse_retry_counts_and_gives_up():
    p = ParseRetry(max_retries=1)
    e = p.process(parsed("mumble", parse_error="could not parse tool call"))
    assert e.followup and "could not parse" in e.followup[0]["content"]
    assert e.state.memory[CONSECUTIVE_PARSE_FAILURES] == 1
    e2 = p.process(ev.ParsedOutputEvent(e.state, text="mumble"))
    assert e2.followup == [] and e.state.memory[CONSECUTIVE_PARSE_FAILURES] == 2
    e3 = p.process(ev.ParsedOutputEvent(e.state, text="<answer>1</answer>", answer="1"))
    assert e3.state.memory[CONSECUTIVE_PARSE_FAILURES] == 0


def test_argument_guard():
    s = state()
    call = ev.ToolCall("python", {"code": "import os\nos.system('x')"})
    bad = ArgumentGuard().process(ev.ToolCallEvent(s, call=call))
    assert "blocked" in bad.result.error
    good = ArgumentGuard().process(ev.ToolCallEvent(s, call=ev.ToolCall("python", {"code": "import math"})))
    assert good.result is None


# --- observability
def test_journal_and_episode_metrics():
    s = state()
    s.usage.update(prompt_tokens=100, completion_tokens=20, tool_calls=4, tool_errors=1)
    Journal(max_chars=5).process(ev.StepEndEvent(s, actions=["calculator(expression='1+1')"]))
    assert s.journal == [{"step": 0, "actions": ["calcu"], "messages": 1, "completion_tokens": 20}]
    s.step, s.final_answer, s.stop_reason = 1, "2", "answer"
    EpisodeMetrics().process(ev.TaskEndEvent(s))
    assert s.metrics == {"steps": 2, "tokens_per_step": 60.0, "tool_calls": 4, "tool_error_rate": 0.25,
                         "answered": True, "stop_reason": "answer", "user_turns": 1, "delegations": 0}
    s.replies.append("first reply")
    s.usage["delegations"] = 2
    EpisodeMetrics().process(ev.TaskEndEvent(s))
    assert (s.metrics["user_turns"], s.metrics["delegations"]) == (2, 2)


# --- training bridge
def test_token_annotation():
    e = TokenAnnotation().process(ev.ModelOutputEvent(state(), text="x", finish_reason="length"))
    assert e.trainable is False and e.loss_weight == 1.0
    s = state()
    s.memory[CONSECUTIVE_PARSE_FAILURES] = 1
    e2 = TokenAnnotation(retry_weight=0.25).process(ev.ModelOutputEvent(s, text="x"))
    assert e2.trainable and e2.loss_weight == 0.25


def test_infra_error_filter():
    s = state()
    InfraErrorFilter().process(ev.TaskEndEvent(s))
    assert s.trainable
    s.usage["tool_timeouts"] = 1
    InfraErrorFilter().process(ev.TaskEndEvent(s))
    assert not s.trainable
