"""Profile interpolation: real Dynamo/aiconfigurator profiles (both layouts) and hand-made ones."""

from __future__ import annotations

import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from connectors.profiles import load_pre_swept, load_profile, load_profile_dir, read_npz
from planner.config import ProfileConfig, SloTarget
from planner.latency.decode_profile import DecodeProfile
from planner.latency.profile import PrefillProfile
from planner.latency.profile_checks import ProfileRangeWarning
from tests.support.fixtures_profile import (
    PRE_SWEPT,
    PROFILER_DIRS,
    linear_decode,
    linear_prefill,
    pre_swept_dir,
    profiler_dir,
)

ALL_PROFILES = [*PROFILER_DIRS, *PRE_SWEPT]


def _load(shared_data, key):
    if key in PROFILER_DIRS:
        d = profiler_dir(shared_data, key)
        return load_profile_dir(d), (
            read_npz(d / "selected_prefill_interpolation" / "raw_data.npz"),
            read_npz(d / "selected_decode_interpolation" / "raw_data.npz"),
        )
    folder, ptp, dtp, gpu = PRE_SWEPT[key]
    d = pre_swept_dir(shared_data, key)
    prof = load_pre_swept(d, prefill_tp=ptp, decode_tp=dtp, gpu_type=gpu)
    p, dec = read_npz(d / "prefill.npz"), read_npz(d / "decode.npz")
    pr = [int(t) for t in p["tp"].ravel()].index(ptp)
    dr = [int(t) for t in dec["tp"].ravel()].index(dtp)
    return prof, ({k: p[k][pr].ravel() for k in p}, {k: dec[k][dr].ravel() for k in dec})


@pytest.fixture(scope="module", params=ALL_PROFILES)
def real(request, shared_data):
    return request.param, *_load(shared_data, request.param)


# -- real profiles ----------------------------------------------------------------


def test_exact_at_every_measured_point(real):
    key, prof, (p, d) = real
    with warnings.catch_warnings():
        warnings.simplefilter("error", ProfileRangeWarning)  # measured points are in range
        for isl, ttft, thpt in zip(p["prefill_isl"], p["prefill_ttft"], p["prefill_thpt_per_gpu"]):
            assert prof.prefill.ttft_ms_at(isl) == pytest.approx(ttft, rel=1e-9)
            assert prof.prefill.throughput_per_gpu_at(isl) == pytest.approx(thpt, rel=1e-9)
        for x, y, itl, thpt in zip(d["x_kv_usage"], d["y_context_length"], d["z_itl"], d["z_thpt_per_gpu"]):
            assert prof.decode.itl_ms_at(x, y) == pytest.approx(itl, rel=1e-9)
            assert prof.decode.throughput_per_gpu_at(x, y) == pytest.approx(thpt, rel=1e-9)
    assert prof.decode.max_kv_tokens == int(np.ravel(d["max_kv_tokens"])[0])


def test_between_points_stays_within_neighbours(real):
    """PCHIP never overshoots: between two measured ISLs TTFT lies between their values."""
    _, prof, (p, _) = real
    isl = np.asarray(p["prefill_isl"], float)
    ttft = np.asarray(p["prefill_ttft"], float)
    for a, b, ta, tb in zip(isl[:-1], isl[1:], ttft[:-1], ttft[1:]):
        xs = np.linspace(a, b, 21)
        vals = prof.prefill.ttft_ms_many(xs)
        assert vals.min() >= min(ta, tb) - 1e-9 and vals.max() <= max(ta, tb) + 1e-9


def test_ttft_monotone_where_measured_monotone(real):
    key, prof, (p, _) = real
    ttft = np.asarray(p["prefill_ttft"], float)
    dense = prof.prefill.ttft_ms_many(np.linspace(*prof.prefill.isl_range_tokens, 2000))
    if np.all(np.diff(ttft) > 0):
        assert np.all(np.diff(dense) >= -1e-9)
    else:
        # pre-swept 70B TP8 has a 498 ms outlier at ISL 6205 between 162 and 321 ms: follow the data
        assert key == "pre-swept-H100-70B-TP8"


