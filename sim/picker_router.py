"""The routing service's picker, in-process, as the simulator's router.

`PickerRouter` keeps a `routing.fleet.registry.EndpointRegistry` in step with the
simulated fleet (one endpoint per ready worker, with its topology domains) and,
before every pick, hands it each candidate's current engine metrics as a scrape
would (KV usage, waiting and running requests). The picker then chooses with its
latency model (the profile estimate unless a trained model is given), SLO
headroom and topology rules, exactly as the HTTP service would.

It also makes the lifecycle calls the service gets from the frontend, in
Dynamo's order, so the registry's own load (prompt tokens awaiting prefill,
requests waiting for decode admission, context tokens decoding, strictest SLOs
in flight) is what the service would hold: `dispatched` with the prefill pick;
`prefill_done` with the decode pick, made when prefill returns (Dynamo's
PrefillRouter picks decode only then); `first_token` once the decode worker has
admitted the request and emitted its first token, after the KV transfer; and
`completed` once it has finished the request. The last two are noticed at the
next pick that looks at that worker, and the first token carries its true time.

Every simulated request is marked critical, so the picker never sheds: the
simulator serves everything it is given (a shed request would be an SLA miss the
planner cannot see). Topology levels are "zone" and "rack", from the workers'
"zone/rack" domains.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from planner.config import SloTarget
from routing.config import PickerConfig
from routing.picking.picker import Picker, RouteRequest, dispatch_record
from routing.models.predictor import LatencyPredictor, ProfileEstimator
from routing.fleet.registry import Endpoint, EndpointRegistry
from sim.fleet import DecodeWorker, PrefillWorker, zone_of

LEVELS = ("zone", "rack")


def _domains(domain: str) -> dict[str, str]:
    zone = zone_of(domain)
    rack = domain.split("/", 1)[1] if "/" in domain else ""
    return {"zone": zone, "rack": f"{zone}/{rack}"} if rack else {"zone": zone}


class PickerRouter:
    """Router protocol adapter around routing.picking.picker.Picker."""

    name = "picker"

    def __init__(
        self,
        profile,
        *,
        slo: SloTarget,
        config: PickerConfig | None = None,
        predictor=None,
        seed: int = 0,
    ):
        """profile: planner.latency.profile.EngineProfile (the estimate and KV capacity).
        predictor: a routing.models.predictor.LatencyPredictor; default: the profile estimate."""
        self.slo = slo
        self.config = config or PickerConfig.model_validate({"topology": {"levels": list(LEVELS)}})
        self.max_kv_tokens = float(profile.decode.max_kv_tokens)
        self.registry = EndpointRegistry(default_max_kv_tokens=int(self.max_kv_tokens), levels=self.config.topology.levels)
        self.picker = Picker(
            self.config, predictor or LatencyPredictor(estimate=ProfileEstimator(profile)), rng=np.random.default_rng(seed)
        )
        self.sim = None
        self._registered: dict[str, object] = {}  # serving workers, by name
        self._draining: dict[str, object] = {}  # workers that left with requests still on them
        self._decoding: dict[str, set[int]] = {}  # decode worker name -> requests assigned there
        self._first_due: dict[str, set[int]] = {}  # decode worker name -> those without their first token yet
        self._prefilling: dict[str, deque[int]] = {}  # prefill worker name -> requests sent there, oldest first
        self.picks = 0

    def bind(self, sim) -> None:
        """Called by FleetSim: the router reads the simulated clock and the workers from it."""
        self.sim = sim

    # -- registry sync ----------------------------------------------------

    def _sync(self, workers) -> None:
        """Register the serving workers; drain the ones that left (not picked, counted until they finish)."""
        role = "prefill" if isinstance(workers[0], PrefillWorker) else "decode"
        live = {w.name: w for w in workers}
        for name, w in list(self._registered.items()):
            if name not in live and isinstance(w, PrefillWorker) == (role == "prefill"):
                del self._registered[name]
                if name in self.registry and self.registry.drain(name):
                    self._draining[name] = w
                else:
                    self._forget(name)
        for name, w in live.items():
            if name not in self._registered:
                self.registry.register(Endpoint(id=name, role=role, domains=_domains(w.domain)))
                self._registered[name] = w
                self._draining.pop(name, None)

    def _forget(self, name: str) -> None:
        self._draining.pop(name, None)
        self._decoding.pop(name, None)
        self._first_due.pop(name, None)
        self._prefilling.pop(name, None)

    def _observe(self, workers, now_s: float) -> None:
        prefill = isinstance(workers[0], PrefillWorker)
        for name, w in list(self._draining.items()):  # their lifecycle calls, until the registry removes them
            if isinstance(w, PrefillWorker) == prefill:
                self._lifecycle(w, now_s)
                if name not in self.registry:
                    self._forget(name)
        cap = self.max_kv_tokens
        for w in workers:
            self._lifecycle(w, now_s)
            if isinstance(w, PrefillWorker):
                # vLLM's KV usage on a prefill engine is the running batch's
                # blocks; queued prompts hold none yet.
                kv = min(w.batch_tokens / cap, 1.0)
                waiting, running = float(len(w.queue)), float(len(w.batch))
            else:
                kv = min(w.kv_tokens_at(now_s) / cap, 1.0)
                waiting, running = float(len(w.pending) + w.incoming), float(w.n)
            self.registry.observe_metrics(
                w.name, now_s=now_s, kv_usage_frac=kv, waiting_requests=waiting, running_requests=running
            )

    def _lifecycle(self, w, now_s: float) -> None:
        if isinstance(w, PrefillWorker):
            self._release_prefilled(w, now_s)
        else:
            self._release_first_tokens(w)
            self._complete_finished(w, now_s)

    def _release_prefilled(self, w: PrefillWorker, now_s: float) -> None:
        """`first_token` for requests whose prefill the worker has finished without a decode pick (FIFO queue).

        The decode pick's `prefill_done` releases most of them at the exact
        moment; single-token outputs never reach a decode pick: prefill's token
        is their first and last.
        """
        mine = self._prefilling.get(w.name)
        if not mine:
            return
        while len(mine) > len(w.queue) + len(w.batch):
            key = str(mine.popleft())
            req = self.registry.in_flight(key)
            if req is not None and not req.prefill_released:
                self.registry.first_token(key, now_s=now_s)

    def _release_first_tokens(self, w: DecodeWorker) -> None:
        """`first_token`, at its true time, for the requests the worker has admitted since the last look."""
        due = self._first_due.get(w.name)
        if not due or len(due) <= w.incoming + len(w.pending) + len(w.first_due):
            return
        first_s = self.sim.first_token_s
        for rid in [r for r in due if first_s[r] == first_s[r]]:  # not NaN: first token out
            due.discard(rid)
            req = self.registry.in_flight(str(rid))
            if req is not None and req.first_token_s is None:
                self.registry.first_token(str(rid), now_s=float(first_s[rid]))

    def _complete_finished(self, w: DecodeWorker, now_s: float) -> None:
        """`completed` for the requests the worker has finished since the last look."""
        mine = self._decoding.get(w.name)
        if not mine or len(mine) <= w.n + len(w.pending) + w.incoming:
            return
        finish_s, osl = self.sim.finish_s, self.sim.osl
        done = [rid for rid in mine if finish_s[rid] == finish_s[rid]]  # not NaN: finished
        for rid in done:
            mine.discard(rid)
            if self.registry.in_flight(str(rid)) is not None:
                self.registry.completed(str(rid), now_s=now_s, output_tokens=int(osl[rid]))

    def _request(self, rid: int, isl_tokens: int) -> RouteRequest:
        return RouteRequest(
            request_id=str(rid),
            input_tokens=int(isl_tokens),
            ttft_ms=self.slo.ttft_ms,
            itl_ms=self.slo.itl_ms,
            critical=True,
        )

    # -- Router protocol --------------------------------------------------

    def pick_prefill(self, rid: int, isl_tokens: int, workers: list[PrefillWorker]) -> PrefillWorker:
        now = self.sim.event_t_s
        self._sync(workers)
        if self.sim.decode_serving:
            self._sync(self.sim.decode_serving)
        self._observe(workers, now)
        req = self._request(rid, isl_tokens)
        result = self.picker.pick_prefill(req, self.registry, now)
        self.picks += 1
        self.registry.dispatched(dispatch_record(req, result, now_s=now))
        self._prefilling.setdefault(result.prefill.endpoint_id, deque()).append(rid)
        return self._registered[result.prefill.endpoint_id]

    def pick_decode(
        self, rid: int, isl_tokens: int, osl_tokens: int, source: PrefillWorker, workers: list[DecodeWorker]
    ) -> DecodeWorker | None:
        now = self.sim.event_t_s
        self._sync(workers)
        gone = source.name not in self.registry  # drained and removed, yet its KV still goes to decode
        if gone:
            self.registry.register(Endpoint(id=source.name, role="prefill", domains=_domains(source.domain)))
        self._observe(workers, now)
        key = str(rid)
        req = self.registry.in_flight(key)
        result = self.picker.pick_decode(self._request(rid, isl_tokens), self.registry, now, prefill_id=source.name)
        self.picks += 1
        choice = result.decode
        if req is not None and req.decode_id is None:
            # Prefill has returned either way; with no decode worker to go to the frontend asks again later.
            decode = {} if choice is None else dict(
                decode_id=choice.endpoint_id, tpot_features=choice.features,
                predicted_tpot_ms=choice.predicted_tpot_ms)
            self.registry.prefill_done(key, now_s=now, **decode)
            if choice is not None:
                self._decoding.setdefault(choice.endpoint_id, set()).add(rid)
                self._first_due.setdefault(choice.endpoint_id, set()).add(rid)
        if gone:
            self.registry.drain(source.name)
        return None if choice is None else self._registered[choice.endpoint_id]
