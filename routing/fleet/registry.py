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
what was waiting; routing.features defines the features). The matrix layout
is routing.fleet.load_matrix; the in-flight request and sample types routing.fleet.requests.

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

from routing.features import RAW_FIELDS, ROLE_CODE, ROLES, Role, Target, view_raw_features
from routing.fleet.requests import InFlight, Sample
from routing.fleet.load_matrix import (
    BATCH_AT, BATCH_TIF, BLOCK_FIELDS, DECODE_TIF, KV_M, LC_RUN, LC_WAIT, M_AT, MAX_KV, MIN_ITL, MIN_TTFT, N_COLS,
    PREFILL_TIF, ROLE, ROLE_CODES, RUN_M, WAIT_M, EndpointView,
)
from routing.fleet.errors import DuplicateRequestError, RegistryError, UnknownEndpointError, UnknownRequestError
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


class EndpointRegistry:
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

    # Request lifecycle: each call moves a request's share of the load between columns of its endpoints'
    # rows (prefill work, tokens held, the running prefill batch, the strictest SLO in flight) and returns the
    # training samples it completes; each call that releases a request ends with _reap_drained.


    def dispatched(self, req: InFlight) -> None:
        """Start tracking a request on its endpoints (prefill_id and/or decode_id)."""
        with self._lock:
            if req.request_id in self._inflight:
                raise DuplicateRequestError(f"request {req.request_id!r} is already in flight")
            if req.prefill_id is None and req.decode_id is None:
                raise RegistryError(f"request {req.request_id!r}: no endpoint given")
            for eid, allowed in ((req.prefill_id, ("prefill",)), (req.decode_id, ("decode", "aggregated"))):
                if eid is not None:
                    role = self._endpoints[self._require(eid)].role
                    if role not in allowed:
                        raise RegistryError(f"request {req.request_id!r}: endpoint {eid} has role {role}, expected {allowed}")
            t_s = req.dispatched_s
            if req.prefill_id is not None:
                p = self._index[req.prefill_id]
                self._start_batch_if_idle(p, req.uncached_tokens, t_s)
                self._f[p, LC_RUN] += 1
                self._f[p, LC_WAIT] += 1
                self._f[p, PREFILL_TIF] += req.uncached_tokens
                self._add_min(self._awaiting[p], p, MIN_TTFT, req.request_id, req.ttft_ms)
            if req.decode_id is not None:
                d = self._index[req.decode_id]
                self._f[d, LC_RUN] += 1
                self._f[d, LC_WAIT] += 1
                self._f[d, DECODE_TIF] += req.input_tokens
                self._add_min(self._decoding[d], d, MIN_ITL, req.request_id, req.itl_ms)
                if req.prefill_id is None:
                    self._start_batch_if_idle(d, req.uncached_tokens, t_s)
                    self._f[d, PREFILL_TIF] += req.uncached_tokens
                    self._add_min(self._awaiting[d], d, MIN_TTFT, req.request_id, req.ttft_ms)
            req.aggregated = req.prefill_id is None
            req.ttft_endpoint_id = req.decode_id if req.aggregated else req.prefill_id
            self._inflight[req.request_id] = req

    def prefill_done(
        self,
        request_id: str,
        *,
        now_s: float,
        decode_id: str | None = None,
        tpot_features: dict | None = None,
        predicted_tpot_ms: float | None = None,
    ) -> None:
        """A disaggregated request's prefill returned: release its prefill share; attach decode if given.

        Dynamo's frontend learns this when the prefill worker answers with the
        transfer metadata, and only then picks the decode worker: the request
        leaves the prefill endpoint's queue now, not at its first token (KV
        transfer and decode admission lie between). decode_id: the decode pick
        made now (assign_decode); the request waits there until its first token.
        """
        with self._lock:
            req = self._get(request_id)
            if req.aggregated:
                raise RegistryError(
                    f"request {request_id!r} is aggregated on {req.decode_id}: it has no prefill to finish")
            if decode_id is not None:
                self.assign_decode(request_id, decode_id, tpot_features=tpot_features,
                                   predicted_tpot_ms=predicted_tpot_ms)
            self._release_prefill_side(req, now_s)
            self._reap_drained()

    def assign_decode(
        self,
        request_id: str,
        decode_id: str,
        *,
        tpot_features: dict | None = None,
        predicted_tpot_ms: float | None = None,
    ) -> None:
        """Attach the decode endpoint to a disaggregated request dispatched to prefill only.

        For callers that pick decode when prefill ends (Picker.pick_decode), as
        Dynamo does; the request then counts on the decode endpoint as if both
        had been chosen at dispatch.
        """
        with self._lock:
            req = self._get(request_id)
            if req.decode_id is not None or req.aggregated:
                raise RegistryError(f"request {request_id!r} already has decode endpoint {req.decode_id}")
            d = self._require(decode_id)
            role = self._endpoints[d].role
            if role != "decode":
                raise RegistryError(f"request {request_id!r}: endpoint {decode_id} has role {role}, expected decode")
            req.decode_id = decode_id
            req.tpot_features = tpot_features
            req.predicted_tpot_ms = predicted_tpot_ms
            self._f[d, LC_RUN] += 1
            if not req.decode_wait_released:
                self._f[d, LC_WAIT] += 1
            self._f[d, DECODE_TIF] += req.input_tokens + req.tokens_generated
            self._add_min(self._decoding[d], d, MIN_ITL, request_id, req.itl_ms)

    def first_token(self, request_id: str, *, now_s: float, observed_ttft_ms: float | None = None) -> list[Sample]:
        """The request produced its first token: release its prefill share; a TTFT sample.

        observed_ttft_ms: measured by the caller; None uses now_s - dispatch time.
        """
        with self._lock:
            req = self._get(request_id)
            if req.first_token_s is not None:
                return []
            ttft_ms = observed_ttft_ms if observed_ttft_ms is not None else (now_s - req.dispatched_s) * 1e3
            _check_latency("observed_ttft_ms", ttft_ms)
            self._release_prefill(req, now_s)
            req.first_token_s = now_s
            samples = self._sample(req, "ttft", ttft_ms, req.predicted_ttft_ms, now_s=now_s)
            self._reap_drained()
            return samples

    def progress(
        self, request_id: str, *, now_s: float, tokens_generated: int, observed_tpot_ms: float | None = None
    ) -> list[Sample]:
        """Update tokens generated so far; with an observed TPOT, a TPOT sample at the current state."""
        with self._lock:
            req = self._get(request_id)
            if tokens_generated < req.tokens_generated:
                raise RegistryError(
                    f"request {request_id!r}: tokens_generated went back from {req.tokens_generated} to {tokens_generated}"
                )
            if req.first_token_s is None:
                self._release_prefill(req, now_s)
                req.first_token_s = now_s
                self._reap_drained()
            if req.decode_id is not None:
                self._f[self._index[req.decode_id], DECODE_TIF] += tokens_generated - req.tokens_generated
            req.tokens_generated = tokens_generated
            if observed_tpot_ms is None or req.decode_id is None:
                return []
            _check_latency("observed_tpot_ms", observed_tpot_ms)
            d = self._index[req.decode_id]
            feats = self._raw_features_now(d, req, now_s=now_s)
            return [self._make_sample(req, "tpot", req.decode_id, feats, observed_tpot_ms, None, now_s)]

    def completed(
        self,
        request_id: str,
        *,
        now_s: float,
        output_tokens: int,
        observed_ttft_ms: float | None = None,
        observed_tpot_ms: float | None = None,
    ) -> list[Sample]:
        """The request finished: release it everywhere; TTFT (if not yet seen) and TPOT samples.

        TPOT without observed_tpot_ms: (now_s - first token time) / (output_tokens - 1),
        when there is more than one output token and a first-token time.
        """
        if output_tokens < 0:
            raise RegistryError(f"request {request_id!r}: output_tokens must be >= 0, got {output_tokens}")
        with self._lock:
            req = self._get(request_id)
            samples: list[Sample] = []
            if req.first_token_s is None:
                if observed_ttft_ms is not None:
                    samples += self.first_token(request_id, now_s=now_s, observed_ttft_ms=observed_ttft_ms)
                else:
                    self._release_prefill(req, now_s)
            tpot_ms = observed_tpot_ms
            if tpot_ms is None and req.first_token_s is not None and output_tokens > 1:
                tpot_ms = (now_s - req.first_token_s) * 1e3 / (output_tokens - 1)
            if tpot_ms is not None:
                _check_latency("observed_tpot_ms", tpot_ms)
                samples += self._sample(req, "tpot", tpot_ms, req.predicted_tpot_ms, now_s=now_s)
            if req.decode_id is not None:
                d = self._index[req.decode_id]
                self._f[d, LC_RUN] -= 1
                self._f[d, DECODE_TIF] -= req.input_tokens + req.tokens_generated
                self._remove_min(self._decoding[d], d, MIN_ITL, request_id)
            del self._inflight[request_id]
            self._reap_drained()
            return samples

    def expire(self, *, now_s: float, ttl_s: float) -> list[str]:
        """Drop requests dispatched more than ttl_s ago (their completion never came)."""
        with self._lock:
            old = [rid for rid, r in self._inflight.items() if now_s - r.dispatched_s > ttl_s]
            for rid in old:
                self.completed(rid, now_s=now_s, output_tokens=0, observed_tpot_ms=None)
            return old

    def in_flight(self, request_id: str) -> InFlight | None:
        return self._inflight.get(request_id)

    def in_flight_count(self) -> int:
        return len(self._inflight)

    def oldest_in_flight(self) -> str | None:
        """The request id dispatched first among those still in flight (None: none)."""
        with self._lock:
            return next(iter(self._inflight), None)

    def _release_prefill(self, req: InFlight, now_s: float) -> None:
        # The first token: nothing of the request waits anywhere any more.
        self._release_prefill_side(req, now_s)
        if req.decode_wait_released:
            return
        req.decode_wait_released = True
        if req.decode_id is not None:
            d = self._index[req.decode_id]
            self._f[d, LC_WAIT] -= 1
            if req.aggregated:
                self._f[d, PREFILL_TIF] -= req.uncached_tokens
                self._remove_min(self._awaiting[d], d, MIN_TTFT, req.request_id)
                self._next_batch(d, now_s)

    def _release_prefill_side(self, req: InFlight, now_s: float) -> None:
        if req.prefill_released:
            return
        req.prefill_released = True
        if req.prefill_id is not None:
            p = self._index[req.prefill_id]
            self._f[p, LC_RUN] -= 1
            self._f[p, LC_WAIT] -= 1
            self._f[p, PREFILL_TIF] -= req.uncached_tokens
            self._remove_min(self._awaiting[p], p, MIN_TTFT, req.request_id)
            self._next_batch(p, now_s)

    def _start_batch_if_idle(self, i: int, uncached_tokens: float, t_s: float) -> None:
        # Nothing awaiting a first token: the endpoint starts on this request at once.
        if not self._awaiting[i]:
            self._f[i, BATCH_TIF] = uncached_tokens
            self._f[i, BATCH_AT] = t_s

    def _next_batch(self, i: int, now_s: float) -> None:
        # A first token ends a prefill batch; the engine starts the next one at
        # once with everything still waiting (an estimate: the engine's batch
        # budget may split it, and a first token can lag its prefill).
        if self._awaiting[i]:
            self._f[i, BATCH_TIF] = max(self._f[i, PREFILL_TIF], 0.0)
            self._f[i, BATCH_AT] = now_s
        else:
            self._f[i, BATCH_TIF] = 0.0
            self._f[i, BATCH_AT] = np.inf

    def _raw_features_now(self, i: int, req: InFlight, *, now_s: float) -> dict:
        # The request itself is excluded, as at dispatch: subtract its own share
        # (scraped KV usage cannot be split and is kept whole).
        hit = 1.0 - req.uncached_tokens / req.input_tokens if req.input_tokens else 0.0
        feats = self.raw_features(
            i, input_tokens=req.input_tokens, prefix_cache_hit_frac=hit, now_s=now_s,
            tokens_generated=req.tokens_generated,
        )
        own = req.input_tokens + req.tokens_generated
        feats["decode_tokens_in_flight"] = max(0.0, feats["decode_tokens_in_flight"] - own)
        feats["running_requests"] = max(0.0, feats["running_requests"] - 1)
        if not self._fresh(i, now_s):
            feats["kv_usage_frac"] = min(1.0, feats["decode_tokens_in_flight"] / self._f[i, MAX_KV])
        return feats

    def _sample(self, req: InFlight, target: Target, observed_ms: float, predicted_ms: float | None, *, now_s: float) -> list[Sample]:
        feats = req.ttft_features if target == "ttft" else req.tpot_features
        eid = req.ttft_endpoint_id if target == "ttft" else req.decode_id
        if feats is None or eid is None:
            return []
        return [self._make_sample(req, target, eid, feats, observed_ms, predicted_ms, now_s)]

    def _make_sample(self, req, target, eid, feats, observed_ms, predicted_ms, now_s) -> Sample:
        return Sample(
            target=target,
            request_id=req.request_id,
            endpoint_id=eid,
            role=feats["role"],
            features={k: feats[k] for k in RAW_FIELDS},
            observed_ms=float(observed_ms),
            predicted_ms=predicted_ms,
            model_version=req.model_version,
            recorded_at_s=now_s,
        )

    def _add_min(self, members: dict[str, float], i: int, col: int, rid: str, slo: float) -> None:
        members[rid] = slo
        if slo < self._f[i, col]:
            self._f[i, col] = slo

    def _remove_min(self, members: dict[str, float], i: int, col: int, rid: str) -> None:
        slo = members.pop(rid, None)
        if slo is not None and slo <= self._f[i, col]:
            self._f[i, col] = min(members.values(), default=np.inf)

    def _get(self, request_id: str) -> InFlight:
        req = self._inflight.get(request_id)
        if req is None:
            raise UnknownRequestError(request_id)
        return req


def _finite_or_none(x: float) -> float | None:
    return float(x) if np.isfinite(x) else None


def _check_latency(name: str, value: float) -> None:
    if not (np.isfinite(value) and value >= 0):
        raise RegistryError(f"{name} must be finite and >= 0 ms, got {value}")