def test_itl_monotone_in_kv_along_monotone_rows(real):
    _, prof, (_, d) = real
    x, y, z = (np.asarray(d[k], float) for k in ("x_kv_usage", "y_context_length", "z_itl"))
    checked = 0
    for ctx in np.unique(y):
        sel = y == ctx
        order = np.argsort(x[sel])
        if sel.sum() < 2 or not np.all(np.diff(z[sel][order]) > 0):
            continue
        kv = np.linspace(x[sel].min(), x[sel].max(), 500)
        assert np.all(np.diff(prof.decode.itl_ms_many(kv, ctx)) >= -1e-9)
        checked += 1
    assert checked >= 1


def test_best_throughput_meets_target_and_grows_with_it(real):
    _, prof, _ = real
    dec = prof.decode
    lo, hi = dec.context_range_tokens
    for ctx in np.linspace(lo, hi, 5):
        prev = 0.0
        single = dec.itl_ms_at(0.0, ctx)
        for target in (single * 1.2, single * 2, single * 3, single * 5):
            op = dec.best_throughput_per_gpu(target, ctx)
            assert op.meets_target
            assert op.itl_ms <= target * (1 + 1e-6)
            assert dec.itl_ms_at(op.kv_usage_frac, ctx) == pytest.approx(op.itl_ms, rel=1e-9)
            assert op.concurrency == pytest.approx(op.kv_usage_frac * dec.max_kv_tokens / ctx)
            assert op.throughput_per_gpu >= prev - 1e-9
            prev = op.throughput_per_gpu
        miss = dec.best_throughput_per_gpu(single * 0.5, ctx)
        assert not miss.meets_target and miss.itl_ms > single * 0.5


def test_vectorised_matches_scalar(real):
    _, prof, _ = real
    rng = np.random.default_rng(0)
    isl = rng.uniform(*prof.prefill.isl_range_tokens, 50)
    assert np.allclose(prof.prefill.ttft_ms_many(isl), [prof.prefill.ttft_ms_at(v) for v in isl], rtol=1e-12)
    assert np.allclose(
        prof.prefill.throughput_per_gpu_many(isl), [prof.prefill.throughput_per_gpu_at(v) for v in isl], rtol=1e-12
    )
    ctx = rng.uniform(*prof.decode.context_range_tokens, 50)
    kv = np.array([rng.uniform(0, prof.decode.kv_range_frac(c)[1]) for c in ctx])
    assert np.allclose(prof.decode.itl_ms_many(kv, ctx), [prof.decode.itl_ms_at(a, b) for a, b in zip(kv, ctx)])
    assert np.allclose(
        prof.decode.throughput_per_gpu_many(kv, ctx),
        [prof.decode.throughput_per_gpu_at(a, b) for a, b in zip(kv, ctx)],
    )


def test_pre_swept_row_equals_profiler_output(shared_data, h200_profile_dir):
    """The H200 pre-swept row and the profiler folder hold the same measurement."""
    a = load_profile_dir(h200_profile_dir)
    b = load_pre_swept(pre_swept_dir(shared_data, "pre-swept-H200-8B-TP1"), prefill_tp=1, decode_tp=1)
    for isl in (100, 777, 5000, 16372):
        assert a.prefill.ttft_ms_at(isl) == b.prefill.ttft_ms_at(isl)
    for kv, ctx in ((0.1, 350), (0.3, 1000), (0.5, 9000)):
        assert a.decode.itl_ms_at(kv, ctx) == b.decode.itl_ms_at(kv, ctx)


def test_load_profile_from_config(shared_data, h200_profile_dir):
    prof = load_profile(ProfileConfig(dir=str(h200_profile_dir)))
    assert prof.name == "H200_TP1P_TP1D"
    d = pre_swept_dir(shared_data, "pre-swept-H100-70B-TP4")
    prof = load_profile(ProfileConfig(pre_swept_dir=str(d), prefill_tp=4, decode_tp=2, gpu_type="h100_sxm"))
    assert prof.prefill.ttft_ms_at(100) == pytest.approx(23.4231, abs=1e-4)  # row tp=4
    assert prof.decode.itl_ms_at(0.0, 350) == pytest.approx(17.5863, abs=1e-4)  # row tp=2, one request
    with pytest.raises(ValueError, match="needs prefill_tp"):
        load_profile(ProfileConfig(pre_swept_dir=str(d), decode_tp=2))


