"""Bounded training-sample store that keeps coverage across load levels.

Every completed request leaves a TTFT and usually a TPOT sample (features at
dispatch + observed latency, see routing.fleet.requests.Sample). The store keeps at
most `capacity` of them. Samples fall into load buckets: (target, role, KV-usage
bucket, waiting-queue bucket). When full, the oldest sample of the currently
largest bucket goes, so a burst of samples from one common load level cannot
push out the rare high-load samples a model most needs; within a bucket the
newest samples win.

Readers page through it in arrival order with a cursor: `page(after_seq=...)`
returns samples whose sequence number is greater, and `next_after_seq` for the
next call. Sequence numbers never repeat; a reader that falls behind sees the
evicted count grow instead of a silent gap.

Eviction and insertion are O(1) amortised: buckets are grouped by size, and
the ordered index drops evicted entries lazily.

Persistence (optional, `path`): a SQLite file (stdlib sqlite3, WAL journal)
mirrors the store. Added rows are written in batches: at most
`flush_interval_s` (1 s) after the first unwritten one, or at once when
`flush_rows` (256) are waiting, and on `close()`. Each batch is one
transaction holding the new rows, the rows they evicted and the counters (next
sequence number, added and evicted totals), so the file always holds a state
the store was in (a sample evicted before it was written is never written).
A killed process loses at most the last second of samples; synchronous mode
NORMAL: a power failure may lose the last transactions but never corrupts the
file. One write per sample cost ~150 us on this machine, a batch ~10 us a row. At start the rows are read back in
sequence order through the same bounded insertion (a smaller capacity evicts
by bucket, and those rows leave the file too), and sequence numbers continue
where they stopped, so a reader's cursor stays valid across restarts.

One writer per file: the store holds an exclusive lock on `<name>.lock`
(routing.store_guard) from open to close, so a second router on the same file
is refused at start naming the holder's pid instead of interleaving writes.

Sequence numbers never repeat, even across a crash: before handing out a
number at or past the durable high-water mark (`seq_reserved` in the meta
table) the store raises the mark by SEQ_BLOCK in its own synced transaction,
and at start numbering resumes at the mark. A killed process leaves a gap of
at most SEQ_BLOCK numbers; close() gives back the unused part, so a clean
restart leaves none.

Every row carries a CRC-32 of its values (and of the field layout its
features use). A row whose CRC does not match, or that is malformed, is
quarantined at start: appended to `<name>.quarantine-<UTC time>.jsonl`,
removed from the store, counted in a warning. A file SQLite itself finds
damaged (`quick_check` fails, a read errors, tables missing) is renamed to
`<name>.corrupt-<UTC time>` (kept for inspection, never deleted); the rows
still readable in it are salvaged in sequence order (a read that fails skips
ahead to where the table reads again), checked the same way, and carried into
a fresh file, and the warning names both files and the counts. Numbering
after a salvage resumes SEQ_BLOCK past anything known, since the file's own
high-water mark may be among the lost pages. A file written by a newer schema
is refused (ValueError naming the file): a downgrade must not discard it.
Stored features are kept by name; rows lacking a field the current feature
set needs (written before a feature-set change) are not loaded and are
counted in the warning.

A write that fails (a full disk) keeps the unwritten samples in memory and
retries every `flush_interval_s` until it goes through; the file stays as the
last good transaction left it. Routing never waits on the file: the failure is
logged and counted in stats() (`persist_errors_total`, `pending_writes`).
"""

from __future__ import annotations

import bisect
import json
import logging
import math
import sqlite3
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from routing.features import FEATURES, RAW_FIELDS, ROLE_CODE, ROLES, TARGETS
from routing.fleet.requests import Sample
from routing.samples.format import (
    CURRENT_LAYOUT_CRC,
    SCHEMA_VERSION,
    SEQ_BLOCK,
    CorruptFile,
    SampleStoreVersionError,
    add_crcs,
    layout_crc,
    row_crc,
)
from routing.samples.salvage import Salvage, salvage_file
from routing.store_guard import StoreLock, is_full, lock_and_load

