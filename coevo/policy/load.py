"""Build a model and tokenizer, and a Policy over them, from a short name or a local path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from coevo.config.schema import RolloutConfig

MODELS = ("smollm2", "tiny")
"""Named models: the embedded SmolLM2-135M-Instruct, and a tiny random model for tests."""


def load_model(model: str = "smollm2", *, device: str = "cpu", dtype: str = "auto", adapter: str | None = None,
               seed: int = 0) -> tuple[Any, Any]:
    """(model, tokenizer). ``model`` is a name from MODELS or a local directory in
    ``save_pretrained`` format; ``adapter`` a PEFT adapter directory loaded on top."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if model == "smollm2":
        from coevo.policy.smollm2 import load_smollm2

        lm, tok = load_smollm2(device=device, dtype=dtype)
    elif model == "tiny":
        from coevo.policy.tiny import tiny_model, tiny_tokenizer

        tok = tiny_tokenizer()
        lm = tiny_model(tok, seed=seed).to(device)
    elif Path(model).is_dir():
        if dtype == "auto":
            dtype = "bfloat16" if device.startswith("cuda") else "float32"
        lm = AutoModelForCausalLM.from_pretrained(model, dtype=getattr(torch, dtype)).to(device)
        tok = AutoTokenizer.from_pretrained(model)
    else:
        raise ValueError(f"model must be one of {MODELS} or a local model directory, got {model!r}")
    if adapter is not None:
        from peft import PeftModel

        if not Path(adapter).is_dir():
            raise FileNotFoundError(f"adapter directory {adapter!r} does not exist")
        lm = PeftModel.from_pretrained(lm, adapter).to(device)
    return lm, tok


def transformers_policy(model: str = "smollm2", *, device: str = "cpu", adapter: str | None = None,
                        max_batch_size: int = RolloutConfig.batch_size, seed: int = 0,
                        model_version: str | None = None):
    from coevo.policy.hf import TransformersPolicy

    lm, tok = load_model(model, device=device, adapter=adapter, seed=seed)
    version = model_version or (Path(model).name if Path(model).is_dir() else model)
    return TransformersPolicy(lm, tok, model_version=version, max_batch_size=max_batch_size, seed=seed)
