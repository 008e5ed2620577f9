"""Request lifecycle on the registry's load matrix: dispatch, prefill done, first token, progress, completion.

Each call moves a request's share of the load between columns of its
endpoints' rows (prefill work, tokens held, the running prefill batch, the
strictest SLO in flight) and returns the training samples it completes: the
features recorded at dispatch with the latency observed. `RequestLifecycle`
is a base of EndpointRegistry and works on its state (`_f`, `_index`,
`_endpoints`, `_awaiting`, `_decoding`, `_inflight`, `_lock`); each call that
releases a request ends with `_reap_drained`, which removes a draining
endpoint once its last request has left.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from routing.features import RAW_FIELDS, Role, Target
from routing.fleet.load_matrix import BATCH_AT, BATCH_TIF, DECODE_TIF, LC_RUN, LC_WAIT, MAX_KV, MIN_ITL, MIN_TTFT, PREFILL_TIF
from routing.fleet.errors import DuplicateRequestError, RegistryError, UnknownRequestError


@dataclass
class InFlight:
    """A dispatched request the registry tracks until it completes."""

    request_id: str
    prefill_id: str | None  # None in aggregated mode
    decode_id: str | None  # the decode or aggregated endpoint
    input_tokens: int
    uncached_tokens: float
    ttft_ms: float  # the request's TTFT SLO, ms (inf: none)
    itl_ms: float  # the request's ITL SLO, ms (inf: none)
    critical: bool
    dispatched_s: float
    ttft_features: dict | None = None
    tpot_features: dict | None = None
    predicted_ttft_ms: float | None = None
    predicted_tpot_ms: float | None = None
    model_version: str | None = None
    first_token_s: float | None = None
    tokens_generated: int = 0
    prefill_released: bool = False  # its prefill endpoint's accounting is done (prefill done or first token)
    decode_wait_released: bool = False  # its decode endpoint no longer counts it as waiting (first token)
    aggregated: bool = False  # set at dispatch: one endpoint does prefill and decode
    ttft_endpoint_id: str | None = None  # set at dispatch: where the TTFT sample belongs


@dataclass(frozen=True)
class Sample:
    """One training sample: features at dispatch and the observed latency."""

    target: Target
    request_id: str
    endpoint_id: str
    role: Role
    features: dict  # RAW_FIELDS -> value
    observed_ms: float
    predicted_ms: float | None
    model_version: str | None
    recorded_at_s: float


class RequestLifecycle:
    """Request lifecycle bookkeeping of EndpointRegistry (see the module docstring)."""

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


def _check_latency(name: str, value: float) -> None:
    if not (np.isfinite(value) and value >= 0):
        raise RegistryError(f"{name} must be finite and >= 0 ms, got {value}")
