"""A small verifiers v1 taskset: integer arithmetic, scored by the last number of the reply.

Written as verifiers' own docs write one (a ``TaskData`` with the answer, a ``Task`` whose
``@reward`` and ``@metric`` score the trace, a ``Taskset`` listed in ``__all__``), with nothing
downloaded. ``system_prompt`` is the program's own system prompt; the default is poor on purpose
(it asks for a long explanation, so a small model rambles past its budget), which is what the
harness evolution experiment starts from (docs/RESULTS.md, "Agents as programs").
"""

from __future__ import annotations

import random
import re

import verifiers.v1 as vf

POOR_SYSTEM_PROMPT = "Explain your reasoning at length, step by step, restating the problem before you begin."
NUMBER = re.compile(r"-?\d+")


class ArithData(vf.TaskData):
    answer: str


class ArithTask(vf.Task[ArithData]):
    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        numbers = NUMBER.findall(trace.last_reply.replace(",", ""))
        return float(bool(numbers) and numbers[-1] == self.data.answer)

    @vf.metric
    async def reply_chars(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply))


class ArithConfig(vf.TasksetConfig):
    n: int = 60
    seed: int = 0
    max_operand: int = 12
    terms: int = 2
    system_prompt_text: str = POOR_SYSTEM_PROMPT


class ArithTaskset(vf.Taskset[ArithTask, ArithConfig]):
    def load(self):
        distinct = (self.config.max_operand - 1) ** self.config.terms * 3 ** (self.config.terms - 1)
        if self.config.n > distinct:
            raise ValueError(f"n={self.config.n} tasks, but terms={self.config.terms} and max_operand="
                             f"{self.config.max_operand} give only {distinct} distinct expressions")
        rng = random.Random(self.config.seed)
        seen: set[str] = set()
        while len(seen) < self.config.n:
            expr = str(rng.randint(2, self.config.max_operand))
            for _ in range(self.config.terms - 1):
                expr += f" {rng.choice('+-*')} {rng.randint(2, self.config.max_operand)}"
            if expr in seen:
                continue
            seen.add(expr)
            yield ArithTask(ArithData(id=f"arith-{len(seen):03d}", prompt=f"What is {expr}?",
                                      system_prompt=self.config.system_prompt_text, answer=str(eval(expr))),
                            self.config.task)


__all__ = ["ArithTaskset"]
