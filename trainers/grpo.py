"""Cross-harness GRPO: one optimizer step over traces from the replay buffer.

``GRPOTrainer.step(traces)`` groups the trainable traces by task id (any harness, any
checkpoint; crashed episodes, infrastructure failures among them, take no part in any group),
computes advantages, turns every trainable model call into a sequence carrying its trace's
advantage, and takes one optimizer step on the clipped off-policy objective against the cached
behaviour log-probs. Current-policy log-probs, ratios and the KL use, per token, the temperature
that sampled it (``ModelCall.logprob_temperature``). The loss comes from the fused kernels in
``coevo.kernels``, which never hold the full [tokens × vocab] logits.

Distribution is accelerate's: the step's sequences are dealt to processes in a fixed order,
each process accumulates its micro-batches without synchronising, and gradients are reduced
once at its last micro-batch. Loss weights are normalised over the whole step
(``coevo.kernels.objective.token_weights``), and the loss is scaled by the number of processes
to undo DDP's averaging, so N processes compute exactly the gradient of one process holding the
whole step. The objective (clip, KL estimator, aggregation) is ``coevo.kernels.objective``'s,
chosen by name from its table.

``trainer.sharding`` picks how the weights are held, as a strategy object
(``coevo.trainers.strategies``): whole on every rank (one process, DDP), sharded by FSDP2, or
DeepSpeed ZeRO-3. It owns the wrapped model and optimizer: gradient accumulation, backward, the
optimizer step, and a checkpoint's full state and load.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from coevo.agent.trace import Trace
from coevo.config.schema import ModelConfig, TrainerConfig
from coevo.kernels import LossParams, grpo_loss
from coevo.kernels.objective import pick, token_weights
from coevo.trainers.advantages import group_advantages
from coevo.trainers.batch import (
    PackedSequence,
    TrainSequence,
    collate,
    micro_batches,
    pack_calls,
    parts_of,
    training_sequences,
)
from coevo.trainers.logprobs import (
    MIN_SHARED_PREFIX,
    allow_prefix_reads,
    completion_hidden,
    lm_head_weight,
    shared_prefix_length,
    token_logprobs,
)
from coevo.trainers.step_metrics import StepMetrics, sampler_mismatch, step_metrics
from coevo.trainers.strategies import strategy_for

if TYPE_CHECKING:
    from accelerate import Accelerator
    from peft import PeftModel
    from transformers import PreTrainedModel

    from coevo.kernels import GRPOLossOutput
    from coevo.trainers.batch import Collated

OPTIMIZERS = {"adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}
"""``trainer.optimizer``: its name → the torch optimizer."""


class GRPOTrainer:
    """Owns the optimizer of ``model`` and applies GRPO steps to it.

    The hyper-parameters come from ``config`` (``coevo.config.schema.TrainerConfig``, as TRL's
    GRPOTrainer takes its GRPOConfig; the dataclass holds the only defaults): ``lr``,
    ``weight_decay``, ``max_grad_norm``, ``warmup_steps`` (linear schedule), ``micro_batch_size``
    (sequences per forward) and ``micro_batch_tokens`` (padded tokens per forward), clip
    ``eps_low``/``eps_high``, ``dual_clip`` (c > 1 or None), ``beta`` for the KL penalty to a
    reference (for LoRA the base model with the adapter disabled; otherwise ``ref_model``) estimated
    by ``kl_estimator`` (k3 | k2 | k1), ``tis_cap`` for the truncated importance weight between the
    trainer's behaviour log-probs and the sampler's, ``aggregation`` (token_mean | sequence_mean |
    dr_grpo), ``scale_by_std`` (False is Dr. GRPO's advantage), ``kernel``
    (auto | chunked | reference | triton), ``optimizer`` (adamw | sgd; SGD keeps the update
    proportional to the gradient, which the distributed test relies on to see a wrong gradient
    scale). ``config.steps_per_round`` is the loop's.

    The values a run derives from other settings are required arguments with no default:
    ``total_steps`` (end of the linear decay: rounds x steps per round) and ``loss_horizon``
    (dr_grpo's constant normaliser in tokens, the completion budget; None for the other
    aggregations). Every token is scored at the temperature that sampled it.

    Keyword arguments no config field sets, each defaulting to what a run does: ``pack_calls``
    (train a trace's chained calls as one row: one forward pass instead of one per call, the same
    per-token loss), ``share_prefix`` (read the prompt prefix a micro-batch's rows share once,
    through a KV cache: the same loss and gradients within fp32 rounding; the tests turn both off
    to prove the equivalence), ``drop_zero_variance`` (skip groups whose rewards are all equal:
    their advantages are 0; reported either way) and ``reshard_after_forward`` (FSDP2: free each
    layer's gathered parameters after its forward, gathered again for backward; an FSDP launch
    config's ``fsdp_reshard_after_forward``, which ``coevo.loop.launch`` reads).
    """

    def __init__(
        self,
        model: PreTrainedModel | PeftModel,
        config: TrainerConfig,
        *,
        pad_id: int,
        total_steps: int,
        loss_horizon: int | None,
        accelerator: Accelerator | None = None,
        ref_model: PreTrainedModel | PeftModel | None = None,
        pack_calls: bool = True,
        share_prefix: bool = True,
        drop_zero_variance: bool = True,
        reshard_after_forward: bool = True,
    ) -> None:
        from accelerate import Accelerator

        c = config
        aggregation, micro_batch_size = c.aggregation, c.micro_batch_size
        pick("aggregation", aggregation)  # a ValueError naming the choices
        if aggregation == "dr_grpo" and not (loss_horizon and loss_horizon >= 1):
            raise ValueError(f"aggregation dr_grpo needs loss_horizon >= 1 (the completion budget), got {loss_horizon}")
        loss_params = LossParams(eps_low=c.eps_low, eps_high=c.eps_high, dual_clip=c.dual_clip, beta=c.beta,
                                 kl_estimator=c.kl_estimator)
        if micro_batch_size < 1 or (c.micro_batch_tokens is not None and c.micro_batch_tokens < 1):
            raise ValueError("micro_batch_size and micro_batch_tokens must be >= 1")
        self.accelerator = accelerator or Accelerator()
        self.strategy = strategy_for(c.sharding, self.accelerator, max_grad_norm=c.max_grad_norm)
        if c.gradient_checkpointing:  # non-reentrant: LoRA's frozen inputs need no requires_grad hook
            if hasattr(model, "activation_checkpointing_enable"):  # its name from transformers 5.2x on
                model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
            else:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            allow_prefix_reads(model)
        self.strategy.prepare_model(model, reshard_after_forward=reshard_after_forward)  # before the optimizer
        params = [p for p in model.parameters() if p.requires_grad]
        if not params:
            raise ValueError("the model has no trainable parameters")
        if c.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {sorted(OPTIMIZERS)}, got {c.optimizer!r}")
        opt = OPTIMIZERS[c.optimizer](params, lr=c.lr, weight_decay=c.weight_decay)

        def schedule(step: int) -> float:
            warm = min(1.0, (step + 1) / c.warmup_steps) if c.warmup_steps else 1.0
            return warm * max(0.0, 1.0 - step / max(total_steps, 1))

        # Not prepared by accelerate: its scheduler wrapper steps once per process at each optimizer step
        # (N times too fast under N ranks); under ZeRO-3 it acts on ``opt``'s groups, which DeepSpeed steps.
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
        self.strategy.wrap(model, opt)
        self.model, self.optimizer = self.strategy.model, self.strategy.optimizer
        self.ref_model, self.pad_id, self.config, self.max_grad_norm = ref_model, pad_id, config, c.max_grad_norm
        self.micro_batch_size, self.micro_batch_tokens = micro_batch_size, c.micro_batch_tokens
        self.loss_params, self.kernel = loss_params, {"impl": c.kernel, "workspace_mib": c.loss_workspace_mib}
        self.beta, self.tis_cap, self.loss_horizon = c.beta, c.tis_cap, loss_horizon
        self.crediting = {k: getattr(c, k) for k in ("credit_prefill", "distill_demos", "distill_prompt")}
        self.aggregation, self.scale_by_std, self.drop_zero_variance = aggregation, c.scale_by_std, drop_zero_variance
        self.pack_calls, self.share_prefix = pack_calls, share_prefix
        self.version = 0  # optimizer steps taken: the model version of the next rollouts

    @property
    def unwrapped(self) -> PreTrainedModel | PeftModel:
        return self.accelerator.unwrap_model(self.model)

    # ----------------------------------------------------------------- the step
    def step(self, traces: Sequence[Trace], *, versions: Sequence[int] | None = None) -> StepMetrics:
        """One optimizer step on ``traces`` (all processes must pass the same traces).

        ``versions`` are the model versions that produced each trace (for the staleness metric).
        """
        start = time.perf_counter()
        members = [t.trainable for t in traces]
        adv, signal, stats = group_advantages([t.task_id for t in traces], [t.reward for t in traces],
                                              scale_by_std=self.scale_by_std, members=members)
        keep = [i for i in range(len(traces)) if members[i] and (signal[i] or not self.drop_zero_variance)]
        seqs = training_sequences([traces[i] for i in keep], adv[keep], **self.crediting)
        staleness = dict(Counter(self.version - v for v in versions)) if versions is not None else {}
        excluded = (stats.excluded_traces, sum(t.infra_failure for t in traces))
        rewards = torch.tensor([t.reward for t, m in zip(traces, members, strict=True) if m], dtype=torch.float64)
        mismatch = sampler_mismatch(seqs, self.tis_cap)
        if not seqs:  # nothing to learn from: no step, but say why in the metrics
            return step_metrics(loss=0.0, details=[], advantages=adv[[i for i, m in enumerate(members) if m]],
                                zero_variance=stats.zero_variance_fraction, sequences=0, tokens=0, start=start,
                                grad_norm=0.0, staleness=staleness, lr=float(self.scheduler.get_last_lr()[0]),
                                excluded=excluded, rewards=rewards)
        lengths = [len(s.completion_ids) for s in seqs]
        step_tokens, step_seqs = sum(lengths), len(seqs)
        world, rank = self.accelerator.num_processes, self.accelerator.process_index
        rows = pack_calls(seqs) if self.pack_calls else seqs  # a chained trace: one forward pass
        if self.share_prefix:  # rows of one prompt side by side: their micro-batch reads it once
            rows = sorted(rows, key=lambda row: parts_of(row)[0].prompt_ids)
        micro = micro_batches(rows, world, self.micro_batch_size, self.micro_batch_tokens)[rank]
        n_micro = len(micro)

        self.model.train()
        total_loss, details = 0.0, []
        for k, mb in enumerate(micro):
            with self.strategy.accumulating(last=k == n_micro - 1):
                loss, detail = self._micro_step(mb, step_tokens, step_seqs, filler=rows[0], world=world)
            total_loss += loss
            if detail is not None:
                details.append(detail)
        lr = float(self.scheduler.get_last_lr()[0])  # the rate this step uses
        grad_norm = self.strategy.step(self.max_grad_norm)
        self.scheduler.step()
        self.version += 1
        total_loss = float(self.accelerator.reduce(torch.tensor(total_loss, device=self.accelerator.device), "sum"))
        metrics = step_metrics(loss=total_loss, details=details, advantages=adv[keep],
                               zero_variance=stats.zero_variance_fraction, sequences=step_seqs, tokens=step_tokens,
                               start=start, grad_norm=float(grad_norm), staleness=staleness, lr=lr, excluded=excluded,
                               rewards=rewards)
        return dataclasses.replace(metrics, **mismatch)

    def _micro_step(self, mb: list[TrainSequence | PackedSequence], step_tokens: int, step_seqs: int,
                    filler: TrainSequence | PackedSequence, world: int) -> tuple[float, GRPOLossOutput | None]:
        """Forward and backward of the micro-batch's share of the step loss; returns (loss, detail). A
        process with fewer sequences than the others still takes part in the gradient reduction: with
        zeros, or sharded (every forward gathers parameters with every rank) with a forward of
        ``filler`` weighted 0. The loss is scaled by ``world`` to undo the mean over ranks of DDP's,
        FSDP2's and ZeRO-3's reductions: the step loss is a sum."""
        if not mb and not self.strategy.every_rank_forwards:
            self.strategy.backward(sum(p.sum() for p in self.model.parameters() if p.requires_grad) * 0.0)
            return 0.0, None
        batch = collate(mb or [filler], self.pad_id, self.accelerator.device)
        share = self._share_prefix(batch)
        temperature = _temperature(mb, batch) if mb else 1.0
        # the reference pass first: under ZeRO-3 a forward between this micro-batch's forward and its
        # backward would release the LM head gathered below. Sharded, the filler runs it too: each
        # forward gathers parameters with every rank, so every rank runs as many
        runs_ref = self.beta > 0 and (mb or self.strategy.every_rank_forwards)
        ref = self._ref_logp(batch, temperature, share) if runs_ref else None
        hidden = completion_hidden(self.model, batch.input_ids, batch.attention_mask, batch.rows, batch.positions,
                                   share_prefix=share)  # [N, H]
        with self.strategy.gathered(lm_head_weight(self.model)) as weight:  # [V, H]; ZeRO-3: until the backward
            if not mb:
                self.strategy.backward((hidden.sum() + weight.sum()) * 0.0)  # every parameter in the graph, no logits
                return 0.0, None
            out = self._loss(mb, batch, hidden, weight, ref, temperature, step_tokens, step_seqs)
            self.strategy.backward(out.loss * world)
        return float(out.loss.detach()), out

    def _loss(self, mb: list[TrainSequence | PackedSequence], batch: Collated, hidden: torch.Tensor,
              weight: torch.Tensor, ref: torch.Tensor | None, temperature: float | torch.Tensor, step_tokens: int,
              step_seqs: int) -> GRPOLossOutput:
        """The fused GRPO loss of the micro-batch (``coevo.kernels``' output: loss and per-token detail)
        from ``hidden`` [N, H] and the LM head ``weight`` [V, H], without [N, V] logits at once."""
        weights = token_weights(batch.lengths, self.aggregation, step_tokens=step_tokens, step_sequences=step_seqs,
                                horizon=self.loss_horizon)
        weights = weights.to(hidden.device) * batch.loss_weights  # [N]
        if self.tis_cap is not None and batch.sampler_logp is not None:
            tis = torch.exp(batch.old_logp - batch.sampler_logp).clamp(max=self.tis_cap)  # [N]
            weights = weights * torch.nan_to_num(tis, nan=1.0)  # a forced token was not sampled: no correction
        return grpo_loss(hidden, weight, batch.targets, batch.old_logp, batch.advantages, weights, ref_logp=ref,
                         temperature=temperature, params=self.loss_params, **self.kernel)

    def _share_prefix(self, batch: Collated) -> bool:
        """Whether this micro-batch reads its common prefix once (where the strategy allows it:
        ``reads_shared_prefix``)."""
        if not self.share_prefix or not self.strategy.reads_shared_prefix:
            return False
        return shared_prefix_length(batch.input_ids, batch.attention_mask, batch.positions) >= MIN_SHARED_PREFIX

    @torch.no_grad()
    def _ref_logp(self, batch: Collated, temperature: float | torch.Tensor, share: bool) -> torch.Tensor:
        """[N] reference log-probs at each token's own temperature, so the k3 KL compares like with like."""
        model = self.unwrapped
        if hasattr(model, "disable_adapter"):  # LoRA: the reference is the base model
            with model.disable_adapter():
                hidden = completion_hidden(model, batch.input_ids, batch.attention_mask, batch.rows, batch.positions,
                                           share_prefix=share)
                with self.strategy.gathered(lm_head_weight(model)) as weight:  # ZeRO-3: partitioned after the forward
                    return token_logprobs(hidden, weight, batch.targets, temperature)
        if self.ref_model is None:
            raise ValueError("beta > 0 needs a ref_model (or a LoRA model, whose base is the reference)")
        hidden = completion_hidden(self.ref_model, batch.input_ids, batch.attention_mask, batch.rows, batch.positions,
                                   share_prefix=share)
        return token_logprobs(hidden, lm_head_weight(self.ref_model), batch.targets, temperature)

    # ----------------------------------------------------------------- checkpoints
    def save(self, directory: str | Path) -> Path:
        """``directory/model`` in save_pretrained format (the adapter only, for LoRA) and
        ``directory/trainer_state.pt`` with optimizer, scheduler and version. Rank 0 writes."""
        directory = Path(directory)
        self.accelerator.wait_for_everyone()
        weights, optimizer = self.strategy.full_state()  # sharded: collectives, rank 0 receives the whole tensors
        if self.accelerator.is_main_process:
            directory.mkdir(parents=True, exist_ok=True)
            self.unwrapped.save_pretrained(directory / "model", state_dict=weights)
            state = {"optimizer": optimizer, "scheduler": self.scheduler.state_dict(), "version": self.version}
            tmp = directory / "trainer_state.pt.tmp"
            torch.save(state, tmp)
            tmp.replace(directory / "trainer_state.pt")
        self.accelerator.wait_for_everyone()
        return directory

    def load(self, directory: str | Path) -> None:
        """Restore weights, optimizer, scheduler and version saved by ``save``; weights holding NaN or
        infinity are refused (a ValueError naming the file and the tensor)."""
        from safetensors.torch import load_file

        directory = Path(directory)
        model = self.unwrapped
        weights_file = next((directory / "model").glob("*.safetensors"))
        device = "cpu" if self.accelerator.device.type == "cpu" else str(self.accelerator.device)  # not "cpu:0"
        tensors = load_file(weights_file, device=device)
        bad = next((name for name, t in tensors.items() if t.is_floating_point() and not torch.isfinite(t).all()), None)
        if bad is not None:  # training on them would give NaN losses from the first step, without a word
            raise ValueError(f"{weights_file}: tensor {bad!r} holds NaN or infinite values")
        self.strategy.load_weights(model, tensors)
        state = torch.load(directory / "trainer_state.pt", map_location=device, weights_only=True)
        self.strategy.load_optimizer(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.version = int(state["version"])


def _temperature(items: Sequence[TrainSequence | PackedSequence], batch: Collated) -> float | torch.Tensor:
    """The micro-batch's temperature: one float when every sequence was sampled at the same one (the
    kernels' scalar path), else the [N] per-token tensor. Decided from the sequences, on the host."""
    temperatures = {s.temperature for item in items for s in parts_of(item)}
    return next(iter(temperatures)) if len(temperatures) == 1 else batch.temperatures


def apply_lora(model: PreTrainedModel, *, r: int = ModelConfig.lora_r, alpha: int = ModelConfig.lora_alpha,
               dropout: float = ModelConfig.lora_dropout,
               target_modules: Sequence[str] = ("q_proj", "k_proj", "v_proj", "o_proj")) -> PeftModel:
    """Wrap ``model`` with a LoRA adapter (PEFT); only the adapter is trainable. PEFT reads a
    property transformers 5 deprecates; its FutureWarning says nothing a user can act on."""
    import warnings

    from peft import LoraConfig, get_peft_model

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        return get_peft_model(model, LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout,
                                                target_modules=list(target_modules), task_type="CAUSAL_LM"))