def test_pre_swept_no_matching_row_lists_available(shared_data):
    d = pre_swept_dir(shared_data, "pre-swept-H100-70B-TP4")
    with pytest.raises(ValueError, match=r"prefill.npz: no row with tp=3; available: row 0: tp=8 gpu_type=h100_sxm"):
        load_pre_swept(d, prefill_tp=3, decode_tp=4)
    with pytest.raises(ValueError, match=r"no row with tp=4 gpu_type=h200_sxm"):
        load_pre_swept(d, prefill_tp=4, decode_tp=4, gpu_type="h200_sxm")


# -- hand-made profiles: interpolation arithmetic ------------------------------------


@pytest.mark.parametrize("isl, ttft_ms", [
    pytest.param(1000, 100.0, id="measured point: 1000 -> 100 ms"),
    pytest.param(1500, 150.0, id="linear data stays linear: 1500*0.1 = 150 ms"),
    pytest.param(3000, 300.0, id="3000*0.1 = 300 ms"),
    pytest.param(500, 50.0, id="lower end: 50 ms"),
])
def test_prefill_hand(isl, ttft_ms):
    p = linear_prefill()
    assert p.ttft_ms_at(isl) == pytest.approx(ttft_ms, rel=1e-12)
    assert p.throughput_per_gpu_at(isl) == pytest.approx(10_000.0)


@pytest.mark.parametrize("kv, ctx, itl_ms, thpt", [
    pytest.param(0.5, 1000, 20.0, 5000.0, id="row 1000 measured: 20 ms, 5000 tok/s"),
    pytest.param(0.7, 1000, 25.0, 7000.0, id="row 1000: 7.5+25*0.7 = 25 ms, 10000*0.7 = 7000"),
    pytest.param(0.5, 2000, 30.0, 2500.0, id="row 2000 measured: 30 ms, 2500"),
    pytest.param(0.5, 4000 / 3, 25.0, 3750.0,
                 id="ctx 1333: 1/ctx halfway so w=0.5: ITL (20+30)/2 = 25; thpt*ctx 5e6 / 1333.3 = 3750"),
    pytest.param(0.3, 1600, 7.5 + 25 * 0.3 + 10 * (1 / 1000 - 1 / 1600) / (1 / 1000 - 1 / 2000), 5e6 * 0.6 / 1600,
                 id="ctx 1600: w=(1/1000-1/1600)/(1/1000-1/2000)=0.75 -> 15+0.75*10 = 22.5 ms; 3e6/1600 = 1875"),
    pytest.param(0.05, 1000, 10.0, 500.0,
                 id="kv 0.05 below the lowest point: single-request ITL 10 ms, throughput 10000*0.05 = 500"),
])
def test_decode_hand(kv, ctx, itl_ms, thpt):
    d = linear_decode()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ProfileRangeWarning)
        assert d.itl_ms_at(kv, ctx) == pytest.approx(itl_ms, rel=1e-12)
        assert d.throughput_per_gpu_at(kv, ctx) == pytest.approx(thpt, rel=1e-12)


