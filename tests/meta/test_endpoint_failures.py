"""A bad endpoint never ends a run: a meta-agent call that fails in a round (HTTP 500s,
a body that is no chat completion, a hung endpoint, a backend of one's own that raises) leaves the
round without that call's proposals, records why in ``evolve.warnings`` of ``rounds.jsonl`` and in
the round table, and the run goes on. Transient failures are first retried by the openai SDK.
A backend import path that cannot work stops the run at the config check, naming the path."""

from __future__ import annotations

import io
import json
import logging
import re
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from coevo.agent.policy import ScriptedPolicy
from coevo.envs.arithmetic import ArithmeticEnv
from coevo.evolution.critic import Critic
from coevo.evolution.engine import AEGIS
from coevo.harness.defaults import base_harness
from coevo.harness.edits import Edit
from coevo.loop.coevolution import Coevolution
from coevo.loop.schedule import Schedule, Splits
from coevo.meta import LLMMetaAgent, MetaAgentError, OpenAIClient, TokenLedger
from coevo.report.data import load_run
from coevo.report.progress import NullProgress
from coevo.report.summary import round_table
from coevo.report.tracking import NullTracker
from coevo.rundir.evolve_records import Proposal
from coevo.rundir.records import RoundRecord
from tests.aegis_helpers import critic_rollout, service
from tests.meta.test_llm import GOOD_EDIT, HANG, KEY_ENV, FakeServer, completion, free_port, plan, proposal_json

SERVER_ERROR = (500, {"error": {"message": "the model worker crashed", "type": "server_error"}})
PLAN_REPLY = (200, completion(plan(proposal_json([GOOD_EDIT])), 30, 9))
META_FAILED = "variant base: the meta-agent's plan call failed, so the round goes on without its proposals"


def prose(messages) -> str:
    """A policy that never uses the answer format: every task fails, so AEGIS asks for proposals."""
    return "I think the answer is 7."


def one_round(run_dir: Path, meta) -> dict:
    """Round 0 of a harness-only loop on two arithmetic tasks that fail; returns its record's ``to_dict()``."""
    env = ArithmeticEnv(n_tasks=10, max_terms=2, seed=3)
    policy = ScriptedPolicy(prose)
    train = env.tasks("train")
    aegis = AEGIS(base_harness(), meta, Critic(critic_rollout(policy, env, max_steps=2), k=1, gate="seesaw"),
                  tasks={t.task_id: t for t in train}, max_proposals=1)
    schedule = Schedule(rounds=1, batch_tasks=2, attempts=1, seed=0, steps_per_round=1, val_every=0, eval_attempts=1)
    loop = Coevolution(mode="harness_only", rollouts=service(policy, env, max_steps=2), aegis=aegis, run_dir=run_dir,
                       splits=Splits(train), schedule=schedule, tracker=NullTracker(), progress=NullProgress())
    return loop.run_round(0).to_dict()


def openai_agent(url: str, timeout_s: float = 5.0) -> LLMMetaAgent:
    return LLMMetaAgent(OpenAIClient(url, "served", api_key_env=KEY_ENV, timeout_s=timeout_s, request_retries=1),
                        name="openai")


def table_text(record: RoundRecord) -> str:
    console = Console(file=io.StringIO(), width=400, record=True, color_system=None)
    console.print(round_table(record))
    return " ".join(console.export_text().split())  # the caption wraps at the table's width


def meta_warnings(record: dict) -> list[str]:
    return [w for w in record["evolve"]["warnings"] if "meta-agent" in w]


# ------------------------------------------------------------------------------- the openai backend
def test_a_500_is_retried_and_the_proposal_it_then_gets_is_judged(tmp_path, sdk_waits):
    with FakeServer([SERVER_ERROR, PLAN_REPLY]) as srv:
        record = one_round(tmp_path, openai_agent(srv.url))
    assert len(srv.requests) == 2 and len(sdk_waits) == 1  # the SDK waited once, then asked again
    (verdict,) = record["evolve"]["verdicts"]
    assert verdict["proposal"]["edits"] == [Edit.from_dict(GOOD_EDIT).to_dict()]
    assert meta_warnings(record) == []
    assert record["meta_tokens"]["plan"]["prompt_tokens"] == 30


