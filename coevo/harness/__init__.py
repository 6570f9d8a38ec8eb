"""Typed harness composition: hooks, events, processors, the Harness and its algebra."""

from coevo.harness.diff import Change, diff, format_diff
from coevo.harness.edits import Edit, apply_edit
from coevo.harness.errors import (
    CompositionError,
    DuplicateNameError,
    EventTypeError,
    HookMismatchError,
    OrderingError,
    ParamError,
    SingletonConflictError,
    UnknownProcessorError,
)
from coevo.harness.harness import Harness
from coevo.harness.hooks import HOOK_ORDER, Dimension, Hook
from coevo.harness.library import PROCESSORS, build_processor
from coevo.harness.processor import Manifest, Param, Processor

__all__ = [
    "Change",
    "CompositionError",
    "Dimension",
    "DuplicateNameError",
    "Edit",
    "EventTypeError",
    "HOOK_ORDER",
    "Harness",
    "Hook",
    "HookMismatchError",
    "Manifest",
    "OrderingError",
    "PROCESSORS",
    "Param",
    "ParamError",
    "Processor",
    "SingletonConflictError",
    "UnknownProcessorError",
    "apply_edit",
    "build_processor",
    "diff",
    "format_diff",
]
