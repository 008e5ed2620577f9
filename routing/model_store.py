"""Published latency models: versions, the active one, atomic swap, rollback, persistence.

A document is validated and compiled completely (routing.models) before it can
become active; a bad one raises and the active model keeps serving. Becoming
active is one reference assignment, so picks in progress finish on the model
they pinned and the next pick sees the new one: nothing is dropped. Rollback
reactivates the previously active version (or a named retained one).

With a directory configured, every accepted document is written there
(`<version>.json`, written to a temp file and renamed) with `state.json`
(active version and activation history), and everything is reloaded at start;
a stored file that no longer validates is a startup error naming it.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from routing.models import DEFAULT_MAX_NODES, DEFAULT_MAX_TREES, LatencyModel, parse_model_document

STATE_FILE = "state.json"


class VersionExistsError(ValueError):
    """A model with this version was already published."""


class UnknownVersionError(KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True)
class PublishedModel:
    model: LatencyModel
    published_at_s: float


class ModelStore:
    """Retained model versions and the active one (thread-safe)."""

    def __init__(
        self,
        *,
        directory: str | Path | None = None,
        keep_versions: int = 10,
        max_trees: int = DEFAULT_MAX_TREES,
        max_nodes: int = DEFAULT_MAX_NODES,
    ):
        if keep_versions < 2:
            raise ValueError(f"keep_versions must be >= 2 (rollback needs a previous version), got {keep_versions}")
        self.directory = Path(directory) if directory is not None else None
        self.keep_versions = keep_versions
        self.max_trees = max_trees
        self.max_nodes = max_nodes
        self._lock = threading.Lock()
        self._versions: dict[str, PublishedModel] = {}  # insertion = publication order
        self._history: list[str] = []  # activation order, most recent last
        self._active: LatencyModel | None = None
        if self.directory is not None:
            self._load_dir()

    @property
    def active(self) -> LatencyModel | None:
        """The model serving now (None: the profile estimate serves)."""
        return self._active

    def publish(self, document: dict, *, now_s: float, activate: bool = True) -> LatencyModel:
        """Validate, retain, persist and (by default) activate a model document.

        Raises ValueError naming the field for an invalid document and
        VersionExistsError for a version already published; in both cases the
        active model is unchanged.
        """
        model = parse_model_document(document, max_trees=self.max_trees, max_nodes=self.max_nodes)
        with self._lock:
            if model.version in self._versions:
                raise VersionExistsError(f"version {model.version!r} was already published; publish a new version")
            # The file goes first: a failed write leaves memory and disk unchanged.
            self._persist(model, published_at_s=now_s)
            self._versions[model.version] = PublishedModel(model, now_s)
            if activate:
                self._history.append(model.version)
            self._evict()
            self._write_state()
            if activate:
                self._active = model
            return model

    def rollback(self, *, to_version: str | None = None) -> LatencyModel | None:
        """Reactivate `to_version`, or the version active before the current one.

        Returns the new active model (None when rolling back past the first
        publication, i.e. back to the profile estimate). Raises
        UnknownVersionError for a version not retained, ValueError when there is
        nothing to roll back.
        """
        with self._lock:
            if to_version is not None:
                if to_version not in self._versions:
                    raise UnknownVersionError(
                        f"version {to_version!r} is not retained (have {list(self._versions)})"
                    )
                self._history.append(to_version)
                target = self._versions[to_version].model
            else:
                if not self._history:
                    raise ValueError("no model is active: nothing to roll back")
                self._history.pop()
                while self._history and self._history[-1] not in self._versions:
                    self._history.pop()
                target = self._versions[self._history[-1]].model if self._history else None
            self._write_state()
            self._active = target
            return target

    def list(self) -> list[dict]:
        """Retained versions, oldest first, with metrics and whether each is active."""
        with self._lock:
            active = self._active.version if self._active else None
            return [
                {
                    "version": v,
                    "published_at_s": p.published_at_s,
                    "created_at_s": p.model.created_at_s,
                    "metrics": dict(p.model.metrics),
                    "active": v == active,
                }
                for v, p in self._versions.items()
            ]

    def get(self, version: str) -> LatencyModel:
        with self._lock:
            if version not in self._versions:
                raise UnknownVersionError(f"version {version!r} is not retained")
            return self._versions[version].model

    # -- internals ---------------------------------------------------------

    def _evict(self) -> None:
        # The active version and the one a rollback would return to stay.
        protected = set(self._history[-2:])
        while len(self._versions) > self.keep_versions:
            oldest = next(v for v in self._versions if v not in protected)
            del self._versions[oldest]
            self._history = [v for v in self._history if v != oldest]
            if self.directory is not None:
                (self.directory / f"{oldest}.json").unlink(missing_ok=True)

    def _persist(self, model: LatencyModel, *, published_at_s: float) -> None:
        if self.directory is None:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        record = {"published_at_s": published_at_s, "document": model.document}
        _atomic_write(self.directory / f"{model.version}.json", json.dumps(record, allow_nan=False))

    def _write_state(self) -> None:
        if self.directory is None:
            return
        order = list(self._versions)
        _atomic_write(self.directory / STATE_FILE, json.dumps({"order": order, "history": self._history}))

    def _load_dir(self) -> None:
        state_path = self.directory / STATE_FILE
        if not state_path.exists():
            return
        try:
            state = json.loads(state_path.read_text())
            order, history = list(state["order"]), list(state["history"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{state_path}: unreadable model store state: {exc}") from None
        for version in order:
            path = self.directory / f"{version}.json"
            try:
                record = json.loads(path.read_text())
                model = parse_model_document(record["document"], max_trees=self.max_trees, max_nodes=self.max_nodes)
                published_at_s = float(record["published_at_s"])
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}: stored model does not load: {exc}") from None
            if model.version != version:
                raise ValueError(f"{path}: holds version {model.version!r}, expected {version!r}")
            self._versions[version] = PublishedModel(model, published_at_s)
        self._history = [v for v in history if v in self._versions]
        self._active = self._versions[self._history[-1]].model if self._history else None


def _atomic_write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
