"""Processors defined outside coevo: a spec names them by import path and loads them back."""

from __future__ import annotations

import pytest

from coevo.harness.defaults import base_harness
from coevo.harness.edits import Edit, apply_edit
from coevo.harness.errors import UnknownProcessorError
from coevo.harness.harness import Harness
from coevo.harness.library import StepBudget, build_processor, processor_class

KIND = "examples.my_processor:ToolCallBudget"


class WrongKind(StepBudget):
    kind = "wrong_kind"  # importable as tests.harness.test_import_kinds:WrongKind, but declares another kind


def test_an_import_path_kind_builds_inserts_and_round_trips():
    from examples.my_processor import ToolCallBudget

    assert processor_class(KIND) is ToolCallBudget and processor_class("step_budget") is StepBudget
    p = build_processor({"kind": KIND, "name": "budget", "params": {"max_calls": 2}})
    assert isinstance(p, ToolCallBudget) and p.config["max_calls"] == 2
    h = apply_edit(base_harness(), Edit("insert", "budget", spec=p.spec()))
    again = Harness.from_yaml(h.to_yaml())
    assert again.id == h.id and again.get("budget").kind == KIND


@pytest.mark.parametrize(("kind", "message"), [
    ("no_such_kind", r"unknown kind 'no_such_kind'; use a built-in kind \[.*'step_budget'.*\] or the import path "
                     r"'package\.module:ClassName' of a Processor subclass"),
    ("no_such_pkg.procs:P", r"module 'no_such_pkg\.procs' is not importable"),
    ("examples.my_processor:REMINDER", r"is 'You have used.*', not a Processor subclass"),
    ("tests.harness.test_import_kinds:WrongKind", r"has kind 'wrong_kind'; a processor loaded by import path must "
                                                  r"declare kind = 'tests\.harness\.test_import_kinds:WrongKind'"),
])
def test_unloadable_kinds_name_the_processor_and_the_allowed_forms(kind, message):
    with pytest.raises(UnknownProcessorError, match=message) as info:
        build_processor({"kind": kind, "name": "mine"})
    assert info.value.processor == "mine"


def test_the_bloat_gate_counts_prompt_growth_of_an_import_path_processor():
    from coevo.evolution.bloat import bloat

    spec = {"kind": KIND, "name": "budget", "params": {"message": "x" * 800}}
    assert bloat([Edit("insert", "budget", spec=spec)], base_harness()).prompt_growth >= 800
