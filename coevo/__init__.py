"""coevo: harness-model co-evolution for LLM agents."""

import sys
from pathlib import Path

__version__ = "0.1.0"

_SOURCE_ROOT = Path(__file__).resolve().parent.parent


def _move_source_root_behind_site_packages() -> None:
    """Keep the repository root from shadowing installed packages named like its sibling folders.

    Why: the root holds ``kernels/`` (installed as ``coevo.kernels``), and ``python train.py`` or
    ``python -m pytest`` run from it put the root first on ``sys.path``. There the folder wins
    ``import kernels`` over Hugging Face's ``kernels`` package, which transformers >= 5.25 requires
    and imports while it loads any model. Moved to the end, the root still serves ``import tests``
    and ``scripts`` but an installed package of the same name comes first. ``coevo`` itself is
    found either way (the editable install's finder, or the root).
    """
    roots = [e for e in sys.path if isinstance(e, str) and Path(e or ".").resolve() == _SOURCE_ROOT]
    if roots:
        sys.path[:] = [e for e in sys.path if e not in roots] + roots


_move_source_root_behind_site_packages()


def run(cfg):  # noqa: ANN001, ANN201 - a Hydra DictConfig or a coevo.config.schema.TrainConfig
    """Run (or resume) a co-evolution run from its config; returns the run directory."""
    from coevo.loop.build import run as _run

    return _run(cfg)