WAITING_EDGES = (1, 2, 4, 8)  # waiting-queue buckets: 0, 1, 2-3, 4-7, 8+
_TARGET_CODE = {t: i for i, t in enumerate(TARGETS)}

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SamplePage:
    samples: list[dict]
    next_after_seq: int
    has_more: bool


def load_bucket(sample: Sample, *, kv_buckets: int) -> tuple[str, str, int, int]:
    """(target, role, KV-usage bucket 0..kv_buckets-1, waiting bucket 0..4) of a sample."""
    return _bucket(sample.target, sample.role, sample.features["kv_usage_frac"],
                   sample.features["waiting_requests"], kv_buckets=kv_buckets)


def _bucket(target: str, role: str, kv: float, waiting: float, *, kv_buckets: int) -> tuple[str, str, int, int]:
    kv_bucket = min(int(kv * kv_buckets), kv_buckets - 1)
    return (target, role, kv_bucket, bisect.bisect_right(WAITING_EDGES, waiting))


class SampleStore:
    """Samples by sequence number, bounded with per-bucket eviction (thread-safe).

    Storage is columnar (numpy arrays and string lists, one slot per sample):
    a full store of 100k samples is a handful of Python objects, so the
    garbage collector never walks it (as dicts it cost ~100 ms per full
    collection, straight into the service's tail latency).
    """

    def __init__(
        self,
        *,
        capacity: int,
        kv_buckets: int = 10,
        path: str | Path | None = None,
        flush_interval_s: float = 1.0,
        flush_rows: int = 256,
    ):
        """capacity: most samples kept; kv_buckets: KV-usage buckets per target and role;
        path: SQLite file that persists the store (created if missing; None: memory only);
        flush_interval_s / flush_rows: unwritten samples go to the file at most this many
        seconds after the first of them, or as soon as this many wait."""
        if capacity < 1:
            raise ValueError(f"sample store capacity must be >= 1, got {capacity}")
        if kv_buckets < 1:
            raise ValueError(f"kv_buckets must be >= 1, got {kv_buckets}")
        self.capacity = capacity
        self.kv_buckets = kv_buckets
        self._lock = threading.Lock()
        self._next_seq = 1
        # Per slot: the raw features, then observed, predicted (NaN: none), recorded_at_s.
        self._num = np.zeros((capacity, len(RAW_FIELDS) + 3))
        self._target = np.zeros(capacity, dtype=np.int8)
        self._role = np.zeros(capacity, dtype=np.int8)
        self._request_id: list[str | None] = [None] * capacity
        self._endpoint_id: list[str | None] = [None] * capacity
        self._version: list[str | None] = [None] * capacity
        self._free = list(range(capacity - 1, -1, -1))
        self._slot: dict[int, int] = {}  # seq -> slot of live samples
        self._order: list[int] = []  # seqs ascending, may hold evicted ones
        self._dead = 0
        self._buckets: dict[tuple, deque[int]] = {}
        self._by_size: dict[int, set[tuple]] = {}
        self._max_size = 0
        self.added_total = 0
        self.evicted_total = 0
        self.path = Path(path) if path is not None else None
        self._db: sqlite3.Connection | None = None
        self._evicted_seqs: list[int] = []
        self.flush_interval_s = flush_interval_s
        self.flush_rows = flush_rows
        self._pending: dict[int, tuple] = {}  # seq -> row not yet in the file
        self._deletes: list[int] = []  # seqs in the file, evicted since the last flush
        self._timer: threading.Timer | None = None
        self.persist_errors_total = 0
        self._failing = False  # the last write failed: retry on the timer only
        self._seq_reserved = 0  # numbers below this are durably spoken for
        self._file_lock: StoreLock | None = None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file_lock = lock_and_load(self.path.with_name(self.path.name + ".lock"),
                                            store=f"sample store {self.path}", load=self._open)

    def flush(self) -> None:
        """Write the samples added (and evicted) since the last flush, in one transaction."""
        with self._lock:
            self._flush()

    def close(self) -> None:
        """Flush, give back unused sequence numbers, close the SQLite file and release its lock.

        Memory-only stores: nothing to do."""
        with self._lock:
            if self._db is not None:
                self._seq_reserved = self._next_seq
                self._flush(counters=True)
                self._db.close()
                self._db = None
            if self._file_lock is not None:
                self._file_lock.release()

    def __len__(self) -> int:
        return len(self._slot)

    def add(self, sample: Sample) -> int:
        """Store a sample (evicting if full); returns its sequence number."""
        row = []
        for name in RAW_FIELDS:
            v = sample.features.get(name)
            if v is None or not math.isfinite(v) or v < 0:
                raise ValueError(f"sample {sample.request_id}: feature {name} must be finite and >= 0, got {v}")
            row.append(v)
        if not (math.isfinite(sample.observed_ms) and sample.observed_ms >= 0):
            raise ValueError(f"sample {sample.request_id}: observed_ms must be finite and >= 0, got {sample.observed_ms}")
        if sample.target not in _TARGET_CODE or sample.role not in ROLE_CODE:
            raise ValueError(f"sample {sample.request_id}: unknown target {sample.target!r} or role {sample.role!r}")
        predicted = sample.predicted_ms if sample.predicted_ms is not None else math.nan
        row += [sample.observed_ms, predicted, sample.recorded_at_s]
        with self._lock:
            seq = self._next_seq
            if self._db is not None and seq >= self._seq_reserved:
                self._reserve(seq + SEQ_BLOCK)
            self._insert(seq, row, sample.target, sample.role, sample.request_id, sample.endpoint_id,
                         sample.model_version)
            self._next_seq += 1
            self.added_total += 1
            if self._db is not None:
                self._queue(seq, row, sample)
            self._evicted_seqs.clear()
            return seq

    def count(self, endpoint_id: str | None = None) -> dict[str, int]:
        """Samples stored per target, all or only those recorded for `endpoint_id`."""
        with self._lock:
            out = {t: 0 for t in TARGETS}
            for slot in self._slot.values():
                if endpoint_id is None or self._endpoint_id[slot] == endpoint_id:
                    out[TARGETS[self._target[slot]]] += 1
            return out

    def discard(self, endpoint_id: str) -> dict[str, int]:
        """Drop every sample recorded for `endpoint_id`, from memory and the file; counted as evicted (a
        reader's cursor sees the gap) and numbering goes on. Returns how many went, per target."""
        with self._lock:
            gone = {t: 0 for t in TARGETS}
            for seq, slot in list(self._slot.items()):
                if self._endpoint_id[slot] != endpoint_id:
                    continue
                target = TARGETS[self._target[slot]]
                key = _bucket(target, ROLES[self._role[slot]], self._num[slot, _KV], self._num[slot, _WAITING],
                              kv_buckets=self.kv_buckets)
                bucket = self._buckets[key]
                self._resize(key, len(bucket), len(bucket) - 1)
                bucket.remove(seq)
                del self._slot[seq]
                self._request_id[slot] = self._endpoint_id[slot] = self._version[slot] = None
                self._free.append(slot)
                self._evicted_seqs.append(seq)
                self.evicted_total += 1
                gone[target] += 1
            self._order = [s for s in self._order if s in self._slot]
            self._dead = 0
            if self._db is not None:
                for q in self._evicted_seqs:
                    if self._pending.pop(q, None) is None:  # written already: delete it from the file
                        self._deletes.append(q)
                self._flush(counters=True)
            self._evicted_seqs.clear()
            return gone

    def _insert(self, seq, row, target, role, request_id, endpoint_id, version) -> None:
        key = _bucket(target, role, row[_KV], row[_WAITING], kv_buckets=self.kv_buckets)
        if not self._free:
            self._evict_one()
        slot = self._free.pop()
        self._num[slot] = row
        self._target[slot] = _TARGET_CODE[target]
        self._role[slot] = ROLE_CODE[role]
        self._request_id[slot] = request_id
        self._endpoint_id[slot] = endpoint_id
        self._version[slot] = version
        self._slot[seq] = slot
        self._order.append(seq)
        bucket = self._buckets.setdefault(key, deque())
        self._resize(key, len(bucket), len(bucket) + 1)
        bucket.append(seq)

    def page(self, *, after_seq: int = 0, limit: int = 1000, target: str | None = None) -> SamplePage:
        """Up to `limit` samples with seq > after_seq, oldest first (optionally one target)."""
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        if target is not None and target not in TARGETS:
            raise ValueError(f"target must be one of {TARGETS}, got {target!r}")
        want = None if target is None else _TARGET_CODE[target]
        with self._lock:
            out: list[dict] = []
            pos = bisect.bisect_right(self._order, after_seq)
            last = after_seq
            while pos < len(self._order) and len(out) < limit:
                seq = self._order[pos]
                pos += 1
                slot = self._slot.get(seq)
                if slot is None:
                    continue
                last = seq
                if want is None or self._target[slot] == want:
                    out.append(self._as_dict(seq, slot))
            has_more = False
            for seq in reversed(self._order):
                if seq in self._slot:
                    has_more = seq > last
                    break
            return SamplePage(out, last, has_more)

    def stats(self) -> dict:
        with self._lock:
            return {
                "stored": len(self._slot),
                "capacity": self.capacity,
                "added_total": self.added_total,
                "evicted_total": self.evicted_total,
                "buckets": len([b for b in self._buckets.values() if b]),
                "last_seq": self._next_seq - 1,
                "persist_errors_total": self.persist_errors_total,
                "pending_writes": len(self._pending) + len(self._deletes),
            }

    def bucket_counts(self) -> dict[tuple, int]:
        with self._lock:
            return {k: len(v) for k, v in self._buckets.items() if v}

    # -- internals ---------------------------------------------------------

    def _as_dict(self, seq: int, slot: int) -> dict:
        num = self._num[slot].tolist()
        n = len(RAW_FIELDS)
        predicted = num[n + 1]
        return {
            "seq": seq,
            "target": TARGETS[self._target[slot]],
            "request_id": self._request_id[slot],
            "endpoint_id": self._endpoint_id[slot],
            "role": ROLES[self._role[slot]],
            "features": dict(zip(RAW_FIELDS, num[:n])),
            "observed_ms": num[n],
            "predicted_ms": None if predicted != predicted else predicted,
            "model_version": self._version[slot],
            "recorded_at_s": num[n + 2],
        }

    def _evict_one(self) -> None:
        key = next(iter(self._by_size[self._max_size]))
        bucket = self._buckets[key]
        self._resize(key, len(bucket), len(bucket) - 1)
        seq = bucket.popleft()
        self._evicted_seqs.append(seq)
        slot = self._slot.pop(seq)
        self._request_id[slot] = self._endpoint_id[slot] = self._version[slot] = None
        self._free.append(slot)
        self.evicted_total += 1
        self._dead += 1
        if self._dead > len(self._slot):
            self._order = [s for s in self._order if s in self._slot]
            self._dead = 0

    def _resize(self, key: tuple, old: int, new: int) -> None:
        if old:
            members = self._by_size[old]
            members.discard(key)
            if not members:
                del self._by_size[old]
                if old == self._max_size and new < old:
                    self._max_size = new
        if new:
            self._by_size.setdefault(new, set()).add(key)
            self._max_size = max(self._max_size, new)

    # Persistence: the SQLite mirror (module docstring). Called with the lock held, except _open (from the
    # constructor, before the store is shared).

    def _queue(self, seq: int, row: list, sample: Sample) -> None:
        n = len(RAW_FIELDS)
        # + 0.0 turns -0.0 into 0.0, which is what SQLite gives back (the CRC must match on reading).
        predicted = None if sample.predicted_ms is None else float(sample.predicted_ms) + 0.0
        values = (seq, sample.target, sample.request_id, sample.endpoint_id, sample.role,
                  np.asarray(row[:n], dtype="<f8").tobytes(), float(row[n]) + 0.0, predicted,
                  sample.model_version, float(row[n + 2]) + 0.0)
        self._pending[seq] = values + (row_crc(values, CURRENT_LAYOUT_CRC),)
        for q in self._evicted_seqs:
            if self._pending.pop(q, None) is None:  # evicted before it was written: nothing to delete
                self._deletes.append(q)
        if len(self._pending) + len(self._deletes) >= self.flush_rows and not self._failing:
            self._flush()
        elif self._timer is None:
            self._start_timer()

    def _start_timer(self) -> None:
        self._timer = threading.Timer(self.flush_interval_s, self.flush)
        self._timer.daemon = True
        self._timer.start()

    def _flush(self, *, counters: bool = False) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._db is None or not (self._pending or self._deletes or counters):
            return
        try:
            with self._db:  # one transaction: new rows, what they evicted, the counters
                self._db.executemany("INSERT INTO samples VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                                     list(self._pending.values()))
                self._db.executemany("DELETE FROM samples WHERE seq = ?", [(q,) for q in self._deletes])
                self._write_counters()
        except sqlite3.Error as exc:
            # The transaction rolled back: the file is as the last good batch left
            # it. The samples stay queued (and in memory, so routing goes on) and
            # the timer tries again; row counts no longer trigger writes meanwhile.
            self._persist_failed(exc, f"writing {len(self._pending)} samples")
            self._failing = True
            if self._pending or self._deletes:
                self._start_timer()
            return
        if self._failing:
            log.warning("sample store %s: writing works again (%d samples written after %d failed writes)",
                        self.path, len(self._pending), self.persist_errors_total)
            self._failing = False
        self._pending.clear()
        self._deletes.clear()

    def _reserve(self, upto: int) -> None:
        """Durably raise the sequence high-water mark to `upto` before numbers below it are handed out."""
        self._seq_reserved = upto  # a failed write is retried with the next batch's counters
        try:
            self._db.execute("PRAGMA synchronous=FULL")  # this one commit survives a power cut too
            try:
                with self._db:
                    self._db.execute("INSERT OR REPLACE INTO meta VALUES ('seq_reserved', ?)", (str(upto),))
            finally:
                self._db.execute("PRAGMA synchronous=NORMAL")
        except sqlite3.Error as exc:
            self._persist_failed(exc, f"reserving sequence numbers up to {upto}")

    def _persist_failed(self, exc: sqlite3.Error, doing: str) -> None:
        self.persist_errors_total += 1
        if self.persist_errors_total == 1 or self.persist_errors_total % 100 == 0:
            cause = "disk full" if is_full(exc) else "write failed"
            log.error("sample store %s: %s %s (%s); kept in memory and retried every %g s; %d failed writes so far",
                      self.path, cause, doing, exc, self.flush_interval_s, self.persist_errors_total)

    def _write_counters(self) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO meta VALUES ('counters', ?)",
            (json.dumps({"next_seq": self._next_seq, "added_total": self.added_total,
                         "evicted_total": self.evicted_total}),),
        )
        self._db.execute("INSERT OR REPLACE INTO meta VALUES ('seq_reserved', ?)", (str(self._seq_reserved),))

    def _open(self) -> None:
        try:
            self._open_file()
        except sqlite3.Error as exc:
            if not is_full(exc):
                raise
            raise ValueError(f"sample store {self.path}: disk full while opening it ({exc}); "
                             "free space or point samples.path elsewhere") from None

    def _open_file(self) -> None:
        try:
            self._db, rows, fields, skipped, bad = self._read_file()
        except CorruptFile as exc:
            salvage = salvage_file(self.path)  # a file from a newer schema raises here and stays in place
            stamp = time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())
            aside = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
            self.path.rename(aside)
            for suffix in ("-wal", "-shm"):
                side = self.path.with_name(self.path.name + suffix)
                if side.exists():
                    side.rename(aside.with_name(aside.name + suffix))
            if salvage.rows or salvage.next_seq > 1:
                self._write_salvage(salvage)
            self._db, rows, fields, skipped, bad = self._read_file()
            log.warning("sample store %s is unreadable (%s): moved to %s; %d rows salvaged from it "
                        "(%d unreadable stretches skipped), numbering resumes at %d", self.path, exc, aside,
                        len(salvage.rows), salvage.stretches, self._next_seq)
        self._quarantine(bad)
        if skipped:
            log.warning("sample store %s: %d stored samples lack current feature fields (feature set changed); "
                        "not loaded and removed", self.path, skipped)
        self._load(rows, fields)

    def _read_file(self):
        """(connection, good rows in seq order, stored field names, rows skipped, (row, reason) failing
        their CRC) or CorruptFile."""
        try:
            # `with db:` commits a transaction (or rolls it back on an error).
            db = sqlite3.connect(self.path, check_same_thread=False)
        except sqlite3.Error as exc:
            raise CorruptFile(str(exc)) from exc
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            check = db.execute("PRAGMA quick_check").fetchone()[0]
            if check != "ok":
                raise CorruptFile(f"quick_check: {check}")
            tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if not tables:
                with db:
                    db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
                    db.execute(
                        "CREATE TABLE samples (seq INTEGER PRIMARY KEY, target TEXT NOT NULL, request_id TEXT, "
                        "endpoint_id TEXT, role TEXT NOT NULL, features BLOB NOT NULL, observed_ms REAL NOT NULL, "
                        "predicted_ms REAL, model_version TEXT, recorded_at_s REAL NOT NULL, crc INTEGER)"
                    )
                    db.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
                    db.execute("INSERT INTO meta VALUES ('raw_fields', ?)", (json.dumps(list(RAW_FIELDS)),))
                return db, [], list(RAW_FIELDS), 0, []
            if tables != {"meta", "samples"}:
                raise CorruptFile(f"tables {sorted(tables)}, expected ['meta', 'samples']")
            meta = dict(db.execute("SELECT key, value FROM meta"))
            version = int(meta.get("schema_version", "0"))
            if version > SCHEMA_VERSION:
                raise SampleStoreVersionError(f"sample store {self.path}: schema_version {version} is newer than this router's "
                                 f"{SCHEMA_VERSION}; use a newer router or another samples.path")
            if version not in (1, SCHEMA_VERSION) or "raw_fields" not in meta:
                raise CorruptFile(f"meta has schema_version {meta.get('schema_version')!r}, raw_fields "
                                   f"{'present' if 'raw_fields' in meta else 'missing'}")
            fields = json.loads(meta["raw_fields"])
            counters = json.loads(meta.get("counters", "{}"))
            if version == 1:
                add_crcs(db, fields)
            rows = db.execute("SELECT * FROM samples ORDER BY seq").fetchall()
        except SampleStoreVersionError:
            db.close()
            raise
        except sqlite3.Error as exc:
            db.close()
            if is_full(exc):
                raise
            raise CorruptFile(f"{type(exc).__name__}: {exc}") from exc
        except (ValueError, TypeError, KeyError) as exc:
            db.close()
            raise CorruptFile(f"{type(exc).__name__}: {exc}") from exc
        layout = layout_crc(fields)
        bad = [(r, "checksum mismatch") for r in rows if r[10] != row_crc(r, layout)]
        if bad:
            rows = [r for r in rows if r[10] == row_crc(r, layout)]
        self._next_seq = max(int(counters.get("next_seq", 1)), (rows[-1][0] + 1) if rows else 1,
                             int(meta.get("seq_reserved", 0)))
        self._seq_reserved = self._next_seq
        self.added_total = int(counters.get("added_total", len(rows)))
        self.evicted_total = int(counters.get("evicted_total", 0))
        skipped = 0
        if not set(RAW_FIELDS) <= set(fields):
            skipped = len(rows)
            with db:  # these rows can never be served: start the file over in the current layout
                db.execute("DELETE FROM samples")
                db.execute("INSERT OR REPLACE INTO meta VALUES ('raw_fields', ?)", (json.dumps(list(RAW_FIELDS)),))
            rows, fields = [], list(RAW_FIELDS)
        elif fields != list(RAW_FIELDS):
            rows = self._migrate(db, rows, fields)
            fields = list(RAW_FIELDS)
        return db, rows, fields, skipped, bad

    def _migrate(self, db: sqlite3.Connection, rows: list, fields: list[str]) -> list:
        """Rewrite rows stored with another field order (or extra fields) in the current layout."""
        cols = np.array([fields.index(f) for f in RAW_FIELDS], dtype=np.int64)
        out = []
        for row in rows:
            feats = np.frombuffer(row[5], dtype="<f8") if isinstance(row[5], bytes) else np.empty(0)
            blob = feats[cols].astype("<f8").tobytes() if feats.size == len(fields) else b""
            values = row[:5] + (blob,) + row[6:10]
            out.append(values + (row_crc(values, CURRENT_LAYOUT_CRC),))
        with db:
            db.executemany("UPDATE samples SET features = ?, crc = ? WHERE seq = ?", [(r[5], r[10], r[0]) for r in out])
            db.execute("INSERT OR REPLACE INTO meta VALUES ('raw_fields', ?)", (json.dumps(list(RAW_FIELDS)),))
        log.info("sample store %s: %d rows rewritten from fields %s to %s", self.path, len(out), fields,
                 list(RAW_FIELDS))
        return out

    def _load(self, rows: list, fields: list[str]) -> None:
        cols = np.array([fields.index(f) for f in RAW_FIELDS], dtype=np.int64)
        bad = []
        for seq, target, request_id, endpoint_id, role, blob, observed, predicted, version, recorded, _ in rows:
            feats = np.frombuffer(blob, dtype="<f8") if isinstance(blob, bytes) else np.empty(0)
            if (feats.size != len(fields) or target not in TARGETS or role not in ROLE_CODE
                    or not np.isfinite(feats[cols]).all()):
                bad.append(seq)
                continue
            row = feats[cols].tolist() + [observed, math.nan if predicted is None else predicted, recorded]
            self._insert(seq, row, target, role, request_id, endpoint_id, version)
        gone = bad + self._evicted_seqs
        if bad:
            log.warning("sample store %s: %d malformed rows skipped and removed (first seq %d)", self.path,
                        len(bad), bad[0])
        if gone:
            with self._db:
                self._db.executemany("DELETE FROM samples WHERE seq = ?", [(q,) for q in gone])
                self._write_counters()
        self._evicted_seqs.clear()

    def _quarantine(self, bad: list[tuple[tuple, str]]) -> None:
        """Append rows that failed their check to a side file (kept for inspection) and drop them from the store."""
        if not bad:
            return
        side = self.path.with_name(f"{self.path.name}.quarantine-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.jsonl")
        try:
            with open(side, "a") as f:
                for row, reason in bad:
                    values = [v.hex() if isinstance(v, bytes) else v for v in row]
                    f.write(json.dumps({"seq": row[0], "reason": reason, "row": values}) + "\n")
        except OSError as exc:
            side = f"nowhere ({exc.strerror})"
        with self._db:
            self._db.executemany("DELETE FROM samples WHERE seq = ?", [(r[0],) for r, _ in bad])
        log.warning("sample store %s: %d rows failed their checksum (first seq %d): quarantined to %s and removed",
                    self.path, len(bad), bad[0][0][0], side)

    def _write_salvage(self, salvage: "Salvage") -> None:
        """A fresh file at self.path holding the salvaged rows, counters and a high-water mark past them."""
        db, *_ = self._read_file()
        layout = layout_crc(salvage.fields)
        rows = [r if r[10] is not None else r[:10] + (row_crc(r, layout),) for r in salvage.rows]
        with db:
            db.execute("INSERT OR REPLACE INTO meta VALUES ('raw_fields', ?)", (json.dumps(salvage.fields),))
            db.execute("INSERT OR REPLACE INTO meta VALUES ('counters', ?)", (json.dumps(salvage.counters),))
            db.execute("INSERT OR REPLACE INTO meta VALUES ('seq_reserved', ?)", (str(salvage.next_seq),))
            db.executemany("INSERT INTO samples VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
        db.close()



_KV = RAW_FIELDS.index("kv_usage_frac")
_WAITING = RAW_FIELDS.index("waiting_requests")
FEATURE_NAMES = {t: list(FEATURES[t]) for t in TARGETS}
