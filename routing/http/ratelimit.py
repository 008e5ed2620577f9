"""Per-source token buckets: how long a source must wait before its next call is allowed.

A bucket holds up to `burst` tokens and refills at `rate_per_s`; a call
costing c tokens passes when the bucket holds at least c (a cost above the
burst is charged as the burst, so a large call is never refused forever).
Sources are keys (client addresses); at most `max_sources` are tracked: when
a new one would exceed that, buckets that have refilled completely (idle
sources, indistinguishable from new ones) are forgotten, then the oldest
created.
Times are passed in (`now_s`, a monotonic clock in the service).
"""

from __future__ import annotations

import math
import threading


class TokenBuckets:
    """One token bucket per source key."""

    def __init__(self, *, rate_per_s: float, burst: float, max_sources: int):
        """rate_per_s: refill, tokens/s (> 0). burst: bucket size, tokens (>= 1). max_sources: keys kept (>= 1)."""
        if not rate_per_s > 0:
            raise ValueError(f"rate_per_s must be > 0, got {rate_per_s}")
        if not burst >= 1:
            raise ValueError(f"burst must be >= 1, got {burst}")
        if max_sources < 1:
            raise ValueError(f"max_sources must be >= 1, got {max_sources}")
        self.rate_per_s = float(rate_per_s)
        self.burst = float(burst)
        self.max_sources = int(max_sources)
        self._buckets: dict[str, list[float]] = {}  # key -> [tokens, at_s]
        self._lock = threading.Lock()

    def take(self, key: str, *, now_s: float, cost: float = 1.0) -> float:
        """Charge `cost` tokens to `key`'s bucket: 0.0 when allowed, else seconds until it would be."""
        cost = min(float(cost), self.burst)
        with self._lock:
            bucket = self._buckets.get(key)
            if bucket is None:
                if len(self._buckets) >= self.max_sources:
                    self._forget(now_s)
                bucket = self._buckets[key] = [self.burst, now_s]
            tokens = min(self.burst, bucket[0] + max(0.0, now_s - bucket[1]) * self.rate_per_s)
            bucket[1] = now_s
            if tokens >= cost:
                bucket[0] = tokens - cost
                return 0.0
            bucket[0] = tokens
            return (cost - tokens) / self.rate_per_s

    def __len__(self) -> int:
        return len(self._buckets)

    def _forget(self, now_s: float) -> None:
        self._buckets = {k: b for k, b in self._buckets.items()
                         if b[0] + (now_s - b[1]) * self.rate_per_s < self.burst or now_s - b[1] < 0}
        while len(self._buckets) >= self.max_sources:
            del self._buckets[next(iter(self._buckets))]


def retry_after_header(wait_s: float) -> str:
    """Whole seconds for a Retry-After header (at least 1)."""
    return str(max(1, math.ceil(wait_s)))
