"""The Harness: an immutable, type-checked composition of processors with a content-hash id.

Every operation of the substitution algebra (``insert``, ``remove``, ``replace``, ``set_param``)
returns a new Harness whose ``parent_id`` is this one's id and whose ``edit`` records the
operation, so harness versions form a lineage tree. The id is a hash of the canonical spec
(processor kinds, names, order and every parameter), so it is the same in every process and for
any key order in a YAML file; name, parent and edit are metadata outside the hash.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

from coevo.harness.algebra import by_hook, validate
from coevo.harness.edit_record import Edit
from coevo.harness.errors import HookMismatchError, UnknownProcessorError
from coevo.harness.hooks import HOOK_ORDER, Hook
from coevo.harness.processor import Processor


def canonical_json(obj: object) -> str:
    """JSON with sorted keys and no whitespace: the byte string the id hashes."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


class Harness:
    """Immutable composition of processors, ordered by hook and, within a hook, by firing order."""

    __slots__ = ("_processors", "name", "parent_id", "edit", "_id")
    _processors: tuple[Processor, ...]
    name: str
    parent_id: str | None
    edit: Edit | None
    _id: str

    def __init__(
        self,
        processors: Sequence[Processor],
        *,
        name: str = "harness",
        parent_id: str | None = None,
        edit: Edit | None = None,
    ) -> None:
        grouped = by_hook(list(processors))
        ordered = tuple(p for hook in HOOK_ORDER for p in grouped[hook])
        validate(ordered)
        object.__setattr__(self, "_processors", ordered)
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "parent_id", parent_id)
        object.__setattr__(self, "edit", edit)
        object.__setattr__(self, "_id", hashlib.sha256(canonical_json(self.spec()).encode()).hexdigest()[:16])

    def __setattr__(self, key: str, value: object) -> None:
        raise AttributeError("Harness is immutable; use insert/remove/replace/set_param")

    # ------------------------------------------------------------------ reading
    @property
    def id(self) -> str:
        return self._id

    @property
    def processors(self) -> tuple[Processor, ...]:
        return self._processors

    def at(self, hook: Hook | str) -> tuple[Processor, ...]:
        hook = Hook(hook)
        return tuple(p for p in self._processors if p.hook is hook)

    def get(self, name: str) -> Processor:
        for p in self._processors:
            if p.name == name:
                return p
        raise UnknownProcessorError(name, f"no processor named {name!r}; harness has {[p.name for p in self]}")

    def __contains__(self, name: object) -> bool:
        return any(p.name == name for p in self._processors)

    def __iter__(self) -> Iterator[Processor]:
        return iter(self._processors)

    def __len__(self) -> int:
        return len(self._processors)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Harness) and self.id == other.id

    def __hash__(self) -> int:
        return hash(self.id)

    def __repr__(self) -> str:
        return f"Harness(id={self.id}, name={self.name!r}, processors={[p.name for p in self]})"

    def spec(self) -> dict[str, Any]:
        """The canonical content of the harness (what the id hashes)."""
        return {"processors": [p.spec() for p in self._processors]}

    # ------------------------------------------------------------------ algebra
    def _child(self, processors: Sequence[Processor], edit: Edit) -> Harness:
        return Harness(processors, name=self.name, parent_id=self.id, edit=edit)

    def insert(
        self,
        processor: Processor,
        *,
        index: int | None = None,
        after: str | None = None,
        hook: Hook | str | None = None,
        manifest: dict[str, Any] | None = None,
    ) -> Harness:
        """Insert ``processor`` into its hook's chain: at ``index`` within the hook, right after
        the processor named ``after``, or (default) at the end of the chain. ``hook``, when
        given, must be the processor's own hook."""
        if hook is not None and Hook(hook) is not processor.hook:
            raise HookMismatchError(
                processor.name, f"attaches to {processor.hook.value} and cannot be inserted at {Hook(hook).value}"
            )
        chain = list(self.at(processor.hook))
        if after is not None:
            anchor = self.get(after)
            if anchor.hook is not processor.hook:
                raise HookMismatchError(
                    processor.name,
                    f"attaches to {processor.hook.value} but {after!r} is at {anchor.hook.value}",
                )
            index = chain.index(anchor) + 1
        if index is None:
            index = len(chain)
        if not 0 <= index <= len(chain):
            raise UnknownProcessorError(processor.name,
                                        f"index {index} outside 0..{len(chain)} at {processor.hook.value}")
        chain.insert(index, processor)
        others = [p for p in self._processors if p.hook is not processor.hook]
        edit = Edit("insert", processor.name, spec=processor.spec(), index=index, manifest=manifest or {})
        return self._child(others + chain, edit)

    def remove(self, name: str, *, manifest: dict[str, Any] | None = None) -> Harness:
        target = self.get(name)
        return self._child([p for p in self._processors if p is not target],
                           Edit("remove", name, manifest=manifest or {}))

    def replace(self, name: str, processor: Processor, *, manifest: dict[str, Any] | None = None) -> Harness:
        """Put ``processor`` in the place of ``name``; both must attach to the same hook."""
        target = self.get(name)
        if processor.hook is not target.hook:
            raise HookMismatchError(
                processor.name,
                f"attaches to {processor.hook.value} and cannot replace {name!r} at {target.hook.value}",
            )
        procs = [processor if p is target else p for p in self._processors]
        return self._child(procs, Edit("replace", name, spec=processor.spec(), manifest=manifest or {}))

    def set_param(self, name: str, param: str, value: object, *, manifest: dict[str, Any] | None = None) -> Harness:
        target = self.get(name)
        updated = target.with_params(**{param: value})
        procs = [updated if p is target else p for p in self._processors]
        return self._child(procs, Edit("set_param", name, param=param, value=value, manifest=manifest or {}))

    # ------------------------------------------------------------------ serialisation
    def to_dict(self) -> dict[str, Any]:
        """Spec plus metadata; ``id`` is informative (it is recomputed on load)."""
        return {
            "name": self.name,
            "id": self.id,
            "parent_id": self.parent_id,
            "edit": self.edit.to_dict() if self.edit else None,
            **self.spec(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Harness:
        from coevo.harness.library import build_processor

        if not isinstance(data, dict) or not isinstance(data.get("processors"), list):
            raise ValueError("a harness spec is a mapping with a 'processors' list")
        edit = data.get("edit")
        return cls(
            [build_processor(p) for p in data["processors"]],
            name=data.get("name", "harness"),
            parent_id=data.get("parent_id"),
            edit=Edit.from_dict(edit) if edit else None,
        )

    def to_yaml(self, *, evolved_on: str | None = None) -> str:
        """The spec as YAML, as every file and artifact holding a harness is written: the value of a
        secret environment variable in it becomes ``<redacted>`` (``coevo.safety.secrets.redact``); ``id``
        stays the id of this harness, so such a file loads as a harness with another id.
        ``evolved_on``: the env a run used this harness on (a top-level note, outside the spec and
        the id; ``coevo eval`` warns when the harness is evaluated on another env)."""
        from coevo.safety.secrets import redact

        data = self.to_dict()
        if evolved_on is not None:
            data = {"evolved_on": evolved_on, **data}
        return yaml.dump(redact(data), Dumper=_SpecDumper, sort_keys=False, allow_unicode=True, width=100)

    @classmethod
    def from_yaml(cls, text: str) -> Harness:
        return cls.from_dict(yaml.safe_load(text))

    def save(self, path: str | Path, *, evolved_on: str | None = None) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(self.to_yaml(evolved_on=evolved_on))
        tmp.replace(path)  # atomic: a crash never leaves half a spec
        return path

    @classmethod
    def load(cls, path: str | Path) -> Harness:
        """The harness in the YAML file ``path``; a file that is not one (truncated, binary, another
        document) raises ``ValueError`` naming the file and what is wrong with it."""
        try:
            text = Path(path).read_text(encoding="utf-8")
            data = yaml.safe_load(text)
        except UnicodeDecodeError as err:
            raise ValueError(f"{path} is not a harness YAML file: not UTF-8 text ({err.reason} at byte "
                             f"{err.start})") from None
        except yaml.YAMLError as err:
            raise ValueError(f"{path} is not a harness YAML file (truncated or not YAML): "
                             f"{str(err).splitlines()[0]}") from None
        try:
            return cls.from_dict(data)
        except ValueError as err:
            raise ValueError(f"{path}: {err}") from err


class _SpecDumper(yaml.SafeDumper):
    """Writes multi-line strings (prompts, code) as readable literal blocks."""


def _str_representer(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_SpecDumper.add_representer(str, _str_representer)
