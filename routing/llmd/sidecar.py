"""llm-d's latency-predictor sidecars, served from the routing service's own models and samples.

An EPP predicts with stateless rows and posts what it observed; this is what answers it, with no HTTP in
it (routing.llmd.app is the HTTP side):

* **Predictions** (`predict`): each row mapped onto our features (routing.llmd.rows), then the routing
  service's served model: the active published model's calibrated p90 (its online calibration included,
  the same p90 our own picker uses) as `ttft_ms`/`tpot_ms`, its mean beside them; before a model exists,
  or when the active one needs fields llm-d's rows do not carry (the running-batch fields of feature set
  2), the profile estimate, and `serving()` says which and why. A prefill pod has no TPOT (0).
* **Training rows** (`add_training`): each entry becomes a TTFT and/or TPOT sample in the routing
  service's sample store (recorded for `LLMD_SOURCE`: the EPP sends no pod id), checked for
  plausibility as every sample is, and scored at intake against the model being served, so the online
  calibration keeps the served p90 at 90% coverage from the EPP's outcomes between retrains. Training
  itself is the retrain flow's (flows/retrain.py): it reads these samples, fits, evaluates and publishes
  through its gate on its own schedule, not on every post (docs/llmd.md, "Cadence").
* **Status**: what is served (model type by its own name: `hist_gradient_boosting`, `linear` or
  `profile_estimate`), the samples held, and `/flush` (the EPP's samples only).
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from routing.features import FEATURE_SETS, LOAD_FIELDS, ROLE_CODE, ROLE_FEATURES, TTFT_FEATURES, feature_matrix
from routing.fleet.requests import Sample
from routing.llmd.rows import PredictionRow, RowError, TrainingEntry, observed_at_s, role_code, row_fields
from routing.models.predictor import PinnedModel
from routing.service import RoutingService

# The endpoint id of samples an EPP posts (its rows name no pod).
LLMD_SOURCE = "llm-d-epp"
# Fields llm-d's rows carry: a model using only these can be served to an EPP.
_CARRIED = set(LOAD_FIELDS[:7]) | set(ROLE_FEATURES) | {"tokens_generated"}
_PREFILL = ROLE_CODE["prefill"]


@dataclass(frozen=True)
class Served:
    """The model one call serves: `pinned` predicts p90 (calibrated), `mean` the mean."""

    pinned: PinnedModel
    mean: PinnedModel
    model_type: str
    reason: str
    last_load_s: float | None


@dataclass(frozen=True)
class Predictions:
    """Per row, ms: calibrated p90 (what the EPP compares with SLOs) and mean, for TTFT and TPOT."""

    ttft_ms: np.ndarray
    tpot_ms: np.ndarray
    ttft_mean_ms: np.ndarray
    tpot_mean_ms: np.ndarray
    served: Served


class LatencyPredictorSidecar:
    """llm-d's prediction and training sidecars over one RoutingService (thread-safe)."""

    def __init__(self, service: RoutingService, *, clock: Callable[[], float] = time.time):
        self.service = service
        self.clock = clock
        self._lock = threading.Lock()
        self._offered = {"entries": 0, "ttft": 0, "tpot": 0}
        self._refused = {"implausible": 0, "pod_type": 0}
        self._ids = itertools.count(1)

    # -- what is served ------------------------------------------------------

    def serving(self) -> Served:
        predictor = self.service.predictor
        pinned = dataclasses.replace(predictor.snapshot(), quantile="p90")
        if pinned.version is None:
            return self._estimate("no model is published yet")
        active = pinned.model
        names = set(FEATURE_SETS[active.feature_set]["ttft"]) | set(FEATURE_SETS[active.feature_set]["tpot"])
        if not names <= _CARRIED:
            missing = sorted(names - _CARRIED)
            return self._estimate(f"model {active.version} uses feature set {active.feature_set}, whose fields "
                                  f"{missing} llm-d's rows do not carry (train with feature_set 1 for llm-d)")
        published = {v["version"]: v["published_at_s"] for v in self.service.models.list()}
        mean = dataclasses.replace(pinned, quantile="mean", shifts=None)
        return Served(pinned, mean, _model_type(active.document), f"model {active.version}",
                      published.get(active.version))

    def _estimate(self, why: str) -> Served:
        est = self.service.predictor.estimate
        pinned = PinnedModel(est, None, "p90")
        return Served(pinned, pinned, "profile_estimate", f"profile estimate {est.name}: {why}", None)

    # -- predictions ---------------------------------------------------------

    def predict(self, rows: list[PredictionRow], *, lenient: bool = False) -> tuple[Predictions, list[RowError]]:
        """Predictions for `rows`, in order. A row with a pod_type we cannot serve raises RowError (strict),
        or (lenient) is left out: its predictions are NaN and its error is returned."""
        codes = np.empty(len(rows), dtype=np.int64)
        errors: list[RowError] = []
        for i, row in enumerate(rows):
            try:
                codes[i] = role_code(row.pod_type, i)
            except RowError as exc:
                if not lenient:
                    raise
                errors.append(exc)
                codes[i] = ROLE_CODE["aggregated"]
        served = self.serving()
        x = feature_matrix("tpot", **row_fields(rows, codes))
        xt = np.ascontiguousarray(x[:, : len(TTFT_FEATURES)])
        out = [served.pinned.predict("ttft", xt), served.pinned.predict("tpot", x),
               served.mean.predict("ttft", xt), served.mean.predict("tpot", x)]
        prefill = codes == _PREFILL
        for k in (1, 3):
            out[k] = np.where(prefill, 0.0, out[k])  # a prefill pod decodes nothing
        if errors:
            bad = np.array([e.index for e in errors])
            for arr in out:
                arr[bad] = np.nan
        return Predictions(*out, served=served), errors

    # -- training rows -------------------------------------------------------

    def add_training(self, entries: list[TrainingEntry]) -> int:
        """Offer each entry's TTFT and TPOT (those > 0) as samples; returns how many entries gave a kept sample."""
        now_s = self.clock()
        usable, codes, refused_role = [], [], 0
        for i, e in enumerate(entries):
            try:
                codes.append(role_code(e.pod_type, i))
                usable.append(e)
            except RowError:
                refused_role += 1
        samples: list[tuple[int, Sample]] = []
        if usable:
            code_arr = np.array(codes, dtype=np.int64)
            fields = row_fields(usable, code_arr)
            served = self.serving()
            x = feature_matrix("tpot", **fields)
            xt = np.ascontiguousarray(x[:, : len(TTFT_FEATURES)])
            predicted = {"ttft": served.pinned.predict("ttft", xt), "tpot": served.pinned.predict("tpot", x)}
            raw_names = [f for f in fields if f != "role"]
            for i, e in enumerate(usable):
                role = _ROLE_NAME[codes[i]]
                request_id = f"llmd-{next(self._ids)}"
                features = {f: float(fields[f][i]) for f in raw_names}
                at_s = observed_at_s(e, now_s)
                for target, observed in (("ttft", e.actual_ttft_ms), ("tpot", e.actual_tpot_ms)):
                    if observed <= 0 or (target == "tpot" and role == "prefill"):
                        continue
                    samples.append((i, Sample(
                        target=target, request_id=request_id, endpoint_id=LLMD_SOURCE, role=role,
                        features=features, observed_ms=float(observed),
                        predicted_ms=float(predicted[target][i]), model_version=served.pinned.version,
                        recorded_at_s=at_s)))
        kept = self.service.offer_samples([s for _, s in samples], event="llmd_training")
        kept_ids = {id(s) for s in kept}
        entries_kept = {i for i, s in samples if id(s) in kept_ids}
        with self._lock:
            self._offered["entries"] += len(entries)
            for s in kept:
                self._offered[s.target] += 1
            self._refused["implausible"] += len(samples) - len(kept)
            self._refused["pod_type"] += refused_role
        return len(entries_kept)

    def data_status(self) -> dict:
        held = self.service.samples.count(LLMD_SOURCE)
        with self._lock:
            offered, refused = dict(self._offered), dict(self._refused)
        return {
            "training_data": {"total_samples": held["ttft"] + held["tpot"], "ttft_samples": held["ttft"],
                              "tpot_samples": held["tpot"]},
            # The retrain flow holds out the most recent share of samples at each retrain
            # (routing.training.split); no separate test set is kept between retrains.
            "test_data": {"total_samples": 0, "ttft_samples": 0, "tpot_samples": 0,
                          "note": "held out at each retrain: the most recent share of samples"},
            "since_start": {"entries_posted": offered["entries"], "ttft_kept": offered["ttft"],
                            "tpot_kept": offered["tpot"], "refused": refused},
            "ensemble": {"ensemble_mode": False, "ensemble_active": False},
        }

    def flush(self, *, training: bool, test: bool, metrics: bool) -> dict:
        gone = self.service.discard_samples(LLMD_SOURCE) if training else {"ttft": 0, "tpot": 0}
        if metrics:
            with self._lock:
                self._offered = dict.fromkeys(self._offered, 0)
                self._refused = dict.fromkeys(self._refused, 0)
        return {"ttft_training_samples_flushed": gone["ttft"], "tpot_training_samples_flushed": gone["tpot"],
                "ttft_test_samples_flushed": 0, "tpot_test_samples_flushed": 0, "metrics_cleared": metrics}

    # -- model files ---------------------------------------------------------

    def model_document(self) -> dict | None:
        """The served model's published document (our safe JSON format), None while the estimate serves."""
        served = self.serving()
        return None if served.pinned.version is None else served.pinned.model.document


def _model_type(document: dict) -> str:
    """The served regressors' kind, named as our document names it (e.g. hist_gradient_boosting)."""
    kinds = {(m or {}).get("kind") for t in document["targets"].values() for m in (t.get("p90"), t.get("mean")) if m}
    return "+".join(sorted(k for k in kinds if k))


_ROLE_NAME = {code: role for role, code in ROLE_CODE.items()}
