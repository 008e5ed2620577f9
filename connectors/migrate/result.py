"""A migration's result: our run configuration as plain data, with every setting that could not be carried over.

The importers (Dynamo planner settings, WVA ConfigMaps) are pure functions, no I/O:
validating the result against our models, reading files or the cluster, is the caller's job.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Unmapped:
    """One setting the migration could not carry over, and why."""

    key: str
    value: object
    why: str

    def line(self) -> str:
        return f"{self.key}={self.value!r}: {self.why}"


@dataclass
class Migration:
    """Our run configuration as plain data, and what could not be mapped."""

    config: dict
    unmapped: list[Unmapped] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # where the result deliberately reads a value differently

    def skip(self, key: str, value: object, why: str) -> None:
        self.unmapped.append(Unmapped(key, value, why))

    def note(self, line: str) -> None:
        self.notes.append(line)


class MigrationError(ValueError):
    """The input is not what the importer reads (the message is one line naming it)."""


def configmap_data(obj: object, *, source: str) -> tuple[str, dict[str, str]]:
    """A ConfigMap's name and data; MigrationError for anything else."""
    if not isinstance(obj, dict) or obj.get("kind") != "ConfigMap":
        kind = obj.get("kind") if isinstance(obj, dict) else type(obj).__name__
        raise MigrationError(f"{source}: not a ConfigMap (kind {kind!r})")
    data = obj.get("data") or {}
    if not isinstance(data, dict):
        raise MigrationError(f"{source}: ConfigMap data must be a mapping")
    return str((obj.get("metadata") or {}).get("name")), {str(k): str(v) for k, v in data.items()}


def merge(base: Mapping, over: Mapping) -> dict:
    """`over` on top of `base`, mappings merged key by key (lists and values replaced)."""
    result = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(result.get(key), Mapping):
            result[key] = merge(result[key], value)
        else:
            result[key] = value
    return result

