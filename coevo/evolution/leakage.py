"""Leakage of the tasks an edit is judged on into the text it adds (HarnessEvolve §3.5), as
pure functions of that text, the tasks' answers and texts: one half of the quality gate
(``coevo.evolution.quality_gate``).

Leakage has two parts, and the score is the larger:

- (a) answers: a task's ground truth appearing in the added text as a whole word/phrase. Answers
  are normalised (stringified, stripped, lower-cased, split into words, punctuation and signs
  dropped; numbers canonical, so ``3.50`` is ``3.5`` and ``007`` is ``7``).
  An answer is *ignored* when its normal form is
  shorter than 2 characters or all its words are in ``COMMON_TOKENS`` (yes/no, true/false,
  articles...), because such strings occur in any prompt. The part scores the share of the
  considered answers found, so a two-digit number that happens to appear in a demonstration
  of another task is weak evidence, while a lookup table of many answers scores high; an
  answer of ``fingerprint_chars`` (6) or more characters cannot appear by chance and scores
  1.0 on its own.
- (b) copying: word n-grams (n = 8; a task text shorter than n words is one n-gram of its full
  length; texts under ``min_words`` words are skipped) of a task's text found in the added
  text. Only *task-specific* n-grams count: one that also occurs in an ``allowed`` text (the
  demonstrations a proposal may quote) or in another given task's text is the environment's
  template, not the task. Eight task-specific consecutive words do not recur by chance, so
  one copied n-gram scores 1.0; the containment (share of the task's specific n-grams
  copied) is reported per task in ``leakage_detail`` for the reviser.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

NGRAM = 8
MIN_WORDS = 4
FINGERPRINT_CHARS = 6

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


def normalise_answer(answer: object) -> str | None:
    """The answer's normal form (its words joined by one space), or None when it is ignored:
    shorter than 2 characters, or made of ``COMMON_TOKENS`` only."""
    toks = words(str(answer).strip())
    norm = " ".join(toks)
    if len(norm) < 2 or all(t in COMMON_TOKENS for t in toks):
        return None
    return norm


def _grams(toks: Sequence[str], n: int) -> set[tuple[str, ...]]:
    return {tuple(toks[i : i + n]) for i in range(len(toks) - n + 1)}


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
    answers: Mapping[str, object],
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
    answers: Mapping[str, object],
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
