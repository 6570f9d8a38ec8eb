"""Reasoning tasks from reasoning-gym's procedural generators, with a calculator and a python tool.

The default mix spans three difficulty bands so that a small model gets some reward early on
(easy: one-digit arithmetic, short counting) while stronger policies and harnesses still have
headroom (hard: GSM-style word problems, 4x4 sudoku). A band describes the curated config of a
dataset; overriding that config through ``configs`` does not relabel it.

Capabilities rule: every task carries ``skill:<dataset>`` and, when its gold solution uses a tool,
``tool:<name>`` for that tool:

- ``tool:calculator`` when the answer is the value of one arithmetic expression (arithmetic
  datasets, leg counting, GSM word problems);
- ``tool:python`` when the answer needs a short program (counting letters, solving an equation,
  extrapolating a sequence, searching a sudoku);
- no tool when the answer comes from reading alone (family relationships).

``gold_actions`` are given only where the call can be read off the entry itself: the entry's
expression for the calculator datasets (evaluated here, and kept only if the dataset's own scorer
accepts the result), leg counting as ``count*legs`` sums from reasoning-gym's own leg table, and
small programs built from the quoted text (letter counting) or the equation (simple equations),
which the tests run in the sandbox. Everything else has none rather than an invented one.

Generation is deterministic: reasoning-gym items are a function of (seed, index), and task ids
hash the question text, so ids and splits agree across runs and machines. reasoning-gym is
imported on first use because importing it costs seconds.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from coevo.envs.arithmetic import CALCULATOR, safe_arithmetic
from coevo.envs.base import SPLITS, Env, EnvSession, Score, Task, assign_split, check_split
from coevo.harness.events import ToolCall, ToolResult, ToolSpec
from coevo.safety.sandbox.python_tool import run_python

if TYPE_CHECKING:
    from reasoning_gym.dataset import ProceduralDataset

PYTHON = ToolSpec(
    "python",
    "Run Python code (standard library only) and return what it prints; a final expression is echoed.",
    {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
    provider="env",
)

BANDS = ("easy", "medium", "hard")
ID_HASH_CHARS = 12
DRAWS_PER_TASK = 4  # generator indices tried per requested task before giving up on finding unique questions

Entry = dict[str, Any]


def format_number(value: float) -> str:
    """Print a calculator result the way reasoning-gym writes answers: integers without ``.0``."""
    if isinstance(value, int):
        return str(value)
    if value.is_integer():
        return str(int(value))
    return f"{value:.12g}"


def calculate(expression: object) -> ToolResult:
    """The calculator tool: ``safe_arithmetic`` with every failure reported as a tool error."""
    if not isinstance(expression, str):
        return ToolResult("", error="calculator needs a string argument 'expression'")
    try:
        return ToolResult(format_number(safe_arithmetic(expression)))
    except (ValueError, ArithmeticError) as err:  # ArithmeticError: float overflow in huge results
        return ToolResult("", error=str(err) or type(err).__name__)


def _expression_gold(entry: Entry) -> tuple[ToolCall, ...]:
    return (ToolCall("calculator", {"expression": entry["metadata"]["expression"]}),)


def _leg_gold(entry: Entry) -> tuple[ToolCall, ...]:
    from reasoning_gym.arithmetic.leg_counting import ANIMALS

    terms = [f"{count}*{ANIMALS[animal]}" for animal, count in entry["metadata"]["animals"].items()]
    return (ToolCall("calculator", {"expression": " + ".join(terms)}),)


def _letter_gold(entry: Entry) -> tuple[ToolCall, ...]:
    meta = entry["metadata"]
    text, letter = " ".join(meta["span"]), meta["target_letter"]
    return (ToolCall("python", {"code": f"text = {text!r}\nprint(text.lower().count({letter!r}))"}),)


def _equation_gold(entry: Entry) -> tuple[ToolCall, ...]:
    """The equation is linear in its variable, so two evaluations of lhs - rhs solve it exactly."""
    meta = entry["metadata"]
    lhs, rhs = meta["equation"].split("=")
    code = (
        "from fractions import Fraction\n"
        f"gap = lambda {meta['variable']}: ({lhs.strip()}) - ({rhs.strip()})\n"
        "print(Fraction(-gap(0), gap(1) - gap(0)))"
    )
    return (ToolCall("python", {"code": code}),)


@dataclass(frozen=True)
class DatasetSpec:
    """How one reasoning-gym dataset enters the env: its curated config and what solving it takes."""

    band: str
    tool: str | None  # the tool a gold solution uses (see the module docstring)
    answer_note: str  # one line appended to the question
    config: Mapping[str, Any] = field(default_factory=dict)
    gold: Callable[[Entry], tuple[ToolCall, ...]] | None = None


CURATED: Mapping[str, DatasetSpec] = MappingProxyType({
    "basic_arithmetic": DatasetSpec(
        "easy", "calculator", "Answer with the integer result only.",
        # allow_parentheses=True selects reasoning-gym's precedence-correct generator; its simple
        # generator evaluates left to right, so "3 + 2 * 3" would come with the answer 15.
        {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 1, "operators": ("+", "-", "*"),
         "allow_parentheses": True, "allow_negation": False},
        _expression_gold,
    ),
    "chain_sum": DatasetSpec(
        "easy", "calculator", "Answer with the integer result only.",
        {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2}, _expression_gold,
    ),
    "letter_counting": DatasetSpec(
        "easy", "python", "Answer with the count as an integer only.", {"min_words": 3, "max_words": 5}, _letter_gold,
    ),
    "leg_counting": DatasetSpec(
        "easy", "calculator", "Answer with the total number of legs as an integer only.",
        {"min_animals": 1, "max_animals": 2, "min_instances": 1, "max_instances": 3}, _leg_gold,
    ),
    "products": DatasetSpec(
        "medium", "calculator", "Answer with the integer result only.",
        {"min_terms": 2, "max_terms": 2, "min_digits": 2, "max_digits": 3}, _expression_gold,
    ),
    "number_sequence": DatasetSpec(
        "medium", "python", "Answer with the next number of the sequence only.",
        {"min_terms": 5, "max_terms": 6, "min_value": -20, "max_value": 20, "max_complexity": 1},
    ),
    "simple_equations": DatasetSpec(
        "medium", "python", "Answer with the value of the variable only.",
        {"min_terms": 2, "max_terms": 3, "min_value": 1, "max_value": 20}, _equation_gold,
    ),
    "family_relationships": DatasetSpec(
        "medium", None, "Answer with the relationship as one lowercase word, such as wife or mother-in-law.",
        {"min_family_size": 4, "max_family_size": 6},
    ),
    "gsm_symbolic": DatasetSpec("hard", "calculator", "Answer with the number only, without units."),
    "mini_sudoku": DatasetSpec(
        "hard", "python", "Answer with the solved grid: four lines of four numbers separated by spaces.",
        {"min_empty": 6, "max_empty": 10},
    ),
})
"""The datasets this env knows, in the default order. A new one needs a row here: a band, a tool
and an answer note are judgements about the dataset that cannot be inferred from its registry."""

DEFAULT_DATASETS: tuple[str, ...] = tuple(CURATED)


def _plain_json(data: object) -> Any | None:
    """``data`` as plain JSON values (tuples become lists), or None when it is not serialisable."""
    try:
        return json.loads(json.dumps(data))
    except (TypeError, ValueError):
        return None


@dataclass
class ReasoningSession(EnvSession):
    """One episode on one reasoning-gym entry: stateless tools, scored by the dataset itself."""

    task: Task
    dataset: ProceduralDataset  # the dataset that produced the entry
    entry: Entry
    observation: str
    python_timeout_s: float
    python_memory_mb: int
    tools: dict[str, ToolSpec] = field(default_factory=lambda: {"calculator": CALCULATOR, "python": PYTHON})
    done: bool = False

    def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        if name == "calculator":
            return calculate(arguments.get("expression"))
        if name == "python":
            code = arguments.get("code")
            if not isinstance(code, str):
                return ToolResult("", error="python needs a string argument 'code'")
            res = run_python(code, timeout_s=self.python_timeout_s, memory_mb=self.python_memory_mb)
            return ToolResult(res.stdout, error=res.error, seconds=res.seconds)
        return ToolResult("", error=f"unknown tool {name!r}; available: {sorted(self.tools)}")

    def verify(self, answer: str | None) -> Score:
        """Score with the dataset's own ``score_answer``; only a full-credit answer passes.

        Surrounding whitespace is stripped first: several scorers compare strings exactly, and a
        trailing newline (as python's ``print`` leaves) is formatting, not a wrong answer.

        A scorer that raises on odd model output is treated as a wrong answer, not an env failure:
        the model wrote that output, and the episode should say so rather than crash.
        """
        info: dict[str, Any] = {"expected": self.entry["answer"]}
        reward = 0.0
        if answer is not None:
            try:
                reward = float(self.dataset.score_answer(answer.strip(), self.entry))
            except Exception as err:  # noqa: BLE001 - see docstring
                info["score_error"] = f"{type(err).__name__}: {err}"
        reward = min(1.0, max(0.0, reward))
        return Score(reward, reward >= 1.0, info)

    def close(self) -> None:
        pass


class ReasoningEnv(Env):
    """``n_per_dataset`` unique questions from each of ``datasets``, generated from ``seed``.

    ``configs`` overrides curated config fields per dataset (e.g. ``{"chain_sum": {"max_terms": 5}}``).
    When a small config cannot yield ``n_per_dataset`` distinct questions within
    ``DRAWS_PER_TASK * n_per_dataset`` draws, the dataset contributes fewer tasks.
    """

    name = "reasoning"

    def __init__(
        self,
        datasets: Sequence[str] | None = None,
        n_per_dataset: int = 40,
        seed: int = 0,
        split_fractions: Sequence[float] = (0.6, 0.2, 0.2),
        configs: Mapping[str, Mapping[str, Any]] | None = None,
        python_timeout_s: float = 5.0,
        python_memory_mb: int = 256,
    ) -> None:
        if isinstance(datasets, str):  # list("chain_sum") would silently become nine one-letter names
            raise ValueError(f"datasets must be a list of names, not the string {datasets!r}")  # noqa: TRY004
        names = list(DEFAULT_DATASETS if datasets is None else datasets)
        self._check_args(names, n_per_dataset, split_fractions, configs or {}, python_timeout_s, python_memory_mb)
        self.seed = seed
        self.split_fractions = tuple(split_fractions)
        self.python_timeout_s, self.python_memory_mb = python_timeout_s, python_memory_mb
        self._tasks: list[Task] = []
        self._sources: dict[str, tuple[Any, Entry]] = {}
        for name in names:
            overrides = dict((configs or {}).get(name, {}))
            self._add_dataset(name, {**CURATED[name].config, **overrides}, n_per_dataset)

    @staticmethod
    def _check_args(
        names: list[str],
        n_per_dataset: int,
        split_fractions: Sequence[float],
        configs: Mapping[str, Mapping[str, Any]],
        python_timeout_s: float,
        python_memory_mb: int,
    ) -> None:
        valid = ", ".join(CURATED)
        if not names:
            raise ValueError(f"datasets must be a non-empty list of names; choose from: {valid}")
        unknown = [n for n in names if n not in CURATED]
        if unknown:
            raise ValueError(f"unknown reasoning datasets {unknown}; choose from: {valid}")
        if len(set(names)) != len(names):
            raise ValueError(f"datasets lists a name twice: {names}")
        if not isinstance(n_per_dataset, int) or n_per_dataset < 1:
            raise ValueError(f"n_per_dataset must be a positive integer, got {n_per_dataset!r}")
        fractions = list(split_fractions)
        if len(fractions) != len(SPLITS) or any(f < 0 for f in fractions) or abs(sum(fractions) - 1.0) > 1e-9:
            raise ValueError(
                f"split_fractions must be three non-negative numbers for {SPLITS} summing to 1, got {fractions}"
            )
        stray = sorted(set(configs) - set(names))
        if stray:
            raise ValueError(f"configs given for datasets that are not selected: {stray}; selected: {names}")
        for name, overrides in configs.items():
            reserved = sorted({"seed", "size"} & set(overrides))
            if reserved:
                raise ValueError(
                    f"configs[{name!r}] sets {reserved}; the env controls these through seed and n_per_dataset"
                )
        if python_timeout_s <= 0 or python_memory_mb <= 0:
            raise ValueError("python_timeout_s and python_memory_mb must be positive")

    def _add_dataset(self, name: str, config: dict[str, Any], n: int) -> None:
        import reasoning_gym

        spec = CURATED[name]
        draws = DRAWS_PER_TASK * n
        try:
            dataset = reasoning_gym.create_dataset(name, seed=self.seed, size=draws, **config)
        except (TypeError, AssertionError, ValueError) as err:  # unknown field, failed validate()
            fields = ", ".join(reasoning_gym.factory.DATASETS[name][1].__dataclass_fields__)
            reason = str(err) or type(err).__name__
            raise ValueError(f"invalid config for {name!r} {config}: {reason}; fields: {fields}") from err
        seen: set[str] = set()
        for index in range(draws):
            if len(seen) == n:
                break
            entry = dataset[index]
            question = entry["question"]
            if question in seen:
                continue
            seen.add(question)
            task = self._task(name, spec, dataset, entry)
            self._tasks.append(task)
            self._sources[task.task_id] = (dataset, entry)

    def _task(self, name: str, spec: DatasetSpec, dataset: ProceduralDataset, entry: Entry) -> Task:
        question = entry["question"]
        task_id = f"reasoning/{name}/{hashlib.sha256(question.encode()).hexdigest()[:ID_HASH_CHARS]}"
        gold = spec.gold(entry) if spec.gold is not None else ()
        if gold and gold[0].name == "calculator":
            result = calculate(gold[0].arguments["expression"])
            if result.error is not None or dataset.score_answer(result.output, entry) < 1.0:
                gold = ()  # the expression does not reproduce the dataset's answer: no known-good call
        metadata: dict[str, Any] = {"dataset": name, "band": spec.band}
        source = _plain_json(entry.get("metadata", {}))
        if source is not None:
            metadata["entry"] = source
        return Task(
            task_id=task_id,
            env=self.name,
            instruction=f"{question.rstrip()}\n\n{spec.answer_note}",
            split=assign_split(task_id, self.seed, self.split_fractions),
            answer=entry["answer"],
            capabilities=((f"tool:{spec.tool}",) if spec.tool else ()) + (f"skill:{name}",),
            gold_actions=gold,
            metadata=metadata,
        )

    def all_tasks(self) -> list[Task]:
        """Every task in generation order (dataset by dataset), whatever its split."""
        return list(self._tasks)

    def tasks(self, split: str) -> list[Task]:
        check_split(split)
        return [t for t in self._tasks if t.split == split]

    def reset(self, task: Task) -> ReasoningSession:
        source = self._sources.get(task.task_id)
        if source is None:
            raise ValueError(f"task {task.task_id!r} was not generated by this reasoning env")
        dataset, entry = source
        return ReasoningSession(task, dataset, entry, task.instruction, self.python_timeout_s, self.python_memory_mb)
