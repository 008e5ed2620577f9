"""Fixed rules for sharing one GPU budget, the baselines the arbitration by expected loss is measured against.

split: each deployment owns a fixed share of the budget (its floor plus an equal part of what the floors
leave, unless given) and its wants are cut to it as the single-deployment budget cuts (both pools proportionally); GPUs one deployment leaves unused
are not lent to another. priority: deployments in descending priority (ties in the order given) each get
their wants in full while the rest of the budget, less the floors still to come, holds them; the first
that does not fit is cut proportionally to what is left, the ones after it keep their floors. Neither
reads the loss tables. Both return planner.fleet.arbitrate's `Arbitration`, reasons included.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from planner.fleet.arbitrate import Arbitration, arbitrate, check_demands, finish, priority_shares, proportional_cut
from planner.fleet.demand import DeploymentDemand
from planner.types import Targets


def fixed_split(demands: Sequence[DeploymentDemand], budget_gpus: int, *,
                shares_gpus: Mapping[str, int] | None = None) -> Arbitration:
    """Each deployment cut to its own share of the budget.

    shares_gpus: GPUs per deployment name (their sum at most budget_gpus, each at least its floor's); None:
    equal shares of what the floors leave on top of each floor (planner.fleet.arbitrate.priority_shares with
    equal weights), rounded down, the GPUs rounding leaves to the first deployments in order.
    """
    check_demands(demands, budget_gpus)
    floor_gpus = sum(d.gpus(d.floor) for d in demands)
    if floor_gpus > budget_gpus:
        return finish(demands, {d.name: d.floor for d in demands}, budget_gpus=budget_gpus, rule="split",
                      notes=(f"GPU budget {budget_gpus} cannot be met: the deployments' minimums alone need "
                             f"{floor_gpus} GPUs",))
    if shares_gpus is None:
        real = priority_shares(demands, budget_gpus, weights={d.name: 1.0 for d in demands})
        shares_gpus = {n: int(math.floor(v + 1e-9)) for n, v in real.items()}
        for d in demands[:budget_gpus - sum(shares_gpus.values())]:
            shares_gpus[d.name] += 1
    for d in demands:
        if d.name not in shares_gpus:
            raise ValueError(f"fixed split: no share for deployment {d.name!r}")
        if shares_gpus[d.name] < d.gpus(d.floor):
            raise ValueError(f"fixed split: deployment {d.name!r}'s share {shares_gpus[d.name]} GPUs is below its "
                             f"minimums' {d.gpus(d.floor)}")
    if sum(shares_gpus[d.name] for d in demands) > budget_gpus:
        raise ValueError(f"fixed split: shares sum to {sum(shares_gpus.values())} GPUs, above the budget {budget_gpus}")
    targets: dict[str, Targets] = {}
    for d in demands:
        share = shares_gpus[d.name]
        targets[d.name] = dict(d.wanted) if d.gpus(d.wanted) <= share else proportional_cut(d, share)
    return finish(demands, targets, budget_gpus=budget_gpus, rule="split")


def priority_order(demands: Sequence[DeploymentDemand], budget_gpus: int) -> Arbitration:
    """Wants in full in descending priority while they fit; the first that does not is cut to what is left."""
    check_demands(demands, budget_gpus)
    order = sorted(range(len(demands)), key=lambda i: (-demands[i].priority, i))
    left = budget_gpus
    floors_after = sum(d.gpus(d.floor) for d in demands)
    targets: dict[str, Targets] = {}
    for i in order:
        d = demands[i]
        floors_after -= d.gpus(d.floor)
        room = left - floors_after
        if d.gpus(d.wanted) <= room:
            targets[d.name] = dict(d.wanted)
        elif d.gpus(d.floor) >= room or room < 1:
            targets[d.name] = d.floor
        else:
            targets[d.name] = proportional_cut(d, room)
        left -= d.gpus(targets[d.name])
    return finish(demands, {d.name: targets[d.name] for d in demands}, budget_gpus=budget_gpus, rule="priority")


# Every rule by the name an Arbitration carries: the arbitration by expected loss and the two fixed ones.
RULES = {"loss": arbitrate, "split": fixed_split, "priority": priority_order}
