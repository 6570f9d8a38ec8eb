"""What a co-evolution run keeps besides the trainer and AEGIS: the round counter, the round
records, the lineage rows and the start evaluation (``LoopState``), as the checkpoint stores them
and as the run directory shows them (``rounds.jsonl``, ``lineage.jsonl``, ``start.json``, and each
variant's current harness as ``harness-<variant>.yaml``). Everything written is redacted of secret
values (``coevo.safety.secrets.redact``; harness YAML by ``Harness.to_yaml``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from coevo.harness.harness import Harness
from coevo.rundir.records import LineageRow, RoundRecord, StartRecord
from coevo.safety.secrets import redact, secret_env_values


@dataclass
class LoopState:
    """The loop's part of a checkpoint (its state holds the records' and lineage rows' ``to_dict()``)."""

    next_round: int = 0
    records: list[RoundRecord] = field(default_factory=list)
    lineage: list[LineageRow] = field(default_factory=list)
    start: StartRecord | None = None  # the starting harness and model on val/test (start.json)

    def to_state(self) -> dict[str, Any]:
        return {"next_round": self.next_round, "records": [r.to_dict() for r in self.records],
                "lineage": [r.to_dict() for r in self.lineage],
                "start": self.start.to_dict() if self.start else None}

    @classmethod
    def from_state(cls, state: dict[str, Any], where: str) -> LoopState:
        return cls(state["next_round"],
                   [RoundRecord.from_dict(r, f"{where}: records[{i}]") for i, r in enumerate(state["records"])],
                   [LineageRow.from_dict(r, f"{where}: lineage[{i}]") for i, r in enumerate(state["lineage"])],
                   StartRecord.from_dict(state["start"], f"{where}: start") if state.get("start") else None)

    def write_files(self, run_dir: Path, harnesses: Mapping[str, Harness], *, evolved_on: str | None = None) -> None:
        """rounds.jsonl, lineage.jsonl and start.json, rewritten whole (atomically, redacted), and
        ``harness-<variant>.yaml`` for each of ``harnesses``: where a run's final harness is,
        without reading the lineage (``evolved_on``: the run's env, noted in them)."""
        secrets = secret_env_values()
        for name, rows in (("rounds.jsonl", self.records), ("lineage.jsonl", self.lineage)):
            tmp = run_dir / (name + ".tmp")
            tmp.write_text("".join(json.dumps(redact(r.to_dict(), secrets), default=str) + "\n" for r in rows))
            tmp.replace(run_dir / name)
        if self.start is not None:
            tmp = run_dir / "start.json.tmp"
            tmp.write_text(json.dumps(redact(self.start.to_dict(), secrets), indent=1, default=str) + "\n")
            tmp.replace(run_dir / "start.json")
        for name, harness in harnesses.items():
            harness.save(run_dir / f"harness-{name}.yaml", evolved_on=evolved_on)
