"""The Critic's quality gate (HarnessEvolve §3.5) as a pure function of the edits, the parent
harness and the judged tasks: leakage (``coevo.evolution.leakage``) of the text the edits add
(``coevo.evolution.added_text``) at most ``eta_leak``, and bloat (``coevo.evolution.bloat``) at
most ``eta_bloat``; otherwise the edit goes back for revision with a reason that quotes the
offending strings. Pure, so a verdict can be re-derived from a run directory and tested against
slow, obvious twins; nothing here runs a model or builds a processor.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from coevo.evolution.added_text import edit_text
from coevo.evolution.bloat import CHARS_PER_EXAMPLE, bloat
from coevo.evolution.leakage import FINGERPRINT_CHARS, MIN_WORDS, NGRAM, leakage_detail
from coevo.harness.edits import Edit
from coevo.harness.harness import Harness
from coevo.rundir.evolve_records import QualityReport

# The gate's thresholds (the Critic's defaults; no config field: a run does not tune them).
ETA_LEAK = 0.2
"""Leakage threshold: one chance collision among five or more short answers passes; a copied
n-gram, a fingerprint answer or more than a fifth of the answers leaked does not."""
ETA_BLOAT = 5.0
"""Bloat threshold (HarnessEvolve's η_blo = 5 injected examples: demonstrations plus prompt growth
/ 400 characters)."""


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

