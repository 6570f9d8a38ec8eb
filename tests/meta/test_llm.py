"""LLM meta-agent: validation and retries, token ledger, disk cache, and the two clients."""

from __future__ import annotations

import json
import logging
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Self

import pytest

from coevo.evolution.meta_agent import MetaAgentError, PlanContext
from coevo.evolution.types import IMPLICATED
from coevo.harness.defaults import base_harness
from coevo.harness.edits import Edit, apply_edit
from coevo.harness.library import PROCESSORS
from coevo.harness.library.context import pair_demo
from coevo.meta import BACKENDS, RuleMetaAgent
from coevo.meta.clients import HFClient, LLMConnectionError, OpenAIClient
from coevo.meta.llm import LLMMetaAgent
from coevo.meta.schema import PLAN_SCHEMA, REVISE_SCHEMA, ROUTE_SCHEMA, parse_reply, schema_errors
from coevo.rundir.evolve_records import Cluster, Digest, Proposal

SECRET = "sk-test-7f3a9c-do-not-log"
KEY_ENV = "COEVO_TEST_META_KEY"


def make_digest() -> Digest:
    c = Cluster("step_budget", IMPLICATED["step_budget"], 2, 1.0, ["t1", "t2"], ["x1", "x2"],
                ["step 6: ran out of steps"])
    return Digest(round=1, variant="base", harness_id="h", n_traces=4, n_failed=2, pass_rate=0.5, clusters=[c],
                  raw_tokens=800, digest_tokens=40, passed_task_ids=["p1", "p2"], failed_task_ids=["t1", "t2"])


def proposal_json(edits: list[dict], **kw) -> dict:
    return {"hypothesis": "more steps let the model finish", "dimension": "control_safety", "cluster": "step_budget",
            "target_tasks": ["t1", "t2"], "predicted_flips": ["t1", "t2"], "at_risk": ["p1", "p2"],
            "edits": edits, **kw}


GOOD_EDIT = {"op": "set_param", "processor": "step_budget", "param": "max_steps", "value": 10}
BAD_EDIT = {"op": "set_param", "processor": "no_such", "param": "x", "value": 1}


class Scripted:
    """A ChatClient that replays (text, prompt_tokens, completion_tokens) and records the calls."""

    model = "scripted-model"

    def __init__(self, replies: list[tuple[str, int, int]]) -> None:
        self.replies = list(replies)
        self.calls: list[tuple[list[dict], dict, str]] = []

    def complete(self, messages, *, schema, stage):
        self.calls.append((messages, schema, stage))
        return self.replies.pop(0)


def plan(*proposals: dict) -> str:
    return json.dumps({"proposals": list(proposals)})


# ------------------------------------------------------------------------------------- schema
def test_schema_errors_name_the_path():
    assert schema_errors({"variant": "a", "confidence": 0.5}, ROUTE_SCHEMA) == []
    assert schema_errors({"variant": 3, "confidence": 2}, ROUTE_SCHEMA) == [
        "$.variant: expected string, got integer", "$.confidence: must be <= 1, got 2"]
    assert schema_errors({"confidence": True, "x": 1}, ROUTE_SCHEMA) == [
        "$: missing required property 'variant'", "$: unexpected properties ['x']; allowed: ['confidence', 'variant']",
        "$.confidence: expected number, got boolean"]
    bad = {"proposals": [proposal_json([{"op": "move", "processor": "a", "index": 1.5}], cluster="nope")]}
    assert schema_errors(bad, PLAN_SCHEMA) == [
        "$.proposals[0].cluster: must be one of " + str(PLAN_SCHEMA["properties"]["proposals"]["items"]["properties"]
                                                        ["cluster"]["enum"]) + ", got 'nope'",
        "$.proposals[0].edits[0].op: must be one of ['insert', 'remove', 'replace', 'set_param'], got 'move'",
        "$.proposals[0].edits[0].index: expected integer or null, got number"]
    assert schema_errors({"proposals": [proposal_json([])]}, PLAN_SCHEMA) == [
        "$.proposals[0].edits: needs at least 1 item(s), got 0"]
    assert schema_errors({"give_up": True}, REVISE_SCHEMA) == []


def test_parse_reply_tolerates_fences_and_reports_bad_json():
    assert parse_reply('```json\n{"variant": "a", "confidence": 1}\n```', ROUTE_SCHEMA) == (
        {"variant": "a", "confidence": 1}, None)
    data, err = parse_reply("no json here", ROUTE_SCHEMA)
    assert data is None and err == "the reply holds no JSON object (it starts 'no json here')"
    data, err = parse_reply('{"variant": ', ROUTE_SCHEMA)
    assert data is None and err.startswith("invalid JSON: ")


