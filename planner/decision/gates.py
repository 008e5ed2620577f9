"""Hold gates: whether this run may change replicas at all, each a reason to hold or None.

A previous decision still in flight, a stale or too-old observation, metric
sources missing, load metrics missing, a fast-path cooldown: each gate is a
pure function of its inputs that returns the reason (with its numbers) or None.
"""

from __future__ import annotations

from planner.config import DecisionConfig
from planner.types import FleetState, Observation, Reason, ReasonCode, is_number


def previous_decision_gate(
    *, fleet: FleetState, cfg: DecisionConfig, now_s: float
) -> tuple[Reason | None, Reason | None]:
    """(hold, note): hold while the previous decision is not done and younger than wait_for_previous_s.

    A decision older than that (seconds, against now_s) no longer holds the
    planner; the note says so.
    """
    last = fleet.last_decision
    if last is None or last.done:
        return None, None
    age_s = now_s - last.decided_at_s
    numbers = {
        "decision_id": float(last.decision_id),
        "age_s": age_s,
        "wait_for_previous_s": cfg.wait_for_previous_s,
        "prefill_in_flight": float(last.prefill_replicas),
        "decode_in_flight": float(last.decode_replicas),
    }
    if age_s < cfg.wait_for_previous_s:
        return (
            Reason(
                ReasonCode.HOLD_PREVIOUS_NOT_DONE,
                None,
                f"decision {last.decision_id} (prefill {last.prefill_replicas}, decode {last.decode_replicas}) "
                f"not done after {age_s:.0f} s (waiting up to {cfg.wait_for_previous_s:.0f} s)",
                numbers,
            ),
            None,
        )
    return None, Reason(
        ReasonCode.PREVIOUS_DECISION_TIMED_OUT,
        None,
        f"decision {last.decision_id} still not done after {age_s:.0f} s >= {cfg.wait_for_previous_s:.0f} s: "
        "deciding again",
        numbers,
    )


def stale_gate(*, obs: Observation, cfg: DecisionConfig, now_s: float) -> Reason | None:
    """Hold when the collect step flagged its data stale or the observation is too old.

    max age: cfg.max_observation_age_s, or two adjustment intervals (seconds).
    """
    max_age_s = cfg.max_observation_age_s if cfg.max_observation_age_s is not None else 2 * obs.interval_s
    age_s = now_s - obs.taken_at_s
    why = list(obs.stale_reasons)
    if age_s > max_age_s:
        why.append(f"observation taken {age_s:.0f} s ago > {max_age_s:.0f} s")
    if not why:
        return None
    return Reason(
        ReasonCode.HOLD_STALE_METRICS,
        None,
        "metrics stale, holding current replicas: " + "; ".join(why),
        {"observation_age_s": age_s, "max_observation_age_s": max_age_s},
    )


def partial_metrics_gate(*, obs: Observation, cfg: DecisionConfig) -> Reason | None:
    """A hold reason when more than cfg.partial_metrics_max_missing_frac of a kind of metric source is missing.

    obs.coverage says, per kind (frontend scrape targets, each pool's
    workers), how many reported of how many should have; a kind with none
    expected was not checked. Sums over the sources that did report understate
    the load, so the data is a lower bound: good for a scale-up, never for a
    scale-down.
    """
    short = [c for c in obs.coverage if c.expected > 0 and c.missing_frac > cfg.partial_metrics_max_missing_frac]
    if not short:
        return None
    numbers: dict[str, float] = {"max_missing_frac": cfg.partial_metrics_max_missing_frac}
    parts = []
    for c in short:
        key = c.source.replace(" ", "_")
        numbers[f"{key}_expected"] = float(c.expected)
        numbers[f"{key}_present"] = float(c.present)
        parts.append(f"{c.missing} of {c.expected} {c.source} missing" + (f" ({c.detail})" if c.detail else ""))
    return Reason(
        ReasonCode.HOLD_PARTIAL_METRICS, None,
        "metrics partial: " + "; ".join(parts) + ": no scale-down on what is left (a scale-up still stands)",
        numbers,
    )


def missing_load_metrics(obs: Observation) -> tuple[str, ...]:
    """Names of the load metrics the interval lacks (None, NaN or inf).

    ISL/OSL are only needed when requests arrived: with zero requests they are
    undefined, not missing.
    """
    if not is_number(obs.num_requests):
        return ("num_requests",)
    if obs.num_requests == 0:
        return ()
    return tuple(n for n in ("avg_isl_tokens", "avg_osl_tokens") if not is_number(getattr(obs, n)))


def fast_path_cooldown_gate(*, fleet: FleetState, cooldown_s: float, now_s: float) -> Reason | None:
    """Skip the fast path while the last applied decision (of either kind) is younger than cooldown_s.

    Stateless: the age comes from the decision history the connector returns.
    A decision stamped after now_s (clock skew) counts as recent.
    """
    last = fleet.last_decision
    if last is None:
        return None
    age_s = now_s - last.decided_at_s
    if age_s >= cooldown_s:
        return None
    return Reason(
        ReasonCode.FAST_PATH_COOLDOWN, None,
        f"fast path skipped: decision {last.decision_id} (prefill {last.prefill_replicas}, decode "
        f"{last.decode_replicas}) applied {age_s:.0f} s ago < cooldown {cooldown_s:.0f} s",
        {"decision_id": float(last.decision_id), "age_s": age_s, "cooldown_s": cooldown_s},
    )



__all__ = [
    "fast_path_cooldown_gate",
    "missing_load_metrics",
    "partial_metrics_gate",
    "previous_decision_gate",
    "stale_gate",
]
