"""Waking a simulated fleet from zero: a request the frontend holds starts the wake run after a dispatch delay.

As live (`sla-planner watch` reads the waker's held requests): while a pool of a
policy that allows scale to zero has no replica set or in flight, the first
arrival is held by the simulated frontend, and the wake run
(planner.decision.wake) decides dispatch_s later, not at the next interval.
The replay calls `wake_until` before each interval's scheduled run and lists
each wake: first held request, decision, replicas ready.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WakeEvent:
    """One wake: the first request held at zero, the run it started, when the woken fleet served.

    ready_s: when every woken pool had a ready replica; None if it never did before the replay ended.
    """

    held_s: float
    decided_s: float
    to_replicas: tuple[int, int]
    applied: bool
    ready_s: float | None = None

    def as_dict(self) -> dict:
        return {"held_s": self.held_s, "decided_s": self.decided_s, "to_replicas": list(self.to_replicas),
                "applied": self.applied, "ready_s": self.ready_s}


def wake_until(run, end_s: float, *, dispatch_s: float, step) -> list[WakeEvent]:
    """Wake runs strictly before end_s (the next scheduled run); the events, oldest first.

    run: the replay (sim.replay.ReplayRun): its fleet, decision log, policy and act().
    dispatch_s: from the first held request to the wake run deciding, s (watcher poll, scrape, run start).
    step: step(now_s, fleet) -> the policy's input (sim.replay.PolicyInput) for a wake run at now_s.
    """
    sim, events = run.sim, []
    while not sim.done:
        fleet = run.log.fleet_state(sim, sim.now_s)
        if not run.policy.at_zero(fleet) or sim.next_arrival >= len(sim.arrival_s):
            return events
        held = float(sim.arrival_s[sim.next_arrival])
        decided = max(held, sim.now_s) + dispatch_s
        if decided >= end_s:
            return events
        sim.run_until(decided)
        fleet = run.log.fleet_state(sim, decided)
        out = run.policy.decide_wake(step(decided, fleet), waiting_requests=float(sim.frontend_waiting()))
        run.act(out, fleet, decided)
        to = (fleet.prefill.current_replicas if out.prefill_replicas is None else out.prefill_replicas,
              fleet.decode.current_replicas if out.decode_replicas is None else out.decode_replicas)
        events.append(WakeEvent(held, decided, to, out.prefill_replicas is not None))
        if out.prefill_replicas is None:  # nothing to wake (a pool came back meanwhile): leave it to the schedule
            return events
    return events


def ready_after(ready_log, t_s: float, targets: tuple[int, int]) -> float | None:
    """First time at or after t_s that the ready counts reached targets (both pools); None: never logged."""
    for t, p, d in ready_log:
        if t >= t_s and p >= min(targets[0], 1) and d >= min(targets[1], 1):
            return t
    return None


__all__ = ["WakeEvent", "ready_after", "wake_until"]