# ------------------------------------------------------------------------------------- planning
def test_invalid_then_valid_reply_retries_with_the_error_quoted(tmp_path):
    client = Scripted([(plan(proposal_json([BAD_EDIT])), 100, 30), (plan(proposal_json([GOOD_EDIT])), 150, 40)])
    agent = LLMMetaAgent(client, cache_dir=tmp_path, name="openai")
    harness = base_harness()
    proposals = agent.propose(make_digest(), harness, PlanContext())

    try:
        apply_edit(harness, Edit.from_dict(BAD_EDIT))
    except ValueError as err:
        expected_error = f"edit 0 (set_param no_such.x) does not apply: {type(err).__name__}: {err}"
    retry = client.calls[1][0]
    assert retry[:2] == client.calls[0][0]  # the conversation continues
    assert retry[2] == {"role": "assistant", "content": plan(proposal_json([BAD_EDIT]))}
    assert retry[3]["role"] == "user" and f"proposal 0: {expected_error}" in retry[3]["content"]
    assert [c[2] for c in client.calls] == ["plan", "plan"] and client.calls[0][1] == PLAN_SCHEMA

    (p,) = proposals
    assert isinstance(p, Proposal)
    assert p.edits == [Edit("set_param", "step_budget", param="max_steps", value=10)]
    assert (p.cluster, p.target_tasks, p.at_risk, p.source, p.variant) == (
        "step_budget", ["t1", "t2"], ["p1", "p2"], "openai", "base")
    assert apply_edit(harness, p.edits[0]).get("step_budget").config["max_steps"] == 10
    usage = agent.ledger.stages["plan"]
    assert (usage.calls, usage.cached, usage.prompt_tokens, usage.completion_tokens) == (2, 0, 250, 70)
    assert agent.ledger.total() == 320

    # the same call again, from a fresh agent over the same cache: no client call, no tokens
    silent = Scripted([])
    again = LLMMetaAgent(silent, cache_dir=tmp_path, name="openai")
    assert [q.to_dict() for q in again.propose(make_digest(), harness, PlanContext())] == [p.to_dict()]
    usage = again.ledger.stages["plan"]
    assert (usage.calls, usage.cached, usage.prompt_tokens, usage.completion_tokens) == (2, 2, 0, 0)
    assert silent.calls == []


def test_plan_prompt_holds_digest_harness_catalogue_and_context():
    client = Scripted([(plan(), 1, 1)])
    ctx = PlanContext(priorities={"tools": 2.0}, demos=[pair_demo("What is 1 + 1?", "<answer>2</answer>")],
                      tools=["calculator"], lessons=["few_shot for format_error: shipped"], rejected={"KEY-X"},
                      max_proposals=3)
    assert LLMMetaAgent(client).propose(make_digest(), base_harness(), ctx) == []
    system, user = client.calls[0][0]
    assert json.dumps(PLAN_SCHEMA) in system["content"]
    text = user["content"]
    for needle in [make_digest().text(), "step_budget: t1, t2", "passed: p1, p2", base_harness().id,
                   '"max_steps": 6', "What is 1 + 1?", "few_shot for format_error: shipped", "KEY-X", '"tools": 2.0',
                   "calculator", "at most 3 proposal(s)"]:
        assert needle in text, needle
    assert all(f"- {kind} " in text for kind in PROCESSORS)


def test_partial_reply_keeps_the_valid_proposal_and_asks_for_the_rest():
    fixed = {"op": "insert", "processor": "self_verification", "spec": {"kind": "self_verification"},
             "after": "answer_extraction"}
    client = Scripted([
        (plan(proposal_json([GOOD_EDIT]), proposal_json([BAD_EDIT])), 10, 10),
        (plan(proposal_json([fixed], dimension="evaluation_reward")), 10, 10),
    ])
    proposals = LLMMetaAgent(client).propose(make_digest(), base_harness(), PlanContext(max_proposals=2))
    assert "1 proposal(s) were accepted" in client.calls[1][0][-1]["content"]
    assert "proposal 1: edit 0 (set_param no_such.x)" in client.calls[1][0][-1]["content"]
    assert [p.edits[0].processor for p in proposals] == ["step_budget", "self_verification"]


