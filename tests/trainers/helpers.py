"""Synthetic traces on a tiny model, shared by the trainer tests and the two-process worker."""

from __future__ import annotations

import random

from coevo.agent.trace import ModelCall, Trace
from coevo.trainers.logprobs import logprob_fn


def synthetic_traces(model, tok, *, n_tasks: int = 3, per_task: int = 4, calls: int = 2, seed: int = 0,
                     stale: float = 0.0, system: int = 0) -> list[Trace]:
    """Traces with random prompt/completion ids, binary rewards that vary within each task, and
    behaviour log-probs from ``model`` (shifted by ``stale`` to imitate an older checkpoint).
    ``system``: every prompt starts with the same that many tokens (a harness's system prompt)."""
    rng = random.Random(seed)
    vocab = len(tok)
    head = [rng.randrange(3, vocab) for _ in range(system)]
    traces = []
    for t in range(n_tasks):
        for k in range(per_task):
            mc = []
            for c in range(calls):
                prompt = head + [rng.randrange(3, vocab) for _ in range(rng.randint(3, 9))]
                completion = [rng.randrange(3, vocab) for _ in range(rng.randint(2, 7))]
                mc.append(ModelCall(c, [], prompt, completion, None, "", "stop", temperature=1.0))
            traces.append(Trace(f"tr-{t}-{k}", f"task-{t}", "env", "train", f"h{k % 2}", "base", "0",
                                model_calls=mc, reward=float((k + t) % 2), passed=bool((k + t) % 2)))
    fn = logprob_fn(model, tok.pad_token_id, temperature=1.0, batch_size=8)
    pairs = [(c.prompt_ids, c.completion_ids) for tr in traces for c in tr.model_calls]
    logps = iter(fn(pairs))
    for tr in traces:
        tr.behaviour_logprobs = [[v + (stale * rng.choice([-1, 1]) if stale else 0.0) for v in next(logps)]
                                 for _ in tr.model_calls]
    return traces


def make_trainer(model, tok, *, accelerator=None, ref_model=None, total_steps: int = 1000,
                 loss_horizon: int | None = None, **hyper):
    """A GRPOTrainer on ``model`` whose hyper-parameters are ``TrainerConfig``'s defaults with ``hyper``
    overriding them (a name that is no config field, e.g. ``pack_calls`` or ``share_prefix``, goes to
    the trainer as its own argument); the run-derived values (schedule length, dr_grpo horizon) are
    this test suite's choices."""
    from dataclasses import fields

    from coevo.config.schema import TrainerConfig
    from coevo.trainers.grpo import GRPOTrainer

    names = {f.name for f in fields(TrainerConfig)}
    config = TrainerConfig(**{k: v for k, v in hyper.items() if k in names})
    return GRPOTrainer(model, config, pad_id=tok.pad_token_id, accelerator=accelerator,
                       ref_model=ref_model, total_steps=total_steps, loss_horizon=loss_horizon,
                       **{k: v for k, v in hyper.items() if k not in names})


def worker_trainer(tok, accelerator, *, lora: bool, adamw: bool, micro_batch_size: int, sharding: str,
                   total_steps: int, **hyper):
    """The sharded-training workers' trainer (FSDP2 and ZeRO-3 against one process): the tiny llama,
    optionally with LoRA, plain SGD without clipping (a step's update is then exactly comparable) or
    AdamW with clipping (optimizer state to save and resume); ``hyper`` as ``make_trainer``'s."""
    import torch

    from coevo.policy.tiny import tiny_model
    from coevo.trainers.grpo import apply_lora

    torch.manual_seed(0)
    model = tiny_model(tok, seed=0, arch="llama")
    if lora:
        model = apply_lora(model, r=4, alpha=8, dropout=0.0)
    return make_trainer(model, tok, accelerator=accelerator, lr=0.05 if adamw else 0.5,
                        optimizer="adamw" if adamw else "sgd", max_grad_norm=1.0 if adamw else 1e9,
                        micro_batch_size=micro_batch_size, aggregation="token_mean", kernel="chunked",
                        sharding=sharding, total_steps=total_steps, **hyper)


def launch_failure(done) -> str:
    """What a failed launch said, for the assertion: the end of its stdout (did each rank finish its
    work?) and stderr from the first abort report on (with PYTHONFAULTHANDLER=1 in the launch's
    environment, every thread's Python stack at the abort), else stderr's end."""
    err = done.stderr
    starts = [i for i in (err.find("Fatal Python error"), err.find("terminate called")) if i >= 0]
    tail = err[min(starts):][:6000] if starts else err[-3000:]
    return f"rc {done.returncode}\n--- stdout (end) ---\n{done.stdout[-800:]}\n--- stderr ---\n{tail}"
