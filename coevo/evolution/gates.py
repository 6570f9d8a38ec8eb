"""The Critic's gates as pure functions: quality (leakage, bloat), seesaw, performance.

Why pure functions: the Critic runs episodes, but what it decides from their outcomes must be
reproducible from the numbers alone (a verdict can be re-derived from a run directory) and
testable against slow, obvious twins. Nothing here runs a model or builds a processor.

Quality gate (HarnessEvolve §3.5), applied to the text an edit *adds* to the harness: the words
of a changed string parameter (prompt, template, code source) outside runs of ≥ 3 words kept from
the old value, new items of a string list (demos), new turns of a turn list (a ``few_shot``
processor's ``turns``: every turn's text, the task, the tool call, the tool's result and the
answer), strings nested in dict parameters (a code processor's ``init_params``). Specs are
compared, nothing is built.

- Leakage has two parts, and the score is the larger:
  (a) answers: a task's ground truth appearing in the added text as a whole word/phrase. Answers
      are normalised (stringified, stripped, lower-cased, split into words, punctuation and signs
      dropped; numbers canonical, so ``3.50`` is ``3.5`` and ``007`` is ``7``). An answer is *ignored* when its normal form is
      shorter than 2 characters or all its words are in ``COMMON_TOKENS`` (yes/no, true/false,
      articles...), because such strings occur in any prompt. The part scores the share of the
      considered answers found, so a two-digit number that happens to appear in a demonstration
      of another task is weak evidence, while a lookup table of many answers scores high; an
      answer of ``fingerprint_chars`` (6) or more characters cannot appear by chance and scores
      1.0 on its own.
  (b) copying: word n-grams (n = 8; a task text shorter than n words is one n-gram of its full
      length; texts under ``min_words`` words are skipped) of a task's text found in the added
      text. Only *task-specific* n-grams count: one that also occurs in an ``allowed`` text (the
      demonstrations a proposal may quote) or in another given task's text is the environment's
      template, not the task. Eight task-specific consecutive words do not recur by chance, so
      one copied n-gram scores 1.0; the containment (share of the task's specific n-grams
      copied) is reported per task in ``leakage_detail`` for the reviser.
- Bloat counts injected examples: new few-shot demonstrations (pairs of ``demos``, demonstrations
  of ``turns``) plus prompt growth in
  characters divided by ``chars_per_example`` (400: a worked example pasted into a prompt instead
  of a demo counts too). Code source is not prompt text and does not count (it is still checked
  for leakage).

Seesaw gate (HarnessX §4.4): per-task pass@k before and after; ship only with at least one
fail→pass and no pass→fail among the tasks evaluated. Performance gate (HarnessEvolve eq. 1):
improvement ≥ delta on the current batch, degradation ≤ epsilon on each recent batch; both
boundaries pass (compared with a 1e-9 tolerance because accuracies are ratios of counts and
``0.3 - 0.2 < 0.1`` in floating point).

Statistical gate (the default; ``stat_gate``): a sequential test on *paired* attempts. The Critic
runs the parent and the candidate afresh on the same tasks; each paired attempt is a win
(candidate passed, parent failed), a loss (the reverse) or a tie. If the edit changes nothing,
a discordant pair is a win or a loss with probability 1/2 each, whatever the task's difficulty.
The statistic is the likelihood ratio of "the candidate wins a share ``win_share`` of discordant
pairs" against "half": ``LR = (2·win_share)^wins · (2·(1 − win_share))^losses``. Under no effect
it is a non-negative martingale, so by Ville's inequality it ever reaches ``1/alpha`` with
probability at most ``alpha`` — however the pairs were gathered: in stages, with confirmation
re-runs, pooled across rounds. Hence: ship when ``LR ≥ 1/alpha``; reject when
``LR ≤ beta/(1 − alpha)`` (Wald's lower boundary: an edit with the designed effect is rejected with
probability about ``beta``), naming harm when the sign test on losses is significant at ``alpha``;
otherwise undecided (more evidence needed), or rejected for no effect once the pooled evidence
reached its cap (``exhausted``). A task that looked regressed is re-run (``regression_confirmed``:
the exact sign test on the fresh pairs alone at ``alpha``); a confirmed regression rejects.
"""

from __future__ import annotations

import difflib
import math
import re
from collections import Counter
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from coevo.agent.outcomes import task_pass_at_k
from coevo.config import EvolutionConfig
from coevo.evolution.types import QualityReport
from coevo.harness.edits import Edit
from coevo.harness.harness import Harness

