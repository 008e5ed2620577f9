"""engine_model "dynamo_mocker": the simulator timed as Dynamo 1.6.1's mocker times its engines.

Expected times are Dynamo 1.6.1's own: the same requests replayed through its mocker
engine in virtual time (`dynamo.replay.api.run_trace_replay`, one prefill and one
decode worker, `--planner-profile-data` = the H200 profile, no KV transfer bandwidth),
per request prefill end, first token and last token in ms. The arithmetic behind
each is written next to it, from the mocker's two lines fitted to the profile:

  prefill step(tokens) = 0.606596 + (tokens - 100) x 0.0221181 ms
      (its grid runs from (100, 0.606596) to (16372, 360.512817))
  decode step(kv, ctx)  = bilinear on its 100 x 100 grid, e.g. 6.158292 ms at (1000, 1000)
"""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest

from connectors.profiles import load_profile_dir
from sim.config import SimConfig
from sim.engine import FleetSim
from sim.fleet import FREE_TRANSFER
from sim.lookup import DriftedTables, ProfileTables
from sim.mocker_timing import MockerTables, chunked_prefill_step, mocker_perf_grids, mocker_tables
from workloads.traces import Trace

MOCKER = SimConfig(engine_model="dynamo_mocker", transfer=FREE_TRANSFER, startup_s=0.0)


@pytest.fixture(scope="module")
def tables(h200_profile_dir):
    return ProfileTables(load_profile_dir(h200_profile_dir))


@pytest.fixture(scope="module")
def profile(tables):
    return tables.profile


def _run(tables, requests):
    """requests: (arrival ms, isl, osl); returns the sim and its results, times in ms."""
    trace = Trace(name="hand", arrival_s=np.array([r[0] for r in requests], float) / 1e3,
                  isl_tokens=np.array([r[1] for r in requests], np.int64),
                  osl_tokens=np.array([r[2] for r in requests], np.int64))
    sim = FleetSim(trace, tables, config=MOCKER)
    sim.run_to_completion()
    r = sim.results()
    return np.array(sim.prefill_done_s) * 1e3, r.first_token_s * 1e3, r.finish_s * 1e3


def test_the_grids_are_dynamo_converters(profile):
    g = mocker_perf_grids(profile)
    assert g["prefill_isl"][[0, -1]] == pytest.approx([100.0, 16372.0])
    assert g["prefill_ttft_ms"][[0, -1]] == pytest.approx([0.606596, 360.512817], abs=1e-6)
    assert g["decode_itl"].shape == (100, 100)
    # the decode line at batch 1 and no KV: its intercept plus the batch slope, 6.110763 ms
    assert g["decode_itl"][0, 0] == pytest.approx(6.110763, abs=1e-6)


@pytest.mark.parametrize("tokens, expected_ms", [
    pytest.param(1000, 20.512913, id="1000: 0.606596 + 900 x 0.0221181"),
    pytest.param(6000, 131.103566, id="6000: 0.606596 + 5900 x 0.0221181"),
    pytest.param(8192, 179.586509, id="8192: one full chunk"),
    pytest.param(0, 0.0, id="nothing to prefill"),
])
def test_prefill_step(profile, tokens, expected_ms):
    assert MockerTables(profile).prefill_ms(tokens) == pytest.approx(expected_ms, abs=1e-6)


def test_decode_step(profile):
    t = MockerTables(profile)
    assert t.decode_step_ms(1000, 1000) == pytest.approx(6.158292, abs=1e-6)
    # below the second context row (138) the grid bends toward its ctx=1 column (batch = kv)
    assert t.decode_step_ms(101, 101) == pytest.approx(6.681120, abs=1e-6)
    assert t.max_kv_tokens == 16384 * 64


@pytest.mark.parametrize("isl, head_done, max_requests, expected", [
    pytest.param([5000, 5000, 5000], 0, 256, ([0], 8192, 3192), id="5000 + 3192 of the next = the budget"),
    pytest.param([5000, 5000], 3192, 256, ([0, 1], 6808, 0), id="the part-done head first: 1808 + 5000"),
    pytest.param([20000], 8192, 256, ([], 8192, 16384), id="a long prompt: one chunk a step"),
    pytest.param([20000], 16384, 256, ([0], 3616, 0), id="its last chunk: 20000 - 16384"),
    pytest.param([10, 10, 10], 0, 2, ([0, 1], 20, 0), id="max 2 requests a step"),
])
def test_chunked_prefill_step(isl, head_done, max_requests, expected):
    queue = deque(range(len(isl)))
    finished, tokens, head = chunked_prefill_step(queue, isl, head_done, 8192, max_requests)
    assert (finished, tokens, head) == expected
    assert list(queue) == [i for i in range(len(isl)) if i not in finished]