@pytest.mark.parametrize("target_ms, ctx, thpt, kv, itl_ms, meets", [
    pytest.param(25.0, 1000, 7000.0, 0.7, 25.0, True, id="25 ms at ctx 1000: kv=(25-7.5)/25=0.7, thpt 7000"),
    pytest.param(20.0, 1000, 5000.0, 0.5, 20.0, True, id="20 ms: kv 0.5 (a measured point), thpt 5000"),
    pytest.param(100.0, 1000, 9000.0, 0.9, 30.0, True, id="loose target: top of the range, kv 0.9"),
    pytest.param(5.0, 1000, 1000.0, 0.1, 10.0, False, id="5 ms < 10 ms single-request ITL: unmet, lowest ITL"),
    pytest.param(30.0, 2000, 2500.0, 0.5, 30.0, True, id="30 ms at ctx 2000: kv=(30-17.5)/25=0.5, thpt 2500"),
])
def test_best_throughput_hand(target_ms, ctx, thpt, kv, itl_ms, meets):
    op = linear_decode().best_throughput_per_gpu(target_ms, ctx)
    assert op.meets_target is meets
    assert op.throughput_per_gpu == pytest.approx(thpt, rel=1e-6)
    assert op.kv_usage_frac == pytest.approx(kv, rel=1e-6)
    assert op.itl_ms == pytest.approx(itl_ms, rel=1e-6)
    assert op.concurrency == pytest.approx(kv * 100_000 / ctx, rel=1e-6)


def test_best_throughput_ignores_a_dip_after_the_target_is_exceeded():
    """ITL 10, 30, 18, 40 ms: a 20 ms target stops before the 30 ms point, not at the 18 ms dip."""
    d = DecodeProfile.from_arrays(
        {
            "x_kv_usage": np.array([0.1, 0.3, 0.5, 0.7]),
            "y_context_length": np.array([1000.0] * 4),
            "z_itl": np.array([10.0, 30.0, 18.0, 40.0]),
            "z_thpt_per_gpu": np.array([1000.0, 3000.0, 5000.0, 7000.0]),
            "max_kv_tokens": np.array([100_000]),
        },
        source="dip",
    )
    op = d.best_throughput_per_gpu(20.0, 1000)
    assert op.meets_target and 0.1 < op.kv_usage_frac < 0.3 and op.itl_ms == pytest.approx(20.0)
    assert op.throughput_per_gpu < 3000.0


# -- range handling -------------------------------------------------------------------


@pytest.mark.parametrize("call, clamped_value", [
    pytest.param(lambda p, d: p.ttft_ms_at(8000), 400.0, id="ISL 8000 > 4000: TTFT at 4000 = 400 ms"),
    pytest.param(lambda p, d: p.ttft_ms_at(100), 50.0, id="ISL 100 < 500: TTFT at 500 = 50 ms"),
    pytest.param(lambda p, d: p.ttft_ms_many([100, 1000]), [50.0, 100.0], id="vector: one warning, clamped"),
    pytest.param(lambda p, d: d.itl_ms_at(0.95, 1000), 30.0, id="KV 0.95 > 0.9: ITL at 0.9 = 30 ms"),
    pytest.param(lambda p, d: d.itl_ms_at(-0.1, 1000), 10.0, id="KV < 0: ITL at 0 -> 10 ms"),
    pytest.param(lambda p, d: d.itl_ms_at(0.5, 5000), 30.0, id="context 5000 > 2000: row 2000 = 30 ms"),
    pytest.param(lambda p, d: d.itl_ms_at(0.5, 10), 20.0, id="context 10 < 1000: row 1000 = 20 ms"),
])
def test_out_of_range_clips_with_warning_or_raises(call, clamped_value):
    with pytest.warns(ProfileRangeWarning, match=r"profile hand-(prefill|decode): .*clamped \(out_of_range='clip'\)"):
        got = call(linear_prefill(), linear_decode())
    assert np.allclose(got, clamped_value)
    with pytest.raises(ValueError, match=r"out_of_range='raise'"):
        call(linear_prefill(out_of_range="raise"), linear_decode(out_of_range="raise"))


def test_nan_input_is_an_error_not_a_clamp():
    with pytest.raises(ValueError, match="ISL is NaN"):
        linear_prefill().ttft_ms_at(float("nan"))
    with pytest.raises(ValueError, match="KV usage is NaN"):
        linear_decode().itl_ms_at(float("nan"), 1000)


# -- bad files --------------------------------------------------------------------------