NGRAM = 8
MIN_WORDS = 4
FINGERPRINT_CHARS = 6
CHARS_PER_EXAMPLE = 400
MIN_KEPT_WORDS = 3
"""A run of fewer than this many words shared by an old and a new prompt is treated as new text
(the word diff would otherwise split a pasted instruction on every "the")."""
ETA_LEAK: float = EvolutionConfig.eta_leak  # the value is stated in coevo.config only
"""Suggested leakage threshold: one chance collision among five or more short answers passes;
a copied n-gram, a fingerprint answer or more than a fifth of the answers leaked does not."""
ETA_BLOAT: float = EvolutionConfig.eta_bloat  # the value is stated in coevo.config only
"""Suggested bloat threshold (HarnessEvolve's η_blo = 5 injected examples)."""
TOLERANCE = 1e-9
GATE_MODES = ("seesaw", "performance", "both")
STAT_ALPHA: float = EvolutionConfig.stat_alpha  # the value is stated in coevo.config only
"""Suggested error rate of the statistical gate: an edit with no effect ships with probability at
most 0.1 over every round it is judged (half the 20% the project tolerates for neutral edits, so
prompt changes that are nearly neutral stay under it; harmful edits ship far less often)."""
STAT_BETA: float = EvolutionConfig.stat_beta  # the value is stated in coevo.config only
"""Suggested miss rate at the designed effect (Wald's lower boundary): the usual 80% power."""
STAT_WIN_SHARE: float = EvolutionConfig.stat_win_share  # the value is stated in coevo.config only
"""Suggested designed effect: the candidate wins 3 of 4 discordant pairs (e.g. a pass rate from
0.05 to 0.15 on a small model: wins 0.14, losses 0.04 per pair)."""

COMMON_TOKENS = frozenset({
    "a", "an", "the", "and", "or", "of", "to", "in", "on", "at", "by", "for", "with", "is", "it", "be", "are",
    "was", "not", "no", "yes", "true", "false", "none", "null", "nan", "na", "n", "ok", "okay", "unknown",
    "answer", "answers", "final", "result", "number", "value", "correct", "incorrect", "wrong", "right",
    "y", "t", "f", "i", "you", "we", "he", "she", "they", "this", "that", "there", "here", "done",
})
"""Words an answer may not consist of only (such answers are ignored by the leakage check)."""

_WORD_RE = re.compile(r"\d+(?:\.\d+)?|[^\W\d_]+")


# ---------------------------------------------------------------------------------- tokenising
def _canon_number(token: str) -> str:
    whole, _, frac = token.partition(".")
    whole = whole.lstrip("0") or "0"
    frac = frac.rstrip("0")
    return f"{whole}.{frac}" if frac else whole


def words(text: str) -> list[str]:
    """Lower-cased words and canonical numbers of ``text``; punctuation and signs are dropped."""
    return [_canon_number(t) if t[0].isdigit() else t for t in _WORD_RE.findall(text.lower())]


def normalise_answer(answer: Any) -> str | None:
    """The answer's normal form (its words joined by one space), or None when it is ignored:
    shorter than 2 characters, or made of ``COMMON_TOKENS`` only."""
    toks = words(str(answer).strip())
    norm = " ".join(toks)
    if len(norm) < 2 or all(t in COMMON_TOKENS for t in toks):
        return None
    return norm


def _grams(toks: Sequence[str], n: int) -> set[tuple[str, ...]]:
    return {tuple(toks[i : i + n]) for i in range(len(toks) - n + 1)}


# ---------------------------------------------------------------------------------- added text
@dataclass(frozen=True)
class Added:
    """One piece of text an edit adds: where it goes and, for demonstrations, whose turn it is."""

    processor: str
    kind: str
    param: str  # dotted path for nested dict params ("init_params.demos")
    text: str
    role: str | None = None  # "user" / "assistant" for an item of a ``demos`` list, the turn's role in ``turns``


@dataclass
class _Proc:
    kind: str
    params: dict[str, Any]
    origin: str | None  # name of the processor in ``harness_before`` this one derives from


def _spec_name(spec: Mapping[str, Any]) -> str:
    params = spec.get("params") or {}
    kind = str(spec.get("kind", ""))
    return str(spec.get("name") or (params.get("class_name") if kind == "code" else None) or kind)