def test_one_request_alone(tables):
    pre, first, last = _run(tables, [(0, 1000, 10)])
    assert pre[0] == pytest.approx(20.512913, abs=1e-3)  # one prefill step of 1000 tokens
    assert first[0] == pytest.approx(26.671205, abs=1e-3)  # + the first decode step, 6.158292
    assert last[0] == pytest.approx(82.097105, abs=1e-3)  # + 9 steps of 6.1583-6.1585 ms


def test_a_single_token_comes_from_a_decode_step(tables):
    pre, first, last = _run(tables, [(0, 1000, 1)])
    assert first[0] == last[0] == pytest.approx(26.671205, abs=1e-3)  # 20.512913 + 6.158292


def test_two_prompts_share_a_step(tables):
    # A (1000) runs alone; B and C (3000 each) arrive during it and share the next step
    pre, first, last = _run(tables, [(0, 1000, 2), (1, 3000, 2), (2, 3000, 2)])
    assert pre[1] == pre[2] == pytest.approx(151.616479, abs=1e-3)  # 20.512913 + step(6000) 131.103566
    assert first[1:] == pytest.approx([157.930684] * 2, abs=1e-3)
    assert last[1:] == pytest.approx([164.244943] * 2, abs=1e-3)


def test_a_prompt_split_across_steps(tables):
    # A (100) runs alone; B, C, D (5000 each) wait: step 2 = B + 3192 of C, step 3 = 1808 of C + D
    pre, first, last = _run(tables, [(0, 100, 2), (0.1, 5000, 2), (0.2, 5000, 2), (0.3, 5000, 2)])
    assert pre[1] == pytest.approx(180.193105, abs=1e-3)  # 0.606596 + step(8192) 179.586509
    assert pre[2] == pre[3] == pytest.approx(329.168121, abs=1e-3)  # + step(6808) 148.975016
    assert last == pytest.approx([13.977896, 192.726614, 342.017184, 342.017184], abs=1e-3)


def test_a_decode_batch(tables):
    # B and C finish one shared prefill step (2000 tokens) and decode together: 4 steps at kv 2000-2006
    pre, first, last = _run(tables, [(0, 1000, 1), (1, 1000, 4), (2, 1000, 4)])
    assert pre[1] == pre[2] == pytest.approx(63.143957, abs=1e-3)  # 20.512913 + step(2000) 42.631044
    assert first[1:] == pytest.approx([69.349779] * 2, abs=1e-3)
    assert last[1:] == pytest.approx([87.967585] * 2, abs=1e-3)


def test_the_profile_model_is_unchanged(tables):
    trace = Trace(name="one", arrival_s=np.array([0.0]), isl_tokens=np.array([1000]), osl_tokens=np.array([10]))
    sim = FleetSim(trace, tables, config=SimConfig(transfer=FREE_TRANSFER, startup_s=0.0))
    sim.run_to_completion()
    assert sim.results().ttft_ms[0] == pytest.approx(tables.prefill_ms(1000))
    assert sim.tables is tables


def test_drift_becomes_speedup_ratios(profile):
    drifted = mocker_tables(DriftedTables(profile, prefill_scale=2.0, decode_scale=3.0))
    plain = MockerTables(profile)
    assert drifted.prefill_ms(1000) == pytest.approx(2 * plain.prefill_ms(1000))
    assert drifted.decode_step_ms(1000, 1000) == pytest.approx(3 * plain.decode_step_ms(1000, 1000))


def test_bad_inputs_are_named(profile):
    with pytest.raises(ValueError, match="engine_model must be 'profile' or 'dynamo_mocker', got 'vllm'"):
        SimConfig(engine_model="vllm")
    with pytest.raises(ValueError, match="speedup ratios must be > 0"):
        MockerTables(profile, speedup_ratio=0.0)
    with pytest.raises(ValueError, match="needs MockerTables or profile tables, got object"):
        mocker_tables(object())
