"""Published latency models: versions, the active one, atomic swap, rollback, persistence.

A document is validated and compiled completely (routing.models.validated) before it can
become active; a bad one raises and the active model keeps serving. Becoming
active is one reference assignment, so picks in progress finish on the model
they pinned and the next pick sees the new one: nothing is dropped. Rollback
reactivates the previously active version (or a named retained one).

With a directory configured, every accepted document is written there
(`<version>.json`, written to a temp file and renamed) with `state.json`
(active version and activation history), and everything is reloaded at start;
a stored file that no longer validates is a startup error naming it.

The directory has one writer: the store holds an exclusive lock on `.lock`
in it (routing.store_guard) while it lives, and a second store on the same
directory is refused naming the holder's pid. Version names become file names,
so a name that would be one of the store's own files (`state`, in any case) is
refused like any invalid document. A publish or rollback writes the new model
file and then the new state before anything changes in memory or any evicted
file is removed: one that fails (a full disk raises StoreFullError) leaves
the files and the serving model as they were.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from routing.models.format import VERSION_PATTERN
from routing.models.validated import DEFAULT_MAX_NODES, DEFAULT_MAX_TREES, LatencyModel, parse_model_document
from routing.store_guard import StoreFullError, StoreLock, is_full, lock_and_load

STATE_FILE = "state.json"
LOCK_FILE = ".lock"
_VERSION_RE = re.compile(VERSION_PATTERN)


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
        self._dir_lock: StoreLock | None = None
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._dir_lock = lock_and_load(self.directory / LOCK_FILE, store=f"model store {self.directory}",
                                           load=self._load_dir)

    def close(self) -> None:
        """Release the directory (another store may then open it); memory-only stores: nothing to do."""
        if self._dir_lock is not None:
            self._dir_lock.release()

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
        _check_version_name(model.version)
        with self._lock:
            if model.version in self._versions:
                raise VersionExistsError(f"version {model.version!r} was already published; publish a new version")
            versions = {**self._versions, model.version: PublishedModel(model, now_s)}
            history = self._history + [model.version] if activate else list(self._history)
            evicted = _evict(versions, history, keep=self.keep_versions)
            if self.directory is not None:
                self._persist(model, published_at_s=now_s)
                try:
                    self._write_state(versions, history, doing=f"publishing version {model.version!r}")
                except BaseException:
                    (self.directory / f"{model.version}.json").unlink(missing_ok=True)
                    raise
                for old in evicted:  # the state no longer names them
                    (self.directory / f"{old}.json").unlink(missing_ok=True)
            self._versions, self._history = versions, history
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
            history = list(self._history)
            if to_version is not None:
                if to_version not in self._versions:
                    raise UnknownVersionError(
                        f"version {to_version!r} is not retained (have {list(self._versions)})"
                    )
                history.append(to_version)
                target = self._versions[to_version].model
            else:
                if not history:
                    raise ValueError("no model is active: nothing to roll back")
                history.pop()
                while history and history[-1] not in self._versions:
                    history.pop()
                target = self._versions[history[-1]].model if history else None
            self._write_state(self._versions, history, doing="rolling back")
            self._history = history
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

    def _persist(self, model: LatencyModel, *, published_at_s: float) -> None:
        record = {"published_at_s": published_at_s, "document": model.document}
        self._write(f"{model.version}.json", json.dumps(record, allow_nan=False),
                    doing=f"publishing version {model.version!r}")

    def _write_state(self, versions: dict, history: list[str], *, doing: str) -> None:
        if self.directory is not None:
            self._write(STATE_FILE, json.dumps({"order": list(versions), "history": history}), doing=doing)

    def _write(self, name: str, text: str, *, doing: str) -> None:
        try:
            _atomic_write(self.directory / name, text)
        except OSError as exc:
            if not is_full(exc):
                raise
            active = f"version {self._active.version!r}" if self._active else "the profile estimate"
            raise StoreFullError(
                f"model store {self.directory}: {exc.strerror} writing {name} while {doing}; "
                f"nothing changed, {active} still serves"
            ) from None

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
            try:
                _check_version_name(version)
            except ValueError as exc:
                raise ValueError(f"{state_path}: lists an unsafe version name: {exc}") from None
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


def _check_version_name(version: str) -> None:
    """ValueError unless `version` is safe as a file name here and not one of the store's own files."""
    if not isinstance(version, str) or not _VERSION_RE.match(version):
        raise ValueError(f"version: {version!r} must match {VERSION_PATTERN}")
    if f"{version}.json".lower() in {STATE_FILE.lower(), LOCK_FILE.lower()}:
        raise ValueError(f"version: {version!r} is reserved (the model store keeps its {STATE_FILE} "
                         "under that name); publish under another version")


def _evict(versions: dict, history: list[str], *, keep: int) -> list[str]:
    """Drop the oldest versions beyond `keep` from `versions` and `history` (in place); returns them."""
    # The active version and the one a rollback would return to stay.
    protected = set(history[-2:])
    gone = []
    while len(versions) > keep:
        oldest = next(v for v in versions if v not in protected)
        del versions[oldest]
        history[:] = [v for v in history if v != oldest]
        gone.append(oldest)
    return gone


def _atomic_write(path: Path, text: str) -> None:
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        tmp = None
        dir_fd = os.open(path.parent, os.O_RDONLY)  # the rename itself survives a power cut
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