def _simulate(edits: Sequence[Edit], harness_before: Harness | None) -> tuple[dict[str, _Proc], dict[str, _Proc]]:
    """Processors by name before and after the edits, from specs only (nothing is built, so a code
    processor is never loaded here). An edit naming a processor that is not there adds it."""
    before: dict[str, _Proc] = {}
    for p in harness_before or ():
        spec = p.spec()
        before[p.name] = _Proc(spec["kind"], dict(spec["params"]), p.name)
    state = {name: _Proc(p.kind, dict(p.params), p.origin) for name, p in before.items()}
    for e in edits:
        if e.op in ("insert", "replace"):
            spec = e.spec or {}
            name = _spec_name(spec)
            origin = None
            if e.op == "replace" and e.processor in state:
                origin = state.pop(e.processor).origin
            elif name in before and all(p.origin != name for p in state.values()):
                origin = name  # removed earlier in this edit list and inserted again: compare with the old one
            state[name] = _Proc(str(spec.get("kind", "")), dict(spec.get("params") or {}), origin)
        elif e.op == "remove":
            state.pop(e.processor, None)
        else:
            proc = state.setdefault(e.processor, _Proc("", {}, None))
            proc.params[e.param or ""] = e.value
    return before, state


def _is_turn(value: Any) -> bool:
    return isinstance(value, Mapping) and isinstance(value.get("content"), str)


def _turn_key(turn: Mapping[str, Any]) -> tuple[str, str, str]:
    """A chat turn as a hashable value: (role, tool name, content)."""
    return (str(turn.get("role", "")), str(turn.get("name") or ""), str(turn.get("content", "")))


def _leaves(value: Any, path: str) -> Iterator[tuple[str, Any]]:
    """String, list-of-string and list-of-turn leaves of a parameter value (dicts are walked);
    a turn list comes back as a list of ``_turn_key`` tuples."""
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        yield path, list(value)
    elif isinstance(value, (list, tuple)) and all(_is_turn(v) for v in value):
        yield path, [_turn_key(v) for v in value]
    elif isinstance(value, Mapping):
        for k in sorted(value, key=str):
            yield from _leaves(value[k], f"{path}.{k}")


def added_words(old: str, new: str) -> list[str]:
    """Runs of ``new`` (whitespace-separated words, each run joined by spaces) that are not kept
    from ``old``: words outside matching blocks of at least ``MIN_KEPT_WORDS`` words (or all of
    ``old`` when it is shorter)."""
    old_w, new_w = old.split(), new.split()
    if not new_w:
        return []
    keep_min = max(1, min(MIN_KEPT_WORDS, len(old_w)))
    kept = [False] * len(new_w)
    matcher = difflib.SequenceMatcher(None, old_w, new_w, autojunk=False)
    for block in matcher.get_matching_blocks():
        if block.size >= keep_min:
            kept[block.b : block.b + block.size] = [True] * block.size
    runs: list[str] = []
    current: list[str] = []
    for word, k in zip(new_w, kept, strict=True):
        if k:
            if current:
                runs.append(" ".join(current))
            current = []
        else:
            current.append(word)
    if current:
        runs.append(" ".join(current))
    return runs


def added_segments(edits: Sequence[Edit], harness_before: Harness | None) -> list[Added]:
    """Every piece of text the edits add, compared with what the processor (or the one it
    replaced) had before: new words of a changed string, new items of a string list. With
    ``harness_before=None`` all text the edits carry counts as added."""
    before, after = _simulate(edits, harness_before)
    out: list[Added] = []
    for name, proc in after.items():
        old_params = before[proc.origin].params if proc.origin in before else {}
        old_leaves = dict(_leaves(old_params, "")) if old_params else {}
        for path, value in _leaves(proc.params, ""):
            param = path[1:]
            old = old_leaves.get(path)
            if isinstance(value, str):
                old_text = old if isinstance(old, str) else ""
                out.extend(Added(name, proc.kind, param, run) for run in added_words(old_text, value))
                continue
            remaining = Counter(old if isinstance(old, list) else [])
            for i, item in enumerate(value):
                if remaining[item] > 0:
                    remaining[item] -= 1
                    continue
                if isinstance(item, tuple):  # a turn: (role, tool name, content)
                    role, text = item[0], item[2]
                else:
                    role = ("user" if i % 2 == 0 else "assistant") if param.rsplit(".", 1)[-1] == "demos" else None
                    text = item
                if text.strip():
                    out.append(Added(name, proc.kind, param, text, role))
    return out


def edit_text(edits: Sequence[Edit], harness_before: Harness | None) -> str:
    """The text the edits add to the harness (prompts, demos, templates, code), one piece a line:
    what could leak a task into the harness."""
    return "\n".join(a.text for a in added_segments(edits, harness_before))


