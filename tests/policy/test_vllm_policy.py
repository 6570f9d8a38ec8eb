"""VLLMPolicy's contract against a fake engine, and the colocated engine's call order against a fake
``vllm`` module (GPU sleep mode, which the CPU build lacks). The real engine runs the same paths in
tests/policy/test_vllm_engine.py (vLLM's CPU build) and scripts/gpu_check.py (GPU)."""

import pytest
import torch

from coevo.agent.policy import ChatRequest
from coevo.harness.events import SamplingParams
from coevo.policy.tiny import tiny_model, tiny_tokenizer
from coevo.policy.vllm import EngineOutput, VLLMPolicy, named_weights


class FakeEngine:
    """Greedy decoding with a real tiny model, returning log-probs at the request temperature —
    what vLLM with processed_logprobs returns — and recording weight loads. ``shift``: reported
    log-probs that far below the model's own (a sampler whose probabilities differ by a known factor)."""

    def __init__(self, model, shift: float = 0.0):
        self.model, self.shift = model, shift
        self.calls: list[tuple[int, SamplingParams]] = []
        self.loaded: dict[str, torch.Tensor] = {}
        self.releases = 0

    @torch.no_grad()
    def generate(self, prompts, sampling):
        self.calls.append((len(prompts), sampling))
        outs = []
        for p in prompts:
            ids, lps = list(p), []
            for _ in range(sampling.max_new_tokens):
                logits = self.model(torch.tensor([ids])).logits[0, -1].double()
                tok = int(logits.argmax())
                lps.append(float(torch.log_softmax(logits / max(sampling.temperature, 1e-6), -1)[tok]) - self.shift)
                ids.append(tok)
            outs.append(EngineOutput(ids[len(p):], lps, "length"))
        return outs

    def load_weights(self, weights):
        self.loaded.update({k: v.clone() for k, v in weights})

    def release(self):
        self.releases += 1


@pytest.fixture
def setup():
    tok = tiny_tokenizer()
    model = tiny_model(tok, seed=0)
    return VLLMPolicy(FakeEngine(model), tok, model_version="m0"), model, tok


def test_contract_ids_text_logprobs_and_grouping(setup):
    policy, model, tok = setup
    msgs = [{"role": "user", "content": "hi"}]
    reqs = [ChatRequest(msgs, SamplingParams(temperature=0.7, max_new_tokens=5)),
            ChatRequest(msgs, SamplingParams(temperature=1.0, max_new_tokens=3)),
            ChatRequest(msgs, SamplingParams(temperature=0.7, max_new_tokens=5))]
    gens = policy.generate(reqs)
    assert [len(g.completion_ids) for g in gens] == [5, 3, 5]
    assert sorted(n for n, _ in policy.engine.calls) == [1, 2]  # one engine call per sampling config
    for g, r in zip(gens, reqs, strict=True):
        assert tok.decode(g.completion_ids, skip_special_tokens=True) == g.text
        assert g.prompt_ids == policy.prompt_ids(r.messages)
        with torch.no_grad():
            out = model(torch.tensor([g.prompt_ids + g.completion_ids]))
            logits = out.logits[0, len(g.prompt_ids) - 1 : -1].double()
        ref = torch.log_softmax(logits / r.sampling.temperature, -1).gather(-1, torch.tensor(g.completion_ids)[:, None])
        assert torch.allclose(torch.tensor(g.logprobs, dtype=torch.float64), ref.squeeze(-1), atol=1e-4)


def test_reply_prefix_ends_the_prompt_ids_sent_to_the_engine(setup):
    """The engine continues a prefilled reply start: its tokens end the prompt ids it is given and
    the completion (ids, text, log-probs) is only what it generated."""
    policy, model, tok = setup
    msgs = [{"role": "user", "content": "What is 2 + 3?"}]
    prefix = '<tool_call>{"name": "calculator", "arguments": {'
    sampling = SamplingParams(temperature=1.0, max_new_tokens=4)
    forced, free = policy.generate([ChatRequest(msgs, sampling, prefix), ChatRequest(msgs, sampling)])
    prefix_ids = tok.encode(prefix, add_special_tokens=False)
    assert forced.prompt_ids == policy.prompt_ids(msgs) + prefix_ids == free.prompt_ids + prefix_ids
    assert policy.prompt_ids(msgs, prefix) == forced.prompt_ids
    assert len(forced.completion_ids) == 4
    assert tok.decode(forced.completion_ids, skip_special_tokens=True) == forced.text
    with torch.no_grad():
        logits = model(torch.tensor([forced.prompt_ids + forced.completion_ids])).logits[0, -5:-1].double()
    ref = torch.log_softmax(logits, -1).gather(-1, torch.tensor(forced.completion_ids)[:, None]).squeeze(-1)
    assert forced.logprobs == pytest.approx(ref.tolist(), abs=1e-5)


