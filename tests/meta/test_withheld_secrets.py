"""Text sent to a meta-agent endpoint holds no secret value: a key quoted by a digest's
excerpts, a demonstration or a routed task reaches the endpoint as ``<redacted>``, and the prompt
says that a value was withheld. Checked against a local OpenAI-compatible server that records every
request body."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from coevo.evolution.meta_agent import PlanContext
from coevo.evolution.types import IMPLICATED
from coevo.harness.defaults import base_harness
from coevo.meta import LLMMetaAgent, OpenAIClient
from coevo.meta.prompts import WITHHELD
from coevo.rundir.evolve_records import Cluster, Digest
from coevo.safety.secrets import REDACTED
from tests.meta.test_llm import GOOD_EDIT, KEY_ENV, FakeServer, completion, plan, proposal_json

PLAN_REPLY = (200, completion(plan(proposal_json([GOOD_EDIT])), 30, 9))
ROUTE_REPLY = (200, completion(json.dumps({"variant": "base", "confidence": 0.9}), 10, 4))


def keyed_digest(key: str) -> Digest:
    """A digest whose failure excerpt quotes ``key`` (a tool printed it in a trace)."""
    c = Cluster("step_budget", IMPLICATED["step_budget"], 2, 1.0, ["t1", "t2"], ["x1", "x2"],
                [f"step 6: the service answered with token {key}; ran out of steps"])
    return Digest(round=1, variant="base", harness_id="h", n_traces=4, n_failed=2, pass_rate=0.5, clusters=[c],
                  raw_tokens=800, digest_tokens=40, passed_task_ids=["p1", "p2"], failed_task_ids=["t1", "t2"])


def sent(server: FakeServer) -> list[list[dict]]:
    """The messages of every request the server received."""
    return [r["body"]["messages"] for r in server.requests]


def test_text_sent_to_the_endpoint_is_redacted_and_says_a_value_was_withheld(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key = f"svc-{uuid.uuid4().hex}"
    monkeypatch.setenv("SERVICE_KEY", key)
    monkeypatch.setenv(KEY_ENV, "endpoint-key-0123456789")  # the endpoint's own key goes in its header only
    context = PlanContext(demos=[(f"Call the service with key {key}: what is 2+2?", "<answer>4</answer>")])
    with FakeServer([PLAN_REPLY, ROUTE_REPLY, ROUTE_REPLY]) as srv:
        agent = LLMMetaAgent(OpenAIClient(srv.url, "served", api_key_env=KEY_ENV, timeout_s=5, request_retries=0),
                             cache_dir=tmp_path / "cache", name="openai")
        (proposal,) = agent.propose(keyed_digest(key), base_harness(), context)
        assert agent.route(f"Use key {key} to fetch the page.", {"base": "8/10 passed"}, []) == ("base", 0.9)
        assert agent.route("What is 2+2?", {"base": "8/10 passed"}, []) == ("base", 0.9)
    plan_call, keyed_route, plain_route = sent(srv)
    assert key not in json.dumps(sent(srv))
    for messages in (plan_call, keyed_route):
        assert messages[0]["role"] == "system" and messages[0]["content"].endswith(WITHHELD)
        assert REDACTED in messages[-1]["content"]
    assert f"token {REDACTED}; ran out of steps" in plan_call[-1]["content"]  # the excerpt
    assert f"Call the service with key {REDACTED}" in plan_call[-1]["content"]  # the demonstration
    assert all(WITHHELD not in m["content"] for m in plain_route)  # nothing withheld: nothing said
    assert [r["auth"] for r in srv.requests] == ["Bearer endpoint-key-0123456789"] * 3
    assert proposal.edits[0].to_dict()["param"] == "max_steps"  # the reply is used as before
    cached = [p.read_bytes() for p in (tmp_path / "cache").rglob("*.json")]
    assert cached and not [b for b in cached if key.encode() in b]
