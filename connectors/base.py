"""The connector interface: how a planner run reads the fleet and applies a decision.

A connector is the only thing that knows where replicas live (a Kubernetes
DynamoGraphDeployment, the "virtual" etcd key protocol, or a local file). Every
call reads fresh state from that backend, so a planner run that crashed or was
rescheduled loses nothing: the previous decision, whether it is done, and the
recent recommendations (for the scale-down stabilization window) all live in
the backend, not in the process.

Like Kubernetes' HPA, the stabilization window looks at what every run
*recommended*, not only at the targets that were applied, so a dip right after
a quiet stretch is held as long as the stretch's recommendations are in the
window. `apply` records the run's recommendation and, when the targets change,
writes them with the next decision id, in one backend write. A connector
stores either every run's recommendation (local file, etcd) or, where a write
has a cost (the Kubernetes DGD: each one is an event for the operator), only
the changes: a recommendation then counts as recommended until the run that
superseded it, and a run that changes nothing writes nothing.

Errors name the backend object and what the connector was doing. Transient
backend trouble raises `ConnectorUnavailableError` (a `ConnectionError`), so the
Prefect task's retries apply; everything else is a `ConnectorError` that a retry
will not fix.
"""

from __future__ import annotations

import json
import re
from typing import Protocol, runtime_checkable

from planner.types import Decision, DecisionRecord, FleetState


class ConnectorError(RuntimeError):
    """A connector could not do its job; the message names object, verb and cause."""


class ConnectorUnavailableError(ConnectorError, ConnectionError):
    """The backend (etcd, API server) could not be reached; retrying may help."""


def unreachable_cause(exc: BaseException) -> str:
    """Why a backend could not be reached, in a few words: "[Errno 111] Connection refused", "Read timed out".

    HTTP clients (requests, urllib3, etcd3gw) wrap the cause in hundreds of characters naming the
    connection pool, the URL and the retries, or in an empty message; the errno or the timeout is
    what the reader needs. Else the first message down the exception chain that says something.
    """
    texts, current = [], exc
    while current is not None:
        if text := str(current).strip():
            texts.append(text)
        current = current.__cause__ or current.__context__
    for pattern in (r"\[Errno -?\d+\] [^'\")]+",
                    r"(?:Read|Connection(?: to \S+)?) timed out\.?(?: \((?:read|connect) timeout=[\d.]+\))?"):
        found = next((m.group(0).strip() for text in texts if (m := re.search(pattern, text))), None)
        if found:
            return found
    return texts[0] if texts else type(exc).__name__


class ConcurrentWriteError(ConnectorError):
    """Another writer changed the planner's state between our read and our write."""


class FleetChangedError(ConnectorError):
    """Another writer changed the replicas since the run read them: its decision is stale, not written."""


def refuse_stale(decision: Decision, current: tuple[int, int], *, resource: str) -> None:
    """Raise FleetChangedError when `decision` would set targets over replicas (prefill, decode)
    other than those it was decided from (Decision.based_on)."""
    if not decision.apply or decision.based_on is None or tuple(current) == tuple(decision.based_on):
        return
    moved = ", ".join(f"{pool} {was} -> {now}" for pool, was, now in zip(("prefill", "decode"), decision.based_on,
                                                                       current) if was != now)
    raise FleetChangedError(
        f"{resource}: another writer changed the replicas since this run read them ({moved}); the decision "
        f"(prefill {decision.prefill_replicas}, decode {decision.decode_replicas}) was made from the old fleet "
        f"and is not written"
    )


class ResourceAccessError(ConnectorError):
    """The backend refused or lacks the object (HTTP 403/404 and the like)."""


