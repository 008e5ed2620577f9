"""Topology domains: reading them from label files, same-domain filters, KV-transfer cost.

Endpoints carry one domain value per level (e.g. zone=us-east-1a, rack=r22).
In Kubernetes the values reach a worker as one file per level in a Downward
API volume (`<dir>/zone`, `<dir>/rack`); the labelling controller writes them
after scheduling, so a file can appear late: `read_domain_labels` waits for the
configured level's file and fails with a clear error if it never comes.

The filters work on integer domain codes (one column per level, -1 = label
missing), so a pick over many endpoints is a few numpy operations. Two
endpoints "share a level" when their values match at that level and every
broader one; the narrowest shared level prices a KV transfer from the QoS
table: weight * (latency_ms + kv_bytes / bandwidth).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

from routing.config import NO_SHARED_DOMAIN, LevelQos

MISSING = -1


class TopologyLabelError(RuntimeError):
    """A required topology label file never appeared (or is unreadable)."""


def read_domain_labels(
    labels_dir: str | Path,
    *,
    levels: Sequence[str],
    required_level: str | None,
    wait_s: float,
    poll_s: float,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> dict[str, str]:
    """Domain value per level from `<labels_dir>/<level>` files (whitespace stripped).

    Levels whose file is absent or empty are left out. When `required_level` is
    set, its file is retried every `poll_s` seconds for up to `wait_s` seconds;
    still missing or empty after that raises TopologyLabelError naming the file.
    """
    folder = Path(labels_dir)
    deadline = clock() + wait_s
    while True:
        labels = _read_once(folder, levels)
        if required_level is None or required_level in labels:
            return labels
        if clock() >= deadline:
            path = folder / required_level
            state = "is empty" if path.is_file() else "does not exist"
            raise TopologyLabelError(
                f"topology label file {path} {state} after waiting {wait_s:g} s "
                f"(level {required_level!r} is the configured KV-transfer level; "
                f"is the Downward API volume mounted and the node labelled?)"
            )
        sleep(poll_s)


def _read_once(folder: Path, levels: Sequence[str]) -> dict[str, str]:
    labels = {}
    for level in levels:
        path = folder / level
        try:
            value = path.read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            continue
        except (OSError, UnicodeDecodeError) as exc:
            raise TopologyLabelError(f"topology label file {path}: unreadable: {exc}") from None
        if value:
            labels[level] = value
    return labels


def prefill_has_local_decode(prefill_codes: np.ndarray, decode_codes: np.ndarray) -> np.ndarray:
    """Mask over prefill endpoints: labelled and sharing their domain with >= 1 labelled decode.

    prefill_codes, decode_codes: domain codes at the KV-transfer level (-1 = missing).
    """
    # Codes are small interned integers: a lookup table beats np.isin.
    size = int(max(prefill_codes.max(initial=MISSING), decode_codes.max(initial=MISSING))) + 1
    if size <= 0:
        return np.zeros(prefill_codes.shape, dtype=bool)
    present = np.zeros(size + 1, dtype=bool)  # last slot: where MISSING (-1) indexes
    present[decode_codes[decode_codes != MISSING]] = True
    return (prefill_codes != MISSING) & present[prefill_codes]


def shared_depth(source_codes: np.ndarray, target_codes: np.ndarray) -> np.ndarray:
    """How many levels, broadest first, each target shares with the source (0..L).

    source_codes: (L,) codes of the source endpoint; target_codes: (n, L).
    A missing label on either side ends the shared prefix.
    """
    same = (target_codes == source_codes) & (source_codes != MISSING)
    # Shared depth = length of the leading run of True per row.
    return np.cumprod(same, axis=1).sum(axis=1)


def cost_table_ms(qos: Mapping[str, LevelQos], levels: Sequence[str], *, kv_bytes: float) -> np.ndarray:
    """Transfer cost per shared depth (index 0 = no shared domain ... L = narrowest level), ms.

    kv_bytes: bytes of KV cache to move. Empty qos: all zeros (no soft scoring).
    """
    if not qos:
        return np.zeros(len(levels) + 1)
    keys = [NO_SHARED_DOMAIN, *levels]
    return np.array(
        [qos[k].weight * (qos[k].latency_ms + kv_bytes / (qos[k].bandwidth_gbyte_per_s * 1e9) * 1e3) for k in keys]
    )


def relation_name(depth: int, levels: Sequence[str]) -> str:
    """The narrowest shared level for a shared depth (or 'none')."""
    return NO_SHARED_DOMAIN if depth == 0 else levels[depth - 1]
