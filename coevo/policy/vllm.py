"""A Policy over vLLM, for GPUs: colocated (``vllm.LLM`` in this process) or a server
(``vllm serve`` reached through TRL's ``VLLMClient``).

Same contract as ``TransformersPolicy``: prompts are rendered with the tokenizer's chat template
and sent as token ids; ``completion_ids`` and per-token ``logprobs`` come back from the engine,
which must run with ``logprobs_mode="processed_logprobs"`` so the log-probs are those of the
temperature-scaled distribution (vLLM's default, raw log-probs, would bias importance ratios).
``text`` is the decoding of ``completion_ids``; a request's ``reply_prefix`` ends the prompt ids
(``coevo.policy.hf.render_prompt``), so it is prefilled, not generated.

After each trainer update, ``sync_weights(model)`` pushes the new weights into the engine (a
LoRA adapter is merged for the copy and unmerged afterwards) and bumps ``model_version``.
``release()`` before the update lets a colocated engine in sleep mode give the GPU memory of its
KV cache (and weights) to the trainer; it wakes what it needs on the next load or generate.

vLLM is an optional GPU-only extra (``pip install coevo[vllm]``); this module imports it only
when an engine is built, so it can be imported and unit-tested on a CPU against a fake engine.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterator, Protocol, Sequence

from coevo.agent.policy import ChatRequest, Generation
from coevo.harness.events import SamplingParams
from coevo.policy.hf import render_prompt

VLLM_HINT = "vLLM is a GPU-only extra: pip install 'coevo[vllm]'"


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


def named_weights(model: Any) -> Iterator[tuple[str, Any]]:
    """(name, tensor) pairs in the base model's naming. For a PEFT model the adapter must already
    be merged (``VLLMPolicy.sync_weights`` does that): LoRA factors and frozen originals of
    ``modules_to_save`` are skipped, and the trained copies take the original names."""
    is_peft = hasattr(model, "peft_config")
    for name, tensor in model.state_dict().items():
        if is_peft:
            if "lora_" in name or ".original_module." in name:
                continue
            name = name.removeprefix("base_model.model.").replace(".base_layer", "")
            name = re.sub(r"\.modules_to_save\.[^.]+", "", name)
        yield name, tensor.detach()


class ColocatedEngine:
    """``vllm.LLM`` in this process, sharing the GPU with the trainer.

    With ``sleep_level`` (vLLM's sleep mode) ``release()`` puts the engine to sleep while the
    trainer steps: level 1 moves its weights to CPU memory and drops the KV cache, level 2 drops
    both (the weight sync that follows every update reloads them). It wakes in two parts, as vLLM
    allows: the weights before a weight load (so the new ones land in allocated memory while the
    KV cache is still free), the KV cache before the next generate.
    """

    def __init__(self, model_path: str, *, sleep_level: int | None = None, **llm_kwargs: Any) -> None:
        if sleep_level not in (None, 1, 2):
            raise ValueError(f"rollout.vllm_sleep_level={sleep_level!r}: vLLM's sleep levels are 1 (weights to CPU, "
                             "KV cache freed) and 2 (both freed); null turns sleep mode off")
        try:
            from vllm import LLM
        except ImportError as err:
            raise ImportError(VLLM_HINT) from err
        llm_kwargs.setdefault("gpu_memory_utilization", 0.3)
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
        runner = self.llm.llm_engine.model_executor.driver_worker.model_runner
        runner.model.load_weights(weights)
        self.weights_dropped = False
        if "kv_cache" not in self.asleep:  # a sleeping cache is dropped whole: it wakes empty
            self.llm.reset_prefix_cache()


class ServerEngine:
    """A ``vllm serve`` process (started with ``--logprobs-mode processed_logprobs``), through
    TRL's ``VLLMClient``; weights travel over NCCL after ``init_communicator``."""

    def __init__(self, base_url: str, *, connection_timeout: float = 60.0, device: str = "cuda") -> None:
        try:
            from trl.generation.vllm_client import VLLMClient

            self.client = VLLMClient(base_url=base_url, connection_timeout=connection_timeout)
        except ImportError as err:  # TRL imports vLLM only when the client is built
            raise ImportError(f"{VLLM_HINT} ({err})") from err
        except OSError as err:  # requests' ConnectionError is an OSError, not the builtin ConnectionError
            raise ConnectionError(
                f"no vLLM server answered at {base_url} within the connection timeout of {connection_timeout:g}s; "
                "start one (trl vllm-serve --model PATH --port PORT) or point rollout.vllm_server_url at it"
            ) from err
        self.device = device
        self._communicator = False

    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[EngineOutput]:
        out = self.client.generate(
            prompts,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            max_tokens=sampling.max_new_tokens,
            logprobs=0,
            generation_kwargs={"stop": list(sampling.stop) or None, "include_stop_str_in_output": True},
        )
        results = []
        for ids, lps in zip(out["completion_ids"], out["logprobs"], strict=True):
            results.append(EngineOutput(list(ids), [step[0] for step in lps], "stop"))
        for r in results:  # the completions endpoint does not report why each stopped
            if len(r.completion_ids) >= sampling.max_new_tokens:
                r.finish_reason = "length"
        return results

    def load_weights(self, weights: Iterator[tuple[str, Any]]) -> None:
        if not self._communicator:
            self.client.init_communicator(device=self.device)
            self._communicator = True
        for name, tensor in weights:
            self.client.update_named_param(name, tensor)
        self.client.reset_prefix_cache()

    def release(self) -> None:
        """Nothing to release: the server holds its own GPUs."""


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


class VLLMPolicy:
    def __init__(self, engine: Engine, tokenizer: Any, *, model_version: str = "0", tool_role: bool = False) -> None:
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
                )
        return [r for r in results if r is not None]

    def release(self) -> None:
        """Before a trainer update: the engine may free GPU memory until the next sync or generate."""
        self.engine.release()

    def sync_weights(self, model: Any, model_version: str) -> None:
        """Copy the trainer's current weights into the engine; rollouts after this use them."""
        is_peft = hasattr(model, "merge_adapter")
        if is_peft:
            model.merge_adapter()
        try:
            self.engine.load_weights(named_weights(model))
        finally:
            if is_peft:
                model.unmerge_adapter()
        self.model_version = model_version
