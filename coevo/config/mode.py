"""A run's mode, answered in one place."""

from __future__ import annotations

from dataclasses import dataclass

from coevo.config.schema import MODES


@dataclass(frozen=True)
class Mode:
    """What a run's ``mode`` switches on, answered in one place: GRPO trains the weights (coevolve,
    model_only), AEGIS evolves the harness (coevolve, harness_only), and episodes without the
    outermost scaffold layer run beside the scaffolded ones in every mode but static (which only
    measures)."""

    name: str

    def __post_init__(self) -> None:
        if self.name not in MODES:
            raise ValueError(f"mode={self.name!r}; choose one of {list(MODES)}")

    @property
    def trains(self) -> bool:
        return self.name in ("coevolve", "model_only")

    @property
    def evolves(self) -> bool:
        return self.name in ("coevolve", "harness_only")

    @property
    def unscaffolds(self) -> bool:
        return self.name != "static"
