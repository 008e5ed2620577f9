"""llm-d WVA ConfigMaps as our saturation settings: pure functions, no I/O.

WVA's saturation ConfigMap holds one YAML entry per key: `default`, and
per-model overrides carrying `model_id` and `namespace`; its controller
ConfigMap holds PROMETHEUS_BASE_URL, GLOBAL_OPT_INTERVAL and the like.
"""

from __future__ import annotations

import re

import yaml
from pydantic import ValidationError

from connectors.migrate.result import Migration, MigrationError
from planner.config import SaturationThresholds
from planner.strict import error_message

# WVA saturation entry fields (internal/interfaces/saturation_scaling.go) -> ours.
WVA_SATURATION_FIELDS = {
    "kvCacheThreshold": "kv_cache_threshold",
    "queueLengthThreshold": "queue_length_threshold",
    "kvSpareTrigger": "kv_spare_trigger",
    "queueSpareTrigger": "queue_spare_trigger",
}
WVA_FIELDS: dict[str, tuple[str, str]] = {
    "default": ("planner.saturation.default", "the entry's four thresholds"),
    "<entry> with model_id, namespace": ("planner.saturation.overrides['model_id#namespace']",
                                         "the entry's thresholds; an entry without both is reported"),
    **{k: (f"planner.saturation.<entry>.{v}", "as is") for k, v in WVA_SATURATION_FIELDS.items()},
    "enableLimiter": ("", "true: GPU limiter; planner.decision.max_gpu_budget is the nearest"),
    "analyzerName": ("", "saturation (V2 token-based analyzer): no equivalent, the V1 thresholds are mapped"),
    "scaleUpThreshold": ("", "V2 analyzer"),
    "scaleDownBoundary": ("", "V2 analyzer"),
    "PROMETHEUS_BASE_URL": ("metrics.prometheus_url", "as is"),
    "PROMETHEUS_TLS_INSECURE_SKIP_VERIFY": ("metrics.verify_tls", "negated"),
    "PROMETHEUS_TOKEN_PATH": ("metrics.bearer_token_file", "as is"),
    "GLOBAL_OPT_INTERVAL": ("planner.adjustment_interval_s", "a Go duration (60s, 1m) in seconds"),
}
_WVA_ENTRY_KEYS = set(WVA_SATURATION_FIELDS) | {"model_id", "namespace", "enableLimiter", "analyzerName",
                                                 "scaleUpThreshold", "scaleDownBoundary"}
_GO_DURATION = re.compile(r"^(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m(?!s))?(?:(\d+(?:\.\d+)?)s)?(?:(\d+(?:\.\d+)?)ms)?$")


def _seconds(text: str) -> float | None:
    match = _GO_DURATION.match(text.strip())
    if not match or not text.strip():
        return None
    h, m, s, ms = (float(g) if g else 0.0 for g in match.groups())
    return 3600 * h + 60 * m + s + ms / 1000


def from_wva(configmaps: list[tuple[str, dict[str, str]]], *, source: str = "WVA") -> Migration:
    """Our saturation (and metrics) settings from WVA's ConfigMaps: (name, data) of each.

    A saturation entry's missing threshold reads as 0 in WVA (Go's zero value,
    which marks every replica saturated); ours takes the recommended value,
    which is reported. An entry our stricter checks refuse (a trigger at or
    above its threshold) is reported and left out, as WVA leaves out the
    entries it refuses.
    """
    out = Migration(config={})
    saturation: dict = {"overrides": {}}
    metrics: dict = {}
    planner: dict = {}
    found = False
    for cm_name, data in configmaps:
        for key, text in data.items():
            label = f"{cm_name}/{key}"
            if key == "config.yaml" or key.isupper():
                items = _yaml_mapping(text, label=label) if key == "config.yaml" else {key: text}
                for k, v in items.items():
                    _wva_controller(f"{cm_name}/{k}", k, v, metrics, planner, out)
                continue
            try:
                entry = _yaml_mapping(text, label=label)
            except MigrationError:
                entry = {}
            if not _WVA_ENTRY_KEYS & set(entry):
                out.skip(label, text[:60], "not a WVA saturation entry: ignored")
                continue
            found = True
            ours = {WVA_SATURATION_FIELDS[k]: entry[k] for k in WVA_SATURATION_FIELDS if k in entry}
            for k in WVA_SATURATION_FIELDS:
                if k not in entry:
                    out.skip(f"{label}.{k}", None, "absent: WVA reads 0 (every replica saturated); "
                             "sla-planner takes the recommended value")
            for k in ("enableLimiter", "analyzerName", "scaleUpThreshold", "scaleDownBoundary"):
                if entry.get(k) not in (None, False, ""):
                    out.skip(f"{label}.{k}", entry[k], WVA_FIELDS[k][1])
            for k in set(entry) - _WVA_ENTRY_KEYS:
                out.skip(f"{label}.{k}", entry[k], "not a WVA saturation field: ignored")
            try:
                SaturationThresholds.model_validate(ours)
            except ValidationError as exc:
                out.skip(label, ours, "refused: " + "; ".join(error_message(e) for e in exc.errors()))
                continue
            if key == "default":
                saturation["default"] = ours
            elif entry.get("model_id") and entry.get("namespace"):
                saturation["overrides"][f"{entry['model_id']}#{entry['namespace']}"] = ours
            else:
                out.skip(label, {k: entry.get(k) for k in ("model_id", "namespace")},
                         "an override needs model_id and namespace (WVA ignores it too)")
    if not found and not metrics and not planner:
        raise MigrationError(f"{source}: no WVA saturation entry (kvCacheThreshold, ...) or controller setting "
                             "in the ConfigMap(s)")
    if found:
        planner["saturation"] = saturation
    out.config = {"planner": planner, "metrics": metrics}
    return out


def _yaml_mapping(text: str, *, label: str) -> dict:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise MigrationError(f"{label}: not valid YAML: {str(exc).splitlines()[0]}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise MigrationError(f"{label}: expected a YAML mapping, got {type(data).__name__}")
    return data


def _wva_controller(label: str, key: str, value: object, metrics: dict, planner: dict, out: Migration) -> None:
    text = str(value).strip()
    if key == "PROMETHEUS_BASE_URL":
        metrics["prometheus_url"] = text
    elif key == "PROMETHEUS_TLS_INSECURE_SKIP_VERIFY":
        metrics["verify_tls"] = text.lower() not in ("true", "1", "yes")
        if not metrics["verify_tls"]:
            out.note(f"{label}={value!r}: metrics.verify_tls false, the planner will not verify Prometheus' "
                     "TLS certificate (as WVA did not)")
    elif key == "PROMETHEUS_TOKEN_PATH":
        metrics["bearer_token_file"] = text
    elif key == "GLOBAL_OPT_INTERVAL":
        seconds = _seconds(text)
        if seconds is None or seconds <= 0:
            out.skip(label, value, "not a positive Go duration (60s, 1m): left out")
        else:
            planner["adjustment_interval_s"] = seconds
    else:
        out.skip(label, value, "WVA controller setting: no equivalent")

