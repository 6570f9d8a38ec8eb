"""Static type checks of a processor composition: the rules the substitution algebra enforces.

``validate`` is called on every harness that is constructed, so an edit that breaks a rule is
refused when it is made, never discovered half-way through an episode. Rules:

- unique_name: processor instance names are unique within a harness;
- event_type: at each hook, every processor accepts what the previous one produces, starting
  from the event the runtime fires there, and the chain delivers what the runtime expects back
  (at ``after_model`` that is a ``ParsedOutputEvent``, so a parser is required);
- singleton_group: at most one processor per singleton group (one system prompt, one parser...);
- ordering: a processor's ``runs_after`` kinds or groups that are present at its hook run first.
"""

from __future__ import annotations

from collections.abc import Sequence

from coevo.harness.errors import (
    DuplicateNameError,
    EventTypeError,
    OrderingError,
    SingletonConflictError,
)
from coevo.harness.events import HOOK_INPUT, HOOK_OUTPUT, Event
from coevo.harness.hooks import HOOK_ORDER, Hook
from coevo.harness.processor import Processor


def by_hook(processors: Sequence[Processor]) -> dict[Hook, list[Processor]]:
    """Group processors by hook, keeping their relative order."""
    groups: dict[Hook, list[Processor]] = {h: [] for h in HOOK_ORDER}
    for p in processors:
        groups[p.hook].append(p)
    return groups


def chain_output_type(hook: Hook, chain: Sequence[Processor]) -> type[Event]:
    """The event type flowing out of ``chain`` at ``hook``; raises EventTypeError if a link breaks.

    A processor whose ``produces is consumes`` passes through the (possibly narrower) type it
    received; one that declares a different ``produces`` narrows or changes the type.
    """
    current = HOOK_INPUT[hook]
    for position, p in enumerate(chain):
        if not issubclass(current, p.consumes):
            raise EventTypeError(
                p.name,
                f"consumes {p.consumes.__name__} but at position {position} of {hook.value} it would "
                f"receive {current.__name__}; place it after a processor producing {p.consumes.__name__}",
            )
        if p.produces is not p.consumes:
            current = p.produces
    return current


def validate(processors: Sequence[Processor]) -> None:
    """Raise the specific CompositionError for the first rule ``processors`` break."""
    seen: dict[str, Processor] = {}
    for p in processors:
        if p.name in seen:
            raise DuplicateNameError(p.name, f"two processors are named {p.name!r}; names must be unique")
        seen[p.name] = p

    groups: dict[str, Processor] = {}
    for p in processors:
        if p.group is None:
            continue
        if p.group in groups:
            other = groups[p.group]
            raise SingletonConflictError(
                p.name, f"group {p.group!r} admits one processor and {other.name!r} already belongs to it"
            )
        groups[p.group] = p

    for hook, chain in by_hook(processors).items():
        out = chain_output_type(hook, chain)
        required = HOOK_OUTPUT[hook]
        if not issubclass(out, required):
            culprit = chain[-1].name if chain else hook.value
            raise EventTypeError(
                culprit,
                f"{hook.value} must deliver {required.__name__} but its chain ends with {out.__name__}; "
                f"it needs a processor producing {required.__name__} (e.g. a parser)",
            )
        for i, p in enumerate(chain):
            for later in chain[i + 1 :]:
                if later.kind in p.runs_after or (later.group is not None and later.group in p.runs_after):
                    raise OrderingError(
                        p.name, f"must run after {later.name!r} at {hook.value} (runs_after={sorted(p.runs_after)})"
                    )
