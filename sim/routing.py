"""Request routing inside the simulated fleet: pluggable pickers.

A router picks the prefill worker for an arriving request and, when its prefill
is done, the decode worker that receives its KV cache. Candidates are the ready,
non-draining workers of the pool (never empty when called). Decode selection
knows the prefill worker's topology domain:

* "ignore": any worker;
* "prefer": least loaded after adding `cross_domain_penalty_tokens` to workers
  in another rack (and twice that in another zone), so transfers stay local unless
  the local workers are clearly busier;
* "require": same rack only, then same zone; None when neither has a worker
  (the simulator then holds the request until one is ready, nothing is lost).
"""

from __future__ import annotations

from typing import Literal, Protocol

from sim.fleet import DecodeWorker, PrefillWorker, zone_of

TopologyMode = Literal["ignore", "prefer", "require"]


class Router(Protocol):
    name: str

    def pick_prefill(self, rid: int, isl_tokens: int, workers: list[PrefillWorker]) -> PrefillWorker: ...

    def pick_decode(
        self, rid: int, isl_tokens: int, osl_tokens: int, source: PrefillWorker, workers: list[DecodeWorker]
    ) -> DecodeWorker | None: ...


def _topology_candidates(source: PrefillWorker, workers: list[DecodeWorker], mode: TopologyMode):
    if mode != "require":
        return workers
    same_rack = [w for w in workers if w.domain == source.domain]
    if same_rack:
        return same_rack
    zone = zone_of(source.domain)
    return [w for w in workers if zone_of(w.domain) == zone]


class RoundRobinRouter:
    """Cycle through the candidates of each pool in order."""

    name = "round-robin"

    def __init__(self, *, topology: TopologyMode = "ignore"):
        self.topology = topology
        self._next_prefill = 0
        self._next_decode = 0

    def pick_prefill(self, rid, isl_tokens, workers):
        w = workers[self._next_prefill % len(workers)]
        self._next_prefill += 1
        return w

    def pick_decode(self, rid, isl_tokens, osl_tokens, source, workers):
        cands = _topology_candidates(source, workers, self.topology)
        if not cands:
            return None
        w = cands[self._next_decode % len(cands)]
        self._next_decode += 1
        return w


class LeastLoadedRouter:
    """Prefill: fewest queued tokens. Decode: fewest reserved KV tokens (plus topology cost)."""

    name = "least-loaded"

    def __init__(self, *, topology: TopologyMode = "prefer", cross_domain_penalty_tokens: float = 50_000.0):
        if topology not in ("ignore", "prefer", "require"):
            raise ValueError(f"LeastLoadedRouter: topology must be ignore, prefer or require, got {topology!r}")
        self.topology = topology
        self.cross_domain_penalty_tokens = cross_domain_penalty_tokens

    def pick_prefill(self, rid, isl_tokens, workers):
        best = workers[0]
        best_load = best.queued_tokens
        for w in workers:
            if w.queued_tokens < best_load:
                best, best_load = w, w.queued_tokens
        return best

    def pick_decode(self, rid, isl_tokens, osl_tokens, source, workers):
        cands = _topology_candidates(source, workers, self.topology)
        if not cands:
            return None
        penalty = self.cross_domain_penalty_tokens if self.topology == "prefer" else 0.0
        src_dom = source.domain
        src_zone = zone_of(src_dom) if penalty else ""
        best = None
        best_cost = 0.0
        for w in cands:
            cost = w.reserved_tokens + w.incoming_tokens
            if penalty and w.domain != src_dom:
                cost += penalty if zone_of(w.domain) == src_zone else 2 * penalty
            if best is None or cost < best_cost:
                best, best_cost = w, cost
        return best


def make_router(name: str, *, topology: TopologyMode = "prefer", profile=None, slo=None, seed: int = 0) -> Router:
    """A router by name: 'round-robin', 'least-loaded' or 'picker' (the routing service's, needs profile and slo)."""
    if name == "picker":
        if profile is None or slo is None:
            raise ValueError("router 'picker' needs the engine profile and the SLO targets")
        from sim.picker_router import PickerRouter

        return PickerRouter(profile, slo=slo, seed=seed)
    if name == "round-robin":
        return RoundRobinRouter(topology="ignore" if topology == "prefer" else topology)
    if name == "least-loaded":
        return LeastLoadedRouter(topology=topology)
    raise ValueError(f"router: unknown name {name!r}; expected round-robin, least-loaded or picker")
