"""The Evolver: a proposal's typed edits → a candidate harness, through the substitution algebra.

Nothing here is clever on purpose: every edit goes through ``apply_edit`` (so insert, remove,
replace and set_param are type-checked, and a code-level edit — a ``code`` processor whose source
subclasses a built-in and calls ``super()`` — passes the sandbox's static policy and is loaded in a
forked child). A proposal that does not build is rejected with the algebra's message, which names
the offending processor, and that message goes back to the meta-agent for revision.
"""

from __future__ import annotations

from dataclasses import replace

from coevo.harness.edits import apply_edit, check_proposed
from coevo.harness.harness import Harness
from coevo.rundir.evolve_records import Proposal


class BuildError(ValueError):
    """A proposal's edits do not apply to the harness; the message says which edit and why."""


def build_candidate(harness: Harness, proposal: Proposal) -> Harness:
    """Apply ``proposal.edits`` in order; each recorded edit carries the proposal's change manifest.

    Raises ``BuildError`` naming the edit (by position and description) and the algebra's reason.
    """
    if not proposal.edits:
        raise BuildError("the proposal has no edits")
    manifest = proposal.manifest()
    candidate = harness
    for i, edit in enumerate(proposal.edits):
        try:
            check_proposed(candidate, edit)
            candidate = apply_edit(candidate, replace(edit, manifest=manifest))
        except Exception as err:  # the algebra's typed errors, a refused code processor, a bad spec
            raise BuildError(f"edit {i} ({edit.describe()}) does not apply: {type(err).__name__}: {err}") from err
    if candidate.id == harness.id:
        raise BuildError("the edits leave the harness unchanged")
    return candidate
