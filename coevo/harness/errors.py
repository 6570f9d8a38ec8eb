"""Errors raised when a harness is composed or edited.

Each names the processor at fault and the rule it broke, because the meta-agent that proposed
the edit gets the message back verbatim and must be able to fix its proposal from it.
"""

from __future__ import annotations


class CompositionError(ValueError):
    """A harness composition rule was broken."""

    rule = "composition"

    def __init__(self, processor: str, message: str) -> None:
        self.processor = processor
        super().__init__(f"[{self.rule}] processor {processor!r}: {message}")


class ParamError(CompositionError):
    rule = "param_type"


class UnknownProcessorError(CompositionError):
    rule = "unknown_processor"


class DuplicateNameError(CompositionError):
    rule = "unique_name"


class HookMismatchError(CompositionError):
    rule = "same_hook"


class EventTypeError(CompositionError):
    rule = "event_type"


class SingletonConflictError(CompositionError):
    rule = "singleton_group"


class OrderingError(CompositionError):
    rule = "ordering"


class ProcessorContractError(RuntimeError):
    """At run time a processor returned something other than its declared event type."""
