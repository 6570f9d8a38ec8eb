"""Gradient checkpointing (``trainer.gradient_checkpointing``): the step keeps less for its backward
and moves the weights as the step that keeps every activation (fp32 tolerance), full fine-tuning
and LoRA alike, with the rows' shared prompt read once by both (the checkpointed rows recompute
their layers over a prefix cache that only reads)."""

from __future__ import annotations

import pytest
import torch

from coevo.policy.tiny import tiny_model, tiny_tokenizer
from coevo.trainers.grpo import apply_lora
from tests.trainers.helpers import make_trainer, synthetic_traces


def _model(tok, lora: bool):
    model = tiny_model(tok, seed=0)
    return apply_lora(model, r=4, target_modules=("q_proj", "v_proj")) if lora else model


def _step(tok, traces, *, lora: bool, checkpointing: bool):
    """(parameters after one SGD step, the step's loss, elements the autograd graph saved)."""
    model = _model(tok, lora)
    if lora:  # lora_B starts at zero: a first step moves it, so the second compares every adapter weight
        make_trainer(model, tok, lr=1e-2, optimizer="sgd").step(traces)
    trainer = make_trainer(model, tok, lr=1e-2, optimizer="sgd", gradient_checkpointing=checkpointing)
    saved = [0]

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved[0] += t.numel()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        metrics = trainer.step(traces)
    params = {k: v.detach().clone() for k, v in model.named_parameters() if v.requires_grad}
    return params, metrics.loss, saved[0]


@pytest.mark.parametrize("lora", [False, True])
def test_checkpointing_keeps_less_and_moves_the_weights_the_same(lora):
    tok = tiny_tokenizer()
    traces = synthetic_traces(tiny_model(tok, seed=0), tok, system=40)  # a prefix the plain step reads once
    plain, plain_loss, plain_saved = _step(tok, traces, lora=lora, checkpointing=False)
    ckpt, ckpt_loss, ckpt_saved = _step(tok, traces, lora=lora, checkpointing=True)
    assert ckpt_saved < 0.7 * plain_saved, (ckpt_saved, plain_saved)  # the rows' layer activations are recomputed
    assert ckpt_loss == pytest.approx(plain_loss, abs=1e-6)
    assert plain.keys() == ckpt.keys() and plain
    for key, value in plain.items():
        assert torch.allclose(value, ckpt[key], atol=1e-6), key
