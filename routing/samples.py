"""Bounded training-sample store that keeps coverage across load levels.

Every completed request leaves a TTFT and usually a TPOT sample (features at
dispatch + observed latency, see routing.registry.Sample). The store keeps at
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
"""

from __future__ import annotations

import bisect
import math
import threading
from collections import deque
from dataclasses import asdict, dataclass

from routing.features import FEATURES, RAW_FIELDS, TARGETS
from routing.registry import Sample

WAITING_EDGES = (1, 2, 4, 8)  # waiting-queue buckets: 0, 1, 2-3, 4-7, 8+


@dataclass(frozen=True)
class SamplePage:
    samples: list[dict]
    next_after_seq: int
    has_more: bool


def load_bucket(sample: Sample, *, kv_buckets: int) -> tuple[str, str, int, int]:
    """(target, role, KV-usage bucket 0..kv_buckets-1, waiting bucket 0..4) of a sample."""
    kv = sample.features["kv_usage_frac"]
    kv_bucket = min(int(kv * kv_buckets), kv_buckets - 1)
    waiting = bisect.bisect_right(WAITING_EDGES, sample.features["waiting_requests"])
    return (sample.target, sample.role, kv_bucket, waiting)


class SampleStore:
    """Samples by sequence number, bounded with per-bucket eviction (thread-safe)."""

    def __init__(self, *, capacity: int, kv_buckets: int = 10):
        if capacity < 1:
            raise ValueError(f"sample store capacity must be >= 1, got {capacity}")
        if kv_buckets < 1:
            raise ValueError(f"kv_buckets must be >= 1, got {kv_buckets}")
        self.capacity = capacity
        self.kv_buckets = kv_buckets
        self._lock = threading.Lock()
        self._next_seq = 1
        self._samples: dict[int, tuple[Sample, tuple]] = {}
        self._order: list[int] = []  # seqs ascending, may hold evicted ones
        self._dead = 0
        self._buckets: dict[tuple, deque[int]] = {}
        self._by_size: dict[int, set[tuple]] = {}
        self._max_size = 0
        self.added_total = 0
        self.evicted_total = 0

    def __len__(self) -> int:
        return len(self._samples)

    def add(self, sample: Sample) -> int:
        """Store a sample (evicting if full); returns its sequence number."""
        for name in RAW_FIELDS:
            v = sample.features.get(name)
            if v is None or not math.isfinite(v) or v < 0:
                raise ValueError(f"sample {sample.request_id}: feature {name} must be finite and >= 0, got {v}")
        if not (math.isfinite(sample.observed_ms) and sample.observed_ms >= 0):
            raise ValueError(f"sample {sample.request_id}: observed_ms must be finite and >= 0, got {sample.observed_ms}")
        key = load_bucket(sample, kv_buckets=self.kv_buckets)
        with self._lock:
            if len(self._samples) >= self.capacity:
                self._evict_one()
            seq = self._next_seq
            self._next_seq += 1
            self._samples[seq] = (sample, key)
            self._order.append(seq)
            bucket = self._buckets.setdefault(key, deque())
            self._resize(key, len(bucket), len(bucket) + 1)
            bucket.append(seq)
            self.added_total += 1
            return seq

    def page(self, *, after_seq: int = 0, limit: int = 1000, target: str | None = None) -> SamplePage:
        """Up to `limit` samples with seq > after_seq, oldest first (optionally one target)."""
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        if target is not None and target not in TARGETS:
            raise ValueError(f"target must be one of {TARGETS}, got {target!r}")
        with self._lock:
            out: list[dict] = []
            pos = bisect.bisect_right(self._order, after_seq)
            last = after_seq
            while pos < len(self._order) and len(out) < limit:
                seq = self._order[pos]
                pos += 1
                entry = self._samples.get(seq)
                if entry is None:
                    continue
                last = seq
                if target is None or entry[0].target == target:
                    out.append(_as_dict(seq, entry[0]))
            has_more = False
            for seq in reversed(self._order):
                if seq in self._samples:
                    has_more = seq > last
                    break
            return SamplePage(out, last, has_more)

    def stats(self) -> dict:
        with self._lock:
            return {
                "stored": len(self._samples),
                "capacity": self.capacity,
                "added_total": self.added_total,
                "evicted_total": self.evicted_total,
                "buckets": len([b for b in self._buckets.values() if b]),
                "last_seq": self._next_seq - 1,
            }

    def bucket_counts(self) -> dict[tuple, int]:
        with self._lock:
            return {k: len(v) for k, v in self._buckets.items() if v}

    # -- internals ---------------------------------------------------------

    def _evict_one(self) -> None:
        key = next(iter(self._by_size[self._max_size]))
        bucket = self._buckets[key]
        self._resize(key, len(bucket), len(bucket) - 1)
        seq = bucket.popleft()
        del self._samples[seq]
        self.evicted_total += 1
        self._dead += 1
        if self._dead > len(self._samples):
            self._order = [s for s in self._order if s in self._samples]
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


def _as_dict(seq: int, sample: Sample) -> dict:
    d = asdict(sample)
    d["seq"] = seq
    return d


FEATURE_NAMES = {t: list(FEATURES[t]) for t in TARGETS}