def test_still_invalid_after_retries_is_dropped_with_a_warning(caplog):
    client = Scripted([("not json", 5, 1)] * 3)
    agent = LLMMetaAgent(client, max_retries=2)
    with caplog.at_level(logging.WARNING, logger="coevo.meta"):
        assert agent.propose(make_digest(), base_harness(), PlanContext()) == []
    assert len(client.calls) == 3
    assert "the reply holds no JSON object" in client.calls[1][0][-1]["content"]
    assert any("dropped proposal(s) still invalid after 2 retries" in r.getMessage() for r in caplog.records)
    assert agent.ledger.stages["plan"].prompt_tokens == 15


def test_rejected_and_unchanged_edits_are_errors():
    rejected = Proposal("h", [Edit.from_dict(GOOD_EDIT)], "control_safety").key()
    same = {"op": "set_param", "processor": "step_budget", "param": "max_steps", "value": 6}
    client = Scripted([(plan(proposal_json([GOOD_EDIT]), proposal_json([same])), 1, 1)])
    assert LLMMetaAgent(client, max_retries=0).propose(make_digest(), base_harness(),
                                                       PlanContext(rejected={rejected})) == []


def test_insert_names_agree():
    unnamed = {"op": "insert", "processor": "verify", "spec": {"kind": "self_verification", "name": None},
               "after": "answer_extraction"}
    clash = {**unnamed, "spec": {"kind": "self_verification", "name": "other"}}
    client = Scripted([(plan(proposal_json([clash])), 1, 1), (plan(proposal_json([unnamed])), 1, 1)])
    (p,) = LLMMetaAgent(client).propose(make_digest(), base_harness(), PlanContext())
    assert "processor 'verify' vs spec.name 'other'" in client.calls[1][0][-1]["content"]
    assert p.edits[0].spec == {"kind": "self_verification", "name": "verify"}
    assert "verify" in apply_edit(base_harness(), p.edits[0])


def test_unknown_task_ids_are_scoped_out():
    item = proposal_json([GOOD_EDIT], target_tasks=["t1", "ghost"], predicted_flips=["ghost"])
    (p,) = LLMMetaAgent(Scripted([(plan(item), 1, 1)])).propose(make_digest(), base_harness(), PlanContext())
    assert (p.target_tasks, p.predicted_flips) == (["t1"], [])


# ------------------------------------------------------------------------------------- revise/route
def test_revise_gives_up_or_returns_a_changed_proposal():
    digest, harness = make_digest(), base_harness()
    original = Proposal("h", [Edit.from_dict(GOOD_EDIT)], "control_safety", cluster="step_budget", revision=1)
    assert LLMMetaAgent(Scripted([('{"give_up": true}', 3, 2)])).revise(
        original, "bloat", digest, harness, PlanContext()) is None
    other = {**GOOD_EDIT, "value": 12}
    client = Scripted([(json.dumps({"proposal": proposal_json([GOOD_EDIT])}), 3, 2),
                       (json.dumps({"proposal": proposal_json([other])}), 3, 2)])
    agent = LLMMetaAgent(client)
    revised = agent.revise(original, "seesaw: p1 broke", digest, harness, PlanContext())
    assert "the revision has the same edits as the rejected proposal" in client.calls[1][0][-1]["content"]
    assert "seesaw: p1 broke" in client.calls[0][0][1]["content"]
    assert revised.edits[0].value == 12 and revised.revision == 2
    assert agent.ledger.stages["revise"].calls == 2 and client.calls[0][1] == REVISE_SCHEMA


def test_route_validates_the_variant_and_falls_back(caplog):
    client = Scripted([('{"variant": "v9", "confidence": 0.9}', 4, 4), ('{"variant": "v1", "confidence": 0.75}', 4, 4)])
    agent = LLMMetaAgent(client)
    options = {"base": "passed 3/4", "v1": "passed 1/4 (chain sums)"}
    assert agent.route("What is 2 + 3?", options, ["chain sums go to v1"]) == ("v1", 0.75)
    assert "variant must be one of ['base', 'v1'], got 'v9'" in client.calls[1][0][-1]["content"]
    assert "chain sums go to v1" in client.calls[0][0][1]["content"]
    with caplog.at_level(logging.WARNING, logger="coevo.meta"):
        assert LLMMetaAgent(Scripted([("?", 1, 1)]), max_retries=0).route("x", options, []) == ("base", 0.0)
    assert any("falling back to 'base'" in r.getMessage() for r in caplog.records)
    with pytest.raises(ValueError, match="options"):
        agent.route("x", {}, [])


