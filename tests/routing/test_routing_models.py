"""Safe model format: sklearn parity, validation of corrupt/mismatched documents, the model store."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
from sklearn.ensemble import HistGradientBoostingRegressor
from sklearn.linear_model import LinearRegression
from threadpoolctl import threadpool_limits

from routing.features import FEATURE_SETS, FEATURES
from routing.training.export import export_hist_gradient_boosting, export_linear, model_document
from routing.models.store import ModelStore, UnknownVersionError, VersionExistsError
from routing.models.validated import parse_model_document
from routing.models.predictor import LatencyPredictor, ProfileEstimator
from tests.support.fixtures_routing import h200_profile, linear, linear_document, trained_document


def _data(n=600, target="ttft", seed=0):
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 1, (n, len(FEATURES[target]))) * 1000
    y = 10 + 0.05 * x[:, 0] + np.sin(x[:, 2] / 100) * 5 + 0.01 * x[:, 5] + rng.normal(0, 1, n)
    return x, y


@pytest.mark.parametrize("loss, kw", [
    pytest.param("squared_error", {}, id="mean"),
    pytest.param("quantile", {"quantile": 0.9}, id="p90 quantile"),
    pytest.param("poisson", {}, id="poisson (log link)"),
    pytest.param("absolute_error", {}, id="median"),
])
def test_exported_trees_predict_exactly_like_sklearn(loss, kw):
    x, y = _data()
    with threadpool_limits(1):  # the machine is shared: no OpenMP oversubscription
        est = HistGradientBoostingRegressor(loss=loss, max_iter=20, random_state=0, **kw).fit(x, y)
    lin = linear("tpot", 1.0)
    doc = model_document(version="v", ttft_mean=export_hist_gradient_boosting(est), tpot_mean=lin)
    model = parse_model_document(json.loads(json.dumps(doc)))  # through real JSON text
    x_test, _ = _data(300, seed=1)
    np.testing.assert_allclose(model.predict("ttft", x_test), np.maximum(est.predict(x_test), 0), rtol=1e-9, atol=1e-9)


def test_linear_export_matches_sklearn():
    x, y = _data(target="tpot")
    est = LinearRegression().fit(x, y)
    doc = model_document(version="v", ttft_mean=linear("ttft", 1.0), tpot_mean=export_linear(est))
    model = parse_model_document(doc)
    np.testing.assert_allclose(model.predict("tpot", x[:50]), np.maximum(est.predict(x[:50]), 0), rtol=1e-9)


def test_p90_falls_back_to_mean_when_not_published():
    model = parse_model_document(linear_document())
    x = np.zeros((1, len(FEATURES["tpot"])))
    assert model.predict("tpot", x, quantile="p90") == model.predict("tpot", x, quantile="mean") == 5.0


def _tree_doc() -> dict:
    tree = {"feature": [0, 0, 0], "threshold": [10.0, 0.0, 0.0], "left": [1, 0, 0], "right": [2, 0, 0],
            "value": [0.0, 1.0, 2.0], "is_leaf": [False, True, True]}
    reg = {"kind": "hist_gradient_boosting", "link": "identity", "baseline": 5.0, "trees": [tree]}
    return model_document(version="t1", ttft_mean=reg, tpot_mean=linear("tpot", 1.0))


def _set(doc, path, value):
    doc = copy.deepcopy(doc)
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return doc


TREE = ("targets", "ttft", "mean", "trees", 0)


def _cycle(doc):
    """Node 1 made internal with itself as left child."""
    for field, value in (("is_leaf", [False, False, True]), ("left", [1, 1, 0]), ("right", [2, 2, 0])):
        doc = _set(doc, TREE + (field,), value)
    return doc


def _overflowing(doc):
    """Three trees whose leaves are each finite (1.7e308) but whose sum is inf."""
    tree = {**doc["targets"]["ttft"]["mean"]["trees"][0], "value": [0.0, 1.7e308, 1.7e308]}
    return _set(doc, ("targets", "ttft", "mean", "trees"), [tree] * 3)


@pytest.mark.parametrize("mutate, message", [
    pytest.param(lambda d: _set(d, ("targets", "ttft", "feature_names"), list(reversed(FEATURES["ttft"]))),
                 "targets.ttft.feature_names: expected", id="feature order differs"),
    pytest.param(lambda d: _set(d, ("targets", "tpot", "feature_names"), list(FEATURES["ttft"])),
                 "targets.tpot.feature_names: expected", id="TTFT features for TPOT"),
    pytest.param(lambda d: _set(d, TREE + ("threshold",), [10.0]), "threshold has 1 entries, is_leaf has 3",
                 id="array lengths differ"),
    pytest.param(lambda d: _set(d, TREE + ("left",), [7, 0, 0]), r"trees\[0\].left\[0\]: must be a node index 1..2",
                 id="child out of range"),
    pytest.param(lambda d: _cycle(d),
                 "node 1 is reached twice", id="cycle"),
    pytest.param(lambda d: _set(d, TREE + ("feature",), [13, 0, 0]), r"feature\[0\]: must be 0..12, got 13",
                 id="feature index out of range: 13 TTFT columns (set 2) -> 0..12"),
    pytest.param(lambda d: _set(d, TREE + ("value",), [0.0, float("nan"), 2.0]), "finite number",
                 id="NaN leaf"),
    pytest.param(lambda d: _overflowing(d), "predictions on probe rows are not finite", id="sum overflows"),
    pytest.param(lambda d: _set(d, ("targets", "ttft", "mean", "kind"), "pickle"), "targets.ttft.mean",
                 id="unknown model kind"),
    pytest.param(lambda d: _set(d, ("version",), "../../etc/passwd"), "version: String should match pattern",
                 id="version not a safe name"),
    pytest.param(lambda d: _set(d, ("format",), "sklearn-pickle"), "format", id="wrong format"),
    pytest.param(lambda d: _set(d, ("targets", "tpot", "mean", "coef"), [1.0, 2.0]),
                 "targets.tpot.mean.coef: expected 14 coefficients, got 2", id="coef length: 14 TPOT columns"),
    pytest.param(lambda d: d | {"feature_set": 99}, r"feature_set: 99 is not known to this router \(knows \[1, 2\]",
                 id="feature set from a newer router"),
    pytest.param(lambda d: {k: v for k, v in d.items() if k != "feature_set"},
                 "feature_set: required from format_version 2", id="format 2 without feature_set"),
    pytest.param(lambda d: d | {"format_version": 1}, "format_version 1 documents use feature set 1, got 2",
                 id="format 1 claiming feature set 2"),
    pytest.param(lambda d: d | {"feature_set": 1},
                 r"targets.ttft.feature_names: expected \[.*\] \(routing.features feature set 1\)",
                 id="feature set 1 with set 2's names"),
    pytest.param(lambda d: {k: v for k, v in d.items() if k != "targets"}, "targets: Field required",
                 id="targets missing"),
    pytest.param(lambda d: d | {"extra": 1}, "extra: Extra inputs are not permitted", id="unknown field"),
])
def test_corrupt_or_mismatched_documents_are_refused(mutate, message):
    with pytest.raises(ValueError, match=message):
        parse_model_document(mutate(_tree_doc()))


def test_size_limits():
    doc = _tree_doc()
    doc["targets"]["ttft"]["mean"]["trees"] *= 3
    with pytest.raises(ValueError, match="more than 2 trees"):
        parse_model_document(doc, max_trees=2)
    with pytest.raises(ValueError, match="more than 8 nodes"):
        parse_model_document(doc, max_nodes=8)


def test_tree_document_evaluates_by_hand():
    model = parse_model_document(_tree_doc())
    x = np.zeros((3, len(FEATURES["ttft"])))
    x[1, 0] = 11.0
    x[2, 0] = 10.0
    # 0 <= 10 -> left leaf: 5 + 1 = 6; 11 > 10 -> right leaf: 5 + 2 = 7; 10 <= 10 -> left: 6
    np.testing.assert_allclose(model.predict("ttft", x), [6.0, 7.0, 6.0])


# -- model store --------------------------------------------------------------


def test_publish_activates_and_rollback_returns_to_previous_then_estimate():
    store = ModelStore()
    assert store.active is None
    store.publish(linear_document("v1"), now_s=1.0)
    store.publish(linear_document("v2"), now_s=2.0)
    assert store.active.version == "v2"
    assert store.rollback().version == "v1"
    assert store.rollback() is None  # back to the profile estimate
    with pytest.raises(ValueError, match="nothing to roll back"):
        store.rollback()
    assert store.rollback(to_version="v2").version == "v2"
    with pytest.raises(UnknownVersionError, match="'v9' is not retained"):
        store.rollback(to_version="v9")
    assert [(v["version"], v["active"]) for v in store.list()] == [("v1", False), ("v2", True)]


def test_rejected_documents_leave_the_active_model_serving():
    store = ModelStore()
    store.publish(linear_document("good"), now_s=1.0)
    bad = linear_document("bad")
    bad["targets"]["ttft"]["feature_names"] = ["input_words"]
    with pytest.raises(ValueError, match="feature_names"):
        store.publish(bad, now_s=2.0)
    with pytest.raises(VersionExistsError, match="'good' was already published"):
        store.publish(linear_document("good"), now_s=3.0)
    assert store.active.version == "good" and [v["version"] for v in store.list()] == ["good"]


def test_store_persists_and_restores(tmp_path):
    store = ModelStore(directory=tmp_path)
    store.publish(linear_document("v1"), now_s=1.0)
    store.publish(trained_document("v2"), now_s=2.0)
    store.rollback()
    store.close()  # one store per directory at a time
    again = ModelStore(directory=tmp_path)
    assert again.active.version == "v1"
    assert again.rollback(to_version="v2").version == "v2"
    again.close()
    x = np.ones((3, len(FEATURES["ttft"])))
    np.testing.assert_allclose(ModelStore(directory=tmp_path).active.predict("ttft", x), store.get("v2").predict("ttft", x))


def test_corrupt_stored_model_is_a_startup_error_naming_the_file(tmp_path):
    ModelStore(directory=tmp_path).publish(linear_document("v1"), now_s=1.0)
    (tmp_path / "v1.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"v1.json: stored model does not load"):
        ModelStore(directory=tmp_path)


def test_eviction_keeps_active_and_rollback_target(tmp_path):
    store = ModelStore(directory=tmp_path, keep_versions=2)
    for k in range(1, 5):
        store.publish(linear_document(f"v{k}"), now_s=float(k))
    assert [v["version"] for v in store.list()] == ["v3", "v4"]
    assert sorted(p.name for p in tmp_path.glob("v*.json")) == ["v3.json", "v4.json"]
    store.rollback(to_version="v3")
    store.publish(linear_document("v5"), now_s=5.0)  # history ... v4, v3, v5: v3 must stay
    assert store.rollback().version == "v3"


def test_predictor_uses_published_model_else_profile_estimate():
    store = ModelStore()
    predictor = LatencyPredictor(estimate=ProfileEstimator(h200_profile()), models=store, quantile="p90")
    x = np.zeros((1, len(FEATURES["ttft"])))
    x[0, 0] = 1000.0
    x[0, FEATURES["ttft"].index("role_prefill")] = 1.0
    before = predictor.snapshot()
    assert before.version is None
    assert before.predict("ttft", x)[0] == pytest.approx(h200_profile().prefill.ttft_ms_at(1000.0), rel=1e-3)
    store.publish(linear_document("v1"), now_s=0.0)
    after = predictor.snapshot()
    assert after.version == "v1" and after.predict("ttft", x)[0] == pytest.approx(60.0)  # 50 + 0.01*1000
    assert before.predict("ttft", x)[0] != pytest.approx(60.0)  # a pinned snapshot keeps its model


@pytest.mark.parametrize("max_leaf_nodes, evaluator", [
    pytest.param(31, "BitvectorTrees", id="<= 64 leaves: threshold bitvectors"),
    pytest.param(120, "CompiledTrees", id="> 64 leaves: level-by-level walk"),
])
def test_both_tree_evaluators_match_sklearn(max_leaf_nodes, evaluator):
    x, y = _data(n=3000)
    with threadpool_limits(1):
        est = HistGradientBoostingRegressor(max_iter=8, max_leaf_nodes=max_leaf_nodes, min_samples_leaf=2,
                                            random_state=0).fit(x, y)
    doc = model_document(version="v", ttft_mean=export_hist_gradient_boosting(est), tpot_mean=linear("tpot", 1.0))
    model = parse_model_document(doc)
    assert type(model._models[("ttft", "mean")]).__name__ == evaluator
    x_test, _ = _data(500, seed=2)
    x_test[:5] = x[:5]  # rows sitting exactly on training values (and so near thresholds)
    np.testing.assert_allclose(model.predict("ttft", x_test), np.maximum(est.predict(x_test), 0), rtol=1e-9, atol=1e-9)


def _v1_document(version: str, ttft_mean: dict, tpot_mean: dict) -> dict:
    """A document as routers before feature set 2 published it (format_version 1, no feature_set)."""
    doc = model_document(version=version, ttft_mean=ttft_mean, tpot_mean=tpot_mean, feature_set=1)
    doc["format_version"] = 1
    del doc["feature_set"]
    return doc


def test_old_feature_set_model_is_served_on_its_own_columns():
    # Trained on feature set 1's columns only; served from the router's current (longer) rows.
    cols = [FEATURES["ttft"].index(n) for n in FEATURE_SETS[1]["ttft"]]
    rng = np.random.default_rng(3)
    x_full = rng.uniform(0, 1000, (2000, len(FEATURES["ttft"])))
    y = 5 + 0.02 * x_full[:, 0] + 0.01 * x_full[:, FEATURES["ttft"].index("prefill_tokens_in_flight")]
    with threadpool_limits(1):
        est = HistGradientBoostingRegressor(max_iter=15, random_state=0).fit(x_full[:, cols], y)
    tpot_coef = np.arange(1, len(FEATURE_SETS[1]["tpot"]) + 1, dtype=float)
    tpot = {"kind": "linear", "link": "identity", "intercept": 1.0, "coef": tpot_coef.tolist()}
    model = parse_model_document(json.loads(json.dumps(_v1_document("old-v1", export_hist_gradient_boosting(est), tpot))))
    assert model.feature_set == 1
    np.testing.assert_allclose(model.predict("ttft", x_full[:300]), np.maximum(est.predict(x_full[:300, cols]), 0),
                               rtol=1e-9, atol=1e-9)
    # Linear: 1 + sum(coef_i * x[name_i]) over set 1's names; the newer columns get no weight.
    row = np.zeros((1, len(FEATURES["tpot"])))
    row[0, FEATURES["tpot"].index("input_tokens")] = 10.0  # coef 1 -> 10
    row[0, FEATURES["tpot"].index("tokens_generated")] = 2.0  # last of set 1's 11: coef 11 -> 22
    row[0, FEATURES["tpot"].index("prefill_batch_tokens")] = 1e6  # not in set 1
    assert model.predict("tpot", row)[0] == pytest.approx(1 + 10 + 22)


def test_model_store_restores_an_old_feature_set_document(tmp_path):
    const = {t: {"kind": "linear", "link": "identity", "intercept": c, "coef": [0.0] * len(FEATURE_SETS[1][t])}
             for t, c in (("ttft", 7.0), ("tpot", 3.0))}
    ModelStore(directory=tmp_path).publish(_v1_document("pre-upgrade", const["ttft"], const["tpot"]), now_s=1.0)
    restored = ModelStore(directory=tmp_path).active
    assert restored.version == "pre-upgrade" and restored.feature_set == 1
    assert restored.predict("ttft", np.ones((2, len(FEATURES["ttft"])))).tolist() == [7.0, 7.0]


def _forest(max_leaf_nodes: int, *, max_iter: int, seed: int = 0):
    x, y = _data(n=4000, seed=seed)
    with threadpool_limits(1):
        est = HistGradientBoostingRegressor(max_iter=max_iter, max_leaf_nodes=max_leaf_nodes, min_samples_leaf=2,
                                            early_stopping=False, random_state=0).fit(x, y)
    reg = export_hist_gradient_boosting(est)
    doc = model_document(version="v", ttft_mean=reg, tpot_mean=linear("tpot", 1.0))
    return est, reg, parse_model_document(json.loads(json.dumps(doc)))


def _walk(reg: dict, x: np.ndarray) -> np.ndarray:
    """The documented semantics, one row and one tree at a time: left when x <= threshold (NaN: right)."""
    out = []
    for row in x:
        raw = reg["baseline"]
        for t in reg["trees"]:
            node = 0
            while not t["is_leaf"][node]:
                node = t["left"][node] if row[t["feature"][node]] <= t["threshold"][node] else t["right"][node]
            raw += t["value"][node]
        out.append(raw)
    return np.maximum(np.array(out), 0.0)


def _rows(reg: dict, n: int, *, seed: int) -> np.ndarray:
    """Random rows: some columns shared by every row (as the request's own size is in a pick), some values
    exactly on split thresholds, the rest uniform over the training range."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 1000, (n, len(FEATURES["ttft"])))
    x[:, 0] = x[0, 0]
    x[:, 1] = rng.choice([0.0, 250.0])
    thr = [(t["feature"][i], t["threshold"][i]) for t in reg["trees"] for i in range(len(t["is_leaf"]))
           if not t["is_leaf"][i]]
    for r in range(0, n, 3):
        f, v = thr[int(rng.integers(len(thr)))]
        x[r, f] = v
    return x


def _compiled(model, *, narrow):
    """The same forest compiled again with 32-bit (narrow) or 64-bit masks."""
    from routing.models.compiled import BitvectorTrees

    fast = model._models[("ttft", "mean")]
    doc = model.document["targets"]["ttft"]["mean"]
    checked = []
    for tree in doc["trees"]:
        is_leaf = np.array(tree["is_leaf"])
        checked.append((0, type("T", (), {"value": tree["value"], "threshold": tree["threshold"]}), is_leaf,
                        np.where(is_leaf, 0, np.array(tree["feature"])), np.array(tree["left"]), np.array(tree["right"])))
    out = BitvectorTrees.build(checked, n_features=len(FEATURES["ttft"]), baseline=fast.baseline,
                                log_link=fast.log_link, narrow=narrow)
    assert out.narrow is narrow
    return out


@pytest.mark.parametrize("n_rows", [
    pytest.param(1, id="one row: every feature looked up once"),
    pytest.param(2, id="two rows"),
    pytest.param(50, id="a pick's candidates (100 endpoints / 2 roles)"),
    pytest.param(300, id="300 rows: three 128-row blocks"),
])
def test_32_bit_masks_match_64_bit_masks_bit_for_bit_and_sklearn(n_rows):
    # 31 leaves (the retrain flow's default) takes the 32-bit path; forcing the
    # 64-bit de Bruijn path on the same forest must give identical floats, since
    # both sum the same leaf values in the same order.
    est, reg, model = _forest(31, max_iter=60)
    x = _rows(reg, n_rows, seed=n_rows)
    narrow, wide = _compiled(model, narrow=True), _compiled(model, narrow=False)
    got = model.predict("ttft", x)
    assert np.array_equal(narrow.raw(x), wide.raw(x))
    assert np.array_equal(got, np.maximum(wide.raw(x), 0.0))
    np.testing.assert_allclose(got, np.maximum(est.predict(x), 0), rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(got, _walk(reg, x), rtol=1e-12, atol=1e-9)


def test_rows_that_differ_only_in_shared_columns_are_not_broadcast_wrongly():
    # Every row equal except one column: the shared-feature shortcut applies to
    # all other columns and must still give each row its own leaf.
    est, reg, model = _forest(31, max_iter=40, seed=4)
    x = np.tile(_rows(reg, 1, seed=5), (40, 1))
    x[:, 2] = np.linspace(0, 1000, 40)
    np.testing.assert_allclose(model.predict("ttft", x), np.maximum(est.predict(x), 0), rtol=1e-9, atol=1e-9)
    assert np.unique(model.predict("ttft", x)).size > 1
    same = np.tile(x[:1], (7, 1))  # all columns shared
    assert np.array_equal(model.predict("ttft", same), np.repeat(model.predict("ttft", x[:1]), 7))


@pytest.mark.parametrize("max_leaf_nodes, evaluator", [
    pytest.param(31, ("BitvectorTrees", True), id="32-bit masks"),
    pytest.param(50, ("BitvectorTrees", False), id="64-bit masks"),
    pytest.param(120, ("CompiledTrees", None), id="level-by-level walk"),
])
def test_nan_goes_right_in_every_evaluator(max_leaf_nodes, evaluator):
    # The format stores no missing-value direction (the router never builds a
    # NaN row); a NaN handed to predict directly fails "<=" and goes right, the
    # same in all three evaluators.
    _, reg, model = _forest(max_leaf_nodes, max_iter=10, seed=1)
    fast = model._models[("ttft", "mean")]
    assert (type(fast).__name__, getattr(fast, "narrow", None)) == evaluator
    x = _rows(reg, 30, seed=7)
    x[::2, 2] = np.nan
    x[1::4, 0] = np.nan
    np.testing.assert_allclose(model.predict("ttft", x), _walk(reg, x), rtol=1e-12, atol=1e-9)


def test_empty_input_gives_empty_prediction():
    _, _, model = _forest(31, max_iter=5)
    assert model.predict("ttft", np.empty((0, len(FEATURES["ttft"])))).shape == (0,)


def test_a_document_refused_by_a_validator_says_why_without_pydantics_prefix():
    doc = linear_document("rel-1")
    doc["targets"]["ttft"]["relative"] = True  # relative to an estimate, but no base named
    with pytest.raises(ValueError) as info:
        parse_model_document(doc)
    assert "base: required, targets ['ttft'] are relative to an estimate" in str(info.value)
    assert "Value error" not in str(info.value)