def test_sync_weights_plain_and_peft(setup):
    from peft import LoraConfig, get_peft_model

    policy, model, tok = setup
    policy.sync_weights(model, "m1")
    assert policy.model_version == "m1"
    assert set(policy.engine.loaded) == set(model.state_dict())
    lora = LoraConfig(r=2, target_modules=["q_proj"], init_lora_weights=False)
    peft_model = get_peft_model(tiny_model(tok, seed=0), lora)
    before = {k: v.clone() for k, v in peft_model.state_dict().items()}
    policy.sync_weights(peft_model, "m2")
    loaded = policy.engine.loaded
    assert set(loaded) == set(model.state_dict())  # base names, no LoRA factors
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.allclose(loaded[q], model.state_dict()[q])  # the merged adapter reached the engine
    merged = tiny_model(tok, seed=1)
    merged.load_state_dict(loaded)  # a plain model holding what the engine got computes as the adapter model
    ids = torch.tensor([[5, 9, 11, 3, 7]])
    with torch.no_grad():
        assert torch.allclose(merged(ids).logits, peft_model(ids).logits, atol=1e-5)
    after = peft_model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # the trainer's weights were only read
    assert dict(named_weights(model)).keys() == model.state_dict().keys()


def test_missing_vllm_names_the_extra(monkeypatch):
    import builtins

    from coevo.policy import vllm as vmod

    real_import = builtins.__import__

    def no_vllm(name, *args, **kwargs):
        if name == "vllm" or name.startswith("vllm."):
            raise ImportError("No module named 'vllm'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_vllm)
    with pytest.raises(ImportError, match=r"pip install 'coevo\[vllm\]'"):
        vmod.ColocatedEngine("some/model")


def _fake_vllm(monkeypatch, log: list, *, sleep_mode: bool = True, cpu: bool = False) -> dict:
    """A fake ``vllm`` module whose LLM logs, in order, what the engine asks of it; returns the kwargs
    the last LLM was built with. ``sleep_mode``/``cpu``: what the fake platform reports."""
    import sys
    import types

    built: dict = {}

    class Out:
        def __init__(self, n):
            step = {7: types.SimpleNamespace(logprob=-0.5)}
            self.outputs = [types.SimpleNamespace(token_ids=[7] * n, logprobs=[step] * n, finish_reason="length")]

    class LLM:
        def __init__(self, **kwargs):
            built.clear()
            built.update(kwargs)
            log.append(("init", kwargs.get("enable_sleep_mode", False)))

        def generate(self, prompts, params, use_tqdm=False):
            log.append(("generate", len(prompts)))
            return [Out(params.max_tokens) for _ in prompts]

        def collective_rpc(self, method, kwargs):
            assert method == "reload_weights" and kwargs["is_checkpoint_format"] is True
            log.append(("load", len(list(kwargs["weights_iterator"]))))

        def sleep(self, level):
            log.append(("sleep", level))

        def wake_up(self, tags):
            log.append(("wake_up", tuple(tags)))

        def reset_prefix_cache(self):
            log.append(("reset",))

    platform = types.SimpleNamespace(is_cpu=lambda: cpu, is_sleep_mode_available=lambda: sleep_mode,
                                     device_type="cpu" if cpu else "cuda")
    sampling = lambda **kw: types.SimpleNamespace(**kw)  # noqa: E731
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=LLM, SamplingParams=sampling))
    monkeypatch.setitem(sys.modules, "vllm.platforms", types.SimpleNamespace(current_platform=platform))
    return built


def test_colocated_engine_caches_prefixes_and_resets_them_after_a_weight_load(monkeypatch):
    from coevo.policy import vllm as vmod

    log: list = []
    built = _fake_vllm(monkeypatch, log)
    engine = vmod.ColocatedEngine("some/model")
    assert built["enable_prefix_caching"] is True and "enforce_eager" not in built
    engine.load_weights(iter([("w", torch.zeros(1))]))
    assert log[-2:] == [("load", 1), ("reset",)]  # reset after the new weights are in
    vmod.ColocatedEngine("some/model", enable_prefix_caching=False)
    assert built["enable_prefix_caching"] is False


def test_on_a_platform_without_sleep_mode_the_level_is_dropped_with_one_warning(monkeypatch, caplog):
    from coevo.policy import vllm as vmod

    log: list = []
    built = _fake_vllm(monkeypatch, log, sleep_mode=False, cpu=True)
    with caplog.at_level("WARNING", logger="coevo.policy.vllm"):
        engine = vmod.ColocatedEngine("some/model", sleep_level=1)
    assert [r.getMessage() for r in caplog.records] == [
        "rollout.vllm_sleep_level=1 ignored: vLLM has no sleep mode on cpu; the engine keeps its memory while "
        "the trainer steps"]
    assert "enable_sleep_mode" not in built and built["enforce_eager"] is True and engine.sleep_level is None
    engine.release()
    assert ("sleep", 1) not in log


