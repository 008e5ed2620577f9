"""Endpoint registry: the fleet the router picks from, with live load per endpoint.

Each endpoint has a role (prefill, decode, aggregated), topology domains per
level, and load from two sources:

* request lifecycle calls (dispatched, first token, progress, completed): the
  router's own view of requests in flight, their prompt and context tokens,
  and the strictest SLO among them;
* scraped (or pushed) vLLM metrics: KV usage, waiting and running requests.
  Fresh metrics (younger than `metrics_max_age_s`) take precedence for those
  three quantities; otherwise lifecycle estimates stand in (see routing.features).

Lifecycle calls also keep, per endpoint, the estimated running prefill batch
(tokens and start time: a first token ends a batch and the next starts with
what was waiting; routing.features defines the features). The lifecycle
bookkeeping lives in routing.fleet.lifecycle, the matrix layout in routing.fleet.load_matrix.

Load lives in one float matrix (a row per endpoint slot) so a pick gathers the
candidates' state in a single numpy indexing operation. All times are passed in
(`now_s`, seconds on the caller's clock: wall clock in the service, virtual time
in the simulator). Methods are thread-safe.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from routing.features import ROLE_CODE, ROLES, Role, view_raw_features
from routing.fleet.lifecycle import InFlight, RequestLifecycle
from routing.fleet.load_matrix import (
    BATCH_AT, BATCH_TIF, BLOCK_FIELDS, DECODE_TIF, KV_M, LC_RUN, LC_WAIT, M_AT, MAX_KV, MIN_ITL, MIN_TTFT, N_COLS,
    PREFILL_TIF, ROLE, ROLE_CODES, RUN_M, WAIT_M, EndpointView,
)
from routing.fleet.errors import RegistryError, UnknownEndpointError
from routing.fleet.topology import MISSING


@dataclass(frozen=True)
class Endpoint:
    """A serving engine the router can pick.

    max_kv_tokens: KV-cache capacity, tokens (None: the registry default).
    domains: topology value per level, e.g. {"zone": "a", "rack": "r1"}.
    """

    id: str
    role: Role
    url: str | None = None
    domains: Mapping[str, str] = field(default_factory=dict)
    max_kv_tokens: int | None = None
    gpus: int = 1


class EndpointRegistry(RequestLifecycle):
    """Endpoints, their topology codes and load; request lifecycle bookkeeping."""

    def __init__(
        self,
        *,
        default_max_kv_tokens: int,
        levels: Sequence[str] = ("zone", "rack", "host"),
        metrics_max_age_s: float = 10.0,
    ):
        """default_max_kv_tokens: KV capacity of endpoints registered without one, tokens.
        metrics_max_age_s: scraped metrics older than this are ignored, s."""
        if default_max_kv_tokens <= 0:
            raise RegistryError(f"default_max_kv_tokens must be > 0, got {default_max_kv_tokens}")
        if not metrics_max_age_s > 0:
            raise RegistryError(f"metrics_max_age_s must be > 0, got {metrics_max_age_s}")
        self.levels = tuple(levels)
        self.metrics_max_age_s = float(metrics_max_age_s)
        self.default_max_kv_tokens = int(default_max_kv_tokens)
        self._lock = threading.RLock()
        self._cap = 16
        self._f = np.zeros((self._cap, N_COLS))
        self._codes = np.full((self._cap, len(self.levels)), MISSING, dtype=np.int64)
        self._interned: list[dict[str, int]] = [{} for _ in self.levels]
        self._endpoints: list[Endpoint | None] = [None] * self._cap
        self._index: dict[str, int] = {}
        self._free: list[int] = list(range(self._cap - 1, -1, -1))  # pop() hands out 0 first
        self._awaiting: list[dict[str, float]] = [{} for _ in range(self._cap)]  # req -> TTFT SLO
        self._decoding: list[dict[str, float]] = [{} for _ in range(self._cap)]  # req -> ITL SLO
        self._inflight: dict[str, InFlight] = {}
        self._by_role: dict[str, np.ndarray] = {r: np.empty(0, dtype=np.int64) for r in ROLES}
        self._draining: set[int] = set()  # slots not picked any more, removed after their last request

    # -- endpoints -------------------------------------------------------

    def register(self, endpoint: Endpoint) -> bool:
        """Add an endpoint, or update one with the same id (its load is kept; a draining one is picked again).

        Returns True when it was new. Raises RegistryError on a bad role,
        max_kv_tokens or domain level.
        """
        if endpoint.role not in ROLE_CODE:
            raise RegistryError(f"endpoint {endpoint.id}: role must be one of {ROLES}, got {endpoint.role!r}")
        if endpoint.max_kv_tokens is not None and endpoint.max_kv_tokens <= 0:
            raise RegistryError(f"endpoint {endpoint.id}: max_kv_tokens must be > 0, got {endpoint.max_kv_tokens}")
        unknown = sorted(set(endpoint.domains) - set(self.levels))
        if unknown:
            raise RegistryError(
                f"endpoint {endpoint.id}: domains has unknown levels {unknown} (configured levels {list(self.levels)})"
            )
        with self._lock:
            i = self._index.get(endpoint.id)
            new = i is None
            if new:
                i = self._free.pop() if self._free else self._grow()
                self._index[endpoint.id] = i
                self._f[i] = 0.0
                self._f[i, M_AT] = -np.inf
                self._f[i, MIN_TTFT] = np.inf
                self._f[i, MIN_ITL] = np.inf
                self._f[i, BATCH_AT] = np.inf
                self._awaiting[i] = {}
                self._decoding[i] = {}
            elif self._endpoints[i].role != endpoint.role and (self._awaiting[i] or self._decoding[i]):
                raise RegistryError(
                    f"endpoint {endpoint.id}: cannot change role {self._endpoints[i].role} -> {endpoint.role} "
                    "while requests are in flight"
                )
            self._endpoints[i] = endpoint
            self._f[i, ROLE] = ROLE_CODE[endpoint.role]
            self._f[i, MAX_KV] = endpoint.max_kv_tokens or self.default_max_kv_tokens
            for j, level in enumerate(self.levels):
                value = endpoint.domains.get(level)
                self._codes[i, j] = MISSING if value is None else self._interned[j].setdefault(value, len(self._interned[j]))
            self._draining.discard(i)
            self._rebuild_roles()
            return new

    def drain(self, endpoint_id: str) -> int:
        """Stop picking an endpoint and remove it after its last request in flight, whose lifecycle calls
        still count there and still make samples (a scale-down's engine finishes what it holds). Returns
        how many are in flight there; with none it is removed at once. Registering it again undoes this."""
        with self._lock:
            i = self._require(endpoint_id)
            n = len(self._awaiting[i].keys() | self._decoding[i].keys())
            if n == 0:
                self.deregister(endpoint_id)
                return 0
            self._draining.add(i)
            self._rebuild_roles()
            return n

    def is_draining(self, endpoint_id: str) -> bool:
        with self._lock:
            return self._require(endpoint_id) in self._draining

    def _reap_drained(self) -> None:
        """Remove the draining endpoints whose last request has left (lifecycle calls end with this)."""
        if self._draining:
            for i in [i for i in self._draining if not self._awaiting[i] and not self._decoding[i]]:
                self.deregister(self._endpoints[i].id)

    def deregister(self, endpoint_id: str) -> int:
        """Remove an endpoint; requests in flight on it are detached. Returns how many."""
        with self._lock:
            i = self._require(endpoint_id)
            self._draining.discard(i)
            detached = set(self._awaiting[i]) | set(self._decoding[i])
            for rid in detached:
                req = self._inflight.get(rid)
                if req is None:
                    continue
                if req.prefill_id == endpoint_id:
                    req.prefill_id = None
                    if req.decode_id is None:
                        del self._inflight[rid]
                if req.decode_id == endpoint_id:
                    req.decode_id = None
                    if req.prefill_id is None:
                        self._inflight.pop(rid, None)
            self._awaiting[i] = {}
            self._decoding[i] = {}
            self._endpoints[i] = None
            self._f[i] = 0.0
            self._codes[i] = MISSING
            del self._index[endpoint_id]
            self._free.append(i)
            self._rebuild_roles()
            return len(detached)

    def get(self, endpoint_id: str) -> Endpoint:
        with self._lock:
            return self._endpoints[self._require(endpoint_id)]

    def endpoints(self) -> list[Endpoint]:
        with self._lock:
            return [e for e in self._endpoints if e is not None]

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, endpoint_id: object) -> bool:
        return endpoint_id in self._index

    def candidates(self, role: Role) -> np.ndarray:
        """Slot indices of the endpoints with this role, draining ones left out (a fresh array each registry
        change)."""
        return self._by_role[role]

    def endpoint_ids(self, idx: np.ndarray) -> list[str]:
        eps = self._endpoints
        return [eps[i].id for i in idx]

    def slot_of(self, endpoint_id: str) -> int | None:
        """The slot index of an endpoint (None when not registered)."""
        return self._index.get(endpoint_id)

    def endpoint_at(self, i: int) -> Endpoint:
        return self._endpoints[i]

    def domain_codes(self, idx: np.ndarray) -> np.ndarray:
        """(n, levels) domain codes of these slots, -1 where the label is missing."""
        return self._codes[idx]

    def level_index(self, level: str) -> int:
        return self.levels.index(level)

    def observe_metrics(
        self,
        endpoint_id: str,
        *,
        now_s: float,
        kv_usage_frac: float,
        waiting_requests: float,
        running_requests: float,
    ) -> None:
        """Record scraped engine metrics (vLLM kv_cache_usage_perc as 0-1, queue lengths)."""
        for name, v, hi in (
            ("kv_usage_frac", kv_usage_frac, 1.0),
            ("waiting_requests", waiting_requests, np.inf),
            ("running_requests", running_requests, np.inf),
        ):
            if not (np.isfinite(v) and 0 <= v <= hi):
                raise RegistryError(f"endpoint {endpoint_id}: {name} must be finite and in [0, {hi}], got {v}")
        with self._lock:
            i = self._require(endpoint_id)
            self._f[i, KV_M] = kv_usage_frac
            self._f[i, WAIT_M] = waiting_requests
            self._f[i, RUN_M] = running_requests
            self._f[i, M_AT] = now_s

    def view(self, idx: np.ndarray, *, now_s: float) -> EndpointView:
        """Effective load of the slots `idx` at now_s (metrics if fresh, else lifecycle)."""
        rows = self._f[idx]
        # Token sums go up and down by fractional amounts (prefix hits): keep
        # float round-off (-1e-12) from showing up as negative load.
        np.maximum(rows[:, LC_RUN : DECODE_TIF + 1], 0.0, out=rows[:, LC_RUN : DECODE_TIF + 1])
        prefill_tif, decode_tif = rows[:, PREFILL_TIF], rows[:, DECODE_TIF]
        batch = np.clip(rows[:, BATCH_TIF], 0.0, prefill_tif)
        # BATCH_AT is +inf while nothing awaits a first token: elapsed 0.
        elapsed_ms = np.maximum(now_s - rows[:, BATCH_AT], 0.0) * 1e3
        fresh = rows[:, M_AT] >= now_s - self.metrics_max_age_s
        role = rows[:, ROLE]
        held = np.where(role == ROLE_CODE["prefill"], prefill_tif, decode_tif)
        kv = np.minimum(held / rows[:, MAX_KV], 1.0)
        running, waiting = rows[:, LC_RUN], rows[:, LC_WAIT]
        if fresh.any():  # otherwise (lifecycle only) skip three selects
            kv = np.where(fresh, rows[:, KV_M], kv)
            running = np.where(fresh, rows[:, RUN_M], running)
            waiting = np.where(fresh, rows[:, WAIT_M], waiting)
        queued = prefill_tif - batch
        # The feature columns as the rows of one block (BLOCK_FIELDS): the
        # feature matrix copies them in one operation, not column by column.
        block = np.empty((len(BLOCK_FIELDS), idx.size))
        for j, col in enumerate((kv, waiting, running, prefill_tif, decode_tif, batch, elapsed_ms, queued)):
            block[j] = col
        np.equal(role, ROLE_CODES[:, None], out=block[8:], casting="unsafe")
        return EndpointView(
            idx=idx,
            role_code=role.astype(np.int64),
            kv_usage_frac=kv,
            waiting_requests=waiting,
            running_requests=running,
            prefill_tokens_in_flight=prefill_tif,
            decode_tokens_in_flight=decode_tif,
            prefill_batch_tokens=batch,
            prefill_batch_elapsed_ms=elapsed_ms,
            prefill_queued_tokens=queued,
            strictest_ttft_ms=rows[:, MIN_TTFT],
            strictest_itl_ms=rows[:, MIN_ITL],
            idle=(rows[:, LC_RUN] == 0) & (running == 0),
            block=block,
        )

    def max_kv_tokens(self, idx: np.ndarray) -> np.ndarray:
        return self._f[idx, MAX_KV]

    def load_of(self, endpoint_id: str, *, now_s: float) -> dict:
        """One endpoint's effective load as plain numbers (for the API and debugging)."""
        with self._lock:
            i = self._require(endpoint_id)
            v = self.view(np.array([i]), now_s=now_s)
            fresh = self._fresh(i, now_s)
            strictest_ttft_ms = _finite_or_none(v.strictest_ttft_ms[0])
            strictest_itl_ms = _finite_or_none(v.strictest_itl_ms[0])
            return {
                "kv_usage_frac": float(v.kv_usage_frac[0]),
                "waiting_requests": float(v.waiting_requests[0]),
                "running_requests": float(v.running_requests[0]),
                "prefill_tokens_in_flight": float(v.prefill_tokens_in_flight[0]),
                "decode_tokens_in_flight": float(v.decode_tokens_in_flight[0]),
                "requests_in_flight": int(self._f[i, LC_RUN]),
                "strictest_ttft_ms": strictest_ttft_ms,
                "strictest_itl_ms": strictest_itl_ms,
                "metrics_fresh": fresh,
                # deprecated spellings of the two above, reported for one release (docs/routing.md)
                "strictest_ttft_slo_ms": strictest_ttft_ms,
                "strictest_tpot_slo_ms": strictest_itl_ms,
            }

    def raw_features(
        self, i: int, *, input_tokens: int, prefix_cache_hit_frac: float, now_s: float, tokens_generated: int = 0
    ) -> dict:
        """RAW_FIELDS of slot i for a new request (the request itself excluded), plus role."""
        v = self.view(np.array([i]), now_s=now_s)
        return view_raw_features(v, 0, input_tokens=input_tokens, prefix_cache_hit_frac=prefix_cache_hit_frac,
                                 tokens_generated=tokens_generated)

    # -- internals ---------------------------------------------------------

    def _fresh(self, i: int, now_s: float) -> bool:
        return bool(self._f[i, M_AT] >= now_s - self.metrics_max_age_s)

    def _require(self, endpoint_id: str) -> int:
        i = self._index.get(endpoint_id)
        if i is None:
            raise UnknownEndpointError(endpoint_id)
        return i

    def _grow(self) -> int:
        old = self._cap
        self._cap *= 2
        self._f = np.vstack([self._f, np.zeros((old, N_COLS))])
        self._codes = np.vstack([self._codes, np.full((old, len(self.levels)), MISSING, dtype=np.int64)])
        self._endpoints.extend([None] * old)
        self._awaiting.extend({} for _ in range(old))
        self._decoding.extend({} for _ in range(old))
        self._free.extend(range(self._cap - 1, old, -1))
        return old

    def _rebuild_roles(self) -> None:
        live = [(i, e.role) for i, e in enumerate(self._endpoints) if e is not None and i not in self._draining]
        self._by_role = {r: np.array([i for i, role in live if role == r], dtype=np.int64) for r in ROLES}


def _finite_or_none(x: float) -> float | None:
    return float(x) if np.isfinite(x) else None
