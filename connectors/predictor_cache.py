"""Fitted predictor state kept on local disk between planner flow runs.

Each scheduled planner run is a fresh process, so without a store every run
fits its predictors from scratch (hundreds of milliseconds for `auto`, about
a second for ARIMA). `PredictorCache` is the `cache` mapping
`planner.predict.forecast_next` accepts, backed by a directory: one file per
key, written atomically (a temporary file renamed over the old one, so a
reader sees the old entry or the new one, never a torn one; concurrent
writers of one key: the last rename wins), bounded in count, bytes and age.
It is only an optimisation: every problem reading an entry (missing,
truncated, tampered with, written by other code versions, too old, not
ours) is a miss, and a miss costs a cold fit, never a different decision
beyond estimation noise (the predictors also refuse state fitted on a series
that does not continue the one they are given).

Format and trust. Fitted predictors hold scikit-learn trees, statsmodels and
pmdarima results and Prophet models, which have no safe serialisation in
common, so entries are pickles, and a pickle runs code when loaded. The rules
that make that acceptable:
- the directory is private: created 0700, must be owned by this user and not
  group/world accessible, otherwise the cache refuses to open;
- every file carries an HMAC-SHA256 of its header and payload under a random
  256-bit key kept in the directory (0600, created once); a file is unpickled
  only after its MAC verifies, so only a process holding that key (i.e. a
  planner of this user with this directory) can have written it;
- the header (checked before unpickling, covered by the MAC) names the
  namespace, the key and a fingerprint of the predictor code and library
  versions: an entry of another namespace, key or code version is a miss.
Never point `cache_dir` at a shared or network-synchronised directory, and
never copy entries in from elsewhere: they are for this process family only.

Namespaces (e.g. "dynamo/llama-3.1-8b") each get their own subdirectory and
their own bounds; one never reads another's entries.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import logging
import os
import pickle
import secrets
import stat
import struct
import sys
import tempfile
import time
from collections.abc import Iterator, MutableMapping
from importlib import metadata
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

MAGIC = b"SLAPC01\n"
_MAC_BYTES = 32
_HEADER_LEN = struct.Struct(">I")
_KEY_FILE = "hmac.key"
_SUFFIX = ".entry"
_TMP_PREFIX = ".tmp-"
# A temporary file older than this is a crashed writer's leftover.
_STALE_TMP_S = 3600.0
# Libraries whose objects end up inside the pickles.
_LIBRARIES = ("numpy", "scipy", "pandas", "scikit-learn", "statsmodels", "pmdarima", "prophet", "filterpy")


@functools.lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """Hash of the predictor source and the library versions whose objects are pickled.

    An entry written by other code is a miss, so a deploy never unpickles
    state into classes that changed shape.
    """
    import planner.predict
    import planner.predictors

    h = hashlib.sha256(sys.version.encode())
    for lib in _LIBRARIES:
        try:
            h.update(f"{lib}={metadata.version(lib)};".encode())
        except metadata.PackageNotFoundError:
            h.update(f"{lib}=none;".encode())
    sources = [Path(planner.predict.__file__)] + sorted(Path(planner.predictors.__file__).parent.glob("*.py"))
    for path in sources:
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:32]


def _key_text(key: Any) -> str:
    """Canonical text of a key: a string or a tuple of strings (what forecast_next uses)."""
    if isinstance(key, str):
        return json.dumps(key)
    if isinstance(key, tuple) and all(isinstance(k, str) for k in key):
        return json.dumps(list(key))
    raise TypeError(f"predictor cache: keys must be a str or a tuple of str, got {key!r}")


def _key_from_text(text: str) -> Any:
    value = json.loads(text)
    return tuple(value) if isinstance(value, list) else value


def _check_private_dir(path: Path, *, what: str) -> None:
    """Refuse a directory another user could read or write (or a symlink to one)."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise ValueError(f"predictor cache: {what} {path} must be a real directory, not a symlink or file")
    if st.st_uid != os.getuid():
        raise ValueError(
            f"predictor cache: {what} {path} is owned by uid {st.st_uid}, not this user ({os.getuid()}); "
            "its entries cannot be trusted"
        )
    if st.st_mode & 0o077:
        # Ours but too open (e.g. created by hand): tighten it rather than fail.
        os.chmod(path, 0o700)


def _make_private_dir(path: Path, *, what: str) -> None:
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    _check_private_dir(path, what=what)