def _write_profile(tmp_path, prefill: dict, decode: dict):
    for sub, arrays in (("selected_prefill_interpolation", prefill), ("selected_decode_interpolation", decode)):
        (tmp_path / sub).mkdir(parents=True, exist_ok=True)
        np.savez(tmp_path / sub / "raw_data.npz", **arrays)
    return tmp_path


def _good(h200_profile_dir):
    return (
        read_npz(h200_profile_dir / "selected_prefill_interpolation" / "raw_data.npz"),
        read_npz(h200_profile_dir / "selected_decode_interpolation" / "raw_data.npz"),
    )


@pytest.mark.parametrize("side, mutate, message", [
    pytest.param("prefill", lambda a: a.pop("prefill_ttft"), r"prefill_interpolation/raw_data.npz: missing key 'prefill_ttft'",
                 id="missing prefill_ttft"),
    pytest.param("decode", lambda a: a.pop("max_kv_tokens"), r"decode_interpolation/raw_data.npz: missing key 'max_kv_tokens'",
                 id="missing max_kv_tokens"),
    pytest.param("prefill", lambda a: a.update(prefill_isl=a["prefill_isl"].reshape(1, -1)),
                 r"raw_data.npz: key 'prefill_isl' must be 1-D, got shape \(1, 17\)", id="2-D prefill_isl"),
    pytest.param("decode", lambda a: a.update(z_itl=np.where(np.arange(41) == 5, np.nan, a["z_itl"])),
                 r"raw_data.npz: key 'z_itl' has 1 non-finite values \(first at index 5", id="NaN in z_itl"),
    pytest.param("decode", lambda a: a.update(z_thpt_per_gpu=a["z_thpt_per_gpu"][:-1]),
                 r"raw_data.npz: .*must have equal lengths, got 41, 41, 41, 40", id="short z_thpt_per_gpu"),
    pytest.param("prefill", lambda a: a.update(prefill_ttft=a["prefill_ttft"].astype(str)),
                 r"key 'prefill_ttft' must be numeric", id="text ttft"),
    pytest.param("decode", lambda a: a.update(x_kv_usage=np.where(np.arange(41) == 0, 0.0, a["x_kv_usage"])),
                 r"raw_data.npz: key 'x_kv_usage' must be > 0", id="zero KV usage point"),
    pytest.param("decode", lambda a: a.update(max_kv_tokens=np.array([1, 2])),
                 r"key 'max_kv_tokens' must hold one value, got shape \(2,\)", id="two max_kv_tokens"),
])
def test_bad_file_names_file_and_key(tmp_path, h200_profile_dir, side, mutate, message):
    prefill, decode = _good(h200_profile_dir)
    mutate(prefill if side == "prefill" else decode)
    d = _write_profile(tmp_path, prefill, decode)
    with pytest.raises(ValueError, match=message):
        load_profile_dir(d)


def test_unreadable_or_missing_files(tmp_path):
    with pytest.raises(ValueError, match="profile folder not found"):
        load_profile_dir(tmp_path / "nope")
    (tmp_path / "selected_prefill_interpolation").mkdir()
    (tmp_path / "selected_prefill_interpolation" / "raw_data.npz").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match=r"raw_data.npz: not a readable .npz file"):
        load_profile_dir(tmp_path)


def test_pickled_object_arrays_are_refused(tmp_path, h200_profile_dir):
    prefill, decode = _good(h200_profile_dir)
    prefill["prefill_isl"] = np.array([object()] * 17, dtype=object)
    d = _write_profile(tmp_path, prefill, decode)
    with pytest.raises(ValueError, match="not a readable .npz file"):
        load_profile_dir(d)


def test_profiles_read_from_many_threads_at_once_are_whole(h200_profile_dir):
    # A what-if sweep loads a profile in every task thread; numpy parses each array header
    # with ast, whose CPython 3.11 counter is shared by threads (a SystemError in CI once).
    files = sorted(h200_profile_dir.rglob("*.npz"))
    want = [read_npz(f) for f in files]
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda i: read_npz(files[i % len(files)]), range(80)))
    for i, arrays in enumerate(got):
        expected = want[i % len(files)]
        assert arrays.keys() == expected.keys()
        assert all(np.array_equal(arrays[k], expected[k]) for k in arrays)


