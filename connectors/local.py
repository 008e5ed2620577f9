"""The local connector: no cluster, the "fleet" is a JSON file (or memory).

For the embedded default and what-if runs on one machine. Applying a decision
sets the targets; ready replicas reach them `apply_delay_s` later (0: at once),
measured on the caller's clock (`now_s`), so a simulated clock works too. With
a `state_path` every call reads the file afresh and writes it atomically, so
separate planner runs (processes) share the state like they would a cluster's.

The state holds the targets, the last decision, the recent applied decisions
(`history`) and every run's recommendation (`recommendations`, for the
scale-down stabilization window); `apply` updates them in one file write.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from pathlib import Path

from connectors.base import (
    ConnectorError,
    add_recommendation,
    append_targets,
    as_applied_targets,
    as_recent_targets,
    parse_recommendations,
    parse_targets_history,
    recommendation_entry,
    recommendation_of,
    refuse_stale,
    targets_entry,
)
from connectors.config import LocalConnectorConfig
from planner.types import Decision, DecisionRecord, FleetState, PoolState

_STATE_VERSION = 1


class LocalConnector:
    """Connector over a local JSON state file, or in memory without one."""

    def __init__(self, config: LocalConnectorConfig):
        self.config = config
        self.path = Path(config.state_path) if config.state_path else None
        self._memory: dict | None = None
        self._lock = threading.Lock()

    # -- Connector interface -------------------------------------------------

    def validate(self) -> None:
        """The state file, if it exists, is readable and well formed."""
        self._load()

    def read_fleet(self, *, now_s: float) -> FleetState:
        state = self._load()
        ready = self._ready(state, now_s=now_s)
        cfg = self.config
        return FleetState(
            prefill=PoolState(state["prefill"], ready[0], cfg.gpus_per_prefill_replica),
            decode=PoolState(state["decode"], ready[1], cfg.gpus_per_decode_replica),
            last_decision=self._record(state, now_s=now_s),
            recent_targets=as_recent_targets(state["recommendations"]),
            applied_targets=as_applied_targets(state["history"]),
        )

    def apply(self, decision: Decision, *, now_s: float) -> DecisionRecord | None:
        """Record the recommendation and set changed targets (ready after apply_delay_s), in one file write.

        Returns the new decision's record, or None when the targets were not
        written (decision.apply False, or already set).
        """
        cfg = self.config
        with self._lock:
            state = self._load()
            refuse_stale(decision, (state["prefill"], state["decode"]), resource=f"local fleet {cfg.state_path}")
            recommended = recommendation_of(decision)
            recommendations = add_recommendation(
                state["recommendations"],
                recommendation_entry(t_s=now_s, prefill=recommended[0], decode=recommended[1]),
                max_entries=cfg.history_max_entries,
                max_age_s=cfg.history_max_age_s,
            )
            want = (decision.prefill_replicas, decision.decode_replicas)
            changes = decision.apply and (state["prefill"], state["decode"]) != want
            if not changes:
                if recommendations is not None:
                    state["recommendations"] = recommendations
                    self._save(state)
                return None
            ready_before = self._ready(state, now_s=now_s)
            new_id = state["decision_id"] + 1
            state.update(
                prefill=want[0],
                decode=want[1],
                decision_id=new_id,
                decided_at_s=float(now_s),
                ready_before=list(ready_before),
                history=append_targets(
                    state["history"],
                    targets_entry(decision_id=new_id, decided_at_s=now_s, prefill=want[0], decode=want[1]),
                    max_entries=cfg.history_max_entries,
                ),
            )
            if recommendations is not None:
                state["recommendations"] = recommendations
            self._save(state)
        return self._record(state, now_s=now_s)

    def last_decision_done(self, *, now_s: float | None = None) -> bool:
        now_s = time.time() if now_s is None else now_s
        record = self._record(self._load(), now_s=now_s)
        return record is None or record.done

    # -- state ---------------------------------------------------------------

    def _initial(self) -> dict:
        cfg = self.config
        return {
            "version": _STATE_VERSION,
            "prefill": cfg.initial_prefill_replicas,
            "decode": cfg.initial_decode_replicas,
            "decision_id": 0,
            "decided_at_s": None,
            "ready_before": [cfg.initial_prefill_replicas, cfg.initial_decode_replicas],
            "history": [],
            "recommendations": [],
        }

    def _load(self) -> dict:
        if self.path is None:
            if self._memory is None:
                self._memory = self._initial()
            return json.loads(json.dumps(self._memory))
        if not self.path.exists():
            return self._initial()
        try:
            state = json.loads(self.path.read_text())
            if not isinstance(state, dict):
                raise ValueError(f"expected a JSON object, got {type(state).__name__}")
            for key in ("prefill", "decode", "decision_id"):
                if not isinstance(state.get(key), int) or state[key] < 0:
                    raise ValueError(f"{key} must be a non-negative integer, got {state.get(key)!r}")
            state["history"] = parse_targets_history(json.dumps(state.get("history", [])), source=str(self.path))
            state["recommendations"] = parse_recommendations(
                json.dumps(state.get("recommendations", [])), source=str(self.path)
            )
            ready_before = state.get("ready_before")
            if not (isinstance(ready_before, list) and len(ready_before) == 2):
                raise ValueError(f"ready_before must be [prefill, decode], got {ready_before!r}")
            if state["decision_id"] > 0 and not isinstance(state.get("decided_at_s"), (int, float)):
                raise ValueError(f"decided_at_s must be seconds, got {state.get('decided_at_s')!r}")
        except (OSError, ValueError) as exc:
            raise ConnectorError(f"local connector state {self.path}: {exc}") from None
        return state

    def _save(self, state: dict) -> None:
        if self.path is None:
            self._memory = json.loads(json.dumps(state))
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Write-then-rename so a crash never leaves half a file behind.
        fd, tmp = tempfile.mkstemp(prefix=self.path.name, dir=self.path.parent)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(state, f, indent=2)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def _reached(self, state: dict, *, now_s: float) -> bool:
        if state["decision_id"] == 0:
            return True
        return now_s >= state["decided_at_s"] + self.config.apply_delay_s

    def _ready(self, state: dict, *, now_s: float) -> tuple[int, int]:
        if self._reached(state, now_s=now_s):
            return (state["prefill"], state["decode"])
        return tuple(state["ready_before"])

    def _record(self, state: dict, *, now_s: float) -> DecisionRecord | None:
        if state["decision_id"] == 0:
            return None
        return DecisionRecord(
            state["decision_id"], state["decided_at_s"], state["prefill"], state["decode"],
            done=self._reached(state, now_s=now_s),
        )