def _read_or_create_secret(root: Path) -> bytes:
    """The directory's HMAC key, created once (atomically: concurrent openers agree on one)."""
    path = root / _KEY_FILE
    for _ in range(3):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            fd_tmp, tmp = tempfile.mkstemp(prefix=_TMP_PREFIX, dir=root)
            try:
                os.write(fd_tmp, secrets.token_bytes(32))
                os.fsync(fd_tmp)
            finally:
                os.close(fd_tmp)
            try:
                os.link(tmp, path)  # fails if another process created it first: then read theirs
            except FileExistsError:
                pass
            finally:
                os.unlink(tmp)
            continue
        try:
            st = os.fstat(fd)
            if st.st_uid != os.getuid() or st.st_mode & 0o077:
                raise ValueError(
                    f"predictor cache: {path} must be owned by this user and private (0600), "
                    f"got uid {st.st_uid} mode {oct(st.st_mode & 0o777)}"
                )
            secret = os.read(fd, 64)
        finally:
            os.close(fd)
        if len(secret) != 32:
            raise ValueError(f"predictor cache: {path} holds {len(secret)} bytes, expected a 32-byte key")
        return secret
    raise ValueError(f"predictor cache: could not create or read {path}")


class PredictorCache(MutableMapping):
    """A directory-backed mapping of fitted predictors for one namespace (see the module docstring).

    root: the cache directory (created 0700 if missing; must be private).
    namespace: what the entries belong to, e.g. "<k8s namespace>/<model id>";
        each namespace has its own subdirectory and bounds.
    max_entries / max_bytes: most entries and total bytes kept per namespace;
        the least recently written go first.
    max_age_s: entries written longer ago than this are misses and removed.
    max_entry_bytes: a larger value is not stored (logged).
    Raises ValueError naming the path when the directory is not private, or
    OSError when it cannot be created.
    """

    def __init__(
        self,
        root: str | os.PathLike,
        *,
        namespace: str,
        max_entries: int = 64,
        max_bytes: int = 256 * 2**20,
        max_age_s: float = 7 * 86400.0,
        max_entry_bytes: int = 64 * 2**20,
    ):
        if not isinstance(namespace, str) or not namespace:
            raise ValueError(f"predictor cache: namespace must be a non-empty string, got {namespace!r}")
        for name, value in (("max_entries", max_entries), ("max_bytes", max_bytes), ("max_entry_bytes", max_entry_bytes)):
            if not (isinstance(value, int) and value >= 1):
                raise ValueError(f"predictor cache: {name} must be an integer >= 1, got {value!r}")
        if not (isinstance(max_age_s, (int, float)) and max_age_s > 0):
            raise ValueError(f"predictor cache: max_age_s must be > 0 seconds, got {max_age_s!r}")
        self.root = Path(root)
        self.namespace = namespace
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.max_age_s = float(max_age_s)
        self.max_entry_bytes = max_entry_bytes
        self.root.parent.mkdir(parents=True, exist_ok=True)
        _make_private_dir(self.root, what="directory")
        self._secret = _read_or_create_secret(self.root)
        # The subdirectory name is a hash: any namespace text is a safe file name.
        ns_hash = hashlib.sha256(namespace.encode()).hexdigest()[:24]
        self.dir = self.root / f"ns-{ns_hash}"
        _make_private_dir(self.dir, what="namespace directory")

    # -- files -------------------------------------------------------------

    def _path(self, key_text: str) -> Path:
        return self.dir / (hashlib.sha256(key_text.encode()).hexdigest()[:40] + _SUFFIX)

    def _mac(self, body: bytes) -> bytes:
        return hmac.new(self._secret, MAGIC + self.namespace.encode() + b"\0" + body, hashlib.sha256).digest()

    def _read_verified(self, path: Path) -> tuple[dict, bytes] | None:
        """(header, payload) of an authentic, well-formed entry file; None otherwise."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            if st.st_uid != os.getuid() or not stat.S_ISREG(st.st_mode):
                return None
            with os.fdopen(fd, "rb", closefd=False) as f:
                data = f.read(self.max_entry_bytes + 4096)
        except OSError:
            return None
        finally:
            os.close(fd)
        head = len(MAGIC) + _MAC_BYTES + _HEADER_LEN.size
        if len(data) < head or not data.startswith(MAGIC):
            return None
        mac = data[len(MAGIC) : len(MAGIC) + _MAC_BYTES]
        body = data[len(MAGIC) + _MAC_BYTES :]
        if not hmac.compare_digest(mac, self._mac(body)):
            return None
        (header_len,) = _HEADER_LEN.unpack_from(body)
        try:
            header = json.loads(body[_HEADER_LEN.size : _HEADER_LEN.size + header_len])
        except ValueError:
            return None
        if not isinstance(header, dict):
            return None
        return header, body[_HEADER_LEN.size + header_len :]

    def _fresh(self, header: dict, key_text: str | None) -> bool:
        written = header.get("written_at_s")
        return (
            header.get("namespace") == self.namespace
            and (key_text is None or header.get("key") == key_text)
            and header.get("code") == code_fingerprint()
            and isinstance(written, (int, float))
            and time.time() - written <= self.max_age_s
        )

    # -- mapping -----------------------------------------------------------

    def __getitem__(self, key):
        key_text = _key_text(key)
        entry = self._read_verified(self._path(key_text))
        if entry is None or not self._fresh(entry[0], key_text):
            raise KeyError(key)
        try:
            # Only reached for a file whose MAC verified under this directory's key.
            return pickle.loads(entry[1])  # noqa: S301
        except Exception:  # noqa: BLE001 (an entry that does not load is a miss)
            logger.warning("predictor cache %s: entry for %s does not load; ignoring it", self.dir, key_text)
            raise KeyError(key) from None

    def __setitem__(self, key, value) -> None:
        key_text = _key_text(key)
        payload = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        if len(payload) > self.max_entry_bytes:
            logger.warning(
                "predictor cache %s: entry for %s is %d bytes > max_entry_bytes %d; not stored",
                self.dir, key_text, len(payload), self.max_entry_bytes,
            )
            self._discard(self._path(key_text))
            return
        header = json.dumps(
            {"namespace": self.namespace, "key": key_text, "code": code_fingerprint(), "written_at_s": time.time()}
        ).encode()
        body = _HEADER_LEN.pack(len(header)) + header + payload
        fd, tmp = tempfile.mkstemp(prefix=_TMP_PREFIX, suffix=_SUFFIX, dir=self.dir)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(MAGIC + self._mac(body) + body)
            # No fsync: after a crash a torn file fails its MAC and is a miss.
            os.replace(tmp, self._path(key_text))
        except BaseException:
            self._discard(Path(tmp))
            raise
        self.prune()

    def __delitem__(self, key) -> None:
        try:
            os.unlink(self._path(_key_text(key)))
        except FileNotFoundError:
            raise KeyError(key) from None

    def _entries(self) -> list[tuple[Path, os.stat_result]]:
        out = []
        try:
            names = os.listdir(self.dir)
        except OSError:
            return out
        for name in names:
            path = self.dir / name
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue  # removed by another process meanwhile
            if name.startswith(_TMP_PREFIX):
                if time.time() - st.st_mtime > _STALE_TMP_S:
                    self._discard(path)
                continue
            if name.endswith(_SUFFIX) and stat.S_ISREG(st.st_mode):
                out.append((path, st))
        return out

    def __iter__(self) -> Iterator:
        for path, _ in self._entries():
            entry = self._read_verified(path)
            if entry is not None and self._fresh(entry[0], None):
                try:
                    yield _key_from_text(entry[0]["key"])
                except (KeyError, ValueError, TypeError):
                    continue

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __contains__(self, key) -> bool:
        key_text = _key_text(key)
        entry = self._read_verified(self._path(key_text))
        return entry is not None and self._fresh(entry[0], key_text)

    # -- bounds ------------------------------------------------------------

    @staticmethod
    def _discard(path: Path) -> None:
        try:
            os.unlink(path)
        except OSError:
            pass

    def prune(self) -> None:
        """Remove entries past max_age_s, then the oldest until within max_entries and max_bytes."""
        now = time.time()
        entries = []
        for path, st in self._entries():
            if now - st.st_mtime > self.max_age_s:
                self._discard(path)
            else:
                entries.append((st.st_mtime, st.st_size, path))
        entries.sort(reverse=True)  # newest first
        total = 0
        for i, (_, size, path) in enumerate(entries):
            total += size
            if i >= self.max_entries or total > self.max_bytes:
                self._discard(path)

    def clear(self) -> None:
        """Remove every entry of this namespace."""
        for path, _ in self._entries():
            self._discard(path)


def open_predictor_cache(cache_dir: str | os.PathLike | None, *, namespace: str | None, **bounds) -> PredictorCache | None:
    """The cache for a planner run, or None when there is none (not configured, or unusable).

    An unusable directory (not private, not creatable) is logged and the run
    goes on without a cache: the cache only saves time.
    """
    if cache_dir is None or namespace is None:
        return None
    try:
        return PredictorCache(cache_dir, namespace=namespace, **bounds)
    except (OSError, ValueError) as exc:
        logger.warning("predictor cache %s unusable, running without it: %s", cache_dir, exc)
        return None