# ---------------------------------------------------------------------------------- leakage
@dataclass
class LeakageDetail:
    """Evidence behind a leakage score, per task, for the reviser and the logs."""

    score: float
    answer_score: float  # part (a): share of answers leaked, 1.0 for a fingerprint answer
    answers_leaked: dict[str, str] = field(default_factory=dict)  # task -> normalised answer
    containment: dict[str, float] = field(default_factory=dict)  # task -> share of specific n-grams copied
    copied: dict[str, list[str]] = field(default_factory=dict)  # task -> copied word runs
    offending: list[str] = field(default_factory=list)


def _check_ngram(ngram: int, min_words: int) -> None:
    if ngram < 1:
        raise ValueError(f"ngram must be >= 1, got {ngram}")
    if min_words < 1:
        raise ValueError(f"min_words must be >= 1, got {min_words}")


def leakage_detail(
    added_text: str,
    answers: Mapping[str, Any],
    task_texts: Mapping[str, str],
    *,
    allowed: Sequence[str] = (),
    ngram: int = NGRAM,
    min_words: int = MIN_WORDS,
    fingerprint_chars: int = FINGERPRINT_CHARS,
) -> LeakageDetail:
    """``leakage`` with its evidence per task (see the module docstring for the rules)."""
    _check_ngram(ngram, min_words)
    added = words(added_text)
    added_grams: dict[int, set[tuple[str, ...]]] = {}

    def grams_of_added(n: int) -> set[tuple[str, ...]]:
        if n not in added_grams:
            added_grams[n] = _grams(added, n)
        return added_grams[n]

    # (a) answers
    considered = 0
    leaked: dict[str, str] = {}
    fingerprint = False
    for task in sorted(answers):
        norm = normalise_answer(answers[task])
        if norm is None:
            continue
        considered += 1
        toks = tuple(norm.split())
        if toks in grams_of_added(len(toks)):
            leaked[task] = norm
            fingerprint = fingerprint or len(norm) >= fingerprint_chars
    share = 1.0 if fingerprint else (len(leaked) / considered if considered else 0.0)

    # (b) copying of task-specific n-grams
    tokens = {t: words(text) for t, text in task_texts.items()}
    allowed_tokens = [words(a) for a in allowed]
    shared: dict[int, tuple[Counter[tuple[str, ...]], set[tuple[str, ...]]]] = {}

    def not_specific(n: int) -> tuple[Counter[tuple[str, ...]], set[tuple[str, ...]]]:
        """How many task texts hold each n-gram, and the n-grams of the allowed texts."""
        if n not in shared:
            freq: Counter[tuple[str, ...]] = Counter()
            for toks in tokens.values():
                freq.update(_grams(toks, n))
            shared[n] = (freq, set().union(*(_grams(a, n) for a in allowed_tokens)))
        return shared[n]

    containment: dict[str, float] = {}
    copied: dict[str, list[str]] = {}
    for task in sorted(tokens):
        toks = tokens[task]
        if len(toks) < min_words:
            continue
        n = min(ngram, len(toks))
        freq, allowed_grams = not_specific(n)
        positions = [
            i for i in range(len(toks) - n + 1)
            if freq[tuple(toks[i : i + n])] == 1 and tuple(toks[i : i + n]) not in allowed_grams
        ]
        specific = {tuple(toks[i : i + n]) for i in positions}
        if not specific:
            continue
        hits = specific & grams_of_added(n)
        if not hits:
            continue
        containment[task] = len(hits) / len(specific)
        covered = [False] * len(toks)
        for i in positions:
            if tuple(toks[i : i + n]) in hits:
                covered[i : i + n] = [True] * n
        copied[task] = _runs(toks, covered)
    score = 1.0 if containment else share
    offending = list(leaked.values()) + [run for task in sorted(copied) for run in copied[task]]
    return LeakageDetail(score, share, leaked, containment, copied, list(dict.fromkeys(offending)))


def _runs(toks: Sequence[str], covered: Sequence[bool]) -> list[str]:
    runs, current = [], []
    for tok, c in zip(toks, covered, strict=True):
        if c:
            current.append(tok)
        elif current:
            runs.append(" ".join(current))
            current = []
    if current:
        runs.append(" ".join(current))
    return runs


