"""Bounded training-sample store that keeps coverage across load levels.

Every completed request leaves a TTFT and usually a TPOT sample (features at
dispatch + observed latency, see routing.fleet.lifecycle.Sample). The store keeps at
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

Persistence (optional, `path`) is the SQLite mirror of routing.samples.file.
"""

from __future__ import annotations

import bisect
import math
import threading
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from routing.features import FEATURES, RAW_FIELDS, ROLE_CODE, ROLES, TARGETS
from routing.fleet.lifecycle import Sample
from routing.samples.file import SampleFile
from routing.samples.format import SEQ_BLOCK
from routing.store_guard import StoreLock, lock_and_load

WAITING_EDGES = (1, 2, 4, 8)  # waiting-queue buckets: 0, 1, 2-3, 4-7, 8+
_TARGET_CODE = {t: i for i, t in enumerate(TARGETS)}


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


class SampleStore(SampleFile):
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


_KV = RAW_FIELDS.index("kv_usage_frac")
_WAITING = RAW_FIELDS.index("waiting_requests")
FEATURE_NAMES = {t: list(FEATURES[t]) for t in TARGETS}
