"""GRPO steps on a tiny model: every trainable parameter moves, LoRA moves only the adapter,
the on-policy ratio is 1, stale log-probs engage clipping, checkpoints restore exactly."""

import pytest
import torch

from coevo.policy.tiny import tiny_model, tiny_tokenizer
from coevo.trainers.grpo import GRPOTrainer, apply_lora
from tests.trainers.helpers import synthetic_traces


@pytest.fixture
def tok():
    return tiny_tokenizer()


def snapshot(model):
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def test_step_changes_every_trainable_parameter(tok):
    model = tiny_model(tok, seed=0)
    trainer = GRPOTrainer(model, pad_id=tok.pad_token_id, lr=1e-3, micro_batch_size=3)
    before = snapshot(model)
    m = trainer.step(synthetic_traces(model, tok))
    after = dict(model.named_parameters())
    unchanged = [k for k in before if torch.equal(before[k], after[k])]
    assert unchanged == []
    assert m.sequences == 24 and m.tokens > 0 and m.loss != 0.0 and trainer.version == 1


def test_lora_changes_every_adapter_parameter_and_no_base_parameter(tok):
    model = apply_lora(tiny_model(tok, seed=0), r=4, target_modules=("q_proj", "v_proj"))
    before = snapshot(model)
    trainer = GRPOTrainer(model, pad_id=tok.pad_token_id, lr=1e-2, micro_batch_size=4)
    trainer.step(synthetic_traces(model, tok))  # lora_B starts at zero: two steps move lora_A too
    trainer.step(synthetic_traces(model, tok, seed=1))
    after = dict(model.named_parameters())
    lora = [k for k in before if "lora_" in k]
    assert lora and all(not torch.equal(before[k], after[k]) for k in lora)
    assert all(torch.equal(before[k], after[k]) for k in before if "lora_" not in k)


def test_on_policy_ratio_is_one_and_stale_logprobs_clip(tok):
    model = tiny_model(tok, seed=0)
    trainer = GRPOTrainer(model, pad_id=tok.pad_token_id, lr=0.0, micro_batch_size=8)
    fresh = trainer.step(synthetic_traces(model, tok))
    assert fresh.ratio_min == pytest.approx(1.0, abs=1e-4) and fresh.ratio_max == pytest.approx(1.0, abs=1e-4)
    assert fresh.clip_fraction == 0.0
    stale = trainer.step(synthetic_traces(model, tok, stale=0.5))
    assert stale.clip_fraction > 0.2 and stale.ratio_max > 1.5


def test_zero_variance_groups_are_reported_and_dropped(tok):
    model = tiny_model(tok, seed=0)
    traces = synthetic_traces(model, tok, n_tasks=2, per_task=2)
    for t in traces:
        t.reward = 1.0 if t.task_id == "task-0" else t.reward
    trainer = GRPOTrainer(model, pad_id=tok.pad_token_id, micro_batch_size=4)
    m = trainer.step(traces, versions=[0, 0, 1, 1])
    assert m.zero_variance_fraction == 0.5 and m.sequences == 4  # only task-1's two traces x two calls
    assert m.staleness == {0: 2, -1: 2}
    for t in traces:
        t.reward = 1.0
    empty = trainer.step(traces)
    assert empty.sequences == 0 and empty.zero_variance_fraction == 1.0 and trainer.version == 1


def test_kl_to_reference_for_lora(tok):
    model = apply_lora(tiny_model(tok, seed=0), r=4, target_modules=("q_proj", "v_proj"))
    trainer = GRPOTrainer(model, pad_id=tok.pad_token_id, lr=5e-2, beta=0.1, micro_batch_size=8)
    first = trainer.step(synthetic_traces(model, tok))
    assert first.kl == pytest.approx(0.0, abs=1e-6)  # the adapter starts as the identity
    trainer.step(synthetic_traces(model, tok, seed=1))
    assert trainer.step(synthetic_traces(model, tok, seed=2)).kl > 0.0
    with pytest.raises(ValueError, match="ref_model"):
        GRPOTrainer(tiny_model(tok), pad_id=tok.pad_token_id, beta=0.1).step(synthetic_traces(model, tok))


@pytest.mark.parametrize("lora", [False, True])
def test_checkpoint_round_trip_continues_identically(tok, tmp_path, lora):
    def make():
        m = tiny_model(tok, seed=0)
        m = apply_lora(m, r=4, target_modules=("q_proj",)) if lora else m
        return GRPOTrainer(m, pad_id=tok.pad_token_id, lr=1e-3, micro_batch_size=4)

    a = make()
    a.step(synthetic_traces(a.unwrapped, tok, seed=0))
    a.save(tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "model").is_dir() and (tmp_path / "ckpt" / "trainer_state.pt").is_file()
    b = make()
    b.load(tmp_path / "ckpt")
    assert b.version == 1
    traces = synthetic_traces(a.unwrapped, tok, seed=5)
    a.step(traces)
    b.step(traces)
    for (ka, va), (kb, vb) in zip(a.unwrapped.named_parameters(), b.unwrapped.named_parameters(), strict=True):
        assert torch.allclose(va, vb, atol=1e-7), ka
