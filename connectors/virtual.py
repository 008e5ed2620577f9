"""The "virtual" connector: Dynamo 1.6.1's etcd key protocol, the environment does the scaling.

Decision keys, exactly as Dynamo's own VirtualConnectorCoordinator writes them
and its VirtualConnectorClient reads them (decimal strings), under
`connector.key_prefix`, default `v1/{namespace}/planner/`:

- `num_prefill_workers`, `num_decode_workers`: the targets (written by us)
- `decision_id`: the decision's id (written by us; the first is 0, as Dynamo's)
- `scaled_decision_id`: the newest decision the environment has carried out
  (written by the environment: Dynamo's client, under its own lease)

The planner's own bookkeeping lives outside that prefix, under
`connector.bookkeeping_prefix` (default `sla-planner/{namespace}/planner/`), so
Dynamo's client, which watches its prefix, is never woken by it:

- `decided_at_s`: `{"id", "t_s"}`: when the decision with that id was written (by
  us), or first seen (one written by someone else, e.g. Dynamo's own planner)
- `recent_targets`: JSON list of recent applied decisions `{"id", "t_s", "prefill", "decode"}`
- `recommendations`: JSON list of every run's recommendation `{"t_s", "prefill",
  "decode"}`, oldest first, for the scale-down stabilization window

Unlike Dynamo's coordinator, nothing is written under a lease: a planner flow
run is a short process, and its decision must outlive it. Each run writes in
one transaction (decision keys and bookkeeping alike): the recommendation
always, targets and a new id when the targets change. A new id exceeds both the
stored `decision_id` and the environment's `scaled_decision_id`, so a client
that acknowledged a higher id (from a restarted Dynamo planner, which starts
again at 0) still sees our decision as new. The transaction compares the
stored `decision_id` with the one we read, so two planners never write the
same id and a crashed run never skips or reuses one, and the recommendation
history's revision, so no run's recommendation is lost; when only that moved,
the connector reads afresh and retries.

A decision is done once `scaled_decision_id >= decision_id`; until then the
planner holds (Dynamo's semantics), at most `done_timeout_s` (Dynamo's planner
waits 1800 s) after the decision was written or first seen. A keyset Dynamo's
own planner wrote (the three keys, no bookkeeping) is read as that planner
left it. Keys under the decision prefix that are not the protocol's are
ignored, as Dynamo's client ignores them. `key_prefix: "/{namespace}/planner/"`
selects the layout Dynamo's planner documentation describes.
"""

from __future__ import annotations

import json
import time
from urllib.parse import urlsplit

from etcd3gw.client import Etcd3Client
from etcd3gw.exceptions import ConnectionFailedError, ConnectionTimeoutError, Etcd3Exception
from etcd3gw.utils import _decode, _encode

from connectors.base import (
    ConcurrentWriteError,
    ConnectorError,
    ConnectorUnavailableError,
    add_recommendation,
    append_targets,
    as_applied_targets,
    as_recent_targets,
    parse_recommendations,
    parse_targets_history,
    refuse_stale,
    recommendation_entry,
    recommendation_of,
    targets_entry,
    unreachable_cause,
)
from connectors.config import VirtualConnectorConfig
from planner.types import Decision, DecisionRecord, FleetState, PoolState

KEY_PREFILL = "num_prefill_workers"
KEY_DECODE = "num_decode_workers"
KEY_DECISION_ID = "decision_id"
KEY_SCALED_ID = "scaled_decision_id"
KEY_DECIDED_AT = "decided_at_s"
KEY_HISTORY = "recent_targets"
KEY_RECOMMENDATIONS = "recommendations"
DECISION_KEYS = (KEY_PREFILL, KEY_DECODE, KEY_DECISION_ID, KEY_SCALED_ID)
BOOKKEEPING_KEYS = (KEY_DECIDED_AT, KEY_HISTORY, KEY_RECOMMENDATIONS)
_WRITTEN_TOGETHER = (KEY_PREFILL, KEY_DECODE, KEY_DECISION_ID)


