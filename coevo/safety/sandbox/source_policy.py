"""The static policy for processor source written by the meta-agent: ``check_source``.

The first of the sandbox's two layers (the second, the forked and limited child that runs the
source, is ``coevo.safety.sandbox.child_runner``; neither is enough alone). ``check_source`` refuses
source that imports anything outside a small allowlist (``ALLOWED_MODULES``), names a private or
dunder identifier (which is how every classic escape walks from a literal to
``object.__subclasses__()`` or a function's ``__globals__``), uses a forbidden builtin
(``FORBIDDEN_NAMES``), or touches the attributes that reach frames, code objects or
``str.format``'s attribute walker (``FORBIDDEN_ATTRIBUTES``); it raises ``SandboxRefusal``.

This is a guard against mistakes and casual escapes by generated code, not an OS-level jail. See
the module caveats in ``coevo.safety.sandbox``.
"""

from __future__ import annotations

import ast

ALLOWED_MODULES: frozenset[str] = frozenset(
    {"math", "re", "json", "itertools", "collections", "functools", "statistics", "string"}
)

FORBIDDEN_NAMES: frozenset[str] = frozenset(
    {
        "exec", "eval", "compile", "open", "globals", "locals", "vars", "getattr", "setattr",
        "delattr", "hasattr", "input", "breakpoint", "help", "memoryview", "type", "dir", "exit",
        "quit", "__import__",
    }
)  # fmt: skip
"""Builtins that execute strings, read files, or reach attributes and namespaces by name.
``object`` is deliberately allowed: it is the natural base class and sentinel, and everything
dangerous about it (``__subclasses__``) needs an underscore name, which is refused anyway."""

FORBIDDEN_ATTRIBUTES: frozenset[str] = frozenset(
    {
        # str.format / format_map and string.Formatter resolve "{0.__class__}" by attribute walk
        "format", "format_map", "vformat", "get_field", "get_value",
        "mro",
        # frames, code objects, tracebacks, generator/coroutine internals, closure cells
        "gi_frame", "gi_code", "gi_yieldfrom", "gi_running", "gi_suspended",
        "cr_frame", "cr_code", "cr_await", "cr_origin", "cr_running",
        "ag_frame", "ag_code", "ag_await", "ag_running",
        "f_back", "f_builtins", "f_code", "f_globals", "f_locals", "f_lasti", "f_lineno", "f_trace",
        "co_code", "co_consts", "co_names", "co_varnames", "co_filename", "co_name",
        "tb_frame", "tb_next", "tb_lasti", "tb_lineno",
        "func_globals", "func_code", "func_closure", "func_defaults", "func_dict",
        "im_func", "im_self", "im_class", "cell_contents",
        # functools helpers that copy attributes named by strings, or eval string annotations
        "update_wrapper", "wraps", "singledispatch", "singledispatchmethod",
    }
)  # fmt: skip


class SandboxRefusal(Exception):
    """The source broke the static policy; ``reason`` says where (line) and which rule."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# --------------------------------------------------------------------------- static policy


def check_source(source: str, *, allowed_modules: frozenset[str] = ALLOWED_MODULES, max_chars: int = 20_000) -> None:
    """Raise ``SandboxRefusal`` if ``source`` violates the policy.

    All violations are reported at once (up to a handful), sorted by line, so the meta-agent can
    fix its code in one round instead of discovering the rules one refusal at a time.
    """
    if len(source) > max_chars:
        raise SandboxRefusal(f"source has {len(source)} characters; the limit is {max_chars}")
    try:
        tree = ast.parse(source, "<sandboxed>")
        # compile() too: it catches errors ast.parse lets through ('return' outside function...).
        compile(tree, "<sandboxed>", "exec", dont_inherit=True)
    except SyntaxError as err:
        raise SandboxRefusal(f"line {err.lineno or 0}: syntax error: {err.msg}") from None
    except (ValueError, RecursionError, MemoryError) as err:  # null bytes, absurd nesting
        raise SandboxRefusal(f"line 0: source cannot be compiled: {type(err).__name__}: {err}") from None
    problems = sorted(set(_violations(tree, allowed_modules)))
    if problems:
        shown = [f"line {line}: {rule}" for line, rule in problems[:8]]
        if len(problems) > 8:
            shown.append(f"... and {len(problems) - 8} more")
        raise SandboxRefusal("; ".join(shown))


def _violations(tree: ast.AST, allowed: frozenset[str]) -> list[tuple[int, str]]:
    """Every (line, rule) the tree breaks. ``ast.walk`` is iterative, so deep nesting is fine."""
    allowed_text = ", ".join(sorted(allowed))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        for kind, ident in _identifiers(node):
            if ident.startswith("_"):
                found.append((line, f"{kind} {ident!r} starts with '_' (private and dunder names are not allowed)"))
            elif kind == "name" and ident in FORBIDDEN_NAMES:
                found.append((line, f"name {ident!r} is not allowed (forbidden builtin)"))
            elif kind in ("attribute", "imported name") and ident in FORBIDDEN_ATTRIBUTES:
                found.append((line, f"{kind} {ident!r} is not allowed (it can reach interpreter internals)"))
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.extend((line, rule) for rule in _import_rules(alias.name, allowed, allowed_text))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                found.append((line, "relative import is not allowed"))
            else:
                found.extend((line, rule) for rule in _import_rules(node.module or "", allowed, allowed_text))
            if any(alias.name == "*" for alias in node.names):
                found.append((line, f"'from {node.module} import *' is not allowed (import * is refused)"))
        elif isinstance(node, ast.Global):
            found.append((line, "'global' statements are not allowed"))
        elif isinstance(node, (ast.AsyncFunctionDef, ast.Await, ast.AsyncFor, ast.AsyncWith)):
            found.append((line, "async functions and await are not allowed"))
        elif isinstance(node, ast.comprehension) and node.is_async:
            found.append((getattr(node.target, "lineno", 0), "async comprehensions are not allowed"))
    return found


def _import_rules(module: str, allowed: frozenset[str], allowed_text: str) -> list[str]:
    if "." in module:
        return [f"import of {module!r} is not allowed: only top-level modules (allowed: {allowed_text})"]
    if module not in allowed:
        return [f"import of {module!r} is not allowed (allowed: {allowed_text})"]
    return []


def _identifiers(node: ast.AST) -> list[tuple[str, str]]:
    """The identifiers a node introduces or reads, tagged by kind, for the naming rules."""
    if isinstance(node, ast.Name):
        return [("name", node.id)]
    if isinstance(node, ast.Attribute):
        return [("attribute", node.attr)]
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [("definition", node.name)]
    if isinstance(node, ast.arg):
        return [("argument", node.arg)]
    if isinstance(node, ast.keyword) and node.arg is not None:
        return [("keyword", node.arg)]
    if isinstance(node, ast.alias):
        names = [] if node.name == "*" else [("imported name", part) for part in node.name.split(".")]
        return names + ([("alias", node.asname)] if node.asname else [])
    if isinstance(node, ast.ExceptHandler) and node.name:
        return [("exception name", node.name)]
    if isinstance(node, ast.Nonlocal):
        return [("name", n) for n in node.names]
    if isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
        return [("name", node.name)]
    if isinstance(node, ast.MatchMapping) and node.rest:
        return [("name", node.rest)]
    if isinstance(node, ast.MatchClass):  # `case C(attr=...)` reads attributes by name
        return [("attribute", a) for a in node.kwd_attrs]
    return []
