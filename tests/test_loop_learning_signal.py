"""What the loop lets into a harness edit and what it counts: no gold answer of a task the run will
still train, validate or test on reaches any proposed edit (demonstrations come from a reference
pool or from tasks no remaining round trains on), and each round's record counts the episodes lost
to infrastructure failures."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from coevo.agent.policy import Policy, ScriptedPolicy
from coevo.envs.base import Env, EnvSession, Score, Task
from coevo.evolution.added_text import edit_text
from coevo.evolution.critic import Critic
from coevo.evolution.engine import AEGIS
from coevo.evolution.reference import ReferenceStore, build_references, split_reference_pool
from coevo.harness.defaults import base_harness
from coevo.harness.events import ToolCall, ToolResult, ToolSpec
from coevo.loop.coevolution import Coevolution
from coevo.loop.schedule import Schedule, Splits
from coevo.meta.rule import RuleMetaAgent
from coevo.report.progress import NullProgress
from coevo.report.tracking import NullTracker
from coevo.rundir.records import InfraFailures
from tests.aegis_helpers import critic_rollout, service

LOOKUP = ToolSpec("lookup", "The code word hidden in a box.",
                  {"type": "object", "properties": {"box": {"type": "integer"}}, "required": ["box"]})


def word(box: int) -> str:
    """A box's code word: a fingerprint no other text holds, so finding it in an edit is a leak."""
    return f"quartz{box:03d}zebra"


@dataclass
class CodeWordSession(EnvSession):
    task: Task
    done: bool = False
    tools: dict = field(default_factory=lambda: {"lookup": LOOKUP})

    @property
    def observation(self) -> str:
        return self.task.instruction

    def call_tool(self, name: str, arguments: dict) -> ToolResult:
        return ToolResult(word(int(arguments["box"])))

    def verify(self, answer: str | None) -> Score:
        ok = answer == self.task.answer
        return Score(float(ok), ok)

    def close(self) -> None:
        pass


class CodeWords(Env):
    """Tasks 'what is the code word of box k', with the lookup call as gold action."""

    name = "codewords"

    def __init__(self) -> None:
        splits = ["train"] * 8 + ["val"] * 2 + ["test"] * 2
        self._tasks = [Task(f"box-{k}", self.name, f"What is the code word of box {k}?", split, answer=word(k),
                            gold_actions=(ToolCall("lookup", {"box": k}),)) for k, split in enumerate(splits, start=1)]

    def tasks(self, split: str) -> list[Task]:
        return [t for t in self._tasks if t.split == split]

    def reset(self, task: Task) -> CodeWordSession:
        return CodeWordSession(task)


def looks_up_then_misreads(messages: list[dict]) -> str:
    """Calls the tool on the task's box, then answers wrongly: a wrong_answer, which demos address first."""
    if messages[-1]["role"] == "tool":
        return "<answer>no idea</answer>"
    box = re.search(r"box (\d+)\?", messages[-1]["content"]).group(1)
    return '<tool_call>{"name": "lookup", "arguments": {"box": %s}}</tool_call>' % box


def loop(tmp_path: Path, env: CodeWords, policy, *, train: list[Task], pool: list[Task], rounds: int) -> Coevolution:
    """A harness-only loop as ``coevo.loop.build`` makes one: references of every train task and of the pool."""
    references = build_references(env, [*train, *pool], ReferenceStore(tmp_path / "references"))
    critic = Critic(critic_rollout(policy, env, max_steps=3), k=1)
    aegis = AEGIS(base_harness(), RuleMetaAgent(), critic, tasks={t.task_id: t for t in train}, references=references,
                  tools=["lookup"], max_proposals=2)
    schedule = Schedule(rounds=rounds, batch_tasks=2, attempts=1, seed=0, steps_per_round=1, val_every=0,
                        eval_attempts=1)
    return Coevolution(mode="harness_only", rollouts=service(policy, env, max_steps=3), aegis=aegis, run_dir=tmp_path,
                       splits=Splits(train, env.tasks("val"), env.tasks("test")), schedule=schedule,
                       tracker=NullTracker(), progress=NullProgress())


