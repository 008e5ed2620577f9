"""SLO-aware, topology-aware endpoint picking: the router's library core.

`Picker.pick(request, endpoints, now_s)` chooses where a request runs: a
prefill and a decode endpoint (disaggregated fleet) or one aggregated endpoint.
It reads the registry, never changes it; `dispatch_record` turns the result
into the in-flight record the registry tracks. The simulator calls it
in-process; the HTTP service wraps it. With a seeded numpy Generator the
choices are reproducible: every stage draws exactly two uniforms.

SLO-aware picking (llm-d's predicted-latency scheduling). For each candidate
the latency model predicts TTFT and TPOT. Headroom is the strictest SLO among
the requests in flight there and the new one, minus the prediction:

* prefill endpoint: TTFT only;
* decode endpoint: TPOT, plus TTFT budget left after the chosen prefill's
  predicted TTFT and the KV-transfer cost (soft scoring);
* aggregated endpoint: both.

Endpoints with headroom of at least `headroom_margin_frac` of every SLO form
the first tier (the margin absorbs estimate error). Strategy `max` takes the
most relative headroom (headroom / SLO, blended TTFT:TPOT by
`ttft_weight_frac`; ties at random); `least` and `most` draw one at random,
weighted by the min-max normalised relative headroom: `least` favours
just-enough headroom (bin-packing), `most` the largest (spreading); every
weight gets `weight_floor`. With probability `exploration_frac` a non-critical
request goes to a uniformly random candidate instead. No endpoint clears the
margin: the one with the most headroom among those still predicted to meet
every SLO. None: an idle endpoint (nothing in flight) is still valid, the
least negative first. None of those: a critical request goes to the least
negative headroom (its binding SLO, relative); a non-critical one is shed with
the reason. Ties on the binding SLO go to the larger blended headroom.
With SLO routing off, the lowest predicted latency wins.

Topology (Dynamo's KV-transfer domains). With `topology.level` set, prefill
candidates are limited to endpoints that have a decode endpoint in their domain
at that level (when any exist), and decode candidates to the chosen prefill's
domain. No same-domain decode: policy `fail` raises TopologyError, `fallback`
uses every decode endpoint (labelled or not) and says so in the result. An
endpoint missing the label never matches a domain. Level unset: no filtering.
Soft scoring adds the transfer cost weight * (latency + kv_bytes / bandwidth)
of the narrowest shared level to each decode candidate: it is spent from the
TTFT budget, or added to the latency score with SLO routing off.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import InitVar, dataclass

import numpy as np

from routing.config import PickerConfig
from routing.features import TTFT_FEATURES, view_feature_matrix, view_raw_features
from routing.fleet.requests import InFlight
from routing.fleet.load_matrix import EndpointView
from routing.picking.result import Choice, PickResult, Tier
from routing.fleet.registry import EndpointRegistry
from routing.fleet.topology import MISSING, cost_table_ms, prefill_has_local_decode, relation_name, shared_depth

_N_TTFT = len(TTFT_FEATURES)


class MissingSloError(ValueError):
    """SLO routing is on and the request carries no SLO."""


class NoEndpointError(RuntimeError):
    """No endpoint of the role a request needs is registered."""


class TopologyError(RuntimeError):
    """Policy `fail`: no decode endpoint in the prefill endpoint's domain."""


@dataclass(frozen=True)
class RouteRequest:
    """A request to place.

    input_tokens: prompt length, tokenizer tokens.
    ttft_ms / itl_ms: the request's SLOs (time to first token, inter-token
        latency), ms (None: none for that metric).
    prefix_cache_hit_frac: share of the prompt cached on every endpoint (0-1);
        prefix_cache_hit_frac_by_endpoint overrides it per endpoint id.
    expected_output_tokens: output length hint for SLO-less scoring.
    ttft_slo_ms / tpot_slo_ms: deprecated spellings of ttft_ms / itl_ms,
        accepted for one release.
    """

    request_id: str
    input_tokens: int
    ttft_ms: float | None = None
    itl_ms: float | None = None
    critical: bool = False
    prefix_cache_hit_frac: float = 0.0
    prefix_cache_hit_frac_by_endpoint: Mapping[str, float] | None = None
    expected_output_tokens: int | None = None
    ttft_slo_ms: InitVar[float | None] = None
    tpot_slo_ms: InitVar[float | None] = None

    def __post_init__(self, ttft_slo_ms: float | None, tpot_slo_ms: float | None) -> None:
        if ttft_slo_ms is not None:
            object.__setattr__(self, "ttft_ms", ttft_slo_ms)
        if tpot_slo_ms is not None:
            object.__setattr__(self, "itl_ms", tpot_slo_ms)


