"""What the fleet executor must do to make the running workers match a decision: pure.

A worker occupies a slot (0, 1, ...) of its role; the slot fixes its ports, so
a restarted worker comes back where Prometheus already scrapes. Scale-up fills
the lowest free slots; scale-down drains the highest slots first, so the
longest-lived workers (warm caches, scraped longest) stay. A worker that
exited without being asked (killed, crashed) frees its slot and is started
again while its role's target still counts it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Role = Literal["prefill", "decode", "aggregated"]
ROLES: tuple[Role, ...] = ("prefill", "decode", "aggregated")


@dataclass(frozen=True)
class Worker:
    """One worker process the executor knows of."""

    role: Role
    slot: int
    pid: int
    draining: bool = False  # asked to stop; still finishing its in-flight requests


@dataclass(frozen=True)
class Start:
    role: Role
    slot: int


@dataclass(frozen=True)
class Drain:
    worker: Worker


Action = Start | Drain


def reconcile(targets: dict[Role, int], workers: list[Worker]) -> list[Action]:
    """Starts and drains that bring each role to its target, drains first.

    targets: wanted workers per role (a role left out keeps what it has).
    workers: the live workers; draining ones count for nothing (they are on
    their way out) but keep their slots until they exit.
    """
    actions: list[Action] = []
    starts: list[Action] = []
    for role in ROLES:
        if role not in targets:
            continue
        want = targets[role]
        if want < 0:
            raise ValueError(f"{role}: target must be >= 0, got {want}")
        mine = [w for w in workers if w.role == role]
        serving = sorted((w for w in mine if not w.draining), key=lambda w: w.slot)
        if len(serving) > want:
            actions.extend(Drain(w) for w in reversed(serving[want:]))
            continue
        taken = {w.slot for w in mine}
        free = (slot for slot in range(len(mine) + want + 1) if slot not in taken)
        starts.extend(Start(role, next(free)) for _ in range(want - len(serving)))
    return actions + starts
