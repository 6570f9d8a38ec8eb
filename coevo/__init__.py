"""coevo: harness-model co-evolution for LLM agents."""

__version__ = "0.1.0"


def run(cfg):  # noqa: ANN001, ANN201 - a Hydra DictConfig or a coevo.config.schema.TrainConfig
    """Run (or resume) a co-evolution run from its config; returns the run directory."""
    from coevo.loop.build import run as _run

    return _run(cfg)