def test_duplicate_isl_is_an_error():
    with pytest.raises(ValueError, match=r"x: key 'prefill_isl' must be strictly increasing"):
        PrefillProfile.from_arrays(
            {"prefill_isl": np.array([1, 1, 2]), "prefill_ttft": np.ones(3), "prefill_thpt_per_gpu": np.ones(3)},
            source="x",
        )


def test_best_throughput_out_of_range_context_warns_then_clamps():
    d = linear_decode()
    with pytest.warns(ProfileRangeWarning, match="context length 5000 tokens is above the profiled max 2000"):
        op = d.best_throughput_per_gpu(30.0, 5000)
    assert op.kv_usage_frac == pytest.approx(0.5)  # as at context 2000: (30-17.5)/25


def test_best_throughput_in_range_emits_no_warning(h200_profile_dir):
    prof = load_profile_dir(h200_profile_dir)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for ctx in (350, 1000, 2997, 13585):
            for target in (5.0, 15.0, 40.0, 100.0):
                prof.decode.best_throughput_per_gpu(target, ctx)


def test_gpus_per_engine_come_from_the_profile_and_size_and_bill_per_engine(shared_data, tmp_path):
    """A TP4 aiconfigurator profile (meta.json: num_gpus_*_engine 4): loaded with 4 GPUs per engine, the
    sizing divides per-GPU throughput by 4 fewer replicas than a 1-GPU reading would, the config can
    override it, and the simulator bills 4 GPUs per worker."""
    import json
    import shutil

    from planner.config import SizingConfig
    from planner.sizing.pools import engine_gpus, resolve_engine_gpus, size_decode
    from planner.types import Corrections, Forecast
    from sim.whatif.scenario import WhatIfScenario, build_replay_settings

    src = shared_data / "profiles" / "aiconfigurator" / "Qwen3-32B_H100_sglang_TP4P_TP4D"
    profile = load_profile_dir(src)
    assert (profile.gpus_per_prefill_engine, profile.gpus_per_decode_engine) == (4, 4)
    one = load_profile_dir(shared_data / "profiles" / "dynamo" / "profiler" / "H200_TP1P_TP1D")
    assert (one.gpus_per_prefill_engine, one.gpus_per_decode_engine) == (None, None)  # no meta.json

    fc = Forecast(num_requests=6000.0, avg_isl_tokens=2000.0, avg_osl_tokens=300.0, num_requests_p90=6000.0,
                  predictor="constant")
    slo = SloTarget(ttft_ms=1000, itl_ms=40)

    def decode_replicas(cfg):
        return size_decode(fc, corrections=Corrections(), profile=profile.decode, slo=slo, cfg=cfg,
                           interval_s=60.0, size_on="mean")

    per_gpu = decode_replicas(SizingConfig())  # unresolved: 1 GPU per engine
    per_engine = decode_replicas(resolve_engine_gpus(SizingConfig(), prefill=4, decode=4))
    assert per_engine.numbers["gpus_per_engine"] == 4.0
    assert per_engine.numbers["replicas_for_throughput"] * 4 == pytest.approx(
        per_gpu.numbers["replicas_for_throughput"])
    assert engine_gpus(resolve_engine_gpus(SizingConfig(gpus_per_decode_engine=2), prefill=4, decode=4),
                       "decode") == 2  # the config wins

    sim = build_replay_settings(WhatIfScenario(trace="t", profile_dir=str(src)), profile).sim
    assert (sim.gpus_per_prefill, sim.gpus_per_decode) == (4, 4)

    bad = tmp_path / "bad"
    shutil.copytree(src, bad)
    meta = json.loads((bad / "meta.json").read_text())
    (bad / "meta.json").write_text(json.dumps(dict(meta, num_gpus_decode_engine="four")))
    with pytest.raises(ValueError, match=r"meta.json: num_gpus_decode_engine must be an integer >= 1, got 'four'"):
        load_profile_dir(bad)