@runtime_checkable
class Connector(Protocol):
    """Read current/ready replicas per pool, apply targets, report whether done."""

    def validate(self) -> None:
        """Check the backend holds what the planner needs; raise naming what is missing."""
        ...

    def read_fleet(self, *, now_s: float) -> FleetState:
        """Current and ready replicas per pool, the last decision (with its done
        flag as of now_s, seconds) and, as `recent_targets`, the recorded
        recommendations (t_s, prefill, decode), oldest first; t_s is the last
        time each was recommended (its run, or, in a change-only history, the
        run that superseded it; now_s for the current one)."""
        ...

    def apply(self, decision: Decision, *, now_s: float) -> DecisionRecord | None:
        """Record the run's recommendation and write the targets if they change, in one write.

        Every call records `recommendation_of(decision)` stamped now_s
        (seconds), whether or not anything else is written (a connector with a
        change-only history writes it only when it differs from the one in
        effect); call it once per planner run that acts (never for a dry run
        or what-if). The targets are
        written, with the next decision id, only when decision.apply is True and
        they differ from the stored ones; the new DecisionRecord is returned
        then, None otherwise. Repeating a call with the same now_s (a retried
        task) records nothing twice.
        """
        ...

    def last_decision_done(self, *, now_s: float | None = None) -> bool:
        """True when the deployment reached the last decision's targets (or there
        is none). now_s: seconds, for connectors with a done timeout; None reads
        the wall clock."""
        ...


def targets_entry(*, decision_id: int, decided_at_s: float, prefill: int, decode: int) -> dict:
    """One element of the stored history of applied decisions (JSON-friendly)."""
    return {"id": decision_id, "t_s": decided_at_s, "prefill": prefill, "decode": decode}


def parse_targets_history(text: str | bytes | None, *, source: str) -> list[dict]:
    """Decode a stored history of applied decisions; empty when absent.

    source: where the text came from (etcd key, annotation), for the error message.
    """
    if text is None or text in ("", b""):
        return []
    try:
        items = json.loads(text)
        return [
            targets_entry(
                decision_id=int(item["id"]),
                decided_at_s=float(item["t_s"]),
                prefill=int(item["prefill"]),
                decode=int(item["decode"]),
            )
            for item in items
        ]
    except (ValueError, TypeError, KeyError) as exc:
        raise ConnectorError(
            f"{source}: recent targets history is not a JSON list of "
            f'{{"id", "t_s", "prefill", "decode"}} objects ({exc}): {text[:200]!r}'
        ) from None


def append_targets(history: list[dict], entry: dict, *, max_entries: int) -> list[dict]:
    """The history with `entry` appended, keeping the newest max_entries."""
    return (list(history) + [entry])[-max_entries:]


def recommendation_of(decision: Decision) -> tuple[int, int]:
    """(prefill, decode) the run recommended: Decision.recommended_* where set, else its targets."""
    prefill = decision.recommended_prefill_replicas
    decode = decision.recommended_decode_replicas
    return (
        decision.prefill_replicas if prefill is None else prefill,
        decision.decode_replicas if decode is None else decode,
    )


def recommendation_entry(*, t_s: float, prefill: int, decode: int) -> dict:
    """One element of the stored recommendation history (JSON-friendly). t_s: run time, s."""
    return {"t_s": float(t_s), "prefill": int(prefill), "decode": int(decode)}


def parse_recommendations(text: str | bytes | None, *, source: str) -> list[dict]:
    """Decode a stored recommendation history, oldest first; empty when absent.

    source: where the text came from (etcd key, annotation, file), for the error message.
    """
    if text is None or text in ("", b""):
        return []
    try:
        items = json.loads(text)
        if not isinstance(items, list):
            raise TypeError(f"expected a list, got {type(items).__name__}")
        entries = []
        for item in items:
            prefill, decode = int(item["prefill"]), int(item["decode"])
            if prefill < 0 or decode < 0:
                raise ValueError(f"replicas must be >= 0, got prefill {prefill}, decode {decode}")
            entries.append(recommendation_entry(t_s=float(item["t_s"]), prefill=prefill, decode=decode))
    except (ValueError, TypeError, KeyError) as exc:
        raise ConnectorError(
            f"{source}: recommendation history is not a JSON list of "
            f'{{"t_s", "prefill", "decode"}} objects ({exc}): {text[:200]!r}'
        ) from None
    return sorted(entries, key=lambda e: e["t_s"])