def test_no_gold_answer_of_a_task_still_to_train_validate_or_test_on_enters_any_edit(tmp_path):
    env = CodeWords()
    train_all = env.tasks("train")
    # the pool: the two tasks whose ids sort last, so references sorted by id offer the others first
    pool, train = train_all[-2:], train_all[:-2]
    # six train tasks in batches of two: round 3 starts the second epoch
    coevo_loop = loop(tmp_path, env, ScriptedPolicy(looks_up_then_misreads), train=train, pool=pool, rounds=4)
    records = coevo_loop.run()
    every = [*train_all, *env.tasks("val"), *env.tasks("test")]
    demo_rounds = []
    for r, record in enumerate(records):
        still = {t.task_id for b in coevo_loop.batches[r:] for t in b} | {t.task_id for t in every
                                                                          if t.split != "train"}
        edits = [v.proposal.edits for v in record.verdicts]
        assert edits, f"round {r} judged no proposal"
        for proposal in edits:
            text = edit_text(proposal, None)  # everything the edits carry: prompts, demonstration turns
            leaked = sorted(t.task_id for t in every if t.task_id in still and t.answer in text)
            assert leaked == [], f"round {r}: an edit quotes the gold answers of {leaked}"
        if any(e.spec and e.spec.get("kind") == "few_shot" for proposal in edits for e in proposal):
            demo_rounds.append(r)
    assert demo_rounds[:1] == [0]  # with every train task still to come, the pool supplies the demonstrations
    assert {t.task_id for b in coevo_loop.batches for t in b} == {t.task_id for t in train}


def test_the_reference_pool_is_split_off_the_train_split():
    env = CodeWords()
    train_all = env.tasks("train")
    pool, train = split_reference_pool(train_all, 3, seed=5)
    assert len(pool) == 3 and len(train) == 5 and not {t.task_id for t in pool} & {t.task_id for t in train}
    assert [t.task_id for t in train] == [t.task_id for t in train_all if t not in pool]  # order kept
    assert split_reference_pool(train_all, 3, seed=5) == (pool, train)  # the same on every machine
    assert split_reference_pool(train_all, 3, seed=6)[0] != pool
    assert split_reference_pool(train_all, 0, seed=5) == ([], train_all)
    for bad in (-1, 8):
        try:
            split_reference_pool(train_all, bad, seed=5)
        except ValueError:
            continue
        raise AssertionError(f"a pool of {bad} was accepted")
    try:
        split_reference_pool(env.tasks("val"), 1, seed=5)
    except ValueError as err:
        assert "only split 'train'" in str(err)
    else:
        raise AssertionError("a pool of validation tasks was accepted")


def test_each_round_counts_its_infrastructure_failures(tmp_path):
    """The policy runs out of memory on box 2 whenever it comes up: the round that holds it records
    the crash (by source, by trace), the others record none."""
    env = CodeWords()
    train = env.tasks("train")

    class OutOfMemoryOnBox2(Policy):
        model_version = "oom"

        def __init__(self) -> None:
            self.scripted = ScriptedPolicy(looks_up_then_misreads)

        def generate(self, requests):
            if any("box 2?" in str(m.get("content")) for r in requests for m in r.messages):
                raise MemoryError("CUDA out of memory")
            return self.scripted.generate(requests)

    coevo_loop = loop(tmp_path, env, OutOfMemoryOnBox2(), train=train, pool=[], rounds=4)
    coevo_loop.rollouts.batch_size = 1  # a crash takes only its own episode's model call
    records = coevo_loop.run()
    for r, record in enumerate(records):
        crashed = [t for t in coevo_loop.batches[r] if t.task_id == "box-2"]
        expected = [f"r{r:04d}-box-2-0"] if crashed else []
        assert record.infra_failures == InfraFailures(len(expected), {"policy": 1} if expected else {}, expected)
        assert record.train.n_traces == 2
    assert sum(r.infra_failures.count for r in records) == 1


def test_tool_use_rate_counts_episodes_that_called_a_tool_themselves():
    """The learning curves' tool-use rate: an episode counts once however many calls it made, and a
    call a processor answered in the tool's place (blocked) does not count."""
    from coevo.agent.rollouts import tool_use_rate
    from coevo.agent.trace import ToolCallRecord, Trace

    def trace(i: int, *blocked: bool) -> Trace:
        calls = [ToolCallRecord(step=0, name="calculator", arguments={}, output="", error=None, seconds=0.0, blocked=b)
                 for b in blocked]
        return Trace(trace_id=f"t{i}", task_id="x", env="e", split="train", harness_id="h", variant="base",
                     model_version="0", tool_calls=calls)

    assert tool_use_rate([trace(0, False, False), trace(1), trace(2, True), trace(3, True, False)]) == 0.5
    assert tool_use_rate([]) == 0.0
