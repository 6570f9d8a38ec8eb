"""Observability: what an episode leaves behind for people and for the Digester."""

from __future__ import annotations

from coevo.harness.events import StepEndEvent, TaskEndEvent
from coevo.harness.hooks import Dimension, Hook
from coevo.harness.processor import Param, Processor


class Journal(Processor):
    kind = "journal"
    description = "Records one line per step (actions, context size, tokens so far) in the trace journal."
    hook = Hook.STEP_END
    dimension = Dimension.OBSERVABILITY
    consumes = produces = StepEndEvent
    params = (Param("max_chars", "int", 200, "characters kept per action description"),)

    def process(self, event: StepEndEvent) -> StepEndEvent:
        s = event.state
        width = self.config["max_chars"]
        s.journal.append(
            {
                "step": s.step,
                "actions": [a[:width] for a in event.actions],
                "messages": len(s.messages),
                "completion_tokens": s.usage.get("completion_tokens", 0),
            }
        )
        return event


class EpisodeMetrics(Processor):
    kind = "episode_metrics"
    description = ("Summarises an episode: steps, tokens per step, tool calls and error rate, whether it answered, "
                   "user turns and delegations.")
    hook = Hook.TASK_END
    dimension = Dimension.OBSERVABILITY
    consumes = produces = TaskEndEvent

    def process(self, event: TaskEndEvent) -> TaskEndEvent:
        s = event.state
        u = s.usage
        steps = s.step + 1
        calls = u.get("tool_calls", 0)
        s.metrics.update(
            steps=steps,
            tokens_per_step=(u.get("prompt_tokens", 0) + u.get("completion_tokens", 0)) / steps,
            tool_calls=calls,
            tool_error_rate=u.get("tool_errors", 0) / calls if calls else 0.0,
            answered=s.final_answer is not None,
            stop_reason=s.stop_reason,
            user_turns=1 + len(s.replies),  # several when the env answers replies with a next user turn
            delegations=u.get("delegations", 0),  # sub-episodes run for specialists
        )
        return event
