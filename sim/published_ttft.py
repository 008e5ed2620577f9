"""A published latency-model document (a file) as the planner's TTFT view in a replay.

A what-if asks what the planner would do with the router's model instead of the
profile: the document is read and validated as the routing service does, and
tabulated on an idle prefill engine (routing.models.planner_view). No freshness check:
the file is the question asked.
"""

from __future__ import annotations

import json
from pathlib import Path

from planner.latency.profile import EngineProfile
from planner.latency.ttft_view import TabulatedTtftView
from routing.models.validated import parse_model_document
from routing.models.planner_view import tabulate_ttft


def load_ttft_view(path: str | Path, profile: EngineProfile) -> TabulatedTtftView:
    """The document's TTFT view; ValueError naming the file when it cannot be read, is invalid or has no TTFT p90."""
    path = Path(path)
    try:
        document = json.loads(path.read_text())
    except OSError as exc:
        raise ValueError(f"{path}: cannot read the latency model: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON: {exc}") from None
    try:
        model = parse_model_document(document)
        if not model.has_quantile("ttft", "p90"):
            raise ValueError(f"model {model.version} has no TTFT p90 model")
        return tabulate_ttft(model, profile)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