def test_backends_and_argument_checks():
    assert set(BACKENDS) == {"rule", "openai", "hf"}
    assert isinstance(BACKENDS["rule"](), RuleMetaAgent)
    a = BACKENDS["openai"]("http://127.0.0.1:1/v1", "m", api_key_env=KEY_ENV)
    h = BACKENDS["hf"]("tiny", max_new_tokens=4)
    assert (a.name, type(a.client), h.name, type(h.client)) == ("openai", OpenAIClient, "hf", HFClient)
    with pytest.raises(ValueError, match="max_retries"):
        LLMMetaAgent(Scripted([]), max_retries=-1)
    with pytest.raises(ValueError, match="timeout_s"):
        OpenAIClient("http://x/v1", "m", timeout_s=0)


# ------------------------------------------------------------------------------------- OpenAIClient
HANG = "hang"
"""A FakeServer script item: the request is read and never answered (a hung endpoint)."""


class FakeServer:
    """127.0.0.1 server speaking /v1/chat/completions; replies are scripted: (status, JSON body),
    (status, raw bytes, content type) or ``HANG``."""

    def __init__(self, script: list[tuple[int, dict] | tuple[int, bytes, str] | str]) -> None:
        self.script = list(script)
        self.requests: list[dict] = []
        self.closing = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
                item = outer.script.pop(0)
                if item == HANG:
                    outer.closing.wait()
                    return
                status, reply, content_type = item if len(item) == 3 else (*item, "application/json")
                data = reply if isinstance(reply, bytes) else json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self) -> Self:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.closing.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


def completion(text: str, prompt_tokens: int, completion_tokens: int) -> dict:
    return {"id": "cmpl-1", "object": "chat.completion", "created": 0, "model": "served",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens}}


RATE_LIMITED = (429, {"error": {"message": "Rate limit reached", "type": "rate_limit_error", "code": "rate_limit"}})


def test_openai_client_backs_off_on_429(monkeypatch, sdk_waits):
    monkeypatch.setenv(KEY_ENV, SECRET)
    with FakeServer([RATE_LIMITED, RATE_LIMITED, (200, completion('{"variant": "a", "confidence": 1}', 11, 7))]) as srv:
        client = OpenAIClient(srv.url, "served", api_key_env=KEY_ENV, timeout_s=5)
        out = client.complete([{"role": "user", "content": "hi"}], schema=ROUTE_SCHEMA, stage="route")
    assert out == ('{"variant": "a", "confidence": 1}', 11, 7)
    assert len(srv.requests) == 3 and len(sdk_waits) == 2  # the SDK retried, waiting before each retry
    req = srv.requests[-1]
    assert req["path"] == "/v1/chat/completions" and req["auth"] == f"Bearer {SECRET}"
    assert req["body"]["model"] == "served" and req["body"]["messages"] == [{"role": "user", "content": "hi"}]
    assert req["body"]["response_format"] == {
        "type": "json_schema", "json_schema": {"name": "coevo_route", "schema": ROUTE_SCHEMA, "strict": False}}
    assert SECRET not in repr(client) and SECRET not in json.dumps(vars(client), default=str)


def test_openai_client_gives_up_after_the_request_retries(sdk_waits):
    with FakeServer([RATE_LIMITED] * 3) as srv:
        client = OpenAIClient(srv.url, "served", api_key_env=KEY_ENV, request_retries=2)
        with pytest.raises(MetaAgentError, match="failed the route request: Error code: 429 - .*Rate limit reached"):
            client.complete([{"role": "user", "content": "hi"}], schema=ROUTE_SCHEMA, stage="route")
    assert len(srv.requests) == 3


def test_openai_client_falls_back_to_json_object():
    unsupported = (400, {"error": {"message": "response_format json_schema is not supported by this model",
                                   "type": "invalid_request_error"}})
    with FakeServer([unsupported, (200, completion("{}", 2, 1)), (200, completion("{}", 2, 1))]) as srv:
        client = OpenAIClient(srv.url, "served", api_key_env=KEY_ENV)
        client.complete([{"role": "user", "content": "a"}], schema=ROUTE_SCHEMA, stage="route")
        client.complete([{"role": "user", "content": "b"}], schema=ROUTE_SCHEMA, stage="route")
    assert [r["body"]["response_format"]["type"] for r in srv.requests] == ["json_schema", "json_object", "json_object"]