def leakage(
    added_text: str,
    answers: Mapping[str, Any],
    task_texts: Mapping[str, str],
    *,
    ngram: int = NGRAM,
    allowed: Sequence[str] = (),
    min_words: int = MIN_WORDS,
    fingerprint_chars: int = FINGERPRINT_CHARS,
) -> tuple[float, list[str]]:
    """Leakage score in [0, 1] of ``added_text`` and the offending strings (leaked answers in
    normal form, then copied word runs), for the tasks the Critic judges the edit on.

    ``answers``: task → ground truth (any value; stringified). ``task_texts``: task → instruction
    of the failed tasks. ``allowed``: texts a proposal may quote (their n-grams never count).
    """
    d = leakage_detail(
        added_text, answers, task_texts, allowed=allowed, ngram=ngram, min_words=min_words,
        fingerprint_chars=fingerprint_chars,
    )
    return d.score, d.offending


# ---------------------------------------------------------------------------------- bloat
class Bloat(NamedTuple):
    """Injected examples: ``score = demos_added + prompt_growth / chars_per_example``."""

    score: float
    demos_added: int
    prompt_growth: int  # characters added to prompt parameters (net per parameter, never < 0)


def _prompt_params(kind: str) -> set[str]:
    from coevo.harness.errors import UnknownProcessorError
    from coevo.harness.library import processor_class

    if kind == "code":
        return set()
    try:  # a processor of the user's own, by import path, has its prompts gated too
        cls = processor_class(kind)
    except UnknownProcessorError:
        return set()
    return {p.name for p in cls.params if p.type == "prompt"}


def bloat(edits: Sequence[Edit], harness_before: Harness | None, *, chars_per_example: int = CHARS_PER_EXAMPLE) -> Bloat:
    """Count the examples the edits inject: new demonstration pairs in any ``demos`` list, new
    demonstrations (a user turn and what follows it) in any turn list, and growth of prompt
    parameters (built-in ``prompt`` params, and string ``init_params`` of a code processor, which
    configure its base's prompts) in units of ``chars_per_example``."""
    if chars_per_example < 1:
        raise ValueError(f"chars_per_example must be >= 1, got {chars_per_example}")
    before, after = _simulate(edits, harness_before)
    demos_added = 0
    growth = 0
    for proc in after.values():
        old_params = before[proc.origin].params if proc.origin in before else {}
        old_leaves = dict(_leaves(old_params, ""))
        prompts = _prompt_params(proc.kind)
        for path, value in _leaves(proc.params, ""):
            old = old_leaves.get(path)
            leaf = path.rsplit(".", 1)[-1]
            if isinstance(value, list) and (leaf == "demos" or any(isinstance(v, tuple) for v in value)):
                split = _pairs if leaf == "demos" else _turn_demos
                old_demos = Counter(split(old if isinstance(old, list) else []))
                for demo in split(value):
                    if old_demos[demo] > 0:
                        old_demos[demo] -= 1
                    else:
                        demos_added += 1
            elif isinstance(value, str):
                is_prompt = path[1:] in prompts or (proc.kind == "code" and path.startswith(".init_params."))
                if is_prompt:
                    growth += max(0, len(value) - (len(old) if isinstance(old, str) else 0))
    return Bloat(demos_added + growth / chars_per_example, demos_added, growth)


def _pairs(items: Sequence[str]) -> list[tuple[str, ...]]:
    return [tuple(items[i : i + 2]) for i in range(0, len(items), 2)]


def _turn_demos(turns: Sequence[tuple[str, str, str]]) -> list[tuple[tuple[str, str, str], ...]]:
    """Turn keys grouped into demonstrations: each starts at a user turn."""
    demos: list[list[tuple[str, str, str]]] = []
    for turn in turns:
        if turn[0] == "user" or not demos:
            demos.append([])
        demos[-1].append(turn)
    return [tuple(d) for d in demos]