@pytest.mark.parametrize(("script", "requests", "why"), [
    ([SERVER_ERROR, SERVER_ERROR], 2, "failed the plan request: Error code: 500 - the model worker crashed"),
    ([(200, b'{"id": "cmpl-1", "choices": [', "application/json")], 1, "a body that is not JSON"),
    ([(200, b"<html>502 Bad Gateway</html>", "text/html")], 1, "not a chat completion: '<html>502 Bad Gateway"),
    ([HANG, HANG], 2, r"\(timeout 0.3s\) after 2 attempts: APITimeoutError"),
], ids=["persistent 500", "invalid JSON body", "HTML page", "hung endpoint"])
def test_a_failing_endpoint_leaves_the_round_without_a_proposal_and_says_why(tmp_path, sdk_waits, script, requests,
                                                                             why):
    with FakeServer(script) as srv:
        record = one_round(tmp_path, openai_agent(srv.url, timeout_s=0.3))
    assert len(srv.requests) == requests and len(sdk_waits) == requests - 1  # what may pass was retried
    assert record["evolve"]["verdicts"] == [] and record["round"] == 0
    (warning,) = meta_warnings(record)
    assert warning.startswith(META_FAILED) and srv.url in warning
    assert re.search(why, warning), warning
    # written to rounds.jsonl, valid for the report, shown under the round table
    (written,) = load_run(tmp_path).records
    assert written.to_dict() == record
    assert f"warning: {META_FAILED}" in table_text(written)


def test_a_failing_router_call_is_no_opinion(caplog):
    with caplog.at_level(logging.WARNING, logger="coevo.meta"):
        choice = unreachable_agent().route("What is 2 + 3?", {"base": "passed 3/4", "v1": "passed 1/4"}, [])
    assert choice == ("base", 0.0)
    assert any("LLMConnectionError: could not reach" in r.getMessage() for r in caplog.records)


# -------------------------------------------------------------------------------- backends of one's own
class RaisingMeta:
    """A meta-agent of one's own whose propose or revise raises ``error``."""

    name = "mine"

    def __init__(self, error: Exception, proposals: list[Proposal] = ()) -> None:
        self.error, self.proposals, self.ledger = error, list(proposals), TokenLedger()

    def propose(self, digest, harness, context):
        if not self.proposals:
            raise self.error
        return self.proposals

    def revise(self, proposal, reason, digest, harness, context):
        raise self.error

    def state_dict(self):
        return {"ledger": self.ledger.as_dict()}

    def load_state_dict(self, state):
        self.ledger.load(state["ledger"])


def test_a_module_missing_in_the_middle_of_a_round_is_a_warning_with_its_traceback_in_the_log(tmp_path, caplog):
    error = ModuleNotFoundError("No module named 'my_planner_extras'", name="my_planner_extras")
    with caplog.at_level(logging.WARNING, logger="coevo.evolution"):
        record = one_round(tmp_path, RaisingMeta(error))
    (warning,) = meta_warnings(record)
    assert warning == f"{META_FAILED}: ModuleNotFoundError: No module named 'my_planner_extras'"
    (logged,) = [r for r in caplog.records if META_FAILED in r.getMessage()]
    assert logged.exc_info is not None  # not a MetaAgentError: maybe a bug, so the log keeps the traceback


def test_a_failed_revision_keeps_the_rejection_and_says_why(tmp_path):
    broken = Proposal(hypothesis="h", edits=[Edit("set_param", "no_such", param="x", value=1)],
                      dimension="control_safety", cluster="format_error")
    record = one_round(tmp_path, RaisingMeta(MetaAgentError("http://x/v1 answered HTTP 503"), [broken]))
    (verdict,) = record["evolve"]["verdicts"]
    assert verdict["gate"] == "build" and not verdict["ship"]
    assert meta_warnings(record) == ["variant base: the meta-agent's revise call failed, so the round goes on without "
                                     "a revision: MetaAgentError: http://x/v1 answered HTTP 503"]


# ----------------------------------------------------------------------------------- coevo evolve
def unreachable_agent() -> LLMMetaAgent:
    """``--meta`` factory: the openai backend at a port where nothing listens."""
    return LLMMetaAgent(OpenAIClient(f"http://127.0.0.1:{free_port()}/v1", "served", timeout_s=2, request_retries=0))


def test_coevo_evolve_goes_on_past_an_unreachable_endpoint(tmp_path):
    from coevo.cli.main import app

    out = tmp_path / "evo"
    result = CliRunner().invoke(app, [
        "evolve", "--env", "arithmetic", "--env-arg", "n_tasks=10", "--model", "scripted", "--max-steps", "1",
        "--meta", "tests.meta.test_endpoint_failures:unreachable_agent", "--rounds", "2", "--batch-tasks", "2",
        "--k", "1", "--val-limit", "1", "--test-limit", "0", "--out", str(out)])
    assert result.exit_code == 0, result.output
    rounds = [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rounds] == [0, 1]
    for r in rounds:
        (warning,) = [w for w in r["evolve"]["warnings"] if "meta-agent" in w]
        assert warning.startswith(META_FAILED) and "could not reach http://127.0.0.1:" in warning
    # the loop's round table prints each round's warnings (wrapped to the console's width)
    assert " ".join(result.output.split()).count(f"warning: {META_FAILED}") == 2
    assert (out / "summary.json").is_file()


