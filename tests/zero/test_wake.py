"""Wake from zero: the signal's table and the scale-up it decides."""

from __future__ import annotations

import math

import pytest

from planner.config import DecisionConfig, PoolBounds, ScaleToZeroConfig
from planner.decision.wake import at_zero, decide_wake, wake_signal
from planner.types import DecisionRecord, FleetState, PoolState


def cfg(prefill_min=0, decode_min=0, wake_replicas=1, decode_max=4):
    return DecisionConfig(prefill=PoolBounds(min_replicas=prefill_min, max_replicas=4),
                          decode=PoolBounds(min_replicas=decode_min, max_replicas=decode_max),
                          allow_scale_to_zero=True, scale_to_zero=ScaleToZeroConfig(wake_replicas=wake_replicas))


def fleet(prefill, decode, last=None):
    return FleetState(prefill=PoolState(prefill, prefill), decode=PoolState(decode, decode), last_decision=last)


@pytest.mark.parametrize("fl, c, expected", [
    pytest.param(fleet(0, 0), cfg(), ("prefill", "decode"), id="both at zero"),
    pytest.param(fleet(1, 0), cfg(prefill_min=1), ("decode",), id="prefill min 1: only decode can be at zero"),
    pytest.param(fleet(1, 1, DecisionRecord(3, 0.0, 0, 0, done=False)), cfg(), ("prefill", "decode"),
                 id="a pending decision to zero counts as zero"),
    pytest.param(fleet(0, 0, DecisionRecord(3, 0.0, 1, 1, done=False)), cfg(), (),
                 id="a wake in flight: nothing at zero"),
])
def test_at_zero(fl, c, expected):
    assert at_zero(fl, c) == expected


@pytest.mark.parametrize("pools, waiting, fire, message", [
    (("decode",), 1.0, True, "decode at zero with 1 requests waiting (>= 1)"),
    (("prefill", "decode"), 0.0, False, "prefill and decode at zero, 0 requests waiting (< 1)"),
    (("decode",), None, False, "decode at zero, waiting requests not known"),
    (("decode",), math.nan, False, "decode at zero, waiting requests not known"),
    ((), 50.0, False, "no pool at zero"),
])
def test_wake_signal(pools, waiting, fire, message):
    s = wake_signal(pools_at_zero=pools, waiting_requests=waiting, min_requests=1.0)
    assert (s.fire, s.message) == (fire, message)


@pytest.mark.parametrize("fl, c, expected, applies", [
    pytest.param(fleet(0, 0), cfg(), (1, 1), True, id="both woken to 1"),
    pytest.param(fleet(0, 0), cfg(wake_replicas=3, decode_max=2), (3, 2), True, id="wake 3, decode max 2"),
    pytest.param(fleet(2, 0), cfg(), (2, 1), True, id="decode alone at zero"),
    pytest.param(fleet(0, 0, DecisionRecord(3, 0.0, 1, 1, done=False)), cfg(), (1, 1), False,
                 id="wake already in flight: not doubled"),
])
def test_decide_wake(fl, c, expected, applies):
    s = wake_signal(pools_at_zero=at_zero(fl, c), waiting_requests=2.0, min_requests=1.0)
    d = decide_wake(fleet=fl, cfg=c, signal=s)
    assert ((d.prefill_replicas, d.decode_replicas), d.apply) == (expected, applies)
    assert d.codes()[0] == "wake_from_zero"


def test_decide_wake_reason_names_the_requests():
    s = wake_signal(pools_at_zero=("prefill", "decode"), waiting_requests=2.0, min_requests=1.0)
    d = decide_wake(fleet=fleet(0, 0), cfg=cfg(), signal=s)
    assert d.reasons[1].message == "decode: 0 -> 1: prefill and decode at zero with 2 requests waiting (>= 1)"
    quiet = wake_signal(pools_at_zero=("prefill", "decode"), waiting_requests=0.0, min_requests=1.0)
    assert decide_wake(fleet=fleet(0, 0), cfg=cfg(), signal=quiet).apply is False