# ---------------------------------------------------------------------------------- quality gate
def quality_gate(
    edits: Sequence[Edit],
    harness_before: Harness | None,
    answers: Mapping[str, Any],
    task_texts: Mapping[str, str],
    *,
    eta_leak: float,
    eta_bloat: float,
    allowed: Sequence[str] = (),
    ngram: int = NGRAM,
    min_words: int = MIN_WORDS,
    fingerprint_chars: int = FINGERPRINT_CHARS,
    chars_per_example: int = CHARS_PER_EXAMPLE,
) -> QualityReport:
    """Leakage ≤ ``eta_leak`` and bloat ≤ ``eta_bloat`` or the edit goes back for revision with a
    reason that quotes the offending strings and the figures against their thresholds."""
    if not 0.0 <= eta_leak <= 1.0:
        raise ValueError(f"eta_leak must be in [0, 1], got {eta_leak}")
    if eta_bloat < 0:
        raise ValueError(f"eta_bloat must be >= 0, got {eta_bloat}")
    text = edit_text(edits, harness_before)
    leak = leakage_detail(
        text, answers, task_texts, allowed=allowed, ngram=ngram, min_words=min_words,
        fingerprint_chars=fingerprint_chars,
    )
    b = bloat(edits, harness_before, chars_per_example=chars_per_example)
    problems = []
    if leak.score > eta_leak:
        parts = []
        if leak.answers_leaked:
            parts.append(
                f"it contains the ground-truth answers of {len(leak.answers_leaked)} task(s) it is judged on: "
                + ", ".join(repr(a) for a in leak.answers_leaked.values())
            )
        if leak.copied:
            parts.append(
                "it copies the text of task(s) it is judged on: "
                + "; ".join(f"{t}: " + ", ".join(repr(r) for r in runs) for t, runs in leak.copied.items())
            )
        problems.append(
            f"leakage {leak.score:.2f} > {eta_leak:.2f}: " + " and ".join(parts)
            + ". Remove these strings; demonstrate the format on a different task instead."
        )
    if b.score > eta_bloat:
        problems.append(
            f"bloat {b.score:.1f} > {eta_bloat:g} injected examples: {b.demos_added} new demonstration pair(s) "
            f"and +{b.prompt_growth} prompt characters ({chars_per_example} characters count as one example). "
            f"Keep at most {eta_bloat:g} examples and state the rule they illustrate instead."
        )
    passed = not problems
    reason = (
        f"quality ok: leakage {leak.score:.2f} <= {eta_leak:.2f}, bloat {b.score:.1f} <= {eta_bloat:g}"
        if passed
        else "rejected by the quality gate: " + " | ".join(problems)
    )
    return QualityReport(passed=passed, leakage=leak.score, bloat=b.score, reason=reason, leaked=leak.offending)


# ---------------------------------------------------------------------------------- seesaw gate
class SeesawResult(NamedTuple):
    ship: bool
    fail_to_pass: list[str]
    pass_to_fail: list[str]
    reason: str


def seesaw_gate(
    before: Mapping[str, Sequence[bool]],
    after: Mapping[str, Sequence[bool]],
    *,
    scope: Collection[str],
) -> SeesawResult:
    """Compare per-task pass@k. Evaluated tasks: ``scope`` ∪ tasks that passed before (those
    missing from ``after`` outside ``scope`` cannot be judged and are named in the reason). Ship
    only with no pass→fail flip and at least one fail→pass; one regression vetoes any number of
    gains (the seesaw constraint is per task, not an aggregate)."""
    b, a = task_pass_at_k(before), task_pass_at_k(after)
    missing_before = sorted(t for t in scope if t not in b)
    if missing_before:
        raise ValueError(f"scope tasks have no outcomes in before: {missing_before}")
    missing_after = sorted(t for t in scope if t not in a)
    if missing_after:
        raise ValueError(f"after lacks scope tasks of before: {missing_after}")
    evaluated = set(scope) | {t for t, ok in b.items() if ok}
    unjudged = sorted(t for t in evaluated if t not in a)
    judged = sorted(t for t in evaluated if t in a)
    f2p = [t for t in judged if not b[t] and a[t]]
    p2f = [t for t in judged if b[t] and not a[t]]
    ship = not p2f and bool(f2p)
    if p2f:
        reason = (
            f"reject: pass→fail on {len(p2f)} task(s) {p2f} "
            f"(with {len(f2p)} fail→pass); no task that passed under pass@k may fail"
        )
    elif not f2p:
        reason = f"reject: no fail→pass among {len(judged)} evaluated task(s)"
    else:
        reason = f"ship: {len(f2p)} fail→pass {f2p}, no pass→fail among {len(judged)} evaluated task(s)"
    if unjudged:
        reason += f"; not re-run after: {unjudged}"
    return SeesawResult(ship, f2p, p2f, reason)


# ---------------------------------------------------------------------------------- performance gate
class PerformanceResult(NamedTuple):
    ship: bool
    reason: str


def _check_acc(name: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and 0.0 <= value <= 1.0):
        raise ValueError(f"{name} must be an accuracy in [0, 1], got {value!r}")