@dataclass
class _Stage:
    """Per-candidate arrays of one stage."""

    reg: EndpointRegistry
    idx: np.ndarray
    view: EndpointView
    hit: np.ndarray
    pred_ttft: np.ndarray | None
    pred_tpot: np.ndarray | None
    h_ttft: np.ndarray
    h_itl: np.ndarray
    valid: np.ndarray  # headroom of at least the safety margin on every SLO
    positive: np.ndarray  # non-negative headroom on every SLO (margin or not)
    blended: np.ndarray
    binding: np.ndarray
    cost: np.ndarray
    depth: np.ndarray | None
    score: np.ndarray


class Picker:
    """Chooses endpoints for requests; see the module docstring for the rules."""

    def __init__(self, config: PickerConfig, predictor, *, rng: np.random.Generator | int | None = None):
        """predictor: routing.models.predictor.LatencyPredictor (anything with snapshot()).
        rng: a numpy Generator or a seed (None: fresh entropy)."""
        self.config = config
        self.predictor = predictor
        self.rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
        # Topology candidate sets depend only on the registry's endpoints and
        # labels; the registry hands out new candidate arrays on every
        # register/deregister, so the arrays themselves are the cache key.
        self._topology_cache: tuple | None = None

    # -- public API --------------------------------------------------------

    def pick(self, request: RouteRequest, endpoints: EndpointRegistry, now_s: float) -> PickResult:
        """Choose endpoints for `request` at now_s (seconds, the registry's clock).

        Raises MissingSloError, NoEndpointError or TopologyError; a request that
        cannot meet its SLO anywhere comes back with outcome "shed".
        """
        self._check(request)
        model = self.predictor.snapshot()
        prefill_idx = endpoints.candidates("prefill")
        decode_idx = endpoints.candidates("decode")
        if prefill_idx.size and decode_idx.size:
            return self._disaggregated(request, endpoints, now_s, model, prefill_idx, decode_idx)
        agg_idx = endpoints.candidates("aggregated")
        if agg_idx.size:
            stage = self._evaluate(request, endpoints, agg_idx, now_s, model, "aggregated")
            pos, tier, reason = self._choose(request, stage)
            return self._result(request, model, "aggregated", endpoints, None, None, tier, reason, stage, pos, False, "")
        missing = "decode" if prefill_idx.size else ("prefill" if decode_idx.size else "prefill/decode or aggregated")
        raise NoEndpointError(f"no {missing} endpoint is registered")

    def pick_prefill(self, request: RouteRequest, endpoints: EndpointRegistry, now_s: float) -> PickResult:
        """Prefill stage only (for simulators that pick decode when prefill ends)."""
        self._check(request)
        model = self.predictor.snapshot()
        prefill_idx, fallback, note = self._prefill_candidates(endpoints, endpoints.candidates("prefill"), endpoints.candidates("decode"))
        stage = self._evaluate(request, endpoints, prefill_idx, now_s, model, "prefill")
        chosen, tier, reason = self._choose(request, stage)
        return self._result(request, model, "disaggregated", endpoints, stage, chosen, tier, reason, None, None, fallback, note)

    def pick_decode(
        self,
        request: RouteRequest,
        endpoints: EndpointRegistry,
        now_s: float,
        *,
        prefill_id: str,
        prefill_ttft_ms: float = 0.0,
    ) -> PickResult:
        """Decode stage only, given the prefill endpoint and its predicted TTFT (ms)."""
        self._check(request)
        model = self.predictor.snapshot()
        p = endpoints.slot_of(prefill_id)
        if p is None:
            raise NoEndpointError(f"prefill endpoint {prefill_id!r} is not registered")
        decode_idx = endpoints.candidates("decode")
        if not decode_idx.size:
            raise NoEndpointError("no decode endpoint is registered")
        decode_idx, fallback, note = self._decode_candidates(endpoints, p, decode_idx, prefill_id)
        stage = self._evaluate(request, endpoints, decode_idx, now_s, model, "decode", prefill_slot=p, prefill_ttft_ms=prefill_ttft_ms)
        chosen, tier, reason = self._choose(request, stage)
        return self._result(request, model, "disaggregated", endpoints, None, None, tier, reason, stage, chosen, fallback, note)

    # -- stages ------------------------------------------------------------

    def _disaggregated(self, request, reg, now_s, model, prefill_idx, decode_idx) -> PickResult:
        prefill_idx, fallback, note = self._prefill_candidates(reg, prefill_idx, decode_idx)
        pstage = self._evaluate(request, reg, prefill_idx, now_s, model, "prefill")
        p_pos, tier, reason = self._choose(request, pstage)
        if p_pos is None:
            return self._result(request, model, "disaggregated", reg, pstage, None, tier, reason, None, None, fallback, note)
        p = int(pstage.idx[p_pos])
        decode_idx, d_fallback, d_note = self._decode_candidates(reg, p, decode_idx, reg.endpoint_at(p).id)
        dstage = self._evaluate(
            request, reg, decode_idx, now_s, model, "decode", prefill_slot=p,
            prefill_ttft_ms=float(pstage.pred_ttft[p_pos]),
        )
        d_pos, d_tier, d_reason = self._choose(request, dstage)
        notes = "; ".join(n for n in (note, d_note) if n)
        if d_pos is None:
            return self._result(request, model, "disaggregated", reg, pstage, p_pos, d_tier, d_reason, dstage, None, fallback or d_fallback, notes)
        tier = tier if tier != "headroom" else d_tier
        return self._result(
            request, model, "disaggregated", reg, pstage, p_pos, tier, f"prefill: {reason}; decode: {d_reason}",
            dstage, d_pos, fallback or d_fallback, notes,
        )

    def _prefill_candidates(self, reg, prefill_idx, decode_idx) -> tuple[np.ndarray, bool, str]:
        level = self.config.topology.level
        if not prefill_idx.size:
            raise NoEndpointError("no prefill endpoint is registered")
        if level is None:
            return prefill_idx, False, ""
        cache = self._topology_for(reg, prefill_idx, decode_idx)
        local = cache.get("prefill")
        if local is None:
            li = reg.level_index(level)
            mask = prefill_has_local_decode(reg.domain_codes(prefill_idx)[:, li], reg.domain_codes(decode_idx)[:, li])
            local = cache["prefill"] = prefill_idx[mask]
        if local.size:
            return local, False, ""
        message = f"no prefill endpoint shares a {level} domain with a decode endpoint"
        if self.config.topology.policy == "fail":
            raise TopologyError(f"{message} (topology policy fail)")
        return prefill_idx, True, f"{message}; fallback: any prefill and decode endpoint"

    def _decode_candidates(self, reg, p: int, decode_idx, prefill_id: str) -> tuple[np.ndarray, bool, str]:
        level = self.config.topology.level
        if level is None:
            return decode_idx, False, ""
        cache = self._topology_for(reg, reg.candidates("prefill"), decode_idx)
        same = cache.get(p)
        if same is None:
            li = reg.level_index(level)
            code = reg.domain_codes(np.array([p]))[0, li]
            same = decode_idx[reg.domain_codes(decode_idx)[:, li] == code] if code != MISSING else decode_idx[:0]
            cache[p] = same
        if same.size:
            return same, False, ""
        domain = reg.endpoint_at(p).domains.get(level)
        where = f"{level} {domain!r}" if domain is not None else f"(prefill {prefill_id} has no {level} label)"
        message = f"no decode endpoint in {where} of prefill {prefill_id}"
        if self.config.topology.policy == "fail":
            raise TopologyError(f"{message} (topology policy fail)")
        return decode_idx, True, f"{message}; fallback: any decode endpoint"

    def _topology_for(self, reg: EndpointRegistry, prefill_idx: np.ndarray, decode_idx: np.ndarray) -> dict:
        """Cached candidate sets for this registry state: "prefill" -> local prefill slots, slot -> same-domain decode."""
        c = self._topology_cache
        level = self.config.topology.level  # compared too: a config edited in place changes the sets
        if (c is None or c[0] is not reg or c[1] is not prefill_idx or c[2] is not decode_idx
                or c[3] is not self.config or c[4] != level):
            c = self._topology_cache = (reg, prefill_idx, decode_idx, self.config, level, {})
        return c[5]

    def _evaluate(
        self, request: RouteRequest, reg: EndpointRegistry, idx: np.ndarray, now_s: float, model, stage: str,
        *, prefill_slot: int | None = None, prefill_ttft_ms: float = 0.0,
    ) -> _Stage:
        view = reg.view(idx, now_s=now_s)
        hit = self._hits(request, reg, idx)
        # TTFT columns are a prefix of TPOT's: one matrix serves both targets.
        x = view_feature_matrix(
            "ttft" if stage == "prefill" else "tpot", view,
            input_tokens=float(request.input_tokens), prefix_cache_hit_frac=hit, tokens_generated=0.0,
        )
        n = idx.size
        pred_ttft = pred_tpot = None
        if stage == "prefill":
            pred_ttft = model.predict("ttft", x)
        elif stage == "aggregated":
            pred_ttft = model.predict("ttft", np.ascontiguousarray(x[:, :_N_TTFT]))
        if stage in ("decode", "aggregated"):
            pred_tpot = model.predict("tpot", x)
        req_ttft = request.ttft_ms if request.ttft_ms is not None else np.inf
        req_itl = request.itl_ms if request.itl_ms is not None else np.inf
        cost = np.zeros(n)
        depth = None
        if stage == "decode":
            topo = self.config.topology
            if topo.qos:
                cache = self._topology_for(reg, reg.candidates("prefill"), reg.candidates("decode"))
                hit_depth = cache.get(("depth", prefill_slot))
                if hit_depth is not None and hit_depth[0] is idx:
                    depth = hit_depth[1]
                else:
                    depth = shared_depth(reg.domain_codes(np.array([prefill_slot]))[0], reg.domain_codes(idx))
                    cache[("depth", prefill_slot)] = (idx, depth)
                table = cost_table_ms(topo.qos, reg.levels, kv_bytes=request.input_tokens * topo.kv_bytes_per_token)
                cost = table[depth]
            strict_ttft = req_ttft
            h_ttft = (req_ttft - prefill_ttft_ms) - cost
        else:
            strict_ttft = np.minimum(req_ttft, view.strictest_ttft_ms)
            h_ttft = strict_ttft - pred_ttft
        if stage == "prefill":
            strict_itl, h_itl = np.inf, np.full(n, np.inf)
        else:
            strict_itl = np.minimum(req_itl, view.strictest_itl_ms)
            h_itl = strict_itl - pred_tpot
        margin = self.config.slo.headroom_margin_frac
        valid = (h_ttft >= margin_ms(strict_ttft, margin)) & (h_itl >= margin_ms(strict_itl, margin))
        positive = (h_ttft >= 0) & (h_itl >= 0)
        r_ttft = relative_headroom(h_ttft, strict_ttft)
        r_itl = relative_headroom(h_itl, strict_itl)
        a = self.config.slo.ttft_weight_frac
        osl = request.expected_output_tokens or self.config.slo.expected_output_tokens
        if stage == "prefill":
            score = pred_ttft.copy()
        elif stage == "decode":
            score = pred_tpot * osl + cost
        else:
            score = pred_ttft + pred_tpot * osl
        return _Stage(
            reg=reg, idx=idx, view=view, hit=hit, pred_ttft=pred_ttft, pred_tpot=pred_tpot, h_ttft=h_ttft, h_itl=h_itl,
            valid=per_endpoint(valid, n).astype(bool, copy=False),
            positive=per_endpoint(positive, n).astype(bool, copy=False),
            blended=per_endpoint(a * r_ttft + (1 - a) * r_itl, n),
            binding=per_endpoint(np.minimum(r_ttft, r_itl), n), cost=cost, depth=depth,
            score=score,
        )

    def _choose(self, request: RouteRequest, s: _Stage) -> tuple[int | None, Tier, str]:
        """Position in s.idx of the chosen endpoint (None: shed), its tier and why."""
        u_explore, u_pick = self.rng.random(2)
        n = s.idx.size
        slo = self.config.slo
        if u_explore < slo.exploration_frac and not request.critical and n > 1:
            return min(int(u_pick * n), n - 1), "explore", f"exploration (p={slo.exploration_frac:g}) among {n}"
        if not slo.enabled:
            pos = argmin_random(s.score, u_pick)
            return pos, "lowest_latency", f"lowest predicted latency {s.score[pos]:.1f} ms among {n}"
        positive = np.flatnonzero(s.valid)
        if positive.size:
            h = s.blended[positive]
            if slo.strategy == "max":
                pos = int(positive[argmax_random(h, u_pick)])
                return pos, "headroom", f"{positive.size} of {n} with headroom, strategy max"
            lo, hi = h.min(), h.max()
            norm = (h - lo) / (hi - lo) if hi > lo else np.ones_like(h)
            weights = (1.0 - norm if slo.strategy == "least" else norm) + slo.weight_floor
            cum = np.cumsum(weights)
            k = min(int(np.searchsorted(cum, u_pick * cum[-1], side="right")), positive.size - 1)
            pos = int(positive[k])
            return pos, "headroom", f"{positive.size} of {n} with headroom, strategy {slo.strategy}"
        thin = np.flatnonzero(s.positive)
        if thin.size:
            # Predicted to meet the SLO, but within the margin of estimate error:
            # the safest of them, whatever the strategy.
            pos = int(thin[argmax_tiebreak(s.binding[thin], s.blended[thin], u_pick)])
            return pos, "thin_headroom", (
                f"no endpoint with headroom above the {slo.headroom_margin_frac:g} margin; most of {thin.size} with less"
            )
        idle = np.flatnonzero(s.view.idle)
        if idle.size:
            pos = int(idle[argmax_tiebreak(s.binding[idle], s.blended[idle], u_pick)])
            return pos, "idle", f"no endpoint with headroom; idle endpoint, least negative of {idle.size}"
        pos = argmax_tiebreak(s.binding, s.blended, u_pick)
        detail = self._deficit(s, pos)
        if request.critical:
            return pos, "critical_negative", f"critical: no endpoint with headroom; least negative ({detail})"
        return None, "shed", f"no endpoint with headroom among {n}; best {detail}"

    # -- results -----------------------------------------------------------

    def _result(self, request, model, mode, reg, pstage, p_pos, tier, reason, dstage, d_pos, fallback, note) -> PickResult:
        prefill = self._choice(reg, request, pstage, p_pos, "prefill") if p_pos is not None else None
        decode = self._choice(reg, request, dstage, d_pos, "decode") if d_pos is not None else None
        routed = decode is not None or (prefill is not None and dstage is None)
        stages = [st for st in (pstage, dstage) if st is not None]
        return PickResult(
            request_id=request.request_id,
            outcome="routed" if routed and tier != "shed" else "shed",
            mode=mode,
            prefill=prefill,
            decode=decode,
            tier=tier,
            reason=f"{reason}; {note}" if note else reason,
            topology_fallback=fallback,
            model_version=model.version,
            candidates=sum(int(st.idx.size) for st in stages),
        )

    def _choice(self, reg: EndpointRegistry, request: RouteRequest, s: _Stage, pos: int, stage: str) -> Choice:
        v = s.view
        i = int(s.idx[pos])
        ep = reg.endpoint_at(i)
        shared = None
        if s.depth is not None:
            shared = relation_name(int(s.depth[pos]), reg.levels)
        return Choice(
            endpoint_id=ep.id,
            role=ep.role,
            predicted_ttft_ms=_opt(s.pred_ttft, pos),
            predicted_tpot_ms=_opt(s.pred_tpot, pos),
            headroom_ttft_ms=_finite(s.h_ttft[pos]),
            headroom_tpot_ms=_finite(s.h_itl[pos]),  # the API's name for the ITL SLO's headroom
            transfer_cost_ms=float(s.cost[pos]),
            shared_level=shared,
            features=view_raw_features(v, pos, input_tokens=request.input_tokens, prefix_cache_hit_frac=s.hit[pos]),
        )

    def _deficit(self, s: _Stage, pos: int) -> str:
        parts = []
        if np.isfinite(s.h_ttft[pos]) and s.h_ttft[pos] < 0:
            parts.append(f"TTFT headroom {s.h_ttft[pos]:.1f} ms")
        if np.isfinite(s.h_itl[pos]) and s.h_itl[pos] < 0:
            parts.append(f"ITL headroom {s.h_itl[pos]:.2f} ms")
        return f"{s.reg.endpoint_at(int(s.idx[pos])).id}: " + (", ".join(parts) or "no deficit")

    def _hits(self, request: RouteRequest, reg: EndpointRegistry, idx: np.ndarray) -> np.ndarray:
        base = request.prefix_cache_hit_frac
        per = request.prefix_cache_hit_frac_by_endpoint
        if not per:
            return np.full(idx.size, float(base))
        return np.array([per.get(eid, base) for eid in reg.endpoint_ids(idx)], dtype=float)

    def _check(self, request: RouteRequest) -> None:
        if self.config.slo.enabled and request.ttft_ms is None and request.itl_ms is None:
            raise MissingSloError(
                f"request {request.request_id}: slo: SLO routing is on, so ttft_ms or itl_ms is required"
            )
        for name in ("ttft_ms", "itl_ms"):
            v = getattr(request, name)
            if v is not None and not (np.isfinite(v) and v > 0):
                raise ValueError(f"request {request.request_id}: {name} must be > 0, got {v}")
        if request.input_tokens < 0:
            raise ValueError(f"request {request.request_id}: input_tokens must be >= 0, got {request.input_tokens}")


