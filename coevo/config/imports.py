"""Objects named by an import path ``package.module:Name``, for things defined outside coevo.

A user's environment or processor lives in their own module, yet configs, harness YAML files and
the command line must reach it by name alone: no registration call, nothing to edit in coevo. An
import path does that the way a console-script entry point (or Hydra's ``_target_``) does. The
module must be importable from ``sys.path``: installed, or its folder on ``PYTHONPATH``
(``python train.py`` and ``python -m ...`` already put the script's or the current folder there).
"""

from __future__ import annotations

import importlib
import re
from typing import Any

from coevo.errors import UsageError

IMPORT_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")
"""``package.module:Name``: a dotted module path, a colon, an attribute of that module."""


def is_import_path(text: str) -> bool:
    return IMPORT_PATH.match(text) is not None


def import_object(path: str, what: str) -> Any:
    """The attribute named by ``package.module:Name``; ``what`` names the thing in errors.

    A malformed path, a module that is not on ``sys.path``, a module that imports a package which
    is not installed, or a missing attribute is a ValueError that says how to fix it. The two
    import failures are told apart because their fixes differ: a module not found is a path or
    PYTHONPATH mistake, while a missing dependency of a module that exists needs that package
    installed (a raw ``ModuleNotFoundError`` would name only the package, not the path that needed
    it). Any other error raised while the module runs propagates unchanged (it is the module's bug)."""
    if not is_import_path(path):
        raise UsageError(f"{what} {path!r} is not an import path; write it as 'package.module:Name'")
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name is not None and (module_name == err.name or module_name.startswith(err.name + ".")):
            raise UsageError(
                f"{what} {path!r}: module {module_name!r} is not importable ({err}); install its package, or put "
                "the folder that holds it on PYTHONPATH (e.g. `PYTHONPATH=. coevo eval ...` run from that folder)"
            ) from None
        raise missing_dependency(what, path, err) from err
    if not hasattr(module, attr):
        raise UsageError(f"{what} {path!r}: module {module_name!r} has no attribute {attr!r}")
    return getattr(module, attr)


def missing_dependency(what: str, path: str, err: ModuleNotFoundError) -> UsageError:
    """The error for a module named by ``path`` that exists but imports a package that is not
    installed (``err``): it names the path and the missing package, so the user knows what to install
    and which configured value needed it."""
    module_name = path.partition(":")[0]
    package = err.name or str(err)
    return UsageError(f"{what} {path!r} needs module {package!r}, which is not installed ({err}); module "
                      f"{module_name!r} imports it: install that package, or fix the import in {module_name!r}")
