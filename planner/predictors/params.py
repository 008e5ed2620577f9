"""A predictor hyperparameter: its default and the values `fit` and a configuration accept."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Param:
    """One hyperparameter: its default and what `fit` (and a configuration naming it) accepts.

    kind: "int" (an integer), "number" (an int or float), "bool" or None
    (anything; the predictor checks it); ge / gt: lower bound; choices: the
    only values allowed.
    """

    name: str
    default: Any
    kind: str | None = None
    ge: float | None = None
    gt: float | None = None
    choices: tuple | None = None

    def check(self, value: Any, *, who: str) -> None:
        """Raise ValueError naming `who`, the parameter, the bound and the value when it is not accepted."""
        if self.choices is not None:
            if value not in self.choices:
                allowed = ", ".join(repr(c) for c in self.choices)
                raise ValueError(f"{who}: {self.name} must be one of {allowed}, got {value!r}")
            return
        if self.kind == "bool":
            if not isinstance(value, bool):
                raise ValueError(f"{who}: {self.name} must be true or false, got {value!r}")
            return
        if self.kind not in ("int", "number"):
            return
        numeric = isinstance(value, int) if self.kind == "int" else isinstance(value, (int, float))
        if not numeric or isinstance(value, bool) or not math.isfinite(value) or not self._in_bounds(value):
            what = "an integer" if self.kind == "int" else "a number"
            bound = f" >= {self.ge:g}" if self.ge is not None else f" > {self.gt:g}" if self.gt is not None else ""
            raise ValueError(f"{who}: {self.name} must be {what}{bound}, got {value!r}")

    def _in_bounds(self, value: float) -> bool:
        return (self.ge is None or value >= self.ge) and (self.gt is None or value > self.gt)