def dispatch_record(request: RouteRequest, result: PickResult, *, now_s: float) -> InFlight:
    """The in-flight record for a routed result (pass to EndpointRegistry.dispatched)."""
    if not result.routed:
        raise ValueError(f"request {request.request_id}: was shed, nothing to dispatch")
    ttft_choice = result.prefill if result.prefill is not None else result.decode
    hit = ttft_choice.features["prefix_cache_hit_frac"] if ttft_choice else request.prefix_cache_hit_frac
    return InFlight(
        request_id=request.request_id,
        prefill_id=result.prefill.endpoint_id if result.prefill else None,
        decode_id=result.decode.endpoint_id if result.decode else None,
        input_tokens=int(request.input_tokens),
        uncached_tokens=request.input_tokens * (1.0 - hit),
        ttft_ms=request.ttft_ms if request.ttft_ms is not None else np.inf,
        itl_ms=request.itl_ms if request.itl_ms is not None else np.inf,
        critical=request.critical,
        dispatched_s=now_s,
        ttft_features=ttft_choice.features if ttft_choice else None,
        tpot_features=result.decode.features if result.decode else None,
        predicted_ttft_ms=ttft_choice.predicted_ttft_ms if ttft_choice else None,
        predicted_tpot_ms=result.decode.predicted_tpot_ms if result.decode else None,
        model_version=result.model_version,
    )