def performance_gate(
    current_before: float,
    current_after: float,
    recent_before: Sequence[float],
    recent_after: Sequence[float],
    *,
    delta: float,
    epsilon: float,
) -> PerformanceResult:
    """Accept iff ``current_after - current_before >= delta`` and, for every recent batch l,
    ``recent_before[l] - recent_after[l] <= epsilon`` (HarnessEvolve eq. 1; no recent batches:
    the second condition holds). Both boundaries pass, within a 1e-9 tolerance."""
    if delta < 0 or epsilon < 0:
        raise ValueError(f"delta and epsilon must be >= 0, got delta={delta}, epsilon={epsilon}")
    if len(recent_before) != len(recent_after):
        raise ValueError(
            f"recent_before and recent_after must have one accuracy per recent batch, "
            f"got {len(recent_before)} and {len(recent_after)}"
        )
    _check_acc("current_before", current_before)
    _check_acc("current_after", current_after)
    for i, (rb, ra) in enumerate(zip(recent_before, recent_after, strict=True)):
        _check_acc(f"recent_before[{i}]", rb)
        _check_acc(f"recent_after[{i}]", ra)
    gain = current_after - current_before
    degradations = [rb - ra for rb, ra in zip(recent_before, recent_after, strict=True)]
    worst = max(degradations, default=0.0)
    problems = []
    if gain < delta - TOLERANCE:
        problems.append(f"current batch {current_before:.3f} → {current_after:.3f} (gain {gain:+.3f} < delta {delta:g})")
    bad = [i for i, d in enumerate(degradations) if d > epsilon + TOLERANCE]
    if bad:
        problems.append(f"recent batch(es) {bad} degrade by up to {worst:.3f} > epsilon {epsilon:g}")
    if problems:
        return PerformanceResult(False, "reject: " + "; ".join(problems))
    return PerformanceResult(
        True,
        f"ship: current batch gain {gain:+.3f} >= {delta:g}, worst recent degradation {worst:.3f} <= {epsilon:g} "
        f"over {len(degradations)} batch(es)",
    )


# ---------------------------------------------------------------------------------- combining
class Decision(NamedTuple):
    ship: bool
    gate: str  # seesaw | performance | seesaw+performance (the gate(s) that decided)
    reason: str


def combine(
    mode: str,
    *,
    seesaw: Sequence[Any] | None = None,
    performance: Sequence[Any] | None = None,
) -> Decision:
    """The Critic's decision from gate results (``SeesawResult``/``PerformanceResult``, or any
    ``(ship, ..., reason)`` tuple). ``both`` ships only when both ship; the gate named is the one
    that rejected, or ``seesaw+performance`` when both agree."""
    if mode not in GATE_MODES:
        raise ValueError(f"gate mode must be one of {GATE_MODES}, got {mode!r}")
    needed = {"seesaw": ("seesaw",), "performance": ("performance",), "both": ("seesaw", "performance")}[mode]
    given = {"seesaw": seesaw, "performance": performance}
    missing = [g for g in needed if given[g] is None]
    if missing:
        raise ValueError(f"gate mode {mode!r} needs the result of {missing}")
    if mode != "both":
        result = given[mode]
        assert result is not None
        return Decision(bool(result[0]), mode, str(result[-1]))
    assert seesaw is not None and performance is not None
    s_ok, p_ok = bool(seesaw[0]), bool(performance[0])
    reason = f"seesaw: {seesaw[-1]}; performance: {performance[-1]}"
    if s_ok == p_ok:
        return Decision(s_ok, "seesaw+performance", reason)
    return Decision(False, "performance" if s_ok else "seesaw", reason)



# ---------------------------------------------------------------------------------- statistical gate
Pair = tuple[bool, bool]
"""One paired attempt on a task: (the parent passed, the candidate passed)."""
STAT_DECISIONS = ("ship", "reject", "undecided")


class PairCounts(NamedTuple):
    wins: int  # candidate passed, parent failed
    losses: int  # parent passed, candidate failed
    both: int  # both passed
    neither: int  # both failed

    @property
    def pairs(self) -> int:
        return self.wins + self.losses + self.both + self.neither


def pair_counts(pairs: Iterable[Pair]) -> PairCounts:
    """Wins, losses and the two kinds of ties among ``pairs``."""
    c = Counter((bool(a), bool(b)) for a, b in pairs)
    return PairCounts(c[(False, True)], c[(True, False)], c[(True, True)], c[(False, False)])


def sign_test(successes: int, failures: int) -> float:
    """One-sided exact sign test: P(X ≥ successes) for X ~ Binomial(successes + failures, 1/2)
    (1.0 when there are no trials)."""
    if successes < 0 or failures < 0:
        raise ValueError(f"counts must be >= 0, got {successes} and {failures}")
    n = successes + failures
    return sum(math.comb(n, i) for i in range(successes, n + 1)) / 2**n