@pytest.mark.parametrize("level", [1, 2])
def test_sleep_mode_frees_the_engine_for_training_and_wakes_it_in_two_parts(monkeypatch, level):
    """release() sleeps at the configured level; the sync wakes the weights only (the KV cache stays
    free while they load, and is not reset: it wakes empty); the next generate wakes the KV cache."""
    from coevo.policy import vllm as vmod

    log: list = []
    _fake_vllm(monkeypatch, log)
    engine = vmod.ColocatedEngine("some/model", sleep_level=level)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=2)
    engine.generate([[1, 2]], sampling)
    engine.release()
    engine.release()  # asleep already: nothing more
    engine.load_weights(iter([("w", torch.zeros(1))]))
    out = engine.generate([[1, 2]], sampling)
    assert out[0].completion_ids == [7, 7] and out[0].logprobs == [-0.5, -0.5]
    assert log == [("init", True), ("generate", 1), ("sleep", level), ("wake_up", ("weights",)), ("load", 1),
                   ("wake_up", ("kv_cache",)), ("generate", 1)]
    log.clear()
    engine.load_weights(iter([("w", torch.zeros(1))]))  # awake: a load resets the prefix cache
    assert log == [("load", 1), ("reset",)]


def test_a_level_2_sleep_refuses_to_generate_before_new_weights_are_loaded(monkeypatch):
    from coevo.policy import vllm as vmod

    log: list = []
    _fake_vllm(monkeypatch, log)
    engine = vmod.ColocatedEngine("some/model", sleep_level=2)
    engine.release()
    with pytest.raises(RuntimeError, match="no weight sync has loaded"):
        engine.generate([[1]], SamplingParams(max_new_tokens=1))
    off = vmod.ColocatedEngine("some/model")  # no sleep mode: release is a no-op
    off.release()
    assert ("sleep", 2) in log and log.count(("sleep", 2)) == 1 and log[-1] == ("init", False)
    with pytest.raises(ValueError, match="sleep levels are 1"):
        vmod.ColocatedEngine("some/model", sleep_level=3)


def test_the_loop_releases_the_engine_before_every_update_and_syncs_after(tmp_path, monkeypatch):
    """A model_only run on a vLLM policy (fake engine): each round releases the engine before its
    GRPO steps and loads the trained weights after them, so rollouts never run on a sleeping engine."""
    from pathlib import Path

    import coevo
    from coevo.loop import builders
    from tests.test_loop import records, smoke

    order: list[str] = []

    class Recording(FakeEngine):
        def generate(self, prompts, sampling):
            order.append("generate")
            return super().generate(prompts, sampling)

        def load_weights(self, weights):
            order.append("load")
            super().load_weights(weights)

        def release(self):
            order.append("release")

    def fake_policy(cfg, model, tok, generates=True):
        policy = VLLMPolicy(Recording(model), tok, model_version="0")
        return policy, lambda: policy.sync_weights(model, policy.model_version)

    monkeypatch.setattr(builders, "build_policy", fake_policy)
    run_dir = Path(coevo.run(smoke(tmp_path / "run", "mode=model_only", "rounds=2", "val_limit=0",
                                   "rollout.max_new_tokens=4")))
    assert len(records(run_dir)) == 2
    squeezed = [k for i, k in enumerate(order) if i == 0 or order[i - 1] != k]
    assert squeezed == ["generate", "release", "load", "generate", "release", "load"], squeezed


def test_sleep_mode_with_a_server_is_refused_naming_why(tmp_path):
    from coevo.loop import builders
    from tests.test_loop import smoke

    cfg = smoke(tmp_path / "run", "rollout=vllm", "rollout.vllm_mode=server", "rollout.vllm_sleep_level=2")
    with pytest.raises(ValueError, match="vllm-serve server holds its own GPUs"):
        builders.build_policy(cfg, None, None)


@pytest.mark.parametrize("mode", ["colocate", "server"])
def test_only_rank_0_builds_a_vllm_engine_and_syncs_it(tmp_path, monkeypatch, mode):
    """Several processes share one server (or one colocated engine): a rank that does not generate
    builds no engine, joins no weight-transfer group, and has nothing to sync; rank 0 builds its own."""
    from coevo.loop import builders
    from coevo.policy import vllm as vmod
    from tests.test_loop import smoke

    built: list[str] = []

    class Built:
        def __init__(self, *args, **kwargs):
            built.append(mode)

    monkeypatch.setattr(vmod, "ColocatedEngine", Built)
    monkeypatch.setattr(vmod, "ServerEngine", Built)
    tok = tiny_tokenizer()
    cfg = smoke(tmp_path / "run", "rollout=vllm", f"rollout.vllm_mode={mode}")
    policy, sync = builders.build_policy(cfg, None, tok, generates=False)
    assert built == [] and isinstance(policy.engine, vmod.IdleEngine) and sync is None
    policy.release()
    with pytest.raises(RuntimeError, match="only rank 0 generates"):
        policy.generate([ChatRequest([{"role": "user", "content": "hi"}], SamplingParams(max_new_tokens=1))])
    policy, sync = builders.build_policy(cfg, tiny_model(tok), tok)
    assert built == [mode] and isinstance(policy.engine, Built) and sync is not None