def _opt(a: np.ndarray | None, pos: int) -> float | None:
    return None if a is None else float(a[pos])


def _finite(x: float) -> float | None:
    return float(x) if np.isfinite(x) else None


# Headroom arithmetic: headroom is SLO minus prediction, ms; an SLO of inf means none constrains.

def per_endpoint(x, n: int) -> np.ndarray:
    return np.full(n, float(x)) if np.ndim(x) == 0 else x


def margin_ms(strict, margin_frac: float):
    """Headroom an endpoint needs, ms: margin_frac of each finite SLO, 0 where none constrains (inf)."""
    if np.ndim(strict) == 0:  # the request's own SLO (decode TTFT, prefill TPOT): no array needed
        strict = float(strict)
        return strict * margin_frac if np.isfinite(strict) else 0.0
    strict = np.asarray(strict, dtype=float)
    finite = np.isfinite(strict)
    return np.where(finite, strict, 0.0) * margin_frac


def relative_headroom(h: np.ndarray, strict) -> np.ndarray | float:
    """Headroom / SLO, clipped to [-1e9, 1]; 1 where no SLO constrains (strict = inf).

    strict: a scalar or an array aligned with h (ms). The 1e-9 ms floor keeps
    absurd SLOs (1e-300 ms) from overflowing.
    """
    if np.ndim(strict) == 0:
        if not np.isfinite(strict):
            return 1.0
        r = h / max(float(strict), 1e-9)
    else:
        finite = np.isfinite(strict)
        if finite.all():
            r = h / np.maximum(strict, 1e-9)
        elif not finite.any():
            return 1.0
        else:
            r = np.where(finite, h / np.where(finite, np.maximum(strict, 1e-9), 1.0), 1.0)
    return np.minimum(np.maximum(r, -1e9), 1.0)


# Seeded choice among tied candidates: one uniform `u` in [0, 1) picks among the best.

def argmin_random(values: np.ndarray, u: float) -> int:
    best = np.flatnonzero(values == values.min())
    return int(best[min(int(u * best.size), best.size - 1)])


def argmax_random(values: np.ndarray, u: float) -> int:
    best = np.flatnonzero(values == values.max())
    return int(best[min(int(u * best.size), best.size - 1)])


def argmax_tiebreak(primary: np.ndarray, secondary: np.ndarray, u: float) -> int:
    """Largest primary; exact ties by the largest secondary, then at random.

    The binding headroom ties whenever one SLO is binding for every candidate
    with the same value (a decode stage's TTFT budget is the same on every
    decode endpoint): the other SLO's headroom should then decide, not chance.
    """
    best = np.flatnonzero(primary == primary.max())
    if best.size > 1:
        sec = secondary[best]
        best = best[sec == sec.max()]
    return int(best[min(int(u * best.size), best.size - 1)])