def log_likelihood_ratio(wins: int, losses: int, win_share: float) -> float:
    """log LR of "the candidate wins ``win_share`` of discordant pairs" against "half of them";
    ties carry no information and do not enter."""
    if not 0.5 < win_share < 1.0:
        raise ValueError(f"win_share must be in (0.5, 1), got {win_share}")
    return wins * math.log(2 * win_share) + losses * math.log(2 * (1 - win_share))


def stat_thresholds(alpha: float, beta: float) -> tuple[float, float]:
    """(ship at log LR ≥ this, reject at log LR ≤ this): log(1/alpha) and log(beta/(1 − alpha))."""
    if not 0.0 < alpha < 1.0 or not 0.0 < beta < 1.0 or alpha + beta >= 1.0:
        raise ValueError(f"alpha and beta must be in (0, 1) with alpha + beta < 1, got {alpha} and {beta}")
    return math.log(1 / alpha), math.log(beta / (1 - alpha))


def apparent_regression(pairs: Sequence[Pair]) -> bool:
    """A task looks regressed when its paired attempts hold more losses than wins."""
    c = pair_counts(pairs)
    return c.losses > c.wins


def regression_confirmed(fresh: Sequence[Pair], alpha: float) -> bool:
    """A regression is confirmed by a re-run alone (the pairs that made it look regressed are
    not used again): the sign test on the fresh pairs' losses is significant at ``alpha``."""
    c = pair_counts(fresh)
    return c.losses > 0 and sign_test(c.losses, c.wins) <= alpha


class StatResult(NamedTuple):
    decision: str  # one of STAT_DECISIONS
    reason: str
    evidence: dict[str, Any]


def stat_gate(
    pairs: Mapping[str, Sequence[Pair]],
    *,
    regressions: Collection[str] = (),
    alpha: float = STAT_ALPHA,
    beta: float = STAT_BETA,
    win_share: float = STAT_WIN_SHARE,
    exhausted: bool = False,
) -> StatResult:
    """The decision from the pooled paired attempts (task → pairs) and the confirmed regressions.

    Order: a confirmed regression rejects; then ``LR ≥ 1/alpha`` ships; ``LR ≤ beta/(1 − alpha)``
    rejects (harm when the sign test on losses is significant at ``alpha``, else no effect); else
    undecided, or, when ``exhausted`` (the pooled evidence reached its cap), rejected for no effect.
    The evidence dict holds every number the decision used."""
    ship_at, reject_at = stat_thresholds(alpha, beta)
    c = pair_counts(p for task_pairs in pairs.values() for p in task_pairs)
    llr = log_likelihood_ratio(c.wins, c.losses, win_share)
    p_gain, p_harm = sign_test(c.wins, c.losses), sign_test(c.losses, c.wins)
    evidence: dict[str, Any] = {
        "tasks": sum(1 for v in pairs.values() if v), "pairs": c.pairs, "wins": c.wins, "losses": c.losses,
        "both_pass": c.both, "both_fail": c.neither, "log_lr": llr, "ship_at": ship_at, "reject_at": reject_at,
        "p_gain": p_gain, "p_harm": p_harm, "alpha": alpha, "beta": beta, "win_share": win_share,
        "regressions": sorted(regressions),
    }
    counts = f"{c.wins} wins / {c.losses} losses in {c.pairs} paired attempts on {evidence['tasks']} task(s)"
    stat = f"log LR {llr:+.2f} (ship ≥ {ship_at:.2f}, reject ≤ {reject_at:.2f})"
    if regressions:
        return StatResult("reject", f"reject: confirmed regression on {sorted(regressions)} "
                          f"(re-run, sign test p ≤ {alpha:g}); {counts}", evidence)
    if llr >= ship_at - TOLERANCE:
        return StatResult("ship", f"ship: {counts}; {stat}, sign test p {p_gain:.3f}", evidence)
    if llr <= reject_at + TOLERANCE:
        what = (f"evidence of harm (sign test on losses p {p_harm:.3f} ≤ {alpha:g})" if p_harm <= alpha
                else "no effect at the designed size")
        return StatResult("reject", f"reject: {what}; {counts}; {stat}", evidence)
    if exhausted:
        return StatResult("reject", f"reject: no effect found with enough evidence (the pooled cap is spent); "
                          f"{counts}; {stat}", evidence)
    return StatResult("undecided", f"undecided: not enough evidence yet; {counts}; {stat}", evidence)
