"""The rule meta-agent: an offline, deterministic Planner built on a catalogue of typed edits.

It exists so AEGIS runs (and is tested) without any LLM: every failure cause of the taxonomy
maps to an ordered list of edit templates (``coevo.meta.templates``: ``TEMPLATES``, ``CATALOGUE``,
``template_order``). This module holds the agent that runs them, ``RuleMetaAgent``, and what it
needs to do so: the order of clusters (``order_clusters``), which template a proposal came from
(``touched_kinds``) and how a rejected proposal is revised (``leaked_strings``, ``quotes``).
Every draft is applied to the harness before it is returned, so a proposal from this agent
always builds.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from coevo.evolution.meta_agent import Demo, PlanContext, TokenLedger
from coevo.evolution.types import CAUSES, IMPLICATED
from coevo.harness.edits import Edit
from coevo.harness.harness import Harness
from coevo.harness.library.context import split_demos
from coevo.harness.scaffold import scaffold_layers
from coevo.meta.drafts import Draft, Template, applies, flatten
from coevo.meta.retire import retirement, unused_tools
from coevo.meta.templates import CATALOGUE, TEMPLATES, template_order
from coevo.rundir.evolve_records import Cluster, Digest, Proposal


# ------------------------------------------------------------------------------------- ordering
def order_clusters(clusters: list[Cluster], priorities: dict[str, float]) -> list[Cluster]:
    """Clusters by severity × the priority of the dimension they implicate (default 1.0),
    highest first; ties by cause name, so the order never depends on the digest's."""
    def weight(c: Cluster) -> float:
        return c.severity * priorities.get(c.component.dimension, 1.0)

    return sorted(clusters, key=lambda c: (-weight(c), c.cause))


def touched_kinds(proposal: Proposal, harness: Harness) -> set[str]:
    """Processor kinds a proposal's edits touch (insert/replace: the new spec's kind; set_param and
    remove: the kind of the named processor when present)."""
    kinds = set()
    for e in proposal.edits:
        if e.spec is not None and "kind" in e.spec:
            kinds.add(str(e.spec["kind"]))
        elif e.processor in harness:
            kinds.add(harness.get(e.processor).kind)
    return kinds


# ------------------------------------------------------------------------------------ revisions
LEAKED_LINE = re.compile(r"^\s*leaked\s*:\s*(.+)$", re.IGNORECASE | re.MULTILINE)
QUOTED = re.compile(r"'([^']+)'|\"([^\"]+)\"")


def leaked_strings(reason: str) -> list[str]:
    """The offending strings a Critic's reason names: the ``leaked: a | b`` line the engine appends
    (from ``QualityReport.leaked``), else any quoted strings."""
    found = [s.strip() for m in LEAKED_LINE.finditer(reason) for s in m.group(1).split(" | ")]
    if not found:
        found = [a or b for a, b in QUOTED.findall(reason)]
    return [s for s in found if s]


def quotes(text: str, leaked: str) -> bool:
    """Whether ``text`` contains ``leaked`` as a whole token (not inside a longer word or number),
    so a leaked answer ``4`` flags ``<answer>4</answer>`` but not ``42``."""
    pattern = r"(?<![A-Za-z0-9_.])" + re.escape(leaked) + r"(?![A-Za-z0-9_])"
    return re.search(pattern, text) is not None


def _is_demo_edit(e: Edit) -> bool:
    """An edit of this agent that carries demonstrations (a ``few_shot`` insert, or its ``turns``)."""
    if e.op in ("insert", "replace"):
        return (e.spec or {}).get("kind") == "few_shot"
    return e.op == "set_param" and e.param == "turns"


def _with_demos(e: Edit, demos: list[Demo]) -> Edit:
    flat = flatten(demos)
    if e.op == "set_param":
        return replace(e, value=flat)
    spec = dict(e.spec or {})
    spec["params"] = {**(spec.get("params") or {}), "turns": flat}
    return replace(e, spec=spec)


def _demos_of(e: Edit) -> list[Demo]:
    turns = e.value if e.op == "set_param" else (e.spec or {}).get("params", {}).get("turns", [])
    return split_demos(list(turns or []))


