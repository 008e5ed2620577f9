"""The planner's decisions kept as annotations on a Kubernetes object (a DGD, an InferencePool).

Controllers do not revert metadata, so the last decision and the recommendation
history live there, under a configurable prefix (default `sla-planner`):

- `<prefix>/decision-id`: increases by one per applied decision
- `<prefix>/decided-at-s`: Unix time of the decision, seconds
- `<prefix>/targets`: `{"prefill": n, "decode": m}`
- `<prefix>/recent-targets`: JSON list of recent applied decisions
- `<prefix>/recommendations`: JSON list of recommendation changes
  `{"t_s", "prefill", "decode"}`, oldest first, each stamped with the first
  run that recommended it and in effect until the next (stabilization window:
  a recommendation holds scale-downs until the window has passed since it was
  superseded)
"""

from __future__ import annotations

import json

from connectors.base import (
    ConnectorError,
    add_recommendation_change,
    append_targets,
    parse_recommendations,
    parse_targets_history,
    targets_entry,
)


class AnnotationLedger:
    """Reads and writes the decision annotations of one object (named `resource` in errors)."""

    def __init__(self, *, prefix: str, resource: str):
        prefix = prefix.rstrip("/")
        self.resource = resource
        self.id_key = f"{prefix}/decision-id"
        self.at_key = f"{prefix}/decided-at-s"
        self.targets_key = f"{prefix}/targets"
        self.history_key = f"{prefix}/recent-targets"
        self.recommendations_key = f"{prefix}/recommendations"

    @staticmethod
    def annotations(obj: dict) -> dict:
        return (obj.get("metadata") or {}).get("annotations") or {}

    def decision_id(self, obj: dict) -> int:
        """The last applied decision's id; 0 when none was applied."""
        text = self.annotations(obj).get(self.id_key)
        if text is None:
            return 0
        try:
            value = int(text)
        except ValueError:
            value = -1
        if value < 0:
            raise ConnectorError(f"{self.resource}: annotation {self.id_key} must be a non-negative integer, got {text!r}")
        return value

    def history(self, obj: dict) -> list[dict]:
        return parse_targets_history(self.annotations(obj).get(self.history_key),
                                     source=f"{self.resource}: annotation {self.history_key}")

    def recommendations(self, obj: dict) -> list[dict]:
        return parse_recommendations(self.annotations(obj).get(self.recommendations_key),
                                     source=f"{self.resource}: annotation {self.recommendations_key}")

    def last_targets(self, obj: dict) -> tuple[int, float, int, int] | None:
        """(decision id, decided at s, prefill, decode) of the last applied decision; None before the first."""
        decision_id = self.decision_id(obj)
        if decision_id == 0:
            return None
        annotations = self.annotations(obj)
        try:
            targets = json.loads(annotations[self.targets_key])
            return decision_id, float(annotations[self.at_key]), int(targets["prefill"]), int(targets["decode"])
        except (KeyError, ValueError, TypeError) as exc:
            raise ConnectorError(
                f"{self.resource}: annotations {self.targets_key} / {self.at_key} must accompany "
                f"{self.id_key}={decision_id} as JSON {{\"prefill\": n, \"decode\": m}} and seconds "
                f"({type(exc).__name__}: {exc})"
            ) from None

    def validate(self, obj: dict) -> None:
        """Every annotation parses (raises naming the one that does not)."""
        self.last_targets(obj)
        self.history(obj)
        self.recommendations(obj)

    def updates(self, obj: dict, *, entry: dict, want: dict[str, int] | None, now_s: float,
                max_entries: int, max_age_s: float) -> dict[str, str]:
        """The annotations to write: the recommendation `entry` when it changes what is in effect, and,
        when `want` (prefill, decode targets) is given, the next decision; {} when nothing changes."""
        out: dict[str, str] = {}
        recommendations = add_recommendation_change(self.recommendations(obj), entry, max_entries=max_entries,
                                                    max_age_s=max_age_s)
        if recommendations is not None:
            out[self.recommendations_key] = json.dumps(recommendations, separators=(",", ":"))
        if want is not None:
            new_id = self.decision_id(obj) + 1
            history = append_targets(
                self.history(obj),
                targets_entry(decision_id=new_id, decided_at_s=now_s, prefill=want["prefill"], decode=want["decode"]),
                max_entries=max_entries,
            )
            out.update({
                self.id_key: str(new_id),
                self.at_key: repr(float(now_s)),
                self.targets_key: json.dumps(want, separators=(",", ":")),
                self.history_key: json.dumps(history, separators=(",", ":")),
            })
        return out
