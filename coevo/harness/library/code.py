"""Code-level processors: a subclass of a built-in processor, written as source text.

This is how the meta-agent makes edits that parameters cannot express (OO-Harness's subclass
hierarchy). The source is refused unless it passes the sandbox's static policy and defines the
named class as a subclass of a built-in processor whose ``process`` calls ``super()``; the class
is then evaluated only inside a forked, time- and memory-limited child, once to read its
declared hook and types, and once per call. Calls are stateless: state that must persist across
hooks lives in ``event.state.memory``, exactly as for built-in processors.
"""

from __future__ import annotations

import ast
import pickle
from collections.abc import Callable
from typing import Any, TypeGuard, TypeVar

from coevo.harness import events as ev
from coevo.harness.errors import ParamError
from coevo.harness.hooks import Dimension, Hook
from coevo.harness.library.builtin import BUILTIN
from coevo.harness.processor import Param, Processor
from coevo.safety.sandbox.child_runner import call_in_sandbox
from coevo.safety.sandbox.source_policy import SandboxRefusal, check_source

T = TypeVar("T")

EVENT_TYPES: dict[str, type[ev.Event]] = {
    cls.__name__: cls
    for cls in (
        ev.Event,
        ev.TaskStartEvent,
        ev.StepStartEvent,
        ev.ModelRequestEvent,
        ev.ModelOutputEvent,
        ev.ParsedOutputEvent,
        ev.ToolCallEvent,
        ev.ToolResultEvent,
        ev.StepEndEvent,
        ev.TaskEndEvent,
    )
}


def subclassable() -> tuple[type[Processor], ...]:
    """Built-in processors code may extend. Those that implement tools (``call_tool``) are left
    out: a subclass could call the tool itself, e.g. run arbitrary code through the python tool."""
    return tuple(cls for cls in BUILTIN if cls.call_tool is Processor.call_tool)


def _exposed() -> dict[str, type]:
    """Names the source may use: subclassable processors, event and payload types, Param."""
    names: dict[str, type] = {cls.__name__: cls for cls in subclassable()}
    names.update(EVENT_TYPES)
    names.update(ToolCall=ev.ToolCall, ToolResult=ev.ToolResult, Param=Param)
    return names


def check_structure(source: str, class_name: str) -> None:
    """Refuse source that does not define ``class_name`` with a base and a process() calling super().

    ``process`` may be bound only by one undecorated ``def`` per class, and every class of the
    source that defines it must call super() there: otherwise a later ``process = lambda ...``, a
    decorator, an assignment to ``X.process`` or an intermediate class of the source whose
    ``process`` ignores the base would replace the parent's behaviour the check is meant to keep."""
    tree = ast.parse(source)
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name), None)
    if cls is None:
        raise SandboxRefusal(f"the source defines no top-level class {class_name!r}")
    if not cls.bases:
        raise SandboxRefusal(f"class {class_name!r} must subclass a built-in processor")
    if not any(isinstance(n, ast.FunctionDef) and n.name == "process" for n in cls.body):
        raise SandboxRefusal(f"class {class_name!r} must define process(self, event)")
    defs = [(c, n) for c in ast.walk(tree) if isinstance(c, ast.ClassDef)
            for n in c.body if isinstance(n, ast.FunctionDef) and n.name == "process"]
    for owner, process in defs:
        if process.decorator_list:
            raise SandboxRefusal(f"line {process.lineno}: {owner.name}.process may not be decorated")
        if not any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "super"
                   for n in ast.walk(process)):
            raise SandboxRefusal(f"{owner.name}.process must call super() so the parent's behaviour is kept")
    allowed = {id(process) for _, process in defs}
    for node in ast.walk(tree):
        if id(node) not in allowed and _binds_process(node):
            raise SandboxRefusal(f"line {node.lineno}: 'process' may only be bound by one def in a class body")
    for owner in {id(c): c for c, _ in defs}.values():
        if sum(isinstance(n, ast.FunctionDef) and n.name == "process" for n in owner.body) > 1:
            raise SandboxRefusal(f"class {owner.name!r} defines process more than once")