# ----------------------------------------------------------------------------------------- agent
class RuleMetaAgent:
    """The ``rule`` backend: catalogue templates in a fixed order, no model, no randomness.

    ``propose`` is a function of (digest, harness, context) alone. ``revise`` also skips drafts
    this agent has already proposed for the variant (``self.tried``): the engine copies
    ``context.rejected`` at the start of a round, so a proposal rejected a moment ago is not in it.

    ``templates`` and ``catalogue`` default to ``TEMPLATES`` and ``CATALOGUE``; pass extended copies
    to let the agent propose processors of your own (docs/processors.md), e.g. ``RuleMetaAgent(templates=
    {**TEMPLATES, "mine": t}, catalogue={**CATALOGUE, "loop": ("mine", *CATALOGUE["loop"])})``.
    A catalogue may leave causes out (nothing is proposed for them); every name it lists must be a template.
    """

    name = "rule"

    def __init__(self, templates: Mapping[str, Template] | None = None,
                 catalogue: Mapping[str, tuple[str, ...]] | None = None) -> None:
        self.templates: Mapping[str, Template] = TEMPLATES if templates is None else dict(templates)
        self.catalogue: Mapping[str, tuple[str, ...]] = CATALOGUE if catalogue is None else dict(catalogue)
        unknown_causes = sorted(set(self.catalogue) - set(CAUSES))
        if unknown_causes:
            raise ValueError(f"catalogue causes {unknown_causes} are not failure causes; use those of {list(CAUSES)}")
        missing = sorted({n for names in self.catalogue.values() for n in names} - set(self.templates))
        if missing:
            raise ValueError(f"catalogue names templates {missing} that are not in templates; add them, or use "
                             f"one of {sorted(self.templates)}")
        self.ledger = TokenLedger()
        self.tried: dict[str, set[str]] = {}

    def state_dict(self) -> dict[str, Any]:
        return {"ledger": self.ledger.as_dict(), "tried": {v: sorted(keys) for v, keys in self.tried.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.ledger.load(state["ledger"])
        self.tried = {v: set(keys) for v, keys in state["tried"].items()}

    # ------------------------------------------------------------------ planning
    def _proposal(self, template: Template, draft: Draft, cluster: Cluster, digest: Digest,
                  context: PlanContext) -> Proposal:
        hypothesis, edits = draft
        return Proposal(
            hypothesis=hypothesis,
            edits=edits,
            dimension=template.dimension,
            cluster=cluster.cause,
            target_tasks=list(cluster.task_ids),
            predicted_flips=list(cluster.task_ids),
            at_risk=list(digest.passed_task_ids),
            variant=context.variant,
            source=self.name,
        )

    def _drafts(self, cluster: Cluster, digest: Digest, harness: Harness, context: PlanContext,
                names: tuple[str, ...]) -> list[Proposal]:
        """Proposals from ``names`` (in order) that build and were not rejected."""
        out = []
        for name in names:
            template = self.templates[name]
            draft = template.build(cluster, harness, context)
            if draft is None or not applies(harness, draft[1]):
                continue
            proposal = self._proposal(template, draft, cluster, digest, context)
            if context.inert and touched_kinds(proposal, harness) <= context.inert:
                continue
            if proposal.key() not in context.rejected:
                out.append(proposal)
        return out

    def propose(self, digest: Digest, harness: Harness, context: PlanContext) -> list[Proposal]:
        """Round-robin over the ordered clusters: each cluster's first usable template, then each
        one's next, ... until ``context.max_proposals``. An edit already taken for one cluster is
        passed over for the next one of the same cluster (format_error and wrong_answer share
        templates), so every cluster in a round gets a distinct proposal while any are left. When the
        digest shows the model behaving unforced as the scaffolding forces it, removing the
        scaffolding is proposed too (``coevo.meta.retire``), and listing only the tools the episodes
        called: ahead of the failures' fixes while the harness holds scaffolding, after them
        otherwise."""
        if context.max_proposals < 0:
            raise ValueError(f"max_proposals must be >= 0, got {context.max_proposals}")
        self.ledger.record("plan")
        queues = [self._drafts(c, digest, harness, context, template_order(c, self.catalogue))
                  for c in order_clusters(digest.clusters, context.priorities) if c.cause in self.catalogue]
        # retiring scaffolding (coevo.meta.retire) comes first; once rejected it goes after every cluster's
        # first proposal, and is still proposed: the evidence it rests on is measured anew every round
        retire = retirement(digest, harness, context)
        if retire is not None:
            queues.insert(0 if retire.key() not in context.rejected else len(queues), [retire])
        # listing only the tools the episodes call: while scaffolding retires (the cheaper agent is the
        # goal) next after a ready shed, before a failure's fix; otherwise after every cluster's first
        # proposal. A rejection stands for the weights it was judged under (context.rejected holds those)
        unlist = unused_tools(digest, harness, context)
        if unlist is not None and unlist.key() not in context.rejected:
            ahead = 1 if retire is not None and retire.key() not in context.rejected else 0
            queues.insert(ahead if scaffold_layers(harness) else len(queues), [unlist])
        chosen: list[Proposal] = []
        seen: set[str] = set()
        while len(chosen) < context.max_proposals and any(queues):
            for queue in queues:
                while queue and queue[0].key() in seen:
                    queue.pop(0)
                if queue and len(chosen) < context.max_proposals:
                    seen.add(queue[0].key())
                    chosen.append(queue.pop(0))
        self.tried.setdefault(context.variant, set()).update(seen)
        return chosen

    # ------------------------------------------------------------------ revising
    def revise(self, proposal: Proposal, reason: str, digest: Digest, harness: Harness,
               context: PlanContext) -> Proposal | None:
        """Leakage: drop the demonstrations that quote a leaked string, keep the rest. Bloat: keep
        one demonstration. Anything else (or when that is impossible): the next template of the
        same cluster not yet tried. None when nothing is left."""
        self.ledger.record("revise")
        tried = self.tried.setdefault(context.variant, set())
        tried.add(proposal.key())
        revised = self._trim_demos(proposal, reason, harness, context)
        if revised is None:
            revised = self._next_template(proposal, digest, harness, context)
        if revised is not None:
            tried.add(revised.key())
        return revised

    def _trim_demos(self, proposal: Proposal, reason: str, harness: Harness, context: PlanContext) -> Proposal | None:
        if not any(_is_demo_edit(e) for e in proposal.edits):
            return None
        leaked = leaked_strings(reason) if re.search(r"leak", reason, re.IGNORECASE) else []
        if leaked:
            def keep(demos: list[Demo]) -> list[Demo]:
                return [d for d in demos
                        if not any(quotes(str(t.get("content", "")), s) for t in d for s in leaked)]
            note = "dropped the demonstrations that quoted leaked text"
        elif re.search(r"bloat", reason, re.IGNORECASE):
            def keep(demos: list[Demo]) -> list[Demo]:
                return demos[:1]
            note = "kept one demonstration to stay within the prompt budget"
        else:
            return None
        edits = []
        for e in proposal.edits:
            if _is_demo_edit(e):
                before = _demos_of(e)
                after = keep(before)
                if not after or after == before:
                    return None
                e = _with_demos(e, after)
            edits.append(e)
        revised = replace(proposal, edits=edits, hypothesis=f"{proposal.hypothesis} (revised: {note})",
                          revision=proposal.revision + 1, source=self.name)
        if not applies(harness, edits) or revised.key() in context.rejected:
            return None
        return revised

    def _next_template(self, proposal: Proposal, digest: Digest, harness: Harness,
                       context: PlanContext) -> Proposal | None:
        cause = proposal.cluster
        if cause not in self.catalogue:
            return None
        cluster = digest.cluster(cause) or Cluster(
            cause=cause, component=IMPLICATED[cause], count=len(proposal.target_tasks), severity=0.0,
            task_ids=list(proposal.target_tasks), trace_ids=[], excerpts=[],
        )
        names = template_order(cluster, self.catalogue)
        kinds = touched_kinds(proposal, harness)
        start = next((i + 1 for i, n in enumerate(names) if self.templates[n].made(kinds)), 0)
        tried = self.tried.get(context.variant, set())
        for candidate in self._drafts(cluster, digest, harness, context, names[start:]):
            if candidate.key() not in tried and candidate.key() != proposal.key():
                return replace(candidate, revision=proposal.revision + 1)
        return None