def test_openai_client_other_400_errors_quote_the_server():
    bad_request = (400, {"error": {"message": "messages must not be empty", "type": "invalid_request_error"}})
    with FakeServer([bad_request]) as srv:
        client = OpenAIClient(srv.url, "served", api_key_env=KEY_ENV)
        with pytest.raises(MetaAgentError, match="failed the route request: Error code: 400 - .*must not be empty"):
            client.complete([], schema=ROUTE_SCHEMA, stage="route")
    assert len(srv.requests) == 1  # a 400 is not retried


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_openai_client_unreachable_names_url_and_timeout(sdk_waits):
    url = f"http://127.0.0.1:{free_port()}/v1"
    client = OpenAIClient(url, "served", api_key_env=KEY_ENV, timeout_s=0.5, request_retries=1)
    with pytest.raises(LLMConnectionError) as info:
        client.complete([{"role": "user", "content": "hi"}], schema=ROUTE_SCHEMA, stage="route")
    assert url in str(info.value) and "timeout 0.5s" in str(info.value) and "after 2 attempts" in str(info.value)


def test_api_key_stays_out_of_repr_logs_and_cache(monkeypatch, tmp_path, caplog, sdk_waits):
    monkeypatch.setenv(KEY_ENV, SECRET)
    reply = plan(proposal_json([GOOD_EDIT]))
    with FakeServer([RATE_LIMITED, (200, completion(reply, 30, 9))]) as srv:
        agent = LLMMetaAgent(OpenAIClient(srv.url, "served", api_key_env=KEY_ENV),
                             cache_dir=tmp_path, name="openai")
        with caplog.at_level(logging.DEBUG):
            (p,) = agent.propose(make_digest(), base_harness(), PlanContext())
    assert p.edits == [Edit.from_dict(GOOD_EDIT)] and srv.requests[-1]["auth"] == f"Bearer {SECRET}"
    files = [f for f in Path(tmp_path).rglob("*") if f.is_file()]
    assert len(files) == 1 and json.loads(files[0].read_text())["text"] == reply
    assert all(SECRET not in f.read_text() for f in files)
    assert SECRET not in repr(agent) and SECRET not in repr(agent.client)
    assert all(SECRET not in r.getMessage() for r in caplog.records)
    usage = agent.ledger.stages["plan"]
    assert (usage.calls, usage.prompt_tokens, usage.completion_tokens) == (1, 30, 9)


# ------------------------------------------------------------------------------------- HFClient
class SpyHF(HFClient):
    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.log: list[tuple[list[dict], tuple[str, int, int]]] = []

    def complete(self, messages, *, schema, stage):
        out = super().complete(messages, schema=schema, stage=stage)
        self.log.append((messages, out))
        return out


def test_hf_client_counts_tokens_and_random_output_fails_cleanly(caplog):
    import torch

    client = SpyHF("tiny", max_new_tokens=8)
    agent = LLMMetaAgent(client, max_retries=1, name="hf")
    options = {"base": "passed 3/4", "v1": "passed 1/4"}
    with caplog.at_level(logging.WARNING, logger="coevo.meta"):
        assert agent.route("What is 2 + 3?", options, []) == ("base", 0.0)  # random weights: never valid JSON
    assert len(client.log) == 2
    lm, tok = client.loaded()
    for messages, (text, prompt_tokens, completion_tokens) in client.log:
        ids = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)["input_ids"]
        assert prompt_tokens == len(ids)
        with torch.no_grad():
            out = lm.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                              max_new_tokens=8, do_sample=False, pad_token_id=tok.pad_token_id,
                              eos_token_id=tok.eos_token_id)
        assert completion_tokens == out.shape[1] - len(ids)
        assert text == tok.decode(out[0, len(ids):], skip_special_tokens=True)
    assert client.log[1][0][-2] == {"role": "assistant", "content": client.log[0][1][0]}
    usage = agent.ledger.stages["route"]
    assert usage.calls == 2
    assert usage.prompt_tokens == sum(out[1] for _, out in client.log)
    assert usage.completion_tokens == sum(out[2] for _, out in client.log)
    assert any("falling back to 'base'" in r.getMessage() for r in caplog.records)


def test_hf_client_refuses_a_prompt_beyond_the_context():
    client = HFClient("tiny", max_new_tokens=5000)  # the tiny model has 4096 positions
    with pytest.raises(MetaAgentError, match=r"exceeds the context of 'tiny' \(4096 tokens\)"):
        client.complete([{"role": "user", "content": "hi"}], schema=ROUTE_SCHEMA, stage="route")