class VirtualConnector:
    """Connector over the etcd key protocol; every call reads etcd afresh."""

    def __init__(
        self,
        config: VirtualConnectorConfig,
        *,
        default_namespace: str = "default",
        client: Etcd3Client | None = None,
    ):
        self.config = config
        self.namespace = config.namespace or default_namespace
        self.prefix = config.key_prefix.format(namespace=self.namespace)
        self.bookkeeping_prefix = config.bookkeeping_prefix.format(namespace=self.namespace)
        if client is None:
            parts = urlsplit(config.etcd_url)
            client = Etcd3Client(
                host=parts.hostname or "127.0.0.1",
                port=parts.port or 2379,
                protocol=parts.scheme,
                timeout=config.request_timeout_s,
            )
        self._client = client

    # -- Connector interface -------------------------------------------------

    def validate(self) -> None:
        """Reach etcd and check the stored keys are complete and well formed."""
        state = self._read_state(doing="validating")
        self._targets(state)
        self._int(state, KEY_DECISION_ID)
        self._int(state, KEY_SCALED_ID)
        self._decided_at(state, now_s=time.time())
        parse_targets_history(state.get(KEY_HISTORY), source=self._key(KEY_HISTORY))
        self._recommendations(state)

    def read_fleet(self, *, now_s: float) -> FleetState:
        """Targets as current replicas; ready = targets of the newest decision the
        environment confirmed (the initial replicas before any)."""
        state = self._read_state(doing="reading the fleet")
        targets = self._targets(state)
        history = parse_targets_history(state.get(KEY_HISTORY), source=self._key(KEY_HISTORY))
        record = self._record(state, now_s=now_s)
        ready = self._confirmed_targets(state, history, record)
        cfg = self.config
        return FleetState(
            prefill=PoolState(targets[0], ready[0], cfg.gpus_per_prefill_replica),
            decode=PoolState(targets[1], ready[1], cfg.gpus_per_decode_replica),
            last_decision=record,
            recent_targets=as_recent_targets(self._recommendations(state)),
            applied_targets=as_applied_targets(history),
        )

    def apply(self, decision: Decision, *, now_s: float) -> DecisionRecord | None:
        """Record the recommendation and write changed targets, id, time and history in one transaction.

        Returns the new decision's record, or None when no targets were written
        (decision.apply False, or the stored targets already equal the
        decision's). Raises ConcurrentWriteError if decision_id changed since
        our read (another planner wrote); when only the recommendation history
        changed, reads afresh and retries up to config.conflict_retries times.
        """
        cfg = self.config
        want = (decision.prefill_replicas, decision.decode_replicas)
        recommended = recommendation_of(decision)
        entry = recommendation_entry(t_s=now_s, prefill=recommended[0], decode=recommended[1])
        for _ in range(cfg.conflict_retries + 1):
            state, revisions = self._read_state_and_revisions(doing="reading before apply")
            prev_id = self._int(state, KEY_DECISION_ID)
            scaled_id = self._int(state, KEY_SCALED_ID)
            refuse_stale(decision, self._targets(state), resource=f"etcd {cfg.etcd_url} {self._key('')}")
            recommendations = add_recommendation(
                self._recommendations(state), entry, max_entries=cfg.history_max_entries, max_age_s=cfg.history_max_age_s
            )
            changes = decision.apply and not (prev_id is not None and self._targets(state) == want)
            new_id = max(-1 if prev_id is None else prev_id, -1 if scaled_id is None else scaled_id) + 1
            values: dict[str, str] = {}
            if not changes and prev_id is not None and self._decided_at_entry(state) is None:
                # A decision someone else wrote (Dynamo's planner): remember when we first saw it,
                # so waiting for its acknowledgement is bounded by done_timeout_s.
                values[KEY_DECIDED_AT] = json.dumps({"id": prev_id, "t_s": float(now_s)}, separators=(",", ":"))
            if changes:
                history = append_targets(
                    parse_targets_history(state.get(KEY_HISTORY), source=self._key(KEY_HISTORY)),
                    targets_entry(decision_id=new_id, decided_at_s=now_s, prefill=want[0], decode=want[1]),
                    max_entries=cfg.history_max_entries,
                )
                values.update({
                    KEY_PREFILL: str(want[0]),
                    KEY_DECODE: str(want[1]),
                    KEY_DECISION_ID: str(new_id),
                    KEY_DECIDED_AT: json.dumps({"id": new_id, "t_s": float(now_s)}, separators=(",", ":")),
                    KEY_HISTORY: json.dumps(history, separators=(",", ":")),
                })
            if recommendations is not None:
                values[KEY_RECOMMENDATIONS] = json.dumps(recommendations, separators=(",", ":"))
            if not values:
                return None
            id_key = _encode(self._key(KEY_DECISION_ID))
            txn = {
                "compare": [
                    self._unchanged(KEY_DECISION_ID, revisions),
                    self._unchanged(KEY_RECOMMENDATIONS, revisions),
                ],
                "success": [
                    {"request_put": {"key": _encode(self._key(k)), "value": _encode(v)}} for k, v in values.items()
                ],  # no lease: a decision outlives the run that wrote it
                "failure": [{"request_range": {"key": id_key}}],
            }
            doing = (
                f"writing decision {new_id} (prefill {want[0]}, decode {want[1]})"
                if changes
                else f"recording the recommendation (prefill {recommended[0]}, decode {recommended[1]})"
            )
            result = self._call(lambda: self._client.transaction(txn), doing=doing)
            if result.get("succeeded", False):
                return DecisionRecord(new_id, float(now_s), want[0], want[1], done=False) if changes else None
            stored_id = _range_value(result)
            if stored_id != (str(prev_id) if prev_id is not None else "(absent)"):
                raise ConcurrentWriteError(
                    f"etcd {cfg.etcd_url}: {doing}: {self._key(KEY_DECISION_ID)} is no longer "
                    f"{prev_id if prev_id is not None else '(absent)'} but {stored_id}: another "
                    f"planner wrote a decision since this run read it; nothing written"
                )
            # Only the recommendation history moved (another run recorded): read afresh.
        raise ConcurrentWriteError(
            f"etcd {cfg.etcd_url}: {doing}: {self._key(KEY_RECOMMENDATIONS)} kept changing between our read "
            f"and our write ({cfg.conflict_retries + 1} attempts, conflict_retries={cfg.conflict_retries}); "
            f"nothing written"
        )

    def last_decision_done(self, *, now_s: float | None = None) -> bool:
        now_s = time.time() if now_s is None else now_s
        record = self._record(self._read_state(doing="checking the last decision"), now_s=now_s)
        return record is None or record.done

    # -- helpers -------------------------------------------------------------

    def _key(self, name: str) -> str:
        return (self.bookkeeping_prefix if name in BOOKKEEPING_KEYS else self.prefix) + name

    def _call(self, fn, *, doing: str):
        try:
            return fn()
        except (ConnectionFailedError, ConnectionTimeoutError) as exc:
            raise ConnectorUnavailableError(
                f"etcd {self.config.etcd_url}: {doing} under {self.prefix}: unreachable ({unreachable_cause(exc)})"
            ) from exc
        except Etcd3Exception as exc:
            raise ConnectorError(
                f"etcd {self.config.etcd_url}: {doing} under {self.prefix}: "
                f"{type(exc).__name__}: {exc.detail_text or exc}"
            ) from exc

    def _read_state(self, *, doing: str) -> dict[str, str]:
        return self._read_state_and_revisions(doing=doing)[0]

    def _read_state_and_revisions(self, *, doing: str) -> tuple[dict[str, str], dict[str, int]]:
        """Values and mod revisions of the planner's keys, by name under the prefix."""
        # Both prefixes in one transaction: one consistent snapshot (one etcd revision).
        reads = [{"request_range": {"key": _encode(prefix), "range_end": _encode(_prefix_end(prefix))}}
                 for prefix in (self.prefix, self.bookkeeping_prefix)]
        result = self._call(lambda: self._client.transaction({"compare": [], "success": reads, "failure": []}),
                            doing=doing)
        state: dict[str, str] = {}
        revisions: dict[str, int] = {}
        for response, (prefix, names) in zip(result.get("responses", []),
                                             ((self.prefix, DECISION_KEYS), (self.bookkeeping_prefix, BOOKKEEPING_KEYS))):
            for kv in response.get("response_range", {}).get("kvs", []) or []:
                name = _decode(kv["key"]).decode()[len(prefix):]
                if name in names:  # anything else under a prefix is not ours to read (Dynamo ignores it too)
                    state[name] = _decode(kv["value"]).decode()
                    revisions[name] = int(kv["mod_revision"])
        return state, revisions

    def _unchanged(self, name: str, revisions: dict[str, int]) -> dict:
        """Transaction compare: the key is as we read it (same mod revision, or still absent)."""
        key = _encode(self._key(name))
        if name not in revisions:
            return {"key": key, "result": "EQUAL", "target": "CREATE", "create_revision": 0}
        return {"key": key, "result": "EQUAL", "target": "MOD", "mod_revision": revisions[name]}

    def _recommendations(self, state: dict[str, str]) -> list[dict]:
        return parse_recommendations(state.get(KEY_RECOMMENDATIONS), source=self._key(KEY_RECOMMENDATIONS))

    def _int(self, state: dict[str, str], name: str) -> int | None:
        if name not in state:
            return None
        try:
            value = int(state[name])
        except ValueError:
            raise ConnectorError(
                f"etcd {self._key(name)}: expected a non-negative integer, got {state[name]!r}"
            ) from None
        if value < 0:
            if value == -1 and name == KEY_SCALED_ID:
                return None  # what Dynamo reads for an absent key
            raise ConnectorError(f"etcd {self._key(name)}: expected a non-negative integer, got {value}")
        return value

    def _decided_at_entry(self, state: dict[str, str]) -> tuple[int, float] | None:
        """(decision id, Unix s) of the bookkeeping time stamp, when it belongs to the stored decision."""
        if KEY_DECIDED_AT not in state:
            return None
        text = state[KEY_DECIDED_AT]
        try:
            entry = json.loads(text)
            stamp = (int(entry["id"]), float(entry["t_s"]))
        except (ValueError, TypeError, KeyError):
            raise ConnectorError(
                f'etcd {self._key(KEY_DECIDED_AT)}: expected {{"id": n, "t_s": seconds}}, got {text[:200]!r}'
            ) from None
        return stamp if stamp[0] == self._int(state, KEY_DECISION_ID) else None

    def _decided_at(self, state: dict[str, str], *, now_s: float) -> float:
        """When the stored decision was written (ours) or first seen (someone else's); now_s if never seen."""
        entry = self._decided_at_entry(state)
        return now_s if entry is None else entry[1]

    def _targets(self, state: dict[str, str]) -> tuple[int, int]:
        present = [k for k in _WRITTEN_TOGETHER if k in state]
        if not present:
            return (self.config.initial_prefill_replicas, self.config.initial_decode_replicas)
        missing = [self._key(k) for k in _WRITTEN_TOGETHER if k not in state]
        if missing:
            raise ConnectorError(
                f"etcd {self.prefix}: keys written together are incomplete, missing {missing}; "
                f"another writer touched the planner's decision keys"
            )
        return (self._int(state, KEY_PREFILL), self._int(state, KEY_DECODE))

    def _record(self, state: dict[str, str], *, now_s: float) -> DecisionRecord | None:
        decision_id = self._int(state, KEY_DECISION_ID)
        if decision_id is None:
            return None
        prefill, decode = self._targets(state)
        decided_at_s = self._decided_at(state, now_s=now_s)
        scaled_id = self._int(state, KEY_SCALED_ID)
        confirmed = scaled_id is not None and scaled_id >= decision_id
        timed_out = now_s - decided_at_s >= self.config.done_timeout_s
        return DecisionRecord(decision_id, decided_at_s, prefill, decode, done=confirmed or timed_out)

    def _confirmed_targets(
        self, state: dict[str, str], history: list[dict], record: DecisionRecord | None
    ) -> tuple[int, int]:
        scaled_id = self._int(state, KEY_SCALED_ID)
        if record is not None and scaled_id is not None and scaled_id >= record.decision_id:
            return (record.prefill_replicas, record.decode_replicas)
        confirmed = [e for e in history if scaled_id is not None and e["id"] <= scaled_id]
        if confirmed:
            newest = max(confirmed, key=lambda e: e["id"])
            return (newest["prefill"], newest["decode"])
        return (self.config.initial_prefill_replicas, self.config.initial_decode_replicas)


def _prefix_end(prefix: str) -> str:
    """etcd's range_end for every key starting with prefix (its last byte plus one)."""
    raw = prefix.encode()
    return (raw[:-1] + bytes([raw[-1] + 1])).decode()


def _range_value(txn_result: dict) -> str:
    """The value the failure branch's range read returned, for error messages."""
    try:
        kvs = txn_result["responses"][0]["response_range"].get("kvs") or []
        return _decode(kvs[0]["value"]).decode() if kvs else "(absent)"
    except (KeyError, IndexError, TypeError):
        return "(unknown)"

