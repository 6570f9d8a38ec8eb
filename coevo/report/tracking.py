"""Experiment tracking for the co-evolution loop: a ``Tracker`` protocol, a null tracker and W&B.

The loop calls its tracker once per round whatever the logger is (``logger=none`` gives the
``NullTracker``), so no caller ever branches on whether W&B is in use. What reaches W&B:

- per-round scalars: ``flatten`` turns a ``coevo.rundir.records.RoundRecord`` (docs/run-directory.md) into
  "/"-separated keys logged at ``step=record.round``; per-task outcomes and other lists are left out (they
  are large and live in ``rounds.jsonl`` anyway), the evolve report is summarised as counts;
- a table of edits with their verdicts (``EDIT_COLUMNS``; ``edit_rows`` builds its rows from a
  RoundRecord), logged again whole each time because a logged W&B table cannot grow;
- harness snapshots as artifacts of type ``harness`` named ``harness-<variant>``.

``scrub`` removes secrets from a config before it reaches W&B or the run directory; metrics, table
rows and artifacts (metadata and ``harness.yaml``, which wandb stages outside the run directory) are
cleared of secret values (``coevo.safety.secrets.redact``) before wandb sees them. The W&B run id
is kept in ``RUN_DIR/wandb_id`` so that a resumed ``train.py`` continues the same W&B run.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from coevo.harness.harness import Harness
from coevo.rundir.records import LINEAGE_HOWS, EvolveReport, RoundRecord
from coevo.rundir.run_files import read_rounds
from coevo.safety.secrets import REDACTED, redact  # noqa: F401 - REDACTED re-exported: the marker scrub writes

if TYPE_CHECKING:
    from wandb import Run

Scalar = float | int | str

EDIT_COLUMNS = ("round", "variant", "edits", "gate", "ship", "fail_to_pass", "pass_to_fail", "reason")
"""The columns of the edits table: one row per Critic verdict."""

MODES = ("auto", "online", "offline", "disabled")
HARNESS_HOW = LINEAGE_HOWS
WANDB_ID_FILE = "wandb_id"
_ARTIFACT_NAME = re.compile(r"[A-Za-z0-9_.-]+")
_RUN_ID = re.compile(r"[A-Za-z0-9_-]+")
# per-task outcomes, per-step GRPO rows (rounds.jsonl keeps them): not a metric row
_SKIPPED_KEYS = {"outcomes", "steps"}


@runtime_checkable
class Tracker(Protocol):
    """What the loop reports to, once per round. ``run_id`` is the tracking run's id (None when
    nothing is tracked); the loop records it in the checkpoint's state."""

    run_id: str | None

    def log_round(self, record: RoundRecord) -> None:
        """One round's record, as appended to ``rounds.jsonl``."""
        ...

    def log_edits(self, rows: list[dict[str, Any]]) -> None:
        """This round's verdicts, one row per verdict with the fields of ``EDIT_COLUMNS``."""
        ...

    def log_harness(self, harness: Harness, *, round: int, variant: str, how: str) -> None:
        """A harness the run started from, shipped or spawned (``how``)."""
        ...

    def finish(self) -> None:
        """Flush and close; nothing may be logged after."""
        ...


class NullTracker:
    """The tracker that records nothing (``logger=none``).

    It takes and ignores the keyword arguments a ``WandbTracker`` takes, so the loop builds its
    tracker with one call whichever logger the config names.
    """

    def __init__(self, **ignored: object) -> None:
        self.run_id = None

    def log_round(self, record: RoundRecord) -> None:
        pass

    def log_edits(self, rows: list[dict[str, Any]]) -> None:
        pass

    def log_harness(self, harness: Harness, *, round: int, variant: str, how: str) -> None:
        pass

    def finish(self) -> None:
        pass