def _binds_process(node: ast.AST) -> TypeGuard[ast.stmt | ast.expr | ast.alias | ast.pattern]:
    """Whether ``node`` binds the name or attribute ``process`` (outside the allowed defs)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return node.name == "process"
    if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
        return node.id == "process"
    if isinstance(node, ast.Attribute) and not isinstance(node.ctx, ast.Load):
        return node.attr == "process"
    if isinstance(node, ast.alias):
        return (node.asname or node.name) == "process"
    if isinstance(node, ast.arg) or isinstance(node, ast.ExceptHandler):
        return False
    if isinstance(node, ast.MatchMapping):  # case {**process}: the rest of the mapping
        return node.rest == "process"
    return isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name == "process"


def _describe(ns: dict[str, Any], class_name: str, name: str, init_params: dict[str, Any]) -> dict[str, Any]:
    """Runs in the sandbox child: instantiate the class and report its declared interface."""
    cls = ns.get(class_name)
    bases = subclassable()
    if not (isinstance(cls, type) and issubclass(cls, bases) and cls not in bases):
        raise TypeError(f"{class_name} is not a subclass of a built-in processor")
    p = cls(name=name, **init_params)
    return {
        "base": next(b.kind for b in cls.__mro__ if b in bases),
        "hook": p.hook.value,
        "dimension": p.dimension.value,
        "consumes": p.consumes.__name__,
        "produces": p.produces.__name__,
        "group": p.group,
        "runs_after": sorted(p.runs_after),
        "description": p.description,
    }


MAX_TIME_LIMIT_S = 5.0
MAX_MEMORY_MB = 512
"""Caps on a code processor's own limits: the source and its limits come from the same proposal,
so a proposal must not be able to give itself an hour of CPU."""
MAX_GROWTH_BYTES = 64 << 10
"""How much larger (pickled) one call's returned event may be than the event it was given: what
crosses the sandbox goes into traces and the replay buffer, so a call cannot inflate them."""


class CodeProcessor(Processor):
    kind = "code"
    description = "A processor subclass given as source code, run in the sandbox."
    params = (
        Param("source", "prompt", "", "Python source defining the class"),
        Param("class_name", "str", "", "the class to instantiate"),
        Param("init_params", "dict", {}, "parameters passed to the class (its base's parameters)"),
        Param("time_limit_s", "float", 2.0, f"wall-clock limit per call (at most {MAX_TIME_LIMIT_S} s)"),
        Param("memory_mb", "int", 128, f"memory limit per call (at most {MAX_MEMORY_MB} MB)"),
    )

    def __init__(self, name: str | None = None, **params: Any) -> None:
        super().__init__(name or params.get("class_name") or None, **params)
        source, class_name = self.config["source"], self.config["class_name"]
        for param, cap in (("time_limit_s", MAX_TIME_LIMIT_S), ("memory_mb", MAX_MEMORY_MB)):
            if not 0 < self.config[param] <= cap:
                raise ParamError(self.name, f"parameter {param!r} must be in (0, {cap}], got {self.config[param]!r}")
        try:
            check_source(source)
            check_structure(source, class_name)
            meta = self._call(lambda ns: _describe(ns, class_name, self.name, dict(self.config["init_params"])))
        except Exception as err:  # refusal, timeout, or the class failing to instantiate
            raise ParamError(self.name, f"code processor refused: {err}") from err
        self.hook = Hook(meta["hook"])
        self.dimension = Dimension(meta["dimension"])
        self.consumes = EVENT_TYPES[meta["consumes"]]
        self.produces = EVENT_TYPES[meta["produces"]]
        self.group = meta["group"]
        self.runs_after = frozenset(meta["runs_after"])
        self.description = meta["description"]
        self.base_kind: str = meta["base"]

    def _call(self, entry: Callable[[dict[str, Any]], T], max_result_bytes: int = MAX_GROWTH_BYTES) -> T:
        return call_in_sandbox(
            self.config["source"],
            entry,
            exposed=_exposed(),
            time_limit_s=self.config["time_limit_s"],
            memory_limit_mb=self.config["memory_mb"],
            max_result_bytes=max_result_bytes,
        )

    def process(self, event: ev.Event) -> ev.Event:
        class_name, init = self.config["class_name"], dict(self.config["init_params"])
        limit = len(pickle.dumps(event, protocol=pickle.HIGHEST_PROTOCOL)) + MAX_GROWTH_BYTES
        out = self._call(lambda ns: ns[class_name](name=self.name, **init).process(event), limit)
        if isinstance(out, ev.Event):
            # The child worked on a copy; carry its state changes back into the live state object.
            vars(event.state).update(vars(out.state))
            out.state = event.state
        return out
