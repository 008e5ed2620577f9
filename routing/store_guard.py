"""Guards on the files a store owns: one writer at a time, running out of space named as such.

Two routers writing one model directory or one sample file lose data without
an error (each overwrites the other's state, sequence numbers collide), so a
store takes an exclusive lock before it reads anything: `fcntl.flock` on a
lock file next to its data, holding this process's pid. The kernel drops the
lock when the process exits, however it exits (SIGKILL included), so a
crashed router never blocks its successor. flock locks an open file, not a
process: a second store object on the same path in the same process is
refused too.

A write that fails for lack of space (ENOSPC, EDQUOT, EFBIG; SQLite's
SQLITE_FULL) becomes StoreFullError, which the HTTP layer answers with 507.
"""

from __future__ import annotations

import errno
import fcntl
import os
import sqlite3
import weakref
from pathlib import Path

FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


class StoreLockedError(ValueError):
    """Another router (or another store object in this process) holds the store."""


class StoreFullError(OSError):
    """A store write failed for lack of space; the store's files are as they were."""


def is_full(exc: BaseException) -> bool:
    """Whether `exc` says the disk (or quota, or file-size limit) is full."""
    if isinstance(exc, sqlite3.Error):
        return getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL
    return isinstance(exc, OSError) and exc.errno in FULL_ERRNOS


class StoreLock:
    """Exclusive lock on `path` (created if missing) for the life of this object or until release().

    store: how errors name the store, e.g. "model store /data/models".
    Raises StoreLockedError naming the store, the lock file and the holder's
    pid; ValueError when the lock file cannot be created.
    """

    def __init__(self, path: str | Path, *, store: str):
        self.path = Path(path)
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise ValueError(f"{store}: cannot open its lock file {self.path}: {exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            raise StoreLockedError(
                f"{store} is in use by another router (pid {holder or 'unknown'}, lock {self.path}): "
                "one writer per store; stop that router or give this one its own path"
            ) from None
        try:  # the pid is for the message above only: a full disk must not stop the store here
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError:
            pass
        self._release = weakref.finalize(self, os.close, fd)

    def release(self) -> None:
        """Let the store go (closing the file drops the lock); safe to call twice."""
        self._release()


def lock_and_load(path: str | Path, *, store: str, load) -> StoreLock:
    """Take the store's lock, then run `load()`; a load that raises lets the lock go again."""
    lock = StoreLock(path, store=store)
    try:
        load()
    except BaseException:
        lock.release()
        raise
    return lock


def _read_pid(fd: int) -> str | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return text if text.isdigit() else None