# ---------------------------------------------------------------------------------- pure helpers
def scrub(config: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``config`` without secrets, for W&B and the run directory.

    Every value under a key that names a secret (api_key / apikey, token, secret, password,
    authorization, as a word of the key) becomes ``"<redacted>"``, at any depth of dicts and
    lists. Strings are also cleared of the value of any secret-named environment variable of 8+
    characters, which is how a key pasted into a config or a URL would otherwise leak
    (``coevo.safety.secrets.redact``; ``coevo.safety.refusal.refuse_secrets`` refuses such configs earlier).
    """
    if not isinstance(config, Mapping):
        raise TypeError(f"config must be a mapping, got {type(config).__name__}")
    return redact(config, by_name=True)


def _walk(prefix: str, value: object, out: dict[str, Scalar]) -> None:
    if value is None:
        return
    if isinstance(value, bool):
        out[prefix] = int(value)
    elif isinstance(value, (int, float, str)):
        out[prefix] = value
    elif isinstance(value, Mapping):
        for key, sub in value.items():
            if key not in _SKIPPED_KEYS:
                _walk(f"{prefix}/{key}", sub, out)
    # lists (outcomes, ids, digests...) are not metrics


def _evolve_metrics(evolve: EvolveReport) -> dict[str, Scalar]:
    """The evolve report as counts: verdicts, accepted / rejected (and rejected per gate) / undecided,
    shipped, spawned, warnings, failures per root cause and each variant's digest compression.
    Its ``seconds`` are left out: the RoundRecord's own ``seconds`` hold digest/plan/critic."""
    verdicts = evolve.verdicts
    accepted = sum(1 for v in verdicts if v.ship)
    undecided = sum(1 for v in verdicts if v.undecided)
    out: dict[str, Scalar] = {
        "evolve/verdicts": len(verdicts),
        "evolve/accepted": accepted,
        "evolve/rejected": len(verdicts) - accepted - undecided,
        "evolve/undecided": undecided,
        "evolve/shipped": len(evolve.shipped),
        "evolve/spawned": len(evolve.spawned),
        "evolve/warnings": len(evolve.warnings),
    }
    if evolve.stopped is not None:
        out["evolve/stopped"] = evolve.stopped
    by_gate = Counter(v.gate or "none" for v in verdicts if not v.ship and not v.undecided)
    out.update({f"evolve/rejected_by/{gate}": n for gate, n in sorted(by_gate.items())})
    failures: Counter[str] = Counter()
    for digest in evolve.digests:
        for cluster in digest.clusters:
            failures[cluster.cause] += cluster.count
        out[f"evolve/compression/{digest.variant}"] = digest.compression
    out.update({f"evolve/failures/{cause}": n for cause, n in sorted(failures.items())})
    return out


def flatten(record: RoundRecord) -> dict[str, Scalar]:
    """A RoundRecord as scalar metrics with "/"-separated keys (``train/pass_rate``,
    ``by_variant/base/pass_rate``, ``meta_tokens/plan/calls``, ``grpo/staleness/1``...).

    Its ``to_dict()`` is walked: booleans become 0/1, None and lists are dropped, per-task
    ``outcomes`` are skipped, and ``evolve`` is replaced by the counts of ``_evolve_metrics``.
    """
    out: dict[str, Scalar] = {}
    for key, value in record.to_dict().items():
        if key == "evolve":
            if record.evolve is not None:
                out.update(_evolve_metrics(record.evolve))
        elif key not in _SKIPPED_KEYS:
            _walk(str(key), value, out)
    return out


def edit_rows(record: RoundRecord) -> list[dict[str, Any]]:
    """The edits-table rows of a RoundRecord: one per verdict of its evolve report (none when the
    round did not evolve). ``edits`` joins ``Edit.describe()`` of the proposal's edits."""
    return [{"round": record.round, "variant": v.variant, "edits": v.describe_edits(), "gate": v.gate,
             "ship": v.ship, "fail_to_pass": len(v.fail_to_pass), "pass_to_fail": len(v.pass_to_fail),
             "reason": v.reason} for v in record.verdicts]


def _check_rows(rows: Sequence[Mapping[str, Any]]) -> None:
    for i, row in enumerate(rows):
        missing = [c for c in EDIT_COLUMNS if c not in row]
        extra = sorted(set(row) - set(EDIT_COLUMNS))
        if missing or extra:
            raise ValueError(
                f"edit row {i}: missing fields {missing}, unexpected fields {extra}; expected {list(EDIT_COLUMNS)}"
            )


# ---------------------------------------------------------------------------------- W&B
def has_credentials() -> bool:
    """Whether wandb finds credentials for its server without prompting: ``WANDB_API_KEY``, an
    identity token file, a netrc entry for the W&B host, or an API key in wandb's settings.
    Uses wandb's own lookup (what ``wandb.init`` would use); it contacts no server."""
    from wandb.sdk import wandb_setup
    from wandb.sdk.lib import wbauth

    host = wandb_setup.singleton().settings.base_url
    auth = wbauth.authenticate_session(host=host, source="coevo", prompt=False, update_session=False)
    return auth is not None


def resolve_mode(mode: str) -> str:
    """The wandb mode to run in: ``auto`` is ``online`` with credentials, else ``offline`` (the
    run is kept under the run directory for ``wandb sync``); the others are taken as given."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {list(MODES)}, got {mode!r}")
    if mode == "auto":
        return "online" if has_credentials() else "offline"
    return mode


def run_id_for(run_dir: Path) -> str:
    """The W&B run id of ``run_dir``: read from ``run_dir/wandb_id``, or made and written there
    (atomically) the first time, so a resumed run logs to the same W&B run."""
    from wandb.sdk.lib import runid

    path = Path(run_dir) / WANDB_ID_FILE
    if path.exists():
        run_id = path.read_text().strip()
        if not _RUN_ID.fullmatch(run_id):
            raise ValueError(f"{path} must hold a W&B run id ([A-Za-z0-9_-]+), got {run_id!r}")
        return run_id
    run_id = runid.generate_id()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(run_id + "\n")
    os.replace(tmp, path)
    return run_id


def _rows_from_rounds(run_dir: Path) -> list[dict[str, Any]]:
    """Edit rows of the rounds already committed in ``run_dir/rounds.jsonl``: a resumed tracker
    starts its table from them, so the table logged after a resume still holds every round."""
    return [row for record in read_rounds(run_dir / "rounds.jsonl") for row in edit_rows(record)]


class WandbTracker:
    """Tracks a run in Weights & Biases; the wandb files live under ``run_dir`` (``run_dir/wandb``).

    ``mode``: auto | online | offline | disabled (see ``resolve_mode``). ``config`` is scrubbed
    of secrets before it is sent. The run id comes from ``run_id_for(run_dir)`` and the run is
    opened with ``resume="allow"``, so the same ``run_dir`` always continues the same W&B run.
    """

    def __init__(
        self,
        project: str,
        run_dir: Path,
        *,
        entity: str | None = None,
        name: str | None = None,
        group: str | None = None,
        tags: Sequence[str] = (),
        config: Mapping[str, Any] | None = None,
        mode: str = "auto",
    ) -> None:
        from coevo.config.optional import require

        # here, not at module level: importing wandb takes seconds and NullTracker needs none of it
        wandb = require("wandb", "logger=wandb (the W&B tracker)")

        if not project:
            raise ValueError("project must be a non-empty W&B project name")
        self.mode = resolve_mode(mode)
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._wandb = wandb
        self._run = wandb.init(
            project=project,
            entity=entity,
            name=name,
            group=group,
            tags=list(tags),
            config=scrub(config or {}),
            dir=str(self.run_dir),
            mode=self.mode,
            id=run_id_for(self.run_dir),
            resume="allow",
        )
        self.run_id: str | None = self._run.id
        self._edit_rows: list[dict[str, Any]] = _rows_from_rounds(self.run_dir)
        self._step = -1
        self._finished = False

    def _live(self) -> Run:
        if self._finished:
            raise RuntimeError(f"tracker of W&B run {self.run_id} is finished; nothing more can be logged")
        return self._run

    def log_round(self, record: RoundRecord) -> None:
        if not isinstance(record, RoundRecord):
            raise TypeError(f"record must be a coevo.rundir.records.RoundRecord, got {type(record).__name__}")
        run = self._live()
        self._step = max(self._step, record.round)
        run.log(redact(flatten(record)), step=record.round)

    def log_edits(self, rows: list[dict[str, Any]]) -> None:
        _check_rows(rows)
        run = self._live()
        if not rows:
            return
        self._edit_rows.extend(redact(dict(r)) for r in rows)
        self._step = max(self._step, max(int(r["round"]) for r in rows))
        table = self._wandb.Table(columns=list(EDIT_COLUMNS),
                                  data=[[r[c] for c in EDIT_COLUMNS] for r in self._edit_rows])
        run.log({"edits": table}, step=self._step)

    def log_harness(self, harness: Harness, *, round: int, variant: str, how: str) -> None:
        if how not in HARNESS_HOW:
            raise ValueError(f"how must be one of {list(HARNESS_HOW)}, got {how!r}")
        if not _ARTIFACT_NAME.fullmatch(variant):
            raise ValueError(f"variant must match [A-Za-z0-9_.-]+ to name an artifact, got {variant!r}")
        run = self._live()
        artifact = self._wandb.Artifact(
            f"harness-{variant}",
            type="harness",
            metadata=redact({"id": harness.id, "round": round, "how": how, "parent_id": harness.parent_id,
                             "variant": variant, "name": harness.name}),
        )
        with artifact.new_file("harness.yaml") as f:
            f.write(harness.to_yaml())  # redacted: wandb stages this file outside the run directory
        run.log_artifact(artifact, aliases=[harness.id])

    def finish(self) -> None:
        if not self._finished:
            self._finished = True
            self._run.finish()


TRACKERS: dict[str, type] = {"none": NullTracker, "wandb": WandbTracker}


def make_tracker(kind: str, **kwargs: object) -> Tracker:
    """The tracker a config's ``logger.kind`` names, built from the remaining logger arguments
    (those of ``WandbTracker``; the null tracker ignores them)."""
    if kind not in TRACKERS:
        raise ValueError(f"logger kind must be one of {list(TRACKERS)}, got {kind!r}")
    return TRACKERS[kind](**kwargs)