# ------------------------------------------------------------------------------- at the config check
def test_a_backend_module_whose_dependency_is_missing_is_refused_naming_the_path(tmp_path, monkeypatch):
    from coevo.cli.main import app
    from coevo.loop.config_check import check
    from tests.test_config import compose_cfg

    (tmp_path / "planner_needing_a_dep.py").write_text("import coevo_no_such_dependency\n\n\ndef make():\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    path = "planner_needing_a_dep:make"
    with pytest.raises(ValueError) as info:
        check(compose_cfg([f"meta_agent.backend={path}"]))
    message = str(info.value)
    assert message.startswith(f"config meta_agent.backend: meta-agent factory {path!r} needs module "
                              "'coevo_no_such_dependency', which is not installed"), message
    result = CliRunner().invoke(app, ["evolve", "--env", "arithmetic", "--model", "scripted", "--meta", path,
                                      "--out", str(tmp_path / "evo")])
    assert result.exit_code != 0 and "coevo_no_such_dependency" in result.output
    assert not isinstance(result.exception, ModuleNotFoundError)


# -------------------------------------------------------------------------------- config fields
def openai_cfg(url: str, *overrides: str):
    from tests.test_config import compose_cfg

    return compose_cfg(["meta_agent=openai", f"meta_agent.url={url}", "meta_agent.model=served", *overrides])


@pytest.mark.parametrize(("retries", "requests"), [(0, 1), (3, 3)])
def test_request_retries_reach_the_sdk(tmp_path, sdk_waits, retries, requests):
    """``request_retries`` (``make_meta_agent``'s; train.py's ``build_meta`` leaves it at the client's
    ``REQUEST_RETRIES``) reaches the openai SDK: with 0 a single 500 fails the call; with 3 two 500s
    are retried past."""
    from coevo.loop.builders import build_meta
    from coevo.loop.config_check import check
    from coevo.meta import make_meta_agent
    from coevo.meta.clients import REQUEST_RETRIES

    with FakeServer([SERVER_ERROR, SERVER_ERROR, PLAN_REPLY]) as srv:
        cfg = openai_cfg(srv.url)
        check(cfg)
        assert build_meta(cfg, tmp_path).client.request_retries == REQUEST_RETRIES == 2
        agent = make_meta_agent("openai", url=srv.url, model="served", cache_dir=tmp_path, request_retries=retries)
        assert agent.client.request_retries == retries
        if retries == 0:
            with pytest.raises(MetaAgentError, match="Error code: 500"):
                agent.call("plan", [{"role": "user", "content": "propose"}])
        else:
            assert json.loads(agent.call("plan", [{"role": "user", "content": "propose"}]))["proposals"]
    assert len(srv.requests) == requests and len(sdk_waits) == requests - 1
    with pytest.raises(ValueError, match=r"request_retries must be >= 0, got -1"):
        OpenAIClient(srv.url, "served", request_retries=-1)


@pytest.mark.parametrize("router_failure", ["fallback", "raise"])
def test_router_failure_falls_back_or_stops_the_run_as_asked(tmp_path, caplog, router_failure):
    """``router_failure``: ``fallback`` (the default, what train.py's ``build_meta`` gives) logs the
    failure and sends the task to the base variant; ``raise`` stops with a ``RouterError`` saying why."""
    from coevo.loop.builders import build_meta
    from coevo.loop.config_check import check
    from coevo.meta import RouterError, make_meta_agent

    url = f"http://127.0.0.1:{free_port()}/v1"
    cfg = openai_cfg(url, "evolution.router=true")
    check(cfg)
    assert build_meta(cfg, tmp_path).router_failure == "fallback"
    agent = make_meta_agent("openai", url=url, model="served", cache_dir=tmp_path, request_retries=0,
                            router_failure=router_failure)
    options = {"base": "passed 3/4", "v1": "passed 1/4"}
    if router_failure == "fallback":
        with caplog.at_level(logging.WARNING, logger="coevo.meta"):
            assert agent.route("What is 2 + 3?", options, []) == ("base", 0.0)
        assert any("router: no usable answer" in r.getMessage() for r in caplog.records)
    else:
        with pytest.raises(RouterError, match=r"router: no usable answer \(LLMConnectionError: could not reach"):
            agent.route("What is 2 + 3?", options, [])
    with pytest.raises(ValueError, match=r"router_failure must be one of \['fallback', 'raise'\], got 'ignore'"):
        make_meta_agent("openai", url=url, model="served", router_failure="ignore")