def add_recommendation(
    history: list[dict], entry: dict, *, max_entries: int, max_age_s: float
) -> list[dict] | None:
    """The history with `entry` recorded, bounded; None when it is recorded already.

    An earlier entry with the same t_s is replaced (a retried run records once).
    Entries at or older than entry t_s - max_age_s (seconds) are dropped, then
    all but the newest max_entries. None means the identical entry is already
    stored, so there is nothing to write.
    """
    if entry in history:
        return None
    now_s = entry["t_s"]
    kept = [e for e in history if e["t_s"] != now_s and e["t_s"] > now_s - max_age_s]
    return sorted(kept + [entry], key=lambda e: e["t_s"])[-max_entries:]


def add_recommendation_change(
    changes: list[dict], entry: dict, *, max_entries: int, max_age_s: float
) -> list[dict] | None:
    """A change-only recommendation history with `entry` recorded; None when nothing changes.

    changes: entries {"t_s", "prefill", "decode"}, oldest first, each stamped
    with the first run that recommended it; a recommendation stays in effect
    until the next entry supersedes it. None when the recommendation in effect
    at entry t_s (seconds) is already entry's: an unchanged run, or a retried
    one, has nothing to write. An earlier entry with the same t_s is replaced.
    Entries superseded at or before entry t_s - max_age_s are dropped (the one
    still in effect then is kept, however old), then all but the newest
    max_entries.
    """
    if entry in changes:
        return None
    now_s = entry["t_s"]
    others = sorted((e for e in changes if e["t_s"] != now_s), key=lambda e: e["t_s"])
    before = [e for e in others if e["t_s"] < now_s]
    unchanged = bool(before) and (before[-1]["prefill"], before[-1]["decode"]) == (entry["prefill"], entry["decode"])
    if unchanged and len(others) == len(changes):
        return None
    merged = others if unchanged else sorted(others + [entry], key=lambda e: e["t_s"])
    superseded_at = [e["t_s"] for e in merged[1:]] + [float("inf")]
    kept = [e for e, end_s in zip(merged, superseded_at) if end_s > now_s - max_age_s]
    return kept[-max_entries:]


def changes_as_recent_targets(changes: list[dict], *, now_s: float) -> tuple[tuple[float, int, int], ...]:
    """FleetState.recent_targets from a change-only history: each recommendation stamped with
    the last time it was in effect (when superseded, or now_s, seconds, for the current one).

    The stabilization window then holds a recommendation until window_s after a
    later run superseded it: at most one adjustment interval longer than
    stamping every run, and, after a planner outage, for a window after restart.
    """
    ordered = sorted(changes, key=lambda e: e["t_s"])
    ends = [e["t_s"] for e in ordered[1:]] + [max(now_s, ordered[-1]["t_s"])] if ordered else []
    return tuple((end_s, e["prefill"], e["decode"]) for e, end_s in zip(ordered, ends))


def as_applied_targets(history: list[dict]) -> tuple[tuple[float, int, int], ...]:
    """FleetState.applied_targets from a stored history of applied decisions, oldest first."""
    ordered = sorted(history, key=lambda e: e["t_s"])
    return tuple((e["t_s"], e["prefill"], e["decode"]) for e in ordered)


def as_recent_targets(recommendations: list[dict]) -> tuple[tuple[float, int, int], ...]:
    """FleetState.recent_targets from a stored recommendation history, oldest first."""
    ordered = sorted(recommendations, key=lambda e: e["t_s"])
    return tuple((e["t_s"], e["prefill"], e["decode"]) for e in ordered)
