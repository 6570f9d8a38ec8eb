"""AEGIS's ``openai`` meta-agent against an OpenAI-compatible endpoint: stages, JSON, tokens, cache.

The worked example of docs/meta-agents.md. A small chat-completions server runs in this process in
place of a real model (a vLLM server or a hosted API answers the same requests), so you can see what
each stage is asked, the JSON it must return, how an unusable reply is quoted back to the model, how
tokens are accounted, and that a second run with the same cache directory asks the server nothing.

    python -m examples.openai_meta_agent
"""

from __future__ import annotations

import json
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from coevo.agent.evaluate import evaluate
from coevo.agent.policy import ScriptedPolicy
from coevo.agent.rollouts import RolloutService
from coevo.envs import ArithmeticEnv
from coevo.evolution.digest import digest
from coevo.harness.defaults import base_harness
from coevo.harness.edits import apply_edit
from coevo.meta import PlanContext, openai_meta_agent

WRONG_NAME = {"op": "set_param", "processor": "answer_extractor", "param": "last_number_fallback", "value": True}
RIGHT_NAME = {**WRONG_NAME, "processor": "answer_extraction"}


def proposal(edit: dict[str, Any], hypothesis: str) -> dict[str, Any]:
    """One item of the plan stage's ``proposals`` (PROPOSAL_SCHEMA in coevo/meta/schema.py)."""
    return {"hypothesis": hypothesis, "dimension": "evaluation_reward", "cluster": "format_error",
            "target_tasks": [], "predicted_flips": [], "at_risk": [], "edits": [edit]}


def model_reply(stage: str, messages: list[dict[str, str]]) -> dict[str, Any]:
    """What the stand-in model answers, by stage (the request's JSON schema is named coevo_<stage>). Its first
    plan names a processor that does not exist; the agent quotes the algebra's error back and it corrects it."""
    if stage == "plan":
        corrected = "Your reply could not be used" in messages[-1]["content"]
        edit = RIGHT_NAME if corrected else WRONG_NAME
        return {"proposals": [proposal(edit, "answers are stated in prose; read the last number as the answer")]}
    if stage == "revise":
        edit = {"op": "set_param", "processor": "parse_retry", "param": "max_retries", "value": 2}
        return {"proposal": proposal(edit, "remind the model of the answer format once more")}
    return {"variant": "base", "confidence": 0.8}  # route


class StubServer:
    """``POST /v1/chat/completions`` on 127.0.0.1, answering with ``model_reply`` and an invented
    ``usage`` (characters / 4), as a real server reports the tokens it counted."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append(body)
                stage = body["response_format"]["json_schema"]["name"].removeprefix("coevo_")
                text = json.dumps(model_reply(stage, body["messages"]))
                prompt_tokens = sum(len(m["content"]) for m in body["messages"]) // 4
                data = json.dumps({
                    "id": f"stub-{len(outer.requests)}", "object": "chat.completion", "created": 0,
                    "model": body["model"], "choices": [{"index": 0, "finish_reason": "stop",
                                                         "message": {"role": "assistant", "content": text}}],
                    "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(text) // 4,
                              "total_tokens": prompt_tokens + len(text) // 4}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


def prose_answers(messages: list[dict[str, str]]) -> str:
    """A scripted model that states its answer in prose, never in <answer> tags: format errors."""
    return "I think the answer is 7."


def one_run(url: str, cache_dir: Path) -> dict[str, Any]:
    """Plan, revise and route once, with a fresh agent on ``cache_dir``; returns what it produced."""
    harness = base_harness()
    env = ArithmeticEnv(n_tasks=10, max_terms=2, seed=3)
    rollouts = RolloutService(ScriptedPolicy(prose_answers), env, batch_size=32, max_steps=6, workers=8, seed=0)
    _, traces = evaluate(harness, rollouts, "train")
    found = digest(traces, round=0, variant="base")
    agent = openai_meta_agent(url, "stub-model", timeout_s=5.0, cache_dir=cache_dir, max_retries=2)
    context = PlanContext(tools=["calculator"], max_proposals=1)
    (planned,) = agent.propose(found, harness, context)
    revised = agent.revise(planned, "rejected by the quality gate: prompt bloat", found, harness, context)
    route = agent.route("What is 2 + 3?", {"base": "passed 3/4", "v1": "passed 1/4"}, [])
    return {"digest": found, "planned": planned, "revised": revised, "route": route, "harness": harness,
            "ledger": agent.ledger.as_dict()}


def main(cache_dir: Path | None = None) -> dict[str, Any]:
    server = StubServer()
    tmp = tempfile.TemporaryDirectory() if cache_dir is None else None
    cache = Path(tmp.name) if tmp is not None else Path(cache_dir)
    try:
        first = one_run(server.url, cache)
        asked = list(server.requests)
        second = one_run(server.url, cache)
    finally:
        server.close()
        if tmp is not None:
            tmp.cleanup()
    plan_request = asked[0]
    print("plan stage, system message (first 300 characters):\n", plan_request["messages"][0]["content"][:300])
    print("plan stage, user message sections:",
          [line for line in plan_request["messages"][1]["content"].splitlines() if line.startswith("## ")])
    print("response_format sent:", plan_request["response_format"]["type"],
          plan_request["response_format"]["json_schema"]["name"])
    print("follow-up after the unusable first plan:\n", asked[1]["messages"][-1]["content"])
    evolved = apply_edit(first["harness"], first["planned"].edits[0])
    print("plan:", first["planned"].hypothesis, [e.describe() for e in first["planned"].edits], "->", evolved.id)
    print("revise:", [e.describe() for e in first["revised"].edits], " route:", first["route"])
    print("ledger, first run: ", json.dumps(first["ledger"]))
    print("ledger, second run:", json.dumps(second["ledger"]))
    print(f"server requests: {len(asked)} in the first run, {len(server.requests) - len(asked)} in the second")
    return {"first": first, "second": second, "requests": asked, "second_requests": server.requests[len(asked):]}


if __name__ == "__main__":
    main()
