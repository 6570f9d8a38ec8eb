"""The co-evolution loop: one round = rollout → verifier → buffer → AEGIS → GRPO → (eval) → commit.

The same traces feed both halves: the round's traces enter the replay buffer with behaviour
log-probs from the checkpoint that sampled them, AEGIS digests them and judges its edits, and
cross-harness GRPO updates the weights on the buffer groups of the round's tasks (whichever
harness version or checkpoint produced each trace). ``mode`` switches halves off for the
ablation: ``harness_only`` (no GRPO), ``model_only`` (no AEGIS), ``static`` (neither). It is the
only round driver: ``coevo evolve`` runs it in ``harness_only`` mode with a frozen model, and a
stream's self-evolving protocol adapts each stage with it. Episodes go through the rollout service
(``coevo.agent.rollouts``); what a run keeps on disk is ``coevo.rundir.state``.

No gold answer of a task the run will still train, validate or test on may reach a harness edit:
each round tells AEGIS to withhold the references of every task a remaining round's batch or
dynamic-sampling reserve holds (this round's included) and of the validation and test tasks, so
demonstrations come only from consumed tasks or a reference pool split off (``coevo.loop.build``).
Infrastructure failures (``Trace.infra_failure``) are counted per round in the record.

Resume: a round ends with an atomic checkpoint commit (``coevo.rundir.checkpoint``). Started again on
the same run directory, the loop restores the last complete round; if the killed round had
already committed its traces to the buffer, they are reused, otherwise they are sampled again —
identically, because every phase of a round reseeds the policy from (seed, round, phase).

Secrets: every episode's trace is cleared of secret values by the rollout service
(``coevo.agent.rollouts``, token ids included) before the replay buffer, AEGIS, records or the
tracker see it; ``rounds.jsonl``, ``lineage.jsonl`` and the checkpoint state are redacted again where
they are written, and harness YAML by ``Harness.to_yaml``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from coevo.agent.rollouts import Rollout, RolloutService
from coevo.agent.trace import Trace
from coevo.config.mode import Mode
from coevo.envs.base import Task
from coevo.evolution.engine import AEGIS
from coevo.evolution.types import HarnessEvent
from coevo.harness.harness import Harness
from coevo.harness.scaffold import without_outer_scaffold
from coevo.loop.round_grpo import (
    UNSCAFFOLDED,
    dynamic_sample,
    grpo_record,
    step_batches,
    training_batch,
)
from coevo.loop.round_plan import batches_per_epoch, extra_pools, round_batches
from coevo.loop.round_record import PhaseClock, round_record
from coevo.loop.schedule import Processes, Schedule, Splits, Training
from coevo.policy.heap import blocks_mapped
from coevo.report.eta import RunShape, start_line, time_left_line
from coevo.report.progress import ProgressDisplay
from coevo.report.tracking import Tracker, edit_rows
from coevo.rundir import checkpoint
from coevo.rundir.check import buffer_next_seq, verify_run
from coevo.rundir.evolve_records import EvolveReport
from coevo.rundir.records import BufferStats, Evaluation, GRPOMetrics, RoundRecord, StartRecord, StepMetrics
from coevo.rundir.state import LoopState
from coevo.safety.secrets import contains_secret

if TYPE_CHECKING:
    from coevo.agent.policy import Policy

log = logging.getLogger("coevo.loop.coevolution")

class Coevolution:
    """Runs rounds. Collaborators: ``rollouts`` (the ``RolloutService`` every episode of the run goes
    through: its policy, env, batching, seed and the redaction of secrets), ``aegis`` (always
    present: static and model-only runs never call ``evolve``), ``tracker``
    (``coevo.report.tracking``) and ``progress`` (``coevo.report.progress``); plain values:
    ``splits`` (the tasks), ``schedule`` (what each round does), ``training`` (the weights' half;
    None in modes that do not train) and ``processes`` (one, or several sharing the loop)."""

    def __init__(self, *, mode: str, rollouts: RolloutService, aegis: AEGIS, run_dir: Path, splits: Splits,
                 schedule: Schedule, tracker: Tracker, progress: ProgressDisplay, training: Training | None = None,
                 processes: Processes = Processes()) -> None:
        self.mode = Mode(mode)
        if self.mode.trains != (training is not None):
            raise ValueError(f"mode {mode!r} {'trains' if self.mode.trains else 'does not train'} the model: "
                             f"{'it needs' if self.mode.trains else 'it takes no'} training (trainer, buffer)")
        if training is not None and processes.is_main and (training.buffer is None or training.logprob_fn is None):
            raise ValueError("a training run needs, on rank 0, a buffer and a logprob_fn")
        self.training = training  # the only optional part: whether, and how, the run trains its weights
        self.rollouts, self.aegis, self.tracker, self.progress = rollouts, aegis, tracker, progress
        self.run_dir, self.schedule, self.processes = run_dir, schedule, processes
        s = schedule
        self.batches = round_batches(splits.train, s.batch_tasks, s.seed, s.rounds)
        # dynamic sampling: only a training run draws more tasks
        self.extras = extra_pools(splits.train, self.batches, s.max_extra_tasks if self.signal_groups else 0, s.seed)
        self.val_tasks, self.test_tasks = list(splits.val), list(splits.test)
        self.per_epoch = batches_per_epoch(len(splits.train), s.batch_tasks)
        self.first, self.end = s.first_round, s.first_round + s.rounds  # round numbers [first, end)
        self.state = LoopState()
        self.shape = RunShape(  # what the time estimates price (coevo.report.eta)
            first=self.first, end=self.end,
            critic_episodes=s.critic_episodes if self.mode.evolves else 0, evolves=s.evolve_rounds,
            rollout_episodes=s.batch_tasks * (s.attempts + s.unscaffolded_attempts),
            grpo_steps=s.steps_per_round if training else 0, step_traces=s.step_traces or s.batch_tasks * s.attempts,
            eval_episodes=(len(self.val_tasks) + len(self.test_tasks)) * s.eval_attempts)

    # what the collaborators already hold, named once
    @property
    def policy(self) -> Policy:
        return self.rollouts.policy

    @property
    def is_main(self) -> bool:
        return self.processes.is_main

    @property
    def env_name(self) -> str:
        """Noted in every harness file the run writes."""
        return self.rollouts.env.name

    @property
    def signal_groups(self) -> int | None:
        """Dynamic sampling's target of groups with a learning signal (a training run only)."""
        return self.schedule.signal_groups if self.training is not None else None

    @property
    def version(self) -> int:
        """The model version the next episodes sample from: optimizer steps so far (0 without training)."""
        return self.training.trainer.version if self.training is not None else 0

    # ------------------------------------------------------------------ resume
    def resume(self) -> int:
        """Restore the last complete round, if any; returns the next round to run. Before anything is
        loaded, the run directory is checked against the checkpoint (``coevo.rundir.check.verify_run``:
        the checkpoint's files, every buffered trace, the lineage's harness files); a damaged file
        stops the resume naming it (``checkpoint.CheckpointError``)."""
        directory = checkpoint.latest(self.run_dir / "checkpoint")
        if directory is None:
            return 0
        state = checkpoint.load_state(directory, resumable=True)
        verify_run(self.run_dir, directory, state, files=True,
                   buffer=self.training.buffer if self.training is not None else None, lineage=True)
        if self.training is not None:
            checkpoint.load_trainer(self.training.trainer, directory / "trainer")
            self.policy.model_version = str(self.version)
            self.processes.sync_weights()
        where = directory / "state.json"
        try:
            self.aegis.load_state_dict(state["aegis"])
            checkpoint.set_rng_state(state["rng"])
            self.state = LoopState.from_state(state, str(where))
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as err:
            raise checkpoint.CheckpointError(f"{where} is damaged ({type(err).__name__}: {err}); the run cannot "
                                             f"resume from it: {checkpoint.RECOVER}") from err
        self._write_logs()
        log.info("resumed %s after round %d", self.run_dir, self.state.next_round - 1)
        return self.state.next_round

    def _commit(self) -> None:
        aegis = self.aegis.state_dict()
        state = {**self.state.to_state(), "aegis": aegis, "rng": checkpoint.rng_state()}
        if contains_secret([aegis.get("variants"), aegis.get("pool")]):  # checkpoint.commit redacts them
            state["harnesses_redacted"] = True
        training = self.training
        if training is not None and training.buffer is not None:
            state["buffer_next_seq"] = buffer_next_seq(training.buffer)

        def write_trainer(directory: Path) -> None:
            if training is not None:
                training.trainer.save(directory / "trainer")

        if self.is_main:
            checkpoint.commit(self.run_dir / "checkpoint", self.state.next_round - 1, state, write_trainer)
            self._write_logs()
        elif training is not None:
            training.trainer.save(self.run_dir / "checkpoint" / "unused")  # joins the collective barrier only

    def _write_logs(self) -> None:
        if self.is_main:
            self.state.write_files(self.run_dir, self.aegis.current(), evolved_on=self.env_name)

    # ------------------------------------------------------------------ rounds
    def run(self) -> list[RoundRecord]:
        start = self.resume()
        if start == 0:
            start = self.first
            self._lineage(self.aegis.start_events(round=self.first - 1))
            if self.is_main:
                self.state.start = self.evaluate_start()
                if self.shape.eval_episodes:
                    self.progress.message(start_line(self.shape, self.state.start.seconds / self.shape.eval_episodes))
        for r in range(start, self.end):
            if self.run_round(r) is not None and r + 1 < self.end:
                self.progress.message(time_left_line(self.state.records, self.shape, self.state.start))
        return self.state.records

    def run_round(self, r: int) -> RoundRecord | None:
        """One round: roll out (or reuse the rollouts a killed round buffered) → buffer → evolve →
        train → evaluate → commit. Under several processes rank 0 rolls out, evolves, evaluates and
        writes; every rank takes part in the GRPO step on the traces rank 0 shares."""
        if not self.is_main:
            return self._follow_round(r)
        clock, generating = PhaseClock(), self.policy.seconds
        batch, version = self.batches[r - self.first], self.version
        traces, bare = self._roll_out(batch, r, version, clock)
        train_ids = {t.task_id for t in batch}
        extra_ids = {t.task_id for t in traces} - train_ids  # dynamic sampling's: they train, AEGIS never sees them
        traces, train_ids = [t for t in traces if t.task_id in train_ids], train_ids | extra_ids
        evolved = None
        if self.mode.evolves and self.schedule.evolve_rounds(r):
            evolved, critic_ids = self._evolve(traces, bare, r, version, clock)
            train_ids |= critic_ids
        grpo = None
        if self.training is not None:
            with clock("grpo"):
                grpo = self._train(self.processes.share(training_batch(self.training.replay, train_ids)), r)
            grpo.extra_tasks = len(extra_ids) if self.signal_groups else None
        val, test = self._evaluate_round(r, clock)
        if evolved is not None:  # the trend monitor: train pass rate up while validation goes down
            judged = [t for t in traces if not t.infra_failure]
            evolved.warnings += self.aegis.observe_rates(
                r, train_pass_rate=sum(t.passed for t in judged) / len(judged) if judged else None,
                val_pass_rate=val.pass_at_1 if val is not None else None)
        record = round_record(r, self.mode.name, version, traces, clock.seconds, unscaffolded=bare, val=val, test=test,
                              evolved=evolved, grpo=grpo, variants={n: h.id for n, h in self.aegis.current().items()},
                              meta_tokens=self.aegis.meta_tokens(),
                              buffer=BufferStats(len(self.training.replay), self.training.replay.lag(self.version))
                              if self.training is not None else None)
        # inside rollout, critic and eval: the share spent in the model's generate() (not a phase of its own)
        record.generation_seconds = self.policy.seconds - generating
        self.state.records.append(record)
        self.state.next_round = r + 1
        with clock("checkpoint"):
            self._commit()
        record.seconds = clock.close()
        record.peak_rss_mb = dict(clock.peak_mb)
        self._write_logs()  # the timing fields of the last record are known only now
        self.tracker.log_round(record)
        if evolved is not None and evolved.verdicts:
            self.tracker.log_edits(edit_rows(record))
        self.progress.round_done(record)
        return record

    def _roll_out(self, batch: Sequence[Task], r: int, version: int, clock: PhaseClock
                  ) -> tuple[list[Trace], list[Trace]]:
        """The round's episodes (with dynamic sampling's extra tasks) and those without the
        scaffolding, stored in the buffer with their behaviour log-probs; a killed round's from the
        buffer instead."""
        buffered = self.training.buffered(r) if self.training is not None else None
        if buffered is not None:
            return buffered
        with clock("rollout"):
            traces = self._routed(batch, r, "rollout", self.schedule.attempts, f"round {r}: rollouts").traces
            traces += self._top_up(traces, r)
            bare = self._unscaffolded(batch, r)
        if self.training is not None:
            with clock("logprobs"):
                self.training.store(traces + bare, r, version)
        return traces, bare

    def _evolve(self, traces: list[Trace], bare: list[Trace], r: int, version: int, clock: PhaseClock
                ) -> tuple[EvolveReport, set[str]]:
        """AEGIS on the round's traces; the tasks whose groups the Critic's re-runs joined (when they
        train); at an epoch's end, the best snapshot on validation."""
        self.rollouts.begin_critic(r)  # the Critic's re-runs go on from here
        withheld = self.withheld(r)
        with clock("evolve", timed=False):  # its time is digest, plan and critic, from the report
            evolved, events = self.aegis.evolve(traces, round=r, withheld=withheld, unscaffolded=bare,
                                                weights=version)
        critic_ids: set[str] = set()
        if self.training is not None and self.training.critic_traces:
            with clock("logprobs"):
                critic_ids = self.training.store_critic(self.rollouts.critic_traces(), r, version, withheld)
        for key in ("digest", "plan", "critic"):
            clock.seconds[key] += evolved.seconds.get(key, 0.0)
        self._lineage(events)
        if self.val_tasks and (r - self.first + 1) % self.per_epoch == 0:  # epoch end: best snapshot on validation
            with clock("eval"):
                self._lineage(self.aegis.select(lambda h: self._harness_pass_rate(h, self.val_tasks, r), round=r))
        return evolved, critic_ids

    def _evaluate_round(self, r: int, clock: PhaseClock) -> tuple[Evaluation | None, Evaluation | None]:
        """Validation every ``val_every`` rounds and in the last; the sealed test split in the last only."""
        val = test = None
        every = self.schedule.val_every
        if self.val_tasks and ((every and (r + 1) % every == 0) or r == self.end - 1):
            with clock("eval"):
                val = self.evaluate(self.val_tasks, r, "eval")
        if self.test_tasks and r == self.end - 1:
            with clock("eval"):
                test = self.evaluate(self.test_tasks, r, "test")
        return val, test

    def evaluate_start(self) -> StartRecord:
        """The starting harness (routed variants) and model on validation, and on test when the run
        tests: the row every later round is compared with (``start.json``). Sampled in a round -1 of
        its own, so it shifts no round's sampling."""
        began = time.perf_counter()
        val = self.evaluate(self.val_tasks, -1, "eval") if self.val_tasks else None
        test = self.evaluate(self.test_tasks, -1, "test") if self.test_tasks else None
        return StartRecord(val, test, {n: h.id for n, h in self.aegis.current().items()},
                           self.version, time.perf_counter() - began)

    def withheld(self, r: int) -> set[str]:
        """Task ids whose references may not become demonstrations in round ``r``: the tasks round ``r`` or
        a later one trains on (batches, dynamic sampling's reserves) and the validation and test tasks."""
        ids = {t.task_id for batch in self.batches[r - self.first :] + self.extras[r - self.first :] for t in batch}
        return ids | {t.task_id for t in self.val_tasks} | {t.task_id for t in self.test_tasks}

    def _unscaffolded(self, tasks: Sequence[Task], r: int) -> list[Trace]:
        """``rollout.unscaffolded_attempts`` episodes of each task whose routed harness holds
        scaffolding, on that harness without its outermost layer (``coevo.harness.scaffold``), on a
        sampling stream of their own: they join the task's GRPO group beside the scaffolded
        episodes, and show AEGIS how the model behaves without that layer."""
        if not self.schedule.unscaffolded_attempts:
            return []
        harnesses, _ = self.aegis.routed(tasks)
        pairs = [(t, bare) for t, h in zip(tasks, harnesses, strict=True)
                 if (bare := without_outer_scaffold(h)) is not h]
        if not pairs:
            return []
        done = self.rollouts.run([h for _, h in pairs], [t for t, _ in pairs],
                                 attempts=self.schedule.unscaffolded_attempts, phase="unscaffolded", round=r,
                                 variant=UNSCAFFOLDED,
                                 label=f"round {r}: without the scaffolding",
                                 trace_id=lambda t, a: f"u{r:04d}-{t.task_id}-{a}")
        return done.traces

    def _top_up(self, traces: list[Trace], r: int) -> list[Trace]:
        """Round ``r``'s extra tasks from its reserve (``rollout.signal_groups``: dynamic sampling), on
        a stream of their own seeded once ("extra"), so the rest of the round samples as without them."""
        def run(tasks: list[Task], first: bool) -> list[Trace]:
            done = self._routed(tasks, r, "extra", self.schedule.attempts, f"round {r}: extra tasks", reseed=first)
            return done.traces

        reserve = self.extras[r - self.first]
        return dynamic_sample(traces, reserve, self.schedule.batch_tasks, self.signal_groups or 0, run)

    def _routed(self, tasks: Sequence[Task], r: int, phase: str, attempts: int, label: str, reseed: bool = True
                ) -> Rollout:
        """``attempts`` episodes of each task on the variant AEGIS routes it to (the policy reseeded
        for ``phase`` first, unless ``reseed`` is False: the phase's stream goes on)."""
        harnesses, variants = self.aegis.routed(tasks)
        prefix = "r" if phase == "rollout" else phase
        return self.rollouts.run(harnesses, tasks, attempts=attempts, phase=phase if reseed else None, round=r,
                                 variant=variants, label=label,
                                 trace_id=lambda t, a: f"{prefix}{r:04d}-{t.task_id}-{a}")

    def _follow_round(self, r: int) -> None:
        """A non-main rank's round: the GRPO step on rank 0's batch, then the checkpoint barrier
        (no record: rank 0 keeps them)."""
        if self.training is not None:
            self._train(self.processes.share(None), r)
        self.state.next_round = r + 1
        self._commit()

    def _train(self, batch: tuple[list[Trace], list[int]], r: int) -> GRPOMetrics:
        """``steps_per_round`` GRPO steps on ``batch`` (traces, the model version of each): passes
        over the same buffered groups (the ratio is clipped), or minibatches of them (``step_traces``)."""
        assert self.training is not None
        trainer, (traces, versions) = self.training.trainer, batch
        steps: list[StepMetrics] = []
        self.processes.release_rollout()
        with self.progress.task("GRPO", self.schedule.steps_per_round) as advance, blocks_mapped():
            for part, part_versions in step_batches(traces, versions, self.schedule.steps_per_round,
                                                    self.schedule.step_traces, seed=f"{self.schedule.seed}-{r}"):
                steps.append(trainer.step(part, versions=part_versions))
                advance()
        self.policy.model_version = str(trainer.version)
        self.processes.sync_weights()
        return grpo_record(steps, traces)

    def evaluate(self, tasks: Sequence[Task], r: int, phase: str) -> Evaluation:
        """pass@1 and pass@k of the routed variants (k = eval_attempts)."""
        label = f"{f'round {r}' if r >= 0 else 'start'}: {'validation' if phase == 'eval' else 'test'}"
        done = self._routed(tasks, r, phase, self.schedule.eval_attempts, label)
        return Evaluation(done.pass_at_1, done.pass_at_k, self.schedule.eval_attempts, done.outcomes(),
                          done.tool_use_rate)

    def _harness_pass_rate(self, harness: Harness, tasks: Sequence[Task], r: int) -> float:
        """pass@1 of one harness on ``tasks`` (epoch-end snapshot selection)."""
        done = self.rollouts.run(harness, tasks, attempts=self.schedule.eval_attempts, phase="eval", round=r,
                                 variant="select",
                                 label=f"round {r}: snapshot {harness.id[:8]} on validation",
                                 trace_id=lambda t, a: f"select{r:04d}-{harness.id}-{t.task_id}-{a}")
        return sum(t.passed for t in done.traces) / len(done.traces)  # every task has eval_attempts of them

    # ------------------------------------------------------------------ records
    def _lineage(self, events: Sequence[HarnessEvent]) -> None:
        """Record the events that changed a variant's harness: a lineage row, the harness YAML, the tracker."""
        for event in events:
            if not event.changes_variant:
                continue
            self.state.lineage.append(event.lineage_row())
            if self.is_main:
                event.harness.save(self.run_dir / "lineage" / f"{event.harness.id}.yaml", evolved_on=self.env_name)
            self.tracker.log_harness(event.harness, round=event.round, variant=event.variant, how=event.how)
